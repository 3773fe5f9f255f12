"""The one run path: deployment -> memory -> cost -> scheduler -> simulator -> typed result.

`capacity simulate`, the planner's tasks, the dashboard and `capacity validate` all go through here, so they
cannot disagree about how a question becomes a simulation:

1. memory: the deployment's engine model reserves the budget (KV blocks, resolved knobs) for its GPU;
2. cost: the one cost factory gives the step cost (roofline or a calibrated profile, used or refused);
3. scheduler: the engine model builds each replica's scheduler from the configuration and the budget;
4. simulator: replicas behind a router, optional front-end delay, the exact fast path;
5. result: a typed `RunResult` (summary with percentiles and intervals, the budget, the source, notes).

`prepare()` does 1-3 once (the dashboard and the planner reuse it); `simulate_requests()` is step 4 for a
caller that brings its own scheduler limits and cost (the engine fit of `capacity calibrate --from-run`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from capacity import steady as steady_notes
from capacity.cost.factory import make_step_cost
from capacity.cost.overlap import cpu_wrap
from capacity.cost.parallel import dp_ranks, dp_router, wrap
from capacity.cost.state_space import state_note
from capacity.engine import EngineModel, MemoryBudget, SchedLimits, SchedulerFactory, engine_for, frontend, speculative
from capacity.engine.budget import kv_bytes_per_token
from capacity.engine.config import EngineConfig
from capacity.engine.graphs import allreduce_rules, graph_wrap
from capacity.engine.lockstep import attention_dp, attention_dp_ranks
from capacity.engine.offload import offloading
from capacity.engine.speculative import run_notes
from capacity.engine.trtllm_host import host_per_request_s
from capacity.errors import CapacityError, ConfigError
from capacity.limits import check
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.sessions import session_note
from capacity.sim.autoscale import AutoscaleConfig
from capacity.sim.metrics import SLO, STEADY_ARRIVALS, Backlogged, Summary, Trend, backlogged, summarize, ttft_trend
from capacity.sim.simulator import ROUTERS, Disaggregation, SimConfig, SimResult, littles_law, simulate
from capacity.sim.vision import serve_images
from capacity.steady import Capacity, capacity_loop, capacity_loop_size, client_wait, lock_step_note, stability_notes
from capacity.workload import Request, WorkloadSpec


@dataclass(frozen=True)
class Deployment:
    """What runs: a model on a GPU type with one engine configuration and one step-cost source, `replicas`
    copies behind a router, and the front end's latency before it."""

    card: ModelCard
    gpu: GPU
    engine: EngineConfig = EngineConfig()
    profile: str | None = None  # a calibrated profile (file or bundled name); None: the roofline
    allow_profile_mismatch: bool = False
    replicas: int = 1
    router: Literal["round_robin", "least_outstanding", "affinity", "queue"] = "round_robin"
    router_max_ongoing: int | None = None  # router "queue": requests per replica before the router holds them
    frontend_s: float = 0.0
    autoscale: AutoscaleConfig | None = None  # a pool that follows the load (replicas is then ignored)

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ConfigError(f"replicas: must be a whole number >= 1 (got {self.replicas!r})")
        check("replicas", self.replicas, "replicas")
        if not math.isfinite(self.frontend_s) or self.frontend_s < 0:
            raise ConfigError(f"frontend_s: must be a finite number >= 0 (got {self.frontend_s})")
        if self.router not in ROUTERS:
            raise ConfigError(f"router {self.router!r}: use {', '.join(ROUTERS)}")
        if self.router_max_ongoing is not None:
            if (isinstance(self.router_max_ongoing, bool) or not isinstance(self.router_max_ongoing, int)
                    or self.router_max_ongoing < 1):
                raise ConfigError(f"router_max_ongoing: must be a whole number >= 1 (got {self.router_max_ongoing!r})")
            if self.router != "queue":
                raise ConfigError("router_max_ongoing: only the queue router holds requests (use router queue)")


