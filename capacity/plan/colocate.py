"""Several models: each on GPUs of its own, or all of them sharing GPUs (one engine configuration, one cost factory
per model, each prepared by capacity.pipeline.prepare), with each model's P99s against its SLO; every layout sees
the same requests per model (`stream_seed`).

- separate: model i runs `replicas` replicas on GPUs of its own (GPUs = the sum): its own deployment through the
  run pipeline (capacity.pipeline.run), measured as `capacity simulate` measures it;
- shared: `gpus` GPUs each host one replica of every model; each engine gets `share` of the GPU's memory
  (vLLM's gpu_memory_utilization, so the KV cache of each is smaller), and their steps take turns on the GPU
  (capacity.sim.simulator.Service: one step at a time holds the device). Sharing packs models with little load
  onto fewer GPUs; the price is memory per model and every step of one model waiting for the others'.
- swapped: `gpus` GPUs each host every model, one resident at a time with the whole GPU's memory (vLLM's sleep
  mode, level 1): the resident model keeps the GPU until it has nothing in flight; a waiting model then makes
  the resident one sleep (its weights copied to host memory, KV discarded) and wakes (its weights copied back),
  each copy weights / `host_link_gbps`. No memory is split, but every switch stalls the GPU and a busy model
  starves the others: swapping suits models with idle gaps, not steady traffic. (The host must hold every
  model's weights in pinned memory.)

A fleet file (YAML/JSON): `gpu`, `gpus` (the shared layout's), `models: [{model, workload, slo_ttft_s,
slo_tpot_s, replicas, share, engine}]`. `capacity colocate --fleet fleet.yaml` prints both layouts.
"""
from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from capacity.engine.config import EngineConfig
from capacity.engine.configs import AnyEngineConfig
from capacity.engine.vllm.config import VllmConfig
from capacity.errors import ConfigError
from capacity.model.card import ModelCard, load_named_card
from capacity.model.gpus import GPU, get_gpu
from capacity.pipeline import Deployment, RunOptions, prepare, run, warmup_requests
from capacity.sim.metrics import SLO, STEADY_ARRIVALS, Summary, summarize, ttft_trend
from capacity.sim.simulator import Service, SimConfig, simulate
from capacity.workload import WorkloadSpec, context_of, generate

MAX_MODELS = 16
LAYOUTS = ("separate", "shared", "swapped")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `true` is not a number of GPUs or seconds


class FleetModel(_Strict):
    model: str  # card path or bundled name
    workload: WorkloadSpec  # its traffic (open loop: poisson, gamma, constant, curve or trace)
    slo_ttft_s: Annotated[float, Field(gt=0)] | None = None  # P99 TTFT objective, s
    slo_tpot_s: Annotated[float, Field(gt=0)] | None = None  # P99 TPOT objective, s
    replicas: Annotated[int, Field(ge=1, le=256)] = 1  # separate layout: replicas (GPUs x TP) of its own
    share: Annotated[float, Field(gt=0, lt=1)] | None = None  # shared layout: its gpu_memory_utilization (default 0.9 / models)
    engine: AnyEngineConfig = VllmConfig()  # engine knobs (tensor_parallel_size 1 in the shared layout)


def check_models(models: list, most: int) -> None:
    """A fleet's model list: 1 to `most` models whose memory shares (default 0.9 / models each) fit one GPU."""
    if not 1 <= len(models) <= most:
        raise ValueError(f"models: 1 to {most} models (got {len(models)})")
    shares = [m.share if m.share is not None else 0.9 / len(models) for m in models]
    if sum(shares) > 0.95 + 1e-9:
        raise ValueError(f"models[].share: the shares add up to {sum(shares):.2f}, more than 0.95 of a GPU")


class Fleet(_Strict):
    gpu: str = "h100-sxm"
    gpus: Annotated[int, Field(ge=1, le=256)] = 1  # shared layout: GPUs, each hosting one replica of every model
    models: list[FleetModel]
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1
    # swapped layout: host <-> GPU copy rate of the weights, GB/s. 25: PCIe Gen4 x16 as achieved with pinned
    # memory (about 80% of 32 GB/s); a Gen5 host (H100/H200/B200 nodes) achieves about 50. Measure yours.
    host_link_gbps: Annotated[float, Field(gt=0, le=2000, allow_inf_nan=False)] = 25.0
    swap_overhead_s: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = 0.0  # per wake-up, beyond the copy

    @model_validator(mode="after")
    def _check(self) -> Fleet:
        check_models(self.models, MAX_MODELS)
        for m in self.models:
            if m.workload.arrivals.kind in ("closed", "offline"):
                raise ValueError(f"models[{m.model}].workload: {m.workload.arrivals.kind} arrivals are not "
                                 "simulated in a fleet (use an open-loop rate)")
            if m.workload.arrivals.max_concurrency is not None:
                raise ValueError(f"models[{m.model}].workload.arrivals.max_concurrency: a client's cap is not "
                                 "simulated in a fleet (its arrivals are merged into one open loop)")
        return self


