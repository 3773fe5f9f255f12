"""Autoscaling against static provisioning, computed: the runs and figures behind `capacity autoscale --json`, the
dashboard's Autoscale tab and `capacity export --autoscale` (capacity.io.fleet reads such a report back and renders
its tables).

`autoscale_report` runs the pool that follows the workload's load curve (capacity.sim.autoscale through the run
pipeline) and a static pool of `static` replicas (default: the autoscaled pool's peak) on the same requests, and
measures both per window against the SLO (capacity.plan.fleetday.layout_metrics).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from capacity.errors import CapacityError
from capacity.files import strict_json
from capacity.pipeline import Deployment, Disagg, RunOptions, run
from capacity.plan.autoscale_bound import distance, lower_bound
from capacity.plan.fleetday import layout_metrics

if TYPE_CHECKING:
    from capacity.curves import RateCurve
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard
    from capacity.model.gpus import GPU
    from capacity.sim.autoscale import AutoscaleConfig
    from capacity.workload import WorkloadSpec


def autoscale_report(card: ModelCard, gpu: GPU, engine_cfg: EngineConfig, spec: WorkloadSpec, asc: AutoscaleConfig,
                     static: int | None = None, *, window_s: float = 300.0, slo_ttft_s: float | None = None,
                     slo_tpot_s: float | None = None, price: float | None = None, seed: int = 0,
                     profile: str | None = None, router: str = "round_robin",
                     decode: tuple[EngineConfig, AutoscaleConfig, str] | None = None,
                     per_replica: tuple[float, str] | None = None, curve: RateCurve | None = None) -> dict[str, Any]:
    """The autoscaled pool and the static one over the workload's curve (arrivals.kind curve), in strict JSON form
    (non-finite numbers are null): settings, then per layout GPU-hours, cost (USD, with `price` per GPU-hour),
    SLO-miss minutes over windows of `window_s`, P99 TTFT/TPOT of the run and per window; the autoscaled pool's
    replicas over time. Both runs use `seed`: the same requests at the same times.

    `decode` = (its engine, its controller, the KV link): a disaggregated deployment, the pool of `engine_cfg`
    prefilling and `asc` scaling it, a decode pool with its own engine (TP) and controller. The static layout is
    then each pool at its peak; `autoscaled.replicas` is the prefill pool's, `autoscaled.decode_replicas` the
    decode pool's, and GPU-hours count both pools at their own TP.

    `per_replica` = (the rate one replica sustains under the SLO, where it came from): the report then has the
    perfect system's `lower_bound` (capacity.plan.autoscale_bound) and each layout its `vs_bound`. `curve`: the
    load curve when the workload is a trace (fitted from its arrivals); otherwise the workload's own."""
    if decode is not None:
        return _disagg_report(card, gpu, engine_cfg, spec, asc, decode, static, window_s=window_s,
                              slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, price=price, seed=seed, profile=profile,
                              router=router)

    if spec.arrivals.kind != "curve" and not (spec.arrivals.kind == "trace" and curve is not None):
        raise CapacityError(f"workload: arrivals.kind is {spec.arrivals.kind}; autoscaling follows a curve "
                            "(arrivals: {kind: curve, curve_file: ...}) or a trace (--trace)")
    _check_window(window_s)
    if static is not None and (isinstance(static, bool) or not isinstance(static, int) or static < 1):
        raise CapacityError(f"static: must be a whole number of replicas >= 1 (got {static!r})")
    curve = curve if curve is not None else spec.total_curve()
    tp = engine_cfg.tensor_parallel_size
    opts = RunOptions(seed=seed, warmup_fraction=0.0, timeseries=False)
    auto = run(Deployment(card, gpu, engine_cfg, profile=profile, autoscale=asc, router=router),  # type: ignore[arg-type]
               spec, opts)
    _served(auto)
    tl = auto.sim.autoscale
    assert tl is not None
    n_static = static if static is not None else _peak(tl)
    fixed = run(Deployment(card, gpu, engine_cfg, profile=profile, replicas=n_static, router=router),  # type: ignore[arg-type]
                spec, opts)
    a = layout_metrics(auto, tl.replica_seconds * tp, window_s, slo_ttft_s, slo_tpot_s, price)
    s = layout_metrics(fixed, n_static * fixed.sim.end_s * tp, window_s, slo_ttft_s, slo_tpot_s, price)
    a["replicas"] = _replicas(tl)
    a["scale_events"] = scale_events(tl)
    out: dict[str, Any] = {
        "model": card.name, "gpu": gpu.name, "tp": tp, "policy": asc.policy, "target": asc.target, "router": router,
        "startup_s": asc.startup_s, "cooldown_s": asc.cooldown_s, "window_s": window_s,
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s}, "curve_mean_rate_per_s": curve.mean_rate,
        "curve_peak_rate_per_s": curve.max_rate, "autoscaled": a, "static": {**s, "replicas": n_static},
        "units": "seconds, GPU-hours, USD"}
    if spec.arrivals.kind == "trace":  # the load curve fitted from the trace's arrivals, for the views' plots
        out["curve"] = {"points": [list(p) for p in curve.points], "shape": curve.shape}
    if per_replica is not None:
        span = float(auto.sim.records.arrival.max())
        out["lower_bound"] = b = lower_bound(curve, per_replica[0], span, tp, per_replica[1])
        a["vs_bound"], out["static"]["vs_bound"] = distance(a, b), distance(out["static"], b)
    return strict_json(out)