@dataclass(frozen=True)
class RunOptions:
    seed: int = 0
    warmup_fraction: float = 0.1  # share of the first requests left out of the metrics (closed loop: `warmup_requests`)
    fast_forward: bool = True
    ci: bool = True  # bootstrap intervals for P99
    max_sim_s: float = math.inf
    timeseries: bool = True
    # also measure the deployment's capacity (`capacity_loop`) and set the offered rate against it: one more
    # simulation, so the planner (which measures it once per configuration itself) leaves it off
    capacity_check: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_fraction < 1:
            raise CapacityError(f"warmup fraction: must be in [0, 1) (got {self.warmup_fraction})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise CapacityError(f"seed: must be a whole number from 0 to 2^63 - 1 (got {self.seed!r})")
        if self.max_sim_s != self.max_sim_s or self.max_sim_s <= 0:
            raise CapacityError(f"max_sim_s: must be > 0 (got {self.max_sim_s})")


@dataclass
class Prepared:
    """Steps 1-3 of the run path, resolved once for a deployment."""

    engine_model: EngineModel
    budget: MemoryBudget
    cost: object  # a StepCost
    make_scheduler: SchedulerFactory

    @property
    def cost_source(self) -> str:
        return getattr(self.cost, "source", type(self.cost).__name__)


def overlapped_cpu_s(em: EngineModel, cfg: EngineConfig, profile: str | None, cost: object) -> float:
    """The engine's CPU time per step that runs beside the GPU (0: none, it adds to the step instead): the engine
    model's figure, or a measured profile's fitted overhead unless the configuration sets one. `cost`: the step cost
    as make_step_cost built it."""
    if not em.overhead_overlaps(cfg):
        return 0.0
    if profile is None or cfg.step_overhead_ms is not None:
        return em.step_overhead_s(cfg)
    return float(getattr(cost, "overhead_s", 0.0))


def prepare(dep: Deployment) -> Prepared:
    em = engine_for(dep.engine.engine, dep.card)  # vLLM: the release's engine and graph mode for the model
    e = dep.engine
    if e.pp_size() > 1:
        raise ConfigError("pipeline_parallel_size: its memory is modelled (capacity memory), its step cost is not: "
                          "simulate and plan take tensor, data and expert parallelism (docs/parallelism.md)")
    b = em.budget(dep.card, dep.gpu, dep.engine)
    spec = e.speculative
    if spec is not None:
        b = speculative.with_draft(b, dep.card, spec, engine=em.name)
    overlaps = em.overhead_overlaps(dep.engine)
    # An engine whose CPU work per step runs beside the GPU: the step cost is the GPU's alone, and the overlap
    # wrapper makes a step last the longer of the two (a profile's fitted overhead moves there too).
    cost = make_step_cost(dep.card, dep.gpu, b.tp, kv_dtype=b.kv_dtype, profile=dep.profile,
                          allow_mismatch=dep.allow_profile_mismatch,
                          step_overhead_s=0.0 if overlaps and dep.profile is None else em.step_overhead_s(dep.engine),
                          overhead_given=dep.engine.step_overhead_ms is not None, allreduce=allreduce_rules(em, e))
    cost = wrap(cost, dep.card, b.tp, e.dp_size(), e.expert_parallel(), dep.profile)  # MoE EP/DP
    cost = graph_wrap(cost, em, e, dep.card, 0.0 if overlaps else em.step_overhead_s(e), dep.profile)
    per_step = overlapped_cpu_s(em, dep.engine, dep.profile, cost)
    if per_step and dep.profile is not None:
        cost.overhead_s = 0.0  # type: ignore[attr-defined]
    factory = offloading(em.scheduler_factory(dep.engine, SchedLimits.of(b)), dep, b)  # a host KV tier, if any
    cost, factory = attention_dp(em, dep, b, cost, factory)  # SGLang/TRT-LLM attention DP: ranks in lock step
    if spec is not None:  # the verify step and the draft's forwards; k drafts per decode, E - 1 accepted
        cost = speculative.wrap_cost(cost, dep.card, spec, dep.gpu, b.tp, b.kv_dtype, e.engine)
        factory = speculative.speculating(factory, spec)
    per_token = (dep.engine.output_cpu_us_per_token or 0.0) / 1e6  # + the engine's loop per request (trtllm_host.py)
    cost = cpu_wrap(cost, per_token, per_step, host_per_request_s(em, e, dep.profile), overlaps)
    return Prepared(em, b, cost, factory)


@dataclass
class RunResult:
    """One simulated run, typed; `as_dict()` is its JSON form (`capacity simulate --json`)."""

    summary: Summary
    sim: SimResult
    budget: MemoryBudget
    engine: EngineConfig
    cost_source: str
    warmup_requests: int
    offered_rate_per_s: float | None
    little: tuple[float, float] = (0.0, 0.0)
    notes: list[str] = field(default_factory=list)
    is_offline: bool = False
    trend: Trend | None = None  # TTFT over arrival time (open-loop arrivals at a steady rate only)
    capacity: Capacity | None = None  # with RunOptions.capacity_check
    backlogged: Backlogged | None = None  # closed loops of at least 3 x users requests: the whole population's rate
    warmup_cohort: bool = False  # the warm-up is a closed loop's start-up cohort (`warmup_requests`), not its fraction
    client_wait: dict | None = None  # a client's cap on requests in flight: the measured requests' waits for a slot

    @property
    def rising(self) -> bool:
        """TTFT still rising through the run: its percentiles are a transient's (see `Trend`)."""
        return self.trend is not None and self.trend.rising

    @property
    def policy(self) -> str:
        return self.engine.policy

    def as_dict(self) -> dict:
        s, b = self.sim, self.budget
        return {
            "summary": self.summary.as_dict(), "policy": self.policy, "step_cost_source": self.cost_source,
            "saturated": s.saturated, "saturation": s.saturation,
            "stopped_early": bool(np.isnan(s.records.finish).any()), "capacity_req_per_s": s.capacity_req_per_s,
            "offered_rate_per_s": self.offered_rate_per_s, "rejected": len(s.rejected),
            "rejected_examples": s.rejected[:3], "warmup_requests_excluded": self.warmup_requests,
            "warmup_is_start_up_cohort": self.warmup_cohort,
            "simulated_s": s.end_s, "steps": s.steps, "engine_events": s.events, "preemptions": s.preemptions,
            "littles_law": {"L": self.little[0], "lambda_W": self.little[1]},
            "kv_blocks_per_replica": b.planning_blocks, "kv_estimate": b.kv_estimate,
            "kv_blocks_range": b.num_blocks_range, "block_size": b.block_size,
            "max_num_seqs": b.max_num_seqs, "max_num_batched_tokens": b.max_num_batched_tokens,
            "max_model_len": b.max_model_len, "notes": self.notes, "units": "seconds, tokens",
            "engine": self.engine.model_dump(mode="json"),
            "offline": self.offline(),
            "ttft_trend": None if self.trend is None else {**self.trend.__dict__, "rising": self.trend.rising},
            "capacity_check": None if self.capacity is None else self.capacity.as_dict(self.offered_rate_per_s),
            "closed_loop_backlogged": None if self.backlogged is None else self.backlogged.__dict__,
            "client_wait": self.client_wait,
        }

    def offline(self) -> dict | None:
        """An offline batch (every request at t=0, as `vllm bench throughput`, trtllm-bench and MLPerf Offline run
        it): the makespan and the throughputs over it (None for other arrivals)."""
        if not self.is_offline:
            return None
        r = self.sim.records
        done = r.finished
        span = float(r.finish[done].max()) if done.any() else float("nan")
        out, inp = float(r.output_tokens[done].sum()), float(r.prompt_tokens[done].sum())
        return {"makespan_s": span, "requests": int(done.sum()), "requests_per_s": int(done.sum()) / span,
                "output_tokens_per_s": out / span, "total_tokens_per_s": (inp + out) / span}


def check_policy(engine: EngineConfig, workload: WorkloadSpec) -> None:
    """Priority scheduling needs classes of different priorities to act on: without them it is FCFS under
    another name, and a plan would compare nothing (say so instead of answering quietly)."""
    if engine.policy == "priority" and len({c.priority for c in workload.classes}) < 2:
        raise ConfigError("policy priority: the workload has no request classes of different priorities "
                          "(workload.classes[].priority, e.g. interactive 0 and batch 1)")


def simulate_requests(make_scheduler: SchedulerFactory, cost, workload: WorkloadSpec | list[Request],
                      opts: RunOptions = RunOptions(), *, replicas: int = 1, router: str = "round_robin",
                      frontend_s: float = 0.0) -> SimResult:
    """Step 4 alone: simulate with a given scheduler builder and cost."""
    cfg = SimConfig(replicas=replicas, router=router, fast_forward=opts.fast_forward,  # type: ignore[arg-type]
                    max_sim_s=opts.max_sim_s, timeseries=opts.timeseries, frontend_s=frontend_s)
    return simulate(workload, cost, make_scheduler, np.random.default_rng(opts.seed), cfg)


# KV transfer links between a prefill and a decode replica: nominal line rate per GPU (each TP rank sends its
# shard over its own link) and a one-way latency. Achieved rates are lower (protocol, NIXL/UCX handshakes):
# measure yours and give --link-gbps. nvlink: the GPU catalogue's per-direction GPU-to-GPU rate.
LINKS: dict[str, tuple[float | None, float]] = {
    "nvlink": (None, 10e-6),  # within a node
    "ib-400": (50e9, 20e-6),  # InfiniBand NDR / ConnectX-7, 400 Gb/s per GPU
    "roce-200": (25e9, 30e-6),  # RoCE, 200 Gb/s per GPU
    "eth-100": (12.5e9, 50e-6),  # 100 GbE per GPU
}


@dataclass(frozen=True)
class Disagg:
    """Disaggregated prefill/decode: the Deployment's replicas are the prefill pool; `decode` is the decode pool's
    deployment (its own TP, memory budget and step cost; its `replicas` is the pool size, or its `autoscale` grows
    and shrinks it, as the prefill Deployment's `autoscale` does the prefill pool). The prompt's KV moves
    over `link` (a name in LINKS, or `bandwidth_gbps` per GPU) with min(TP_p, TP_d) ranks sending in parallel."""

    decode: Deployment
    link: str = "nvlink"
    bandwidth_gbps: float | None = None  # GB/s per GPU, overrides the link's rate
    latency_s: float | None = None
    shared_link: bool = False  # one link for the whole prefill pool instead of one per prefill replica

    def __post_init__(self) -> None:
        if self.link not in LINKS:
            raise ConfigError(f"link {self.link!r}: use one of {', '.join(LINKS)} (or give its GB/s)")
        if self.bandwidth_gbps is not None and not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ConfigError(f"link bandwidth: must be a finite number of GB/s > 0 (got {self.bandwidth_gbps})")
        if self.latency_s is not None and not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"link latency: must be a finite number >= 0 (got {self.latency_s})")

    def spec(self, prefill: Deployment, decode: Prepared) -> Disaggregation:
        rate, lat = LINKS[self.link]
        per_gpu = self.bandwidth_gbps * 1e9 if self.bandwidth_gbps is not None else (
            rate if rate is not None else prefill.gpu.interconnect_bytes_per_s)
        lanes = min(prefill.engine.tensor_parallel_size, self.decode.engine.tensor_parallel_size)

        per_token = kv_bytes_per_token(prefill.card, decode.budget.kv_dtype, 1)  # the whole model's, all ranks
        return Disaggregation(prefill.replicas, self.decode.replicas, decode.cost, decode.make_scheduler,
                              float(per_token), per_gpu * lanes, self.latency_s if self.latency_s is not None else lat,
                              "shared" if self.shared_link else "per_prefill", self.decode.autoscale)


