"""The start-up cliff (issue 52): the same autoscaled pool over the same requests with the replica start-up delay
swept, per policy, and where each policy's SLO breaks: the longest start-up at which no window misses the SLO,
and the next one swept, at which some window does.

Each (policy, start-up) run is independent (same seed, so the same requests at the same times): a process pool
runs them, one worker per core.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

from capacity.errors import ConfigError
from capacity.files import short
from capacity.pipeline import Deployment, RunOptions, run
from capacity.plan.executors import stop_pool, worker_pool
from capacity.plan.fleetday import layout_metrics

if TYPE_CHECKING:
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard
    from capacity.model.gpus import GPU
    from capacity.sim.autoscale import AutoscaleConfig
    from capacity.workload import WorkloadSpec

MAX_RUNS = 200


def parse_sweep(spec: str, name: str = "--startup-sweep") -> list[float]:
    """'LO:HI:STEP' seconds -> [LO, LO + STEP, ..., HI] (HI included when on the grid), or one ConfigError line."""
    parts = spec.split(":")
    try:
        lo, hi, step = (float(x) for x in parts) if len(parts) == 3 else (math.nan,) * 3
    except ValueError:
        lo = hi = step = math.nan
    if not all(math.isfinite(x) for x in (lo, hi, step)):
        raise ConfigError(f"{name} {short(spec)}: expected LO:HI:STEP seconds (e.g. 0:300:30)")
    if lo < 0:
        raise ConfigError(f"{name} {short(spec)}: start-up {lo:g} s is negative")
    if not (hi >= lo and step > 0):
        raise ConfigError(f"{name} {short(spec)}: an empty range (need LO <= HI and STEP > 0)")
    n = math.floor((hi - lo) / step + 1e-9) + 1
    if n > MAX_RUNS:
        raise ConfigError(f"{name} {short(spec)}: {n} start-up values, at most {MAX_RUNS}")
    return [lo + i * step for i in range(n)]


def _one(args: tuple) -> dict[str, Any]:
    card, gpu, engine, spec, asc, window_s, slo_ttft_s, slo_tpot_s, router, seed = args
    res = run(Deployment(card, gpu, engine, autoscale=asc, router=router), spec,
              RunOptions(seed=seed, warmup_fraction=0.0, ci=False, timeseries=False))
    tl = res.sim.autoscale
    assert tl is not None
    m = layout_metrics(res, tl.replica_seconds * engine.tensor_parallel_size, window_s, slo_ttft_s, slo_tpot_s, None)
    return {"policy": asc.policy, "startup_s": asc.startup_s, "gpu_hours": m["gpu_hours"],
            "violation_minutes": m["violation_minutes"], "p99_ttft_s": m["p99_ttft_s"], "saturated": m["saturated"]}


def cliff(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where one policy's SLO breaks, over its rows in increasing start-up: `holds_to_s` the longest start-up
    before the first that misses (None: it misses from the first), `breaks_at_s` that first one (None: never)."""
    holds = None
    for r in rows:
        if r["violation_minutes"] > 0:
            return {"holds_to_s": holds, "breaks_at_s": r["startup_s"]}
        holds = r["startup_s"]
    return {"holds_to_s": holds, "breaks_at_s": None}


def startup_sweep(card: ModelCard, gpu: GPU, engine: EngineConfig, spec: WorkloadSpec,
                  controllers: list[AutoscaleConfig], startups: list[float], *, window_s: float,
                  slo_ttft_s: float | None, slo_tpot_s: float | None, router: str, seed: int = 0,
                  workers: int | None = None) -> dict[str, Any]:
    """Every controller (one per policy) at every start-up: GPU-hours and SLO-miss minutes per run, and each
    policy's cliff."""
    if slo_ttft_s is None and slo_tpot_s is None:
        raise ConfigError("--startup-sweep: needs an SLO (--slo-ttft-ms, --slo-tpot-ms): the cliff is where it breaks")
    jobs = [(card, gpu, engine, spec, dataclasses.replace(c, startup_s=s), window_s, slo_ttft_s, slo_tpot_s, router,
             seed) for c in controllers for s in startups]
    n = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if n == 1:
        out = [_one(j) for j in jobs]
    else:
        pool = worker_pool(n)
        try:
            out = list(pool.map(_one, jobs))
        except BaseException:
            stop_pool(pool)
            raise
        stop_pool(pool, wait=True)
    per: dict[str, list[dict[str, Any]]] = {}
    for r in out:
        per.setdefault(r["policy"], []).append(r)
    return {"startups_s": startups, "runs": per, "cliff": {p: cliff(rows) for p, rows in per.items()}}