def scale_events(tl) -> dict[str, int]:
    """Decisions that changed the pool: `up` when replicas were started (ready + starting grew), `down` when
    replicas were drained (it shrank); a start-up completing moves a replica from starting to ready, no event."""
    have = np.diff(np.asarray(tl.ready) + np.asarray(tl.starting))
    return {"up": int((have > 0).sum()), "down": int((have < 0).sum())}


def _check_window(window_s: float) -> None:
    if not (math.isfinite(window_s) and window_s > 0):
        raise CapacityError(f"window_s: must be a finite number > 0 (got {window_s})")


def _served(res) -> None:
    """A run over the curve that served no request (every one rejected, e.g. longer than max_model_len) is one
    error naming why, not an empty report."""
    if len(res.sim.records) == 0:
        why = f": {res.sim.rejected[0][1]}" if res.sim.rejected else ""
        raise CapacityError(f"workload: no request was served ({len(res.sim.rejected)} rejected{why})")


def _peak(tl) -> int:
    return max(r + s + d for r, s, d in zip(tl.ready, tl.starting, tl.draining))


def _replicas(tl) -> dict[str, Any]:
    arrays = tl.arrays()
    return {"t_s": arrays["t"].tolist(), "ready": arrays["ready"].tolist(), "starting": arrays["starting"].tolist(),
            "draining": arrays["draining"].tolist(), "min": int(arrays["ready"].min()), "max": int(_peak(tl))}


def _disagg_report(card, gpu, engine_cfg, spec, asc, decode, static, *, window_s, slo_ttft_s, slo_tpot_s, price, seed,
                   profile, router) -> dict[str, Any]:
    """autoscale_report for a disaggregated deployment (see there)."""
    if static is not None:
        raise CapacityError("--static: with a decode pool the static layout is each pool at its peak (leave it out)")
    if spec.arrivals.kind != "curve":
        raise CapacityError(f"workload: arrivals.kind is {spec.arrivals.kind}; autoscaling follows a curve "
                            "(arrivals: {kind: curve, curve_file: ...})")
    _check_window(window_s)
    dec_cfg, dasc, link = decode
    tp_p, tp_d = engine_cfg.tensor_parallel_size, dec_cfg.tensor_parallel_size
    opts = RunOptions(seed=seed, warmup_fraction=0.0, timeseries=False)
    auto = run(Deployment(card, gpu, engine_cfg, profile=profile, autoscale=asc, router=router), spec, opts,
               disagg=Disagg(Deployment(card, gpu, dec_cfg, profile=profile, autoscale=dasc, router=router), link))
    _served(auto)
    tp_, td_ = auto.sim.autoscale, auto.sim.autoscale_decode
    assert tp_ is not None and td_ is not None
    n_p, n_d = _peak(tp_), _peak(td_)
    fixed = run(Deployment(card, gpu, engine_cfg, profile=profile, replicas=n_p, router=router), spec, opts,
                disagg=Disagg(Deployment(card, gpu, dec_cfg, profile=profile, replicas=n_d, router=router), link))
    a = layout_metrics(auto, tp_.replica_seconds * tp_p + td_.replica_seconds * tp_d, window_s, slo_ttft_s,
                       slo_tpot_s, price)
    s = layout_metrics(fixed, (n_p * tp_p + n_d * tp_d) * fixed.sim.end_s, window_s, slo_ttft_s, slo_tpot_s, price)
    a["replicas"], a["decode_replicas"] = _replicas(tp_), _replicas(td_)
    curve = spec.total_curve()
    return strict_json({
        "model": card.name, "gpu": gpu.name, "tp": tp_p, "policy": asc.policy, "target": asc.target, "router": router,
        "startup_s": asc.startup_s, "cooldown_s": asc.cooldown_s, "window_s": window_s,
        "decode": {"tp": tp_d, "policy": dasc.policy, "target": dasc.target, "startup_s": dasc.startup_s,
                   "cooldown_s": dasc.cooldown_s, "link": link},
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s}, "curve_mean_rate_per_s": curve.mean_rate,
        "curve_peak_rate_per_s": curve.max_rate, "autoscaled": a,
        "static": {**s, "replicas": n_p, "decode_replicas": n_d}, "units": "seconds, GPU-hours, USD"})