def simulate_fleet(fleet: Fleet, layout: str, seed: int = 0) -> dict[str, Any]:
    """One layout of the fleet, simulated: per model its GPUs' share, KV blocks, P99 TTFT/TPOT and whether its
    SLO holds; the layout's GPU count. The separate layout is each model's own deployment on the run pipeline
    (capacity.pipeline.run); the shared and swapped layouts put every model's
    engine on the same GPUs, one simulation of several services (capacity.sim.simulator.Service), which the
    pipeline's one deployment does not express."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout {layout!r}: use {', '.join(LAYOUTS)}")
    gpu = get_gpu(fleet.gpu)
    if layout == "separate":
        return _separate(fleet, gpu, seed)
    n = len(fleet.models)
    services, reqs, cards, budgets, services_util = [], [], [], [], []
    for i, m in enumerate(fleet.models):
        card, eng = _model(m, i, layout)
        if layout == "shared":
            eng = eng.model_copy(update={"gpu_memory_utilization": m.share or 0.9 / n})
        try:
            p = prepare(Deployment(card, gpu, eng))
        except ConfigError as exc:
            raise ConfigError(f"models[{i}] ({card.name}), {layout} layout: {exc}") from None
        if layout == "shared":
            sv = Service(card.name, p.cost, p.make_scheduler, fleet.gpus, tuple(range(fleet.gpus)))
        else:
            copy_s = p.budget.weights_bytes / (fleet.host_link_gbps * 1e9)
            sv = Service(card.name, p.cost, p.make_scheduler, fleet.gpus, tuple(range(fleet.gpus)),
                         swap_s=copy_s + fleet.swap_overhead_s, sleep_s=copy_s)
        services.append(sv)
        services_util.append(eng.gpu_memory_utilization)
        cards.append(card)
        budgets.append(p.budget)
        for r in generate(m.workload, np.random.default_rng(stream_seed(seed, i))):
            r.service = i
            reqs.append(r)
    reqs.sort(key=lambda r: (r.arrival_s, r.service, r.id))
    for k, r in enumerate(reqs):
        r.id = k
    res = simulate(reqs, services[0].cost, services[0].make_scheduler, np.random.default_rng(seed),
                   SimConfig(services=tuple(services), timeseries=False,
                             device_sharing="swap" if layout == "swapped" else "timeslice"))
    rec = res.records
    bounds = np.cumsum([0] + [s.replicas for s in services])
    models = []
    for i, m in enumerate(fleet.models):
        mine = rec.subset((rec.replica >= bounds[i]) & (rec.replica < bounds[i + 1]))
        measured = mine.subset(np.arange(len(mine)) >= warmup_requests(len(mine), fleet.warmup_fraction, m.workload))
        s = summarize(measured, np.zeros(0), np.zeros(0), np.random.default_rng(seed), ci=False,
                      slos=[SLO(m.slo_ttft_s, m.slo_tpot_s)])
        # a TTFT still rising through the run fails, as the planner's probe does (capacity.sim.metrics.Trend)
        tr = (ttft_trend(measured.arrival, measured.first_token)
              if m.workload.arrivals.kind in STEADY_ARRIVALS and not res.saturation else None)
        models.append(_row(m, cards[i].name, services[i].replicas, services_util[i], budgets[i].planning_blocks,
                           len(mine), s, res.saturated, bool(tr is not None and tr.rising)))
    extra = {}
    if layout == "swapped":
        extra = {"swaps": len(res.swaps), "swap_s": [s.swap_s for s in services],
                 "swaps_per_hour": len(res.swaps) / max(res.end_s, 1e-9) * 3600}
    return {"layout": layout, "gpus": fleet.gpus, "gpu": gpu.name, "saturated": res.saturated, **extra,
            "saturation": res.saturation, "models": models, "meets_slo": all(x["meets_slo"] for x in models)}


def stream_seed(seed: int, i: int) -> int:
    """Model i's requests in every layout (common random numbers across layouts): the seed whose generator is
    numpy's `default_rng([seed, i])`, as one integer for the run pipeline (numpy's SeedSequence reads an integer
    as its 32-bit words, least significant first, and pads the pool with zeros, so for seed < 2^32 the integer
    seed + i * 2^32 is the entropy [seed, i]; tests/test_colocate_pipeline.py checks it)."""
    return seed + (i << 32) if seed < 2**32 else int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint64)[0] >> 1)


def _model(m: FleetModel, i: int, layout: str) -> tuple[ModelCard, EngineConfig]:
    """A model's card and engine. The layouts are compared on the engines' time only: the shared and swapped
    simulation of several models has no server front end (capacity.sim.simulator), so the separate layout runs
    without one too (a front end set for a model is refused, not dropped)."""
    card = load_named_card(m.model)
    limit, what = context_of(m.engine, card)
    m.workload.check_context(limit, f"models[{i}] ({card.name}): {what}")
    if layout != "separate" and m.engine.tensor_parallel_size != 1:
        raise ConfigError(f"models[{i}].engine.tensor_parallel_size: the {layout} layout puts one replica of "
                          "every model on each GPU (TP 1)")
    for name in ("frontend_ms", "frontend_us_per_input_token", "frontend_ms_per_image_mpx"):
        if getattr(m.engine, name):
            raise ConfigError(f"models[{i}].engine.{name}: {getattr(m.engine, name)}: colocate compares the layouts "
                              "on the engines' time; a server front end in a fleet of several models is not modelled")
    return card, m.engine.model_copy(update={"frontend_ms": 0.0, "frontend_us_per_input_token": 0.0,
                                             "frontend_ms_per_image_mpx": 0.0})


def _separate(fleet: Fleet, gpu: GPU, seed: int) -> dict[str, Any]:
    """Each model on GPUs of its own: its own deployment through the run pipeline (warm-up, summary, TTFT trend
    as `capacity simulate` measures them)."""
    models, gpus, sat = [], 0, []
    for i, m in enumerate(fleet.models):
        card, eng = _model(m, i, "separate")
        opts = RunOptions(seed=stream_seed(seed, i), warmup_fraction=fleet.warmup_fraction, ci=False, timeseries=False)
        try:
            res = run(Deployment(card, gpu, eng, replicas=m.replicas), m.workload, opts)
        except ConfigError as exc:
            raise ConfigError(f"models[{i}] ({card.name}), separate layout: {exc}") from None
        gpus += m.replicas * eng.tensor_parallel_size
        if res.sim.saturated:
            sat.append(f"{card.name}: {res.sim.saturation}")
        models.append(_row(m, card.name, m.replicas, eng.gpu_memory_utilization, res.budget.planning_blocks,
                           len(res.sim.records), res.summary, res.sim.saturated, res.rising))
    return {"layout": "separate", "gpus": gpus, "gpu": gpu.name, "saturated": bool(sat), "saturation": "; ".join(sat),
            "models": models, "meets_slo": all(x["meets_slo"] for x in models)}


def _row(m: FleetModel, name: str, replicas: int, util: float, kv_blocks: int, requests: int, s: Summary,
         saturated: bool, rising: bool) -> dict[str, Any]:
    """One model's line of a layout: its share, KV blocks, P50/P99 TTFT and TPOT, and whether it meets its SLO
    (not saturated, TTFT not still rising, each P99 within its objective)."""
    p99_t, p99_p = s.ttft_s.p99, s.tpot_s.p99
    ok = not saturated and not rising and (m.slo_ttft_s is None or (p99_t is not None and p99_t <= m.slo_ttft_s)) and (
        m.slo_tpot_s is None or (p99_p is not None and p99_p <= m.slo_tpot_s))
    return {"model": name, "replicas": replicas, "gpu_memory_utilization": util, "kv_blocks": kv_blocks,
            "requests": requests, "p99_ttft_s": p99_t, "p99_tpot_s": p99_p, "p50_ttft_s": s.ttft_s.p50,
            "p50_tpot_s": s.tpot_s.p50, "slo_ttft_s": m.slo_ttft_s, "slo_tpot_s": m.slo_tpot_s, "ttft_rising": rising,
            "meets_slo": bool(ok)}


def colocate(fleet: Fleet, seed: int = 0) -> dict[str, Any]:
    """Every layout of the fleet (`capacity colocate --json`): {layout: simulate_fleet's answer}, and the units."""
    out: dict[str, Any] = {lay: simulate_fleet(fleet, lay, seed) for lay in LAYOUTS}
    out["units"] = "seconds"
    return out


def best_layout(out: dict[str, Any]) -> str | None:
    """The layout that meets every SLO on the fewest GPUs (on a tie the more isolated one: LAYOUTS' order), or
    None where each misses an SLO."""
    ok = [lay for lay in LAYOUTS if out[lay]["meets_slo"]]
    return min(ok, key=lambda lay: (out[lay]["gpus"], LAYOUTS.index(lay))) if ok else None
