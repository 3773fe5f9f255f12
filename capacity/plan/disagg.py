"""Aggregated or disaggregated serving for a node of GPUs: every way to use the node (replicas x TP of aggregated
engines, or a prefill pool and a decode pool with their own TP), the highest rate each sustains under the P99
TTFT and TPOT SLOs, the GPUs and cost a target rate needs with that layout repeated, and which wins and why.

Each layout's max rate comes from a bisection on open-loop Poisson probes of the run pipeline (a probe passes
when it is not saturated and both P99s meet the SLO), `seeds` simulations per probe. `capacity disagg` prints it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.errors import CapacityError, ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.pipeline import Deployment, Disagg, RunOptions, prepare, run
from capacity.workload import Arrivals, WorkloadSpec, context_of

TPS = (1, 2, 4, 8)
MAX_PROBE_REQUESTS = 8000


@dataclass(frozen=True)
class Layout:
    prefill: int  # replicas (aggregated: all of them)
    tp_prefill: int
    decode: int = 0  # 0: aggregated
    tp_decode: int = 0

    @property
    def aggregated(self) -> bool:
        return self.decode == 0

    @property
    def gpus(self) -> int:
        return self.prefill * self.tp_prefill + self.decode * self.tp_decode

    @property
    def name(self) -> str:
        if self.aggregated:
            return f"{self.prefill}xTP{self.tp_prefill}"
        return f"P {self.prefill}xTP{self.tp_prefill} + D {self.decode}xTP{self.tp_decode}"


def layouts(gpus: int, tps: tuple[int, ...] = TPS) -> list[Layout]:
    """Every aggregated layout that fills `gpus` with one TP, and every prefill/decode split of them."""
    out = [Layout(gpus // t, t) for t in tps if gpus % t == 0]
    for tp_p in tps:
        for tp_d in tps:
            for n_p in range(1, gpus // tp_p + 1):
                rest = gpus - n_p * tp_p
                if rest > 0 and rest % tp_d == 0:
                    out.append(Layout(n_p, tp_p, rest // tp_d, tp_d))
    return out


def _probe(card: ModelCard, gpu: GPU, engine: EngineConfig, lay: Layout, workload: WorkloadSpec, rate: float,
           slo: tuple[float, float], seeds: int, link: str,
           decode_over: dict | None = None) -> tuple[bool, float | None, float | None]:
    # long enough to reach steady state: arrivals over 3 x the longest end-to-end time the SLO allows (a short
    # burst of long requests never fills the batch and looks better than the engine will be), within bounds
    e2e = slo[0] + workload.mean_output_tokens * slo[1]
    n = int(min(MAX_PROBE_REQUESTS, max(workload.num_requests, math.ceil(rate * 3 * e2e))))
    spec = workload.model_copy(update={"arrivals": Arrivals(kind="poisson", rate_per_s=rate), "num_requests": n})
    ok, pt, pp = True, [], []
    for seed in range(seeds):
        opts = RunOptions(seed=seed, ci=False, timeseries=False)
        eng = engine.model_copy(update={"tensor_parallel_size": lay.tp_prefill})
        if lay.aggregated:
            res = run(Deployment(card, gpu, eng, replicas=lay.prefill), spec, opts)
        else:
            dec = Deployment(card, gpu, engine.model_copy(update={**(decode_over or {}),
                                                                  "tensor_parallel_size": lay.tp_decode}),
                             replicas=lay.decode)
            res = run(Deployment(card, gpu, eng, replicas=lay.prefill), spec, opts, disagg=Disagg(dec, link))
        s = res.summary
        t, p = s.ttft_s.p99, s.tpot_s.p99 or 0.0
        pt.append(t if t is not None else math.inf)
        pp.append(p)
        ok = ok and not res.sim.saturated and not res.rising and pt[-1] <= slo[0] and p <= slo[1]  # as Planner.judge
    return ok, sum(pt) / len(pt), sum(pp) / len(pp)


def max_rate(card: ModelCard, gpu: GPU, engine: EngineConfig, lay: Layout, workload: WorkloadSpec,
             slo: tuple[float, float], seeds: int = 1, link: str = "nvlink", lo: float = 0.05, hi: float = 512.0,
             tolerance: float = 0.06, decode_over: dict | None = None) -> dict[str, Any]:
    """The highest Poisson rate (within `tolerance`) at which the layout meets both P99 SLOs, with its P99s,
    searched upwards from `lo` (a rate that fails there gives max_rate 0). `decode_over`: engine settings of the
    decode pool only (a validated EngineConfig's fields)."""
    ok, pt, pp = _probe(card, gpu, engine, lay, workload, lo, slo, seeds, link, decode_over)
    if not ok:
        return {"max_rate": 0.0, "p99_ttft_s": pt, "p99_tpot_s": pp}
    best = (pt, pp)
    # bracket from below by doubling (fewer probes than a bisection over the whole range)
    r = lo
    while r * 2 <= hi:
        ok, pt, pp = _probe(card, gpu, engine, lay, workload, r * 2, slo, seeds, link, decode_over)
        if not ok:
            hi = r * 2
            break
        r, best = r * 2, (pt, pp)
    lo = r
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        ok, pt, pp = _probe(card, gpu, engine, lay, workload, mid, slo, seeds, link, decode_over)
        if ok:
            lo, best = mid, (pt, pp)
        else:
            hi = mid
    return {"max_rate": lo, "p99_ttft_s": best[0], "p99_tpot_s": best[1]}


SEQS = (64, 128, 256, 512, 1024)  # batch caps tried (vLLM's default is 256 or 1,024 by GPU and release)
BUDGETS = (2048, 4096, 8192, 16384)  # token budgets tried (its defaults run from 2,048 to 16,384)


def _knobs(lay: Layout) -> list[tuple[str, str, tuple[int, ...]]]:
    """(role, setting, values) searched for a layout, in order. An aggregated engine: its batch cap, then its
    token budget (the TPOT/TTFT trade of chunked prefill). Disaggregated: the decode pool's batch cap (its
    concurrency against its TPOT), then the prefill pool's token budget (prompt tokens per step: its TTFT), then
    the decode pool's token budget (its steps carry one token per sequence, so the budget only sizes the
    activation reserve: a smaller one leaves more KV blocks)."""
    if lay.aggregated:
        return [("engine", "max_num_seqs", SEQS), ("engine", "max_num_batched_tokens", BUDGETS)]
    return [("decode", "max_num_seqs", SEQS), ("prefill", "max_num_batched_tokens", BUDGETS),
            ("decode", "max_num_batched_tokens", BUDGETS)]


def _resolved(card: ModelCard, gpu: GPU, engine: EngineConfig) -> tuple[int, int]:
    """The batch cap and token budget the engine runs with (its release's defaults where not set)."""
    b = get_engine(engine.engine).budget(card, gpu, engine)
    return b.max_num_seqs, b.max_num_batched_tokens


def tune(card: ModelCard, gpu: GPU, engine: EngineConfig, lay: Layout, workload: WorkloadSpec,
         slo: tuple[float, float], found: dict[str, Any], *, seeds: int = 1, link: str = "nvlink",
         tolerance: float = 0.06, decode_over: dict | None = None,
         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Each role's engine settings for one layout, by coordinate search from `found` (max_rate's answer at the
    settings given): for each setting of `_knobs` in turn, each value is first probed just above the best rate
    so far (1 + tolerance); one that fails there cannot win and costs that one probe, one that passes is
    searched upwards and kept if it sustains more. A batch cap above the token budget raises the budget with it
    (vLLM refuses a budget below the cap); a budget below the batch cap is not tried. Returns the best rate and
    P99s, each role's settings that differ from the ones given (`settings`: `prefill` and `decode`, or an
    aggregated layout's `engine`), and every value tried with its rate (None: it did not beat the best then)."""
    pre: dict[str, int] = {}
    dec: dict[str, Any] = dict(decode_over or {})
    best = {k: found[k] for k in ("max_rate", "p99_ttft_s", "p99_tpot_s")}
    tried: list[dict[str, Any]] = []
    for role, name, values in _knobs(lay):
        for v in values:
            p2, d2 = dict(pre), dict(dec)
            mine = d2 if role == "decode" else p2
            tp = lay.tp_decode if role == "decode" else lay.tp_prefill
            try:
                seqs, budget = _resolved(card, gpu, engine.model_copy(update={**mine, "tensor_parallel_size": tp}))
            except CapacityError:
                seqs, budget = -1, -1
            if (seqs, budget)[name == "max_num_batched_tokens"] == v or (name == "max_num_batched_tokens" and v < seqs):
                continue
            mine[name] = v
            if name == "max_num_seqs" and budget < v:
                mine["max_num_batched_tokens"] = v
            if progress:
                progress(f"{lay.name}: {role} {name}={v}")
            floor = best["max_rate"] * (1 + tolerance) if best["max_rate"] > 0 else 0.05
            try:
                r = max_rate(card, gpu, engine.model_copy(update=p2), lay, workload, slo, seeds, link, lo=floor,
                             tolerance=tolerance, decode_over=d2)
            except CapacityError as exc:  # no room for the model or one request at this value
                tried.append({"role": role, "setting": name, "value": v, "max_rate": None,
                              "why": " ".join(str(exc).split())[:160]})
                continue
            won = r["max_rate"] > 0
            tried.append({"role": role, "setting": name, "value": v, "max_rate": r["max_rate"] if won else None})
            if won:
                best, pre, dec = r, p2, d2
    settings = ({"engine": pre} if lay.aggregated else
                {"prefill": pre, "decode": {k: v for k, v in dec.items() if (decode_over or {}).get(k) != v}})
    return {**best, "settings": settings, "tried": tried}


def _size(row: dict[str, Any], target_rate: float | None, price: float | None, mean_out: float) -> None:
    """Units, GPUs and cost per 1M output tokens of a layout for the target rate (in place)."""
    if target_rate is not None and row["max_rate"] > 0:
        units = math.ceil(target_rate / row["max_rate"] - 1e-9)
        row["units"], row["total_gpus"] = units, units * row["gpus"]
        if price:
            row["cost_per_1m_output_tokens"] = units * row["gpus"] * price / (target_rate * mean_out * 3600) * 1e6


def compare(card: ModelCard, gpu: GPU, engine: EngineConfig, workload: WorkloadSpec, slo: tuple[float, float], *,
            gpus: int = 8, target_rate: float | None = None, price_per_gpu_hour: float | None = None,
            seeds: int = 1, link: str = "nvlink", progress: Callable[[str], None] | None = None,
            decode_over: dict | None = None, tune_roles: bool = False) -> dict[str, Any]:
    """Every layout of a `gpus`-GPU unit (see the module docstring); with `target_rate`, the units each needs.
    `decode_over`: settings of the decode pool's engine only (its max_num_seqs, token budget, ...).
    `tune_roles`: then search each role's settings (`tune`) for the best aggregated and the best disaggregated
    layout found at the settings given, and compare those two as tuned. Only the two winners are tuned (every
    layout would multiply the probes by the layouts): another layout that gains more from tuning is not seen."""
    if gpus < 1 or gpus > 64:
        raise ConfigError(f"gpus: 1 to 64 GPUs per unit (got {gpus})")
    if target_rate is not None and not (math.isfinite(target_rate) and target_rate > 0):
        raise ConfigError(f"target rate: must be > 0 (got {target_rate})")
    if not all(math.isfinite(x) and x > 0 for x in slo):
        raise ConfigError(f"slo: TTFT and TPOT must be > 0 (got {slo})")
    workload.check_context(*context_of(engine, card))

    unfit: dict[int, str] = {}  # TP sizes that cannot hold the model here: their layouts are left out
    for tp in (t for t in TPS if t <= gpus):
        try:
            prepare(Deployment(card, gpu, engine.model_copy(update={"tensor_parallel_size": tp})))
        except CapacityError as exc:
            unfit[tp] = " ".join(str(exc).split())[:200]
    tps = tuple(t for t in TPS if t <= gpus and t not in unfit)
    rows: list[dict[str, Any]] = []
    mean_out = workload.mean_output_tokens
    for lay in layouts(gpus, tps):
        if progress:
            progress(lay.name)
        try:
            r = max_rate(card, gpu, engine, lay, workload, slo, seeds, link, decode_over=decode_over)
        except CapacityError as exc:  # a TP that cannot hold the model, a pool without room: shown with why
            rows.append({"layout": lay.name, "aggregated": lay.aggregated, "gpus": lay.gpus, "max_rate": None,
                         "why": " ".join(str(exc).split())[:160]})
            continue
        row: dict[str, Any] = {"layout": lay.name, "aggregated": lay.aggregated, "gpus": lay.gpus,
                               "prefill": [lay.prefill, lay.tp_prefill], "decode": [lay.decode, lay.tp_decode], **r}
        _size(row, target_rate, price_per_gpu_hour, mean_out)
        rows.append(row)
    ok = [r for r in rows if r.get("max_rate")]
    key = (lambda r: (r["total_gpus"], -r["max_rate"])) if target_rate is not None else (lambda r: -r["max_rate"])
    best_agg = min((r for r in ok if r["aggregated"]), key=key, default=None)
    best_dis = min((r for r in ok if not r["aggregated"]), key=key, default=None)
    tuned: dict[str, Any] = {}
    for kind, best in (("aggregated", best_agg), ("disaggregated", best_dis)):
        if not tune_roles or best is None:
            continue
        (n_p, tp_p), (n_d, tp_d) = best["prefill"], best["decode"]
        lay = Layout(n_p, tp_p, n_d, tp_d)
        t = tune(card, gpu, engine, lay, workload, slo, best, seeds=seeds, link=link, decode_over=decode_over,
                 progress=progress)
        row = {**{k: v for k, v in best.items() if k not in ("units", "total_gpus", "cost_per_1m_output_tokens")},
               **t, "max_rate_as_given": best["max_rate"]}
        _size(row, target_rate, price_per_gpu_hour, mean_out)
        tuned[kind] = row
    best_agg, best_dis = tuned.get("aggregated", best_agg), tuned.get("disaggregated", best_dis)
    return {"model": card.name, "gpu": gpu.name, "gpus_per_unit": gpus, "link": link,
            "slo": {"ttft_s": slo[0], "tpot_s": slo[1]}, "target_rate_per_s": target_rate,
            "decode_engine": dict(decode_over or {}),
            "input_tokens": workload.input_len.expected, "output_tokens": mean_out, "rows": rows,
            "tp_that_does_not_fit": {str(k): v for k, v in unfit.items()},
            "best_aggregated": best_agg, "best_disaggregated": best_dis, "tuned": bool(tune_roles),
            "verdict": verdict(best_agg, best_dis, slo, target_rate is not None)}


def verdict(agg: dict | None, dis: dict | None, slo: tuple[float, float], by_gpus: bool) -> str:
    """Which wins and why, from the numbers: which SLO bounds each at its max rate."""
    if agg is None and dis is None:
        return "no layout meets the SLO at any rate"
    if agg is None or dis is None:
        return f"only {'disaggregated' if agg is None else 'aggregated'} layouts meet the SLO"

    def bound(r: dict) -> str:
        t, p = (r["p99_ttft_s"] or 0) / slo[0], (r["p99_tpot_s"] or 0) / slo[1]
        return (f"TPOT ({r['p99_tpot_s'] * 1e3:.1f} of {slo[1] * 1e3:g} ms)" if p >= t else
                f"TTFT ({r['p99_ttft_s'] * 1e3:.0f} of {slo[0] * 1e3:g} ms)")

    if by_gpus:
        win = dis if (dis["total_gpus"], -dis["max_rate"]) < (agg["total_gpus"], -agg["max_rate"]) else agg
    else:
        win = dis if dis["max_rate"] > agg["max_rate"] else agg
    lose = agg if win is dis else dis
    how = (f"{win['total_gpus']} GPUs against {lose['total_gpus']}" if by_gpus else
           f"{win['max_rate'] / lose['max_rate']:.2f}x the rate per unit")
    kind = "disaggregated" if win is dis else "aggregated"
    return (f"{kind} wins ({win['layout']}: {how}). At its max rate the best aggregated layout is bound by "
            f"{bound(agg)}, the best disaggregated one by {bound(dis)}. Long prompts put prefill chunks into an "
            "aggregated engine's decode steps (TPOT); a separate decode pool avoids that, at the price of GPUs that "
            "only prefill (and a KV transfer in TTFT): with short prompts those idle, and aggregation wins.")
