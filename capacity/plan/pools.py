"""Interactive and batch traffic of one model, sized together: one pool that serves both with priority
scheduling (interactive first: vLLM's `--scheduling-policy priority`), or two pools, each sized for its own
traffic. The interactive class is held to its P99 TTFT and TPOT SLO; the batch class to a P99 end-to-end
deadline (its requests must finish within it; the pool must not saturate). Each layout's replicas are the
fewest that pass (a linear search, every count simulated through the run pipeline); the cheaper layout is
recommended with its P99s. `capacity pools` prints it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.pipeline import Deployment, RunOptions, run
from capacity.workload import Arrivals, Lengths, RequestClass, WorkloadSpec, context_of


def _check(res, names: list[str], slo: dict[str, float]) -> tuple[bool, dict[str, Any]]:
    """Whether a run meets the interactive SLO and the batch deadline, and the P99s it measured."""
    s = res.summary
    per = s.per_class if len(names) > 1 else {names[0]: s}
    out: dict[str, Any] = {"saturated": res.sim.saturated, "ttft_rising": res.rising}
    ok = not res.sim.saturated and not res.rising  # a TTFT still rising: a queue that grows (as Planner.judge)
    for name in names:
        c = per[name]
        out[name] = {"p99_ttft_s": c.ttft_s.p99, "p99_tpot_s": c.tpot_s.p99, "p99_e2e_s": c.e2e_s.p99,
                     "requests": c.n_requests if hasattr(c, "n_requests") else s.n_requests}
        if name == "interactive":
            ok = ok and c.ttft_s.p99 is not None and c.ttft_s.p99 <= slo["ttft_s"] and (c.tpot_s.p99 or 0) <= slo["tpot_s"]
        else:
            ok = ok and c.e2e_s.p99 is not None and c.e2e_s.p99 <= slo["batch_deadline_s"]
    return ok, out


def size_pools(card: ModelCard, gpu: GPU, engine: EngineConfig, *, interactive_rate: float, batch_rate: float,
               interactive_len: tuple[Lengths, Lengths], batch_len: tuple[Lengths, Lengths], slo_ttft_s: float,
               slo_tpot_s: float, batch_deadline_s: float, max_replicas: int = 64, requests: int = 2000, seed: int = 0,
               price_per_gpu_hour: float | None = None,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    for name, v in (("interactive rate", interactive_rate), ("batch rate", batch_rate), ("TTFT SLO", slo_ttft_s),
                    ("TPOT SLO", slo_tpot_s), ("batch deadline", batch_deadline_s)):
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{name}: must be a finite number > 0 (got {v})")
    if not 1 <= max_replicas <= 1024:
        raise ConfigError(f"max replicas: 1 to 1024 (got {max_replicas})")
    slo = {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s, "batch_deadline_s": batch_deadline_s}
    total = interactive_rate + batch_rate
    inter = RequestClass(name="interactive", weight=interactive_rate / total, priority=0,
                         input_len=interactive_len[0], output_len=interactive_len[1])
    batch = RequestClass(name="batch", weight=batch_rate / total, priority=1, input_len=batch_len[0],
                         output_len=batch_len[1])
    tp = engine.tensor_parallel_size

    def search(label: str, eng: EngineConfig, spec: WorkloadSpec, names: list[str]) -> dict[str, Any]:
        for n in range(1, max_replicas + 1):
            if progress:
                progress(f"{label}: {n} replica{'s' if n > 1 else ''}")
            res = run(Deployment(card, gpu, eng, replicas=n, router="least_outstanding"), spec,
                      RunOptions(seed=seed, ci=False, timeseries=False))
            ok, got = _check(res, names, slo)
            if ok:
                return {"replicas": n, "gpus": n * tp, **got}
        return {"replicas": None, "gpus": None, "why": f"more than {max_replicas} replicas"}

    def spec_of(rate: float, classes: list[RequestClass]) -> WorkloadSpec:
        mean_e2e = slo_ttft_s + max(c.output_len.expected for c in classes if c.output_len) * slo_tpot_s
        n = int(min(20_000, max(requests, math.ceil(rate * 3 * max(mean_e2e, batch_deadline_s / 3)))))
        return WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=rate), classes=classes, num_requests=n)

    spec_of(total, [inter, batch]).check_context(*context_of(engine, card))
    one = search("one pool, priority", engine.model_copy(update={"policy": "priority"}),
                 spec_of(total, [inter, batch]), ["interactive", "batch"])
    two_i = search("interactive pool", engine, spec_of(interactive_rate, [inter.model_copy(update={"weight": 1.0})]),
                   ["interactive"])
    two_b = search("batch pool", engine, spec_of(batch_rate, [batch.model_copy(update={"weight": 1.0})]), ["batch"])
    two = {"interactive_pool": two_i, "batch_pool": two_b,
           "gpus": (two_i["gpus"] + two_b["gpus"]) if two_i["gpus"] and two_b["gpus"] else None}
    layouts = [("one pool with priority", one["gpus"]), ("two pools", two["gpus"])]
    # the fewest GPUs; on a tie, the lower interactive P99 TTFT
    ttft = {"one pool with priority": (one.get("interactive") or {}).get("p99_ttft_s"),
            "two pools": (two_i.get("interactive") or {}).get("p99_ttft_s")}
    feasible = [(g, ttft[name] if ttft[name] is not None else math.inf, name) for name, g in layouts if g is not None]
    rec = min(feasible)[2] if feasible else None
    out: dict[str, Any] = {"model": card.name, "gpu": gpu.name, "tp": tp, "slo": slo,
                           "interactive_rate_per_s": interactive_rate, "batch_rate_per_s": batch_rate,
                           "one_pool": one, "two_pools": two, "recommended": rec}
    if price_per_gpu_hour:
        out["cost_per_hour"] = {name: (g * price_per_gpu_hour if g else None) for name, g in layouts}
    return out
