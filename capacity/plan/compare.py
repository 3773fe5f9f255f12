"""The same sizing question on several GPU types (and engines): a plan for each, sorted by cost per 1M output
tokens, and why a GPU has no plan instead of leaving it out (`capacity plan --gpu A --gpu B`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.errors import CapacityError
from capacity.model.compute import measured_gemm_efficiency
from capacity.model.gpus import get_gpu
from capacity.plan.planner import Plan, make_plan
from capacity.plan.scenario import Scenario


@dataclass
class GpuOption:
    """One GPU type's answer to the same question: its plan, or why there is none."""

    gpu: str
    plan: Plan | None
    why: str = ""
    price_per_gpu_hour: float | None = None
    engine: str | None = None  # set when engines are compared: the option is `gpu (engine)`

    @property
    def label(self) -> str:
        return self.gpu if self.engine is None else f"{self.gpu} ({self.engine})"

    @property
    def sort_key(self) -> tuple:
        p = self.plan
        if p is None:
            return (1, math.inf, math.inf)
        return (0, p.cost_per_million_tokens if p.cost_per_million_tokens is not None else math.inf, p.gpus)

    def row(self) -> dict:
        p = self.plan
        if p is None:
            return {"gpu": self.gpu, "engine": self.engine, "fits": False, "why": self.why}
        rec = p.recommended
        return {"gpu": self.gpu, "engine": self.engine, "fits": True, "tp": p.tp, "replicas": p.replicas, "gpus": p.gpus,
                "max_num_seqs": rec.max_num_seqs if rec else None, "max_model_len": rec.max_model_len if rec else None,
                "max_rate_per_replica": p.rec_search.max_rate if p.rec_search else None,
                "verified": p.verification.passed, "p_ttft_s": p.verification.p_ttft_s,
                "p_tpot_s": p.verification.p_tpot_s, "price_per_gpu_hour": self.price_per_gpu_hour,
                "usd_per_hour": p.gpus * self.price_per_gpu_hour if self.price_per_gpu_hour else None,
                "cost_per_million_tokens": p.cost_per_million_tokens, "source": p.source,
                "rate_per_tp": {str(r.tp): round(r.max_rate, 4) for r in p.searches},
                "tp_unfit": {str(u.tp): u.why for u in p.tp_unfit}, "caveat": self.caveat, "notes": list(p.notes)}

    @property
    def caveat(self) -> str:
        """What makes this option's rank less certain than the others': step costs from the datasheet where
        nothing was measured on the part (no calibrated profile, no measured GEMM efficiency)."""
        p = self.plan
        if p is None or not p.source.startswith("roofline"):
            return ""
        try:
            g = get_gpu(self.gpu)
        except CapacityError:
            return ""
        if measured_gemm_efficiency(g, "bf16") is not None:
            return ""
        return f"nothing measured on {g.name}: {UNMEASURED}"


UNMEASURED = ("step costs are datasheet peaks x efficiencies assumed from NVIDIA parts (GEMM 0.70, memory "
              "bandwidth 0.80), so the rate may be optimistic; calibrate on the part (capacity calibrate) before it "
              "decides a purchase")


def comparison_table(options: list[GpuOption]) -> tuple[list[str], list[list]]:
    """The comparison as one table (the workbook's Comparison sheet, `--output csv`): a row per option, its rate
    per replica at each TP size searched, and why an option has no plan."""
    tps = sorted({int(t) for o in options for t in (o.row().get("rate_per_tp") or {})})
    head = ["GPU", "engine", "fits", "TP", "replicas", "GPUs", "max_num_seqs", "max_model_len",
            "req/s per replica", *(f"req/s per replica at tp={t}" for t in tps), "P99 TTFT (ms)", "P99 TPOT (ms)",
            "USD per GPU-hour", "USD per hour", "USD per 1M output tokens", "step-cost source", "caveat or why not"]
    rows = []
    for o in options:
        r = o.row()
        if not r["fits"]:
            rows.append([o.gpu, o.engine or "", False, *[None] * (9 + len(tps) + 3), "", r["why"]])
            continue
        ms = [None if r[k] is None else round(r[k] * 1e3, 1) for k in ("p_ttft_s", "p_tpot_s")]
        rows.append([o.gpu, o.engine or "", True, r["tp"], r["replicas"], r["gpus"], r["max_num_seqs"],
                     r["max_model_len"], r["max_rate_per_replica"], *(r["rate_per_tp"].get(str(t)) for t in tps),
                     *ms, r["price_per_gpu_hour"], r["usd_per_hour"], r["cost_per_million_tokens"], r["source"],
                     r["caveat"]])
    return head, rows


def compare_gpus(scenarios: list[tuple[Scenario, object]], executor) -> list[GpuOption]:
    """The same question on several GPU types (one scenario each): every plan, sorted by cost per 1M output
    tokens (by GPU count when unpriced); a GPU that cannot serve it says why instead of vanishing."""
    out = []
    several = len({sc.engine.engine for sc, _ in scenarios}) > 1
    phases = getattr(executor, "phases", None)
    for i, (sc, card) in enumerate(scenarios):
        eng = sc.engine.engine if several else None
        if phases is not None:
            phases.option(i, len(scenarios), sc.gpu_name + (f" ({eng})" if eng else ""))
        try:
            out.append(GpuOption(sc.gpu_name, make_plan(sc, card, executor), "", sc.price_per_gpu_hour, eng))
        except CapacityError as exc:  # does not fit, or no configuration meets the SLO: an answer for this GPU
            out.append(GpuOption(sc.gpu_name, None, str(exc), sc.price_per_gpu_hour, eng))
    return sorted(out, key=lambda o: o.sort_key)
