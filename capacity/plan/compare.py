"""The same sizing question on several GPU types (and engines): a plan for each, sorted by cost per 1M output
tokens, and why a GPU has no plan instead of leaving it out (`capacity plan --gpu A --gpu B`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.errors import CapacityError
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
                "cost_per_million_tokens": p.cost_per_million_tokens, "source": p.source}


def compare_gpus(scenarios: list[tuple[Scenario, object]], executor) -> list[GpuOption]:
    """The same question on several GPU types (one scenario each): every plan, sorted by cost per 1M output
    tokens (by GPU count when unpriced); a GPU that cannot serve it says why instead of vanishing."""
    out = []
    several = len({sc.engine.engine for sc, _ in scenarios}) > 1
    for sc, card in scenarios:
        eng = sc.engine.engine if several else None
        try:
            out.append(GpuOption(sc.gpu_name, make_plan(sc, card, executor), "", sc.price_per_gpu_hour, eng))
        except CapacityError as exc:  # does not fit, or no configuration meets the SLO: an answer for this GPU
            out.append(GpuOption(sc.gpu_name, None, str(exc), sc.price_per_gpu_hour, eng))
    return sorted(out, key=lambda o: o.sort_key)
