"""What an autoscaler could have done at best: the GPU-hours of a perfect system for a load curve and an SLO, and
the operating point of one replica that defines it (issue 52).

The perfect system has replicas(t) = ceil(rate(t) / R) at every instant, R being the rate one replica sustains
under the SLO (the planner's max-rate search, `capacity plan`'s max rate), and starts them with no delay. Its
GPU-hours are TP x the integral of that step function over the arrivals' span, computed exactly here: the curve is
step or linear between its points, so ceil(rate / R) changes only where the rate crosses a multiple of R, which
is solved for in closed form on each segment. It meets the SLO in every window by construction (each replica runs
at most at R, the highest rate at which it still meets the SLO), so a policy's distance from it is its GPU-hours
above the bound and its SLO-miss minutes.

No minimum and no maximum replica count: the bound is what the load needs, 0 replicas while nothing arrives.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from capacity.engine.configs import one_of_the_engines
from capacity.errors import ConfigError
from capacity.pipeline import Deployment, RunOptions, run
from capacity.plan.executors import make_executor
from capacity.plan.planner import Planner
from capacity.plan.scenario import Scenario, SLOSpec
from capacity.sim.simulator import littles_law
from capacity.workload import Arrivals

if TYPE_CHECKING:
    from capacity.curves import RateCurve
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard
    from capacity.model.gpus import GPU
    from capacity.workload import WorkloadSpec

EPS = 1e-9  # ceil(x - EPS): a rate exactly at k x R needs k replicas, as the autoscaler's own rules round


def _breaks(curve: RateCurve, t_end: float) -> np.ndarray:
    """The times in [0, t_end] where the curve's formula changes (its points, repeated each period), with 0 and
    t_end."""
    x = np.asarray([p[0] for p in curve.points], dtype=float)
    if curve.period_s is not None:
        k = np.arange(math.ceil(t_end / curve.period_s) + 1)
        x = (x[None, :] + curve.period_s * k[:, None]).ravel()
    x = x[(x > 0) & (x < t_end)]
    return np.unique(np.concatenate(([0.0], x, [t_end])))


def perfect_replica_seconds(curve: RateCurve, per_replica_rate: float, t_end: float) -> tuple[float, int]:
    """(integral over [0, t_end] of ceil(rate(t) / per_replica_rate) dt in replica-seconds, the most replicas at
    once), exact for step and linear curves."""
    if not (math.isfinite(per_replica_rate) and per_replica_rate > 0):
        raise ConfigError(f"per_replica_rate: must be a finite number > 0 (got {per_replica_rate})")
    if not (math.isfinite(t_end) and t_end >= 0):
        raise ConfigError(f"t_end: must be a finite number >= 0 (got {t_end})")
    if t_end == 0:
        return 0.0, 0
    b = _breaks(curve, t_end)
    a, e = b[:-1], b[1:]
    ra = curve.rate(a)  # the rate at each segment's start and middle: linear within a segment
    rm = curve.rate((a + e) / 2)
    slope = 2 * (rm - ra) / (e - a)
    total, most = 0.0, 0
    for i in range(a.size):
        r0, r1 = float(ra[i]), float(ra[i] + slope[i] * (e[i] - a[i]))
        at = [a[i], e[i]]
        if slope[i] != 0:  # where the rate crosses k x R inside the segment
            lo, hi = sorted((r0, r1))
            ks = np.arange(math.floor(lo / per_replica_rate) + 1, math.ceil(hi / per_replica_rate))
            at += list(a[i] + (ks * per_replica_rate - r0) / slope[i])
        cuts = np.unique(np.clip(at, a[i], e[i]))
        mid = (cuts[:-1] + cuts[1:]) / 2
        n = np.maximum(np.ceil((r0 + slope[i] * (mid - a[i])) / per_replica_rate - EPS), 0)
        total += float(np.sum(n * np.diff(cuts)))
        # the peak: at a segment's ends too (a step point's rate holds from it)
        ends = np.ceil(np.array([r0, r1]) / per_replica_rate - EPS)
        most = max(most, int(n.max(initial=0)), int(ends.max()))
    return total, most


def lower_bound(curve: RateCurve, per_replica_rate: float, t_end: float, tp: int, source: str) -> dict[str, Any]:
    """The perfect system's report block: its GPU-hours (TP x replica-hours), its most replicas, the rate and where
    it came from, and the span it covers (the arrivals': 0 to the last arrival)."""
    rs, most = perfect_replica_seconds(curve, per_replica_rate, t_end)
    return {"gpu_hours": rs * tp / 3600, "replicas_max": most, "per_replica_rate_per_s": per_replica_rate,
            "rate_source": source, "span_s": t_end, "violation_minutes": 0.0}


def distance(layout: dict[str, Any], bound: dict[str, Any]) -> dict[str, Any]:
    """A layout's distance from the bound: GPU-hours above it (and as a share of it) and its SLO-miss minutes
    (the bound misses none)."""
    gh, b = layout["gpu_hours"], bound["gpu_hours"]
    return {"gpu_hours": gh - b, "pct": (gh - b) / b * 100 if b > 0 else None,
            "violation_minutes": layout["violation_minutes"]}


def max_rate_per_replica(card: ModelCard, gpu: GPU, engine: EngineConfig, workload: WorkloadSpec,
                         slo_ttft_s: float | None, slo_tpot_s: float | None, headroom: float = 1.0,
                         what: str = "") -> tuple[float, str]:
    """(the rate one replica sustains under the SLO x headroom, where it came from): the planner's rate search
    (capacity.plan.planner.Planner.rate_search: bisection with common random numbers at a steady Poisson rate
    with the workload's lengths), the one `capacity plan` and `capacity fleet-day` use."""
    if slo_ttft_s is None and slo_tpot_s is None:
        raise ConfigError("the per-replica rate under the SLO needs an SLO (a P99 TTFT, a P99 TPOT or both)")
    ttft = slo_ttft_s if slo_ttft_s is not None else 3600.0
    slo = SLOSpec(ttft_s=ttft, tpot_s=slo_tpot_s if slo_tpot_s is not None else ttft)
    tp = engine.tensor_parallel_size
    sc = Scenario(model=card.model_dump(), gpu=gpu.name, engine=one_of_the_engines(engine), workload=steady(workload, 1.0, 1000),
                  slo=slo, headroom=headroom)
    planner = Planner(sc, card, make_executor("serial", progress=False))
    e, b = planner.fitting_engine(tp)
    rs = planner.rate_search(e, tp, b.max_num_seqs)
    if rs.max_rate <= 0:
        raise ConfigError(f"{what}even a trickle of requests misses the SLO on {gpu.name} at TP {tp}")
    said = f"planner max rate {rs.max_rate:.3g} req/s"
    return rs.max_rate * headroom, said if headroom == 1 else f"{said} x headroom {headroom:g}"


def steady(workload: WorkloadSpec, rate: float, n: int) -> WorkloadSpec:
    """The workload's lengths at a steady Poisson `rate` (trace workloads: their lengths as given in the spec)."""
    return workload.model_copy(update={"arrivals": Arrivals(kind="poisson", rate_per_s=rate), "num_requests": n,
                                       "trace": None})


def steady_point(card: ModelCard, gpu: GPU, engine: EngineConfig, workload: WorkloadSpec, rate: float,
                 seed: int = 0, n: int = 2000) -> dict[str, float]:
    """One replica at a steady `rate`: requests in flight (Little's law), mean TTFT and mean TPOT, s. The
    reactive target and the SLA planner's profile (what it expects to see at its operating point)."""
    res = run(Deployment(card, gpu, engine), steady(workload, rate, n), RunOptions(seed=seed, ci=False,
                                                                                   timeseries=False))
    rec = res.sim.records
    done = np.isfinite(rec.finish)
    ttft = rec.first_token[done] - rec.arrival[done]
    many = done & (rec.output_tokens > 1)
    tpot = (rec.finish[many] - rec.first_token[many]) / (rec.output_tokens[many] - 1)
    return {"in_flight": max(littles_law(res.sim)[0], 0.5), "ttft_mean_s": float(np.mean(ttft)) if ttft.size else 0.0,
            "tpot_mean_s": float(np.mean(tpot)) if tpot.size else 0.0}