def disagg_launch_hints(prefill: Deployment, dis: Disagg) -> str:
    """vLLM commands for the layout, as text to adapt: each pool's `vllm serve` (the simulated knobs of its own
    budget) with the NIXL KV connector, one port per instance, and vLLM's toy proxy that sends each request to
    a prefiller with max_tokens 1, then to a decoder (tests/v1/kv_connector/nixl_integration/ in vLLM's repo)."""
    pools = (("prefill", prefill, prepare(prefill)), ("decode", dis.decode, prepare(dis.decode)))
    other = sorted({p.engine_model.name for _, _, p in pools} - {"vllm"})
    if other:  # another engine's command with vLLM's connector flags would be wrong, not a hint
        how = {"sglang": "SGLang: --disaggregation-mode prefill / decode and its router",
               "trtllm": "TensorRT-LLM: trtllm-serve disaggregated with a config file"}
        return (f"# not generated for {', '.join(other)}: these hints are vLLM's (NIXL connector, toy proxy); set "
                "disaggregated serving up as the engine does (" + "; ".join(how.get(e, e) for e in other) + "). "
                "Each pool's command: " + " | ".join(f"{role}: {p.engine_model.launch_command(d.card, d.engine, p.budget)}"
                                                for role, d, p in pools))
    kv = """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
    lines: list[str] = []
    ports: dict[str, list[int]] = {"prefill": [], "decode": []}
    for role, d, base in (("prefill", prefill, 8100), ("decode", dis.decode, 8200)):
        p = prepare(d)
        cmd = p.engine_model.launch_command(d.card, d.engine, p.budget)
        for i in range(d.replicas):
            port = base + i
            ports[role].append(port)
            lines.append(f"VLLM_NIXL_SIDE_CHANNEL_PORT={5600 + len(lines)} UCX_NET_DEVICES=all {cmd} "
                         f"--port {port} {kv}  # {role} {i + 1} of {d.replicas}")
    lines.append("python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port 8192 "
                 f"--prefiller-hosts {' '.join(['localhost'] * len(ports['prefill']))} "
                 f"--prefiller-ports {' '.join(map(str, ports['prefill']))} "
                 f"--decoder-hosts {' '.join(['localhost'] * len(ports['decode']))} "
                 f"--decoder-ports {' '.join(map(str, ports['decode']))}")
    lines.append("# not generated: CUDA_VISIBLE_DEVICES per instance, hosts across nodes (and "
                 "VLLM_NIXL_SIDE_CHANNEL_HOST), UCX transports, a production router (llm-d, Dynamo)")
    return "\n".join(lines)


def disagg_report(res: RunResult, prefill: Deployment, dis: Disagg) -> dict[str, Any]:
    """A disaggregated run's own figures, as `simulate --disagg` and the dashboard show them: the pools, GPUs, the
    link, transfer times and waits, each pool's KV blocks per replica and the most any of its replicas held (the
    time series at engine events: the prefill pool's are the prompts in prefill and those whose KV waits to be
    read), and the launch hints."""
    s = res.sim
    waits, times = s.transfer_waits, s.transfer_times
    assert waits is not None and times is not None
    n_p, n_d = prefill.replicas, dis.decode.replicas
    tp_p, tp_d = prefill.engine.tensor_parallel_size, dis.decode.engine.tensor_parallel_size
    ts = s.timeseries
    blocks = {"prefill": res.budget.planning_blocks, "decode": prepare(dis.decode).budget.planning_blocks}
    kv: dict[str, dict[str, int | None]] = {}
    for role in ("prefill", "decode"):
        m = (ts[:, 4] < n_p) if role == "prefill" else (ts[:, 4] >= n_p)
        kv[role] = {"blocks_per_replica": int(blocks[role]),
                    "peak_used": int(ts[m, 3].max()) if ts.size and m.any() else None}

    def stats(x: np.ndarray) -> dict[str, float | None]:
        return {"mean": float(x.mean()) if x.size else None, "p99": float(np.percentile(x, 99)) if x.size else None}

    return {"kv": kv, "launch_hints": disagg_launch_hints(prefill, dis), "prefill_replicas": n_p,
            "decode_replicas": n_d, "prefill_tp": tp_p, "decode_tp": tp_d, "gpus": n_p * tp_p + n_d * tp_d,
            "link": dis.link, "shared_link": dis.shared_link, "transfers": int(times.size),
            "transfer_s": stats(times), "link_wait_s": stats(waits)}


def warmup_requests(n: int, fraction: float, workload: WorkloadSpec) -> int:
    """How many of a run's first requests its metrics leave out: `fraction` of them, and in a closed loop at least
    the start-up cohort, the `users` requests sent at once at t=0 (when more were sent than that). The cohort
    waits for every user's prompt at once, a burst the loop never sees again unless its users stay in lock-step:
    left in, it set the P99 TTFT of a loop of 8 x its users (8B on an H100, 200 users, 1,000 requests: 4.5 s, 253
    ms without it). Load generators' maintainers found the same on real engines and hand the start-up burst to a
    warm-up (evalscope pull request 1641; docs/fidelity.md, "A closed loop's warm-up"). A fraction of 0 leaves out
    nothing, to compare with a tool that counts the burst."""
    n_warm = int(n * fraction)
    users = workload.arrivals.users or 0
    if fraction > 0 and workload.arrivals.kind == "closed" and n > users:
        n_warm = max(n_warm, users)
    return n_warm


def run(dep: Deployment, workload: WorkloadSpec, opts: RunOptions = RunOptions(),
        prepared: Prepared | None = None, disagg: Disagg | None = None) -> RunResult:
    """The whole path (see module docstring). With `disagg`, `dep` is the prefill pool."""
    check_policy(dep.engine, workload)

    p, workload = serve_images(prepared or prepare(dep), dep.card, dep.gpu, workload)
    rng = np.random.default_rng(opts.seed)
    dg = None
    if disagg is not None:
        if disagg.decode.card.name != dep.card.name:
            raise ConfigError("disaggregation: the prefill and decode pools must serve the same model")
        dg = disagg.spec(dep, prepare(disagg.decode))
    cfg = SimConfig(replicas=dp_ranks(dep), router=dp_router(dep), router_max_ongoing=dep.router_max_ongoing,  # type: ignore[arg-type]
                    fast_forward=opts.fast_forward, max_sim_s=opts.max_sim_s, timeseries=opts.timeseries,
                    autoscale=dep.autoscale, disagg=dg, **frontend.sim_terms(dep.engine, dep.frontend_s, dep.card, workload))
    sim = simulate(workload, p.cost, p.make_scheduler, rng, cfg)
    rec = sim.records
    offline = workload.arrivals.kind == "offline"
    n_warm = 0 if offline else warmup_requests(len(rec), opts.warmup_fraction, workload)
    measured = rec.subset(np.arange(len(rec)) >= n_warm)
    # ITL samples are per token, not per request: the warm-up excludes tokens emitted before the first
    # measured request arrived.
    t0 = measured.arrival.min() if len(measured) else 0.0
    m = sim.itl_times >= t0
    slos = [SLO(c.slo_ttft_s, c.slo_tpot_s) for c in workload.classes]
    summary = summarize(measured, sim.itl_values[m], sim.itl_weights[m], rng, slos=slos, ci=opts.ci,
                        class_names=[c.name for c in workload.classes],
                        others=rec.subset(np.arange(len(rec)) < n_warm) if n_warm else None,
                        client=workload.reasoning)  # a reasoning model as the benchmark client counts it
    notes = []
    if sim.rejected:
        notes.append(f"{len(sim.rejected)} requests rejected: {sim.rejected[0][1]}")
    b = p.budget
    if b.estimates:
        notes.append("KV blocks from a memory budget with estimated terms: " + ", ".join(b.estimates))
    notes += (p.engine_model.launch_notes(dep.engine) + state_note(dep.card, dep.profile)
              + frontend.note(dep.engine, dep.card, workload) + [w for w in b.warnings if "(max_req_len)" in w])
    if dep.engine.speculative is not None:
        notes += run_notes(dep.engine.speculative, b.warnings)
    arr = workload.arrivals
    backlog = None
    if arr.kind == "closed" or arr.max_concurrency:  # a client's cap that binds is a closed loop of its slots
        n_first = int(np.isfinite(rec.first_token).sum())
        lock = lock_step_note(measured.first_token, arr.users or arr.max_concurrency or 0, n_first / max(sim.steps, 1))
        notes += lock
    if arr.kind == "closed":
        backlog = backlogged(rec, arr.users or 0, sim.itl_times, sim.itl_weights)
        notes += [] if lock else steady_notes.drift_note(workload)
    client, say = client_wait(sim.client_waits, measured.arrival, n_warm, arr.max_concurrency)
    notes += say
    offered = workload.total_curve().mean_rate if arr.kind == "curve" else arr.rate_per_s
    if workload.sessions is not None and offered is not None:  # turns/s: sessions/s x mean turns (uncongested)
        offered *= workload.sessions.mean_turns
        notes.append(session_note(workload))
    steady = arr.kind in STEADY_ARRIVALS
    trend = ttft_trend(measured.arrival, measured.first_token) if steady and not sim.saturation else None
    cap = None
    if opts.capacity_check and steady and disagg is None and dep.autoscale is None and workload.sessions is None:
        cap, why = measure_capacity(dep, workload, p, opts)
        notes += [why] if why else []
    notes += stability_notes(sim, trend, cap, offered)
    return RunResult(summary, sim, b, dep.engine, p.cost_source, n_warm, offered,
                     littles_law(sim), notes, is_offline=offline, trend=trend, capacity=cap, backlogged=backlog,
                     warmup_cohort=bool(n_warm) and arr.kind == "closed" and n_warm == (arr.users or 0),
                     client_wait=client)


CAPACITY_LOOP_MAX_REQUESTS = 100_000  # a capacity loop over this many requests is not run (time, memory)


def measure_capacity(dep: Deployment, workload: WorkloadSpec, p: Prepared,
                     opts: RunOptions) -> tuple[Capacity | None, str]:
    """The deployment's capacity for this workload (`capacity_loop`, the planner's measure), from the run's seed
    and at most 10,000 requests of its own (fewer than the run when the run is longer: the estimate settles by
    then), or None and why not: a loop of four requests per user over `CAPACITY_LOOP_MAX_REQUESTS` (hundreds of
    replicas, each with a big batch) is not run."""
    size = (dep.engine, p.budget, workload, min(workload.num_requests, 10_000), dp_ranks(dep) * attention_dp_ranks(dep.engine))
    users, n = capacity_loop_size(*size)
    if n > CAPACITY_LOOP_MAX_REQUESTS:
        return None, (f"capacity not measured: its closed loop ({users:,} users over {dep.replicas:,} replicas, "
                      f"{n:,} requests) is over the {CAPACITY_LOOP_MAX_REQUESTS:,}-request bound; "
                      "the TTFT trend still judges the run")
    wl = capacity_loop(*size)
    r = run(dep, wl, RunOptions(seed=opts.seed, warmup_fraction=opts.warmup_fraction, fast_forward=opts.fast_forward,
                                ci=False, max_sim_s=opts.max_sim_s, timeseries=False), prepared=p)
    rate = r.backlogged.requests_per_s if r.backlogged is not None else r.summary.requests_per_s
    if r.sim.saturation or not (rate > 0 and math.isfinite(rate)):
        return None, "capacity not measured: its closed loop " + (r.sim.saturation or "finished no request")
    return Capacity(rate, users, wl.num_requests), ""
