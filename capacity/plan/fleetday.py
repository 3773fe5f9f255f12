"""A fleet of models over a day: per model, static provisioning for the peak, reactive autoscaling and predictive
autoscaling, each simulated over the model's load curve; and the models sharing GPUs. GPU-hours, cost and
SLO-miss minutes per model and for the fleet (`capacity fleet-day --fleet day.yaml`).

How each answer is obtained:

- **the rate one replica sustains** under the model's SLO: the planner's rate search (`capacity plan`'s max
  rate: bisection with common random numbers at a steady Poisson rate with the workload's lengths), times
  `headroom`; or `per_replica_rate` when given;
- **static**: ceil(peak rate / that rate) replicas all day;
- **predictive**: the autoscaler asks for ceil(rate at now + start-up / that rate) (capacity.sim.autoscale);
- **reactive**: the concurrency policy (HPA / KServe-Knative style) with the target requests per replica that a
  replica holds at that rate (Little's law on a steady simulation at it), or `target` when given; it sees load
  only once it has arrived, and replicas come `startup_s` later;
- **shared**: G GPUs all day, each hosting one replica of every model (memory split by shares, steps taking
  turns: capacity.plan.colocate), G the fewest that meets every model's SLO with every model at its peak rate
  at once. Checked at the peaks together, which is the conservative end when the models peak at different
  hours; a shared pool that autoscales is not modelled (every model's engine would restart to change shares).

The per-model day runs are independent: they go to a process pool (one worker per core).
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capacity.engine.configs import AnyEngineConfig
from capacity.engine.vllm.config import VllmConfig
from capacity.errors import ConfigError
from capacity.files import strict_json
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu
from capacity.pipeline import Deployment, RunOptions, run
from capacity.plan.autoscale_bound import max_rate_per_replica, steady_point
from capacity.plan.colocate import Fleet, FleetModel, check_models, simulate_fleet
from capacity.plan.executors import stop_pool, worker_pool
from capacity.sim.autoscale import AutoscaleConfig, window_metrics
from capacity.workload import Arrivals, WorkloadSpec, context_of

LAYOUTS = ("static", "reactive", "predictive")
MAX_MODELS = 8


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `true` is not a number of GPUs or seconds


Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class DayModel(_Strict):
    model: str  # card path or bundled name
    workload: WorkloadSpec  # curve arrivals: the model's day
    slo_ttft_s: Pos | None = None  # P99 TTFT objective, s (at least one of the two)
    slo_tpot_s: Pos | None = None  # P99 TPOT objective, s
    engine: AnyEngineConfig = VllmConfig()
    share: Annotated[float, Field(gt=0, lt=1)] | None = None  # shared layout: its gpu_memory_utilization
    per_replica_rate: Pos | None = None  # req/s one replica sustains under the SLO (default: the planner's x headroom)
    target: Pos | None = None  # reactive: requests in flight per replica (default: Little's law at that rate)
    max_replicas: Annotated[int, Field(ge=1, le=256)] = 64

    @model_validator(mode="after")
    def _check(self) -> DayModel:
        if self.slo_ttft_s is None and self.slo_tpot_s is None:
            raise ValueError(f"{self.model}: no SLO (give slo_ttft_s, slo_tpot_s or both): a fleet is sized "
                             "against each model's objective")
        if self.workload.arrivals.kind != "curve":
            raise ValueError(f"{self.model}: workload.arrivals.kind is {self.workload.arrivals.kind}; a day "
                             "follows a load curve (arrivals: {kind: curve, curve_file: ...})")
        return self


class DayFleet(_Strict):
    gpu: str = "h100-sxm"
    models: list[DayModel]
    price_per_gpu_hour: Pos | None = None  # USD
    startup_s: NonNeg = 120.0  # model load + engine start-up of a new replica, s
    cooldown_s: NonNeg = 300.0  # scale down after wanting fewer this long, s
    interval_s: Pos = 15.0  # the autoscaler's period, s
    metric_window_s: NonNeg = 60.0  # the reactive controller averages in-flight requests over this window, s
    window_s: Pos = 300.0  # SLO windows: a window whose P99 misses the SLO counts its minutes as violated
    headroom: Annotated[float, Field(gt=0, le=1)] = 0.8  # replicas run at this share of their max rate
    # how a pool's router sends requests to its replicas (capacity.sim.routing.Router): least_outstanding (a
    # least-request load balancer), round_robin, or queue (one FIFO at the router: queued requests go to a new
    # replica as soon as it is ready, which engines' own queues cannot do)
    router: Literal["round_robin", "least_outstanding", "queue"] = "least_outstanding"
    shared_gpus: Annotated[int, Field(ge=1, le=256)] | None = None  # shared layout: GPUs (default: the fewest passing)
    shared_check_requests: Annotated[int, Field(ge=100, le=100_000)] = 1500  # per model, at its peak rate

    @model_validator(mode="after")
    def _check(self) -> DayFleet:
        check_models(self.models, MAX_MODELS)
        return self


def _steady(m: DayModel, rate: float, n: int) -> WorkloadSpec:
    return m.workload.model_copy(update={"arrivals": Arrivals(kind="poisson", rate_per_s=rate), "num_requests": n})


def per_replica(fleet: DayFleet, i: int, seed: int = 0) -> dict[str, Any]:
    """Model i's operating point: the rate one replica sustains under its SLO (x headroom), where it came from,
    and the reactive target (requests in flight per replica at that rate)."""
    m = fleet.models[i]
    card = load_named_card(m.model)
    gpu = get_gpu(fleet.gpu)
    if m.per_replica_rate is not None:
        rate, source = m.per_replica_rate, "given"
    else:
        rate, source = max_rate_per_replica(card, gpu, m.engine, m.workload, m.slo_ttft_s, m.slo_tpot_s,
                                            fleet.headroom, f"models[{i}] ({card.name}): ")
    target = m.target
    if target is None:
        target = steady_point(card, gpu, m.engine, m.workload, rate, seed)["in_flight"]
    return {"model": card.name, "tp": m.engine.tensor_parallel_size, "per_replica_rate": rate,
            "rate_source": source, "target": target,
            "target_source": "given" if m.target is not None else "Little's law at that rate"}


def layout_metrics(res, gpu_seconds: float, window_s: float, slo_ttft_s: float | None, slo_tpot_s: float | None,
                   price: float | None) -> dict[str, Any]:
    """One run over a load curve (a `capacity.pipeline.RunResult`) as a report's layout: GPU-hours from
    `gpu_seconds` (replica-seconds x TP), cost, SLO-miss minutes over windows of `window_s`, the run's P99s and
    the per-window metrics (non-finite values as None)."""
    import numpy as np

    w = window_metrics(res.sim.records, window_s, slo_ttft_s, slo_tpot_s)
    gpu_h = gpu_seconds / 3600
    return {"gpu_hours": gpu_h, "cost_usd": gpu_h * price if price else None,
            "violation_minutes": float((~w["met"]).sum() * window_s / 60), "windows": int(w["met"].size),
            "p99_ttft_s": res.summary.ttft_s.p99, "p99_tpot_s": res.summary.tpot_s.p99,
            "simulated_s": res.sim.end_s, "requests": len(res.sim.records), "saturated": res.sim.saturated,
            "window": {k: ([bool(x) for x in v] if k == "met" else
                           [None if not np.isfinite(x) else float(x) for x in v]) for k, v in w.items()}}


def _day_run(args: tuple) -> dict[str, Any]:
    """One model, one layout, over its whole curve (a process-pool worker)."""
    fleet, i, layout, point, seed = args
    t0 = time.perf_counter()
    m: DayModel = fleet.models[i]
    card = load_named_card(m.model)
    gpu = get_gpu(fleet.gpu)
    curve = m.workload.total_curve()
    rate = point["per_replica_rate"]
    n_static = min(m.max_replicas, max(1, math.ceil(curve.max_rate / rate - 1e-9)))
    opts = RunOptions(seed=seed, warmup_fraction=0.0, ci=False, timeseries=False)
    tp = m.engine.tensor_parallel_size
    if layout == "static":
        res = run(Deployment(card, gpu, m.engine, replicas=n_static, router=fleet.router), m.workload, opts)
        span = max(res.sim.end_s, m.workload.arrivals.duration_s or 0.0)  # provisioned for the whole day
        out = layout_metrics(res, n_static * span * tp, fleet.window_s, m.slo_ttft_s, m.slo_tpot_s,
                             fleet.price_per_gpu_hour)
        out["replicas_min"] = out["replicas_max"] = n_static
    else:
        initial = min(m.max_replicas, max(1, math.ceil(float(curve.rate(0.0)) / rate - 1e-9)))
        asc = AutoscaleConfig(min_replicas=1, max_replicas=m.max_replicas, initial=initial,
                              policy="concurrency" if layout == "reactive" else "predictive",
                              target=point["target"] if layout == "reactive" else 32.0,
                              interval_s=fleet.interval_s, startup_s=fleet.startup_s, cooldown_s=fleet.cooldown_s,
                              window_s=fleet.metric_window_s,
                              per_replica_rate=rate if layout == "predictive" else None,
                              curve=curve if layout == "predictive" else None)
        res = run(Deployment(card, gpu, m.engine, autoscale=asc, router=fleet.router), m.workload, opts)
        tl = res.sim.autoscale
        assert tl is not None
        out = layout_metrics(res, tl.replica_seconds * tp, fleet.window_s, m.slo_ttft_s, m.slo_tpot_s,
                             fleet.price_per_gpu_hour)
        out["replicas_min"] = int(min(tl.ready))
        out["replicas_max"] = int(max(r + s + d for r, s, d in zip(tl.ready, tl.starting, tl.draining)))
        # the pool at the start of each SLO window (ready, and provisioned: starting and draining too), beside
        # the window's P99s: what explains a miss
        import bisect

        ready, prov = [], []
        for w0 in out["window"]["start_s"]:
            j = max(0, bisect.bisect_right(tl.t, w0) - 1)
            ready.append(int(tl.ready[j]))
            prov.append(int(tl.ready[j] + tl.starting[j] + tl.draining[j]))
        out["window"]["ready"], out["window"]["provisioned"] = ready, prov
    out["wall_s"] = time.perf_counter() - t0
    return out


def shared_check(fleet: DayFleet, gpus: int, seed: int = 0) -> dict[str, Any]:
    """Every model at its peak rate at once on `gpus` shared GPUs (capacity.plan.colocate's shared layout)."""
    models = []
    for m in fleet.models:
        peak = m.workload.total_curve().max_rate
        models.append(FleetModel(model=m.model, workload=_steady(m, peak, fleet.shared_check_requests),
                                 slo_ttft_s=m.slo_ttft_s, slo_tpot_s=m.slo_tpot_s, share=m.share,
                                 engine=m.engine))
    return simulate_fleet(Fleet(gpu=fleet.gpu, gpus=gpus, models=models), "shared", seed)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def fleet_day(fleet: DayFleet, seed: int = 0, *, workers: int | None = None, progress: bool = False,
              shared: bool = True) -> dict[str, Any]:
    """The whole comparison (see the module docstring) as a JSON-ready report."""
    t0 = time.perf_counter()
    for i, m in enumerate(fleet.models):  # every model's requests fit its context, before any simulation
        card = load_named_card(m.model)
        limit, what = context_of(m.engine, card)
        m.workload.check_context(limit, f"models[{i}] ({card.name}): {what}")
    points = []
    for i, m in enumerate(fleet.models):
        try:
            points.append(per_replica(fleet, i, seed))
        except ConfigError as exc:
            raise ConfigError(f"models[{i}] ({m.model}): {exc}") from None
        p = points[-1]
        _say(progress, f"fleet-day: {p['model']}: {p['per_replica_rate']:.3g} req/s per replica "
                       f"({p['rate_source']}), reactive target {p['target']:.3g} in flight")
    jobs = [(fleet, i, lay, points[i], seed) for i in range(len(fleet.models)) for lay in LAYOUTS]
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    results: dict[tuple[int, str], dict] = {}
    out_shared: dict[str, Any] | None = None
    checks: list = []  # the shared checks, in the order _shared reads them (on the pool: queued after the day runs)
    if n_workers == 1:
        for j in jobs:
            results[(j[1], j[2])] = _day_run(j)
            _say(progress, f"fleet-day: {len(results)}/{len(jobs)} day runs ({points[j[1]]['model']} {j[2]})")
    else:
        from concurrent.futures import as_completed

        pool = worker_pool(n_workers)  # workers that die with the command (SIGTERM, SIGKILL, Ctrl-C, an error)
        try:
            futs = {pool.submit(_day_run, j): j for j in jobs}
            if shared:  # independent of the day runs: they fill the cores the last day runs leave idle
                checks = [pool.submit(_shared_try, fleet, g, seed) for g in _shared_tries(fleet, _most(fleet, points))]
            for f in as_completed(futs):
                j = futs[f]
                results[(j[1], j[2])] = f.result()
                _say(progress, f"fleet-day: {len(results)}/{len(jobs)} day runs ({points[j[1]]['model']} {j[2]})")
            if shared:
                out_shared = _shared(fleet, _most(fleet, points), _hours(results), progress, [c.result for c in checks],
                                     checks)
        except BaseException:
            stop_pool(pool)
            raise
        stop_pool(pool, wait=all(c.done() for c in checks))  # a check past the answer still running: ended now
    models = []
    for i, m in enumerate(fleet.models):
        curve = m.workload.total_curve()
        models.append({**points[i], "peak_rate_per_s": curve.max_rate, "mean_rate_per_s": curve.mean_rate,
                       "slo": {"ttft_s": m.slo_ttft_s, "tpot_s": m.slo_tpot_s},
                       "layouts": {lay: results[(i, lay)] for lay in LAYOUTS}})
    totals = {}
    for lay in LAYOUTS:
        rows = [mm["layouts"][lay] for mm in models]
        gh = sum(r["gpu_hours"] for r in rows)
        totals[lay] = {"gpu_hours": gh, "cost_usd": gh * fleet.price_per_gpu_hour if fleet.price_per_gpu_hour else None,
                       "violation_minutes": sum(r["violation_minutes"] for r in rows),
                       "saturated": any(r["saturated"] for r in rows)}
    out: dict[str, Any] = {"gpu": fleet.gpu, "price_per_gpu_hour": fleet.price_per_gpu_hour, "router": fleet.router,
                           "startup_s": fleet.startup_s, "window_s": fleet.window_s, "models": models,
                           "totals": totals}
    if shared:
        most = _most(fleet, points)
        out["shared"] = out_shared if out_shared is not None else _shared(
            fleet, most, _hours(results), progress,
            [(lambda g=g: _shared_try(fleet, g, seed)) for g in _shared_tries(fleet, most)])
        if out["shared"]["gpus"] is not None:
            gh = out["shared"]["gpus"] * out["shared"]["hours"]
            totals["shared"] = {"gpu_hours": gh, "cost_usd": gh * fleet.price_per_gpu_hour
                                if fleet.price_per_gpu_hour else None, "violation_minutes": None, "saturated": False}
    out["wall_s"] = time.perf_counter() - t0
    out["units"] = "seconds, GPU-hours, USD"
    return strict_json(out)


def _most(fleet: DayFleet, points: list[dict[str, Any]]) -> int:
    """The GPUs the separate layouts hold at the peak: each model's static replicas (as _day_run counts them) x TP."""
    return sum(min(m.max_replicas, max(1, math.ceil(m.workload.total_curve().max_rate / p["per_replica_rate"]
                                                    - 1e-9))) * m.engine.tensor_parallel_size
               for m, p in zip(fleet.models, points))


def _shared_tries(fleet: DayFleet, most: int) -> list[int]:
    """The GPU counts the shared layout tries, in order (none where a model is not TP 1)."""
    if any(m.engine.tensor_parallel_size != 1 for m in fleet.models):
        return []
    return [fleet.shared_gpus] if fleet.shared_gpus else list(range(1, most + 1))


def _shared_try(fleet: DayFleet, gpus: int, seed: int) -> dict[str, Any] | str:
    """One shared check (a pool worker's job): its result, or the ConfigError's line where the models do not fit."""
    try:
        return shared_check(fleet, gpus, seed)
    except ConfigError as exc:
        return str(exc)


def _hours(results: dict[tuple[int, str], dict]) -> float:
    return max(r["simulated_s"] for (_, lay), r in results.items() if lay == "static") / 3600


def _shared(fleet: DayFleet, most: int, hours: float, progress: bool, tries: list, pending: Any = ()) -> dict[str, Any]:
    """The fewest shared GPUs (or the given number) that hold every model's SLO at the peaks together: the
    checks' results read in the order of _shared_tries (`tries`: one callable per count; `pending`: their futures
    on the pool, those after the answer cancelled)."""
    if any(m.engine.tensor_parallel_size != 1 for m in fleet.models):
        return {"gpus": None, "hours": hours, "tried": [],
                "why": "the shared layout puts one replica of every model on a GPU (TP 1 only)"}
    counts = _shared_tries(fleet, most)
    tried: list[dict[str, Any]] = []
    answer: dict[str, Any] | None = None
    for g, get in zip(counts, tries):
        r = get()
        if isinstance(r, str):  # the models do not fit their shares of one GPU
            answer = {"gpus": None, "hours": hours, "tried": tried, "why": r}
            break
        tried.append({"gpus": g, "meets_slo": r["meets_slo"], "models": r["models"]})
        _say(progress, f"fleet-day: shared on {g} GPU(s) at every model's peak: "
                       f"{'every SLO met' if r['meets_slo'] else 'an SLO missed'}")
        if r["meets_slo"]:
            answer = {"gpus": g, "hours": hours, "tried": tried, "why": ""}
            break
    for f in pending:
        f.cancel()
    return answer or {"gpus": None, "hours": hours, "tried": tried,
                      "why": f"no count up to {counts[-1]} shared GPUs met every SLO at the peaks (separate pools "
                             f"need {most} at the peak)"}
