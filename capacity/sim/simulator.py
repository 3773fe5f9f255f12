"""The discrete-event simulator of a serving deployment. SimPy is the clock; this package is the only one
that imports it.

Requests arrive (open loop from a workload, or closed loop: N users who send, wait, think, repeat), pass an
optional front-end `Delay`, and a `Router` sends each to a `Replica`, whose engine loop asks its scheduler for
a step, advances the clock by the step cost, applies the step and records token times
(`capacity.sim.entities`). Per-request timelines (arrival, first scheduled, first token, finish,
preemptions) and the ITL of every token are kept; time series of queue length, running batch and KV blocks
in use are sampled at each engine event.

Fast path: when every running sequence is decoding and nothing else can happen (no admission possible,
no finish, no block shortage, no arrival that could be admitted), k decode steps are one event whose k
durations come vectorised and exact from the cost model (`decode_run_s`). With `fast_forward=False` every
step is its own event; both must agree (tests and bench/sim_speed.py check it).

Overload: if a replica's queue grows past `saturation_queue`, the run stops and reports "saturated" with
the throughput the replicas sustained while backlogged (the capacity estimate); a run too short for that
is also "saturated" when more than `overload_fraction` of its requests are still queued at the last arrival.
A run never goes forever: `max_sim_s` bounds simulated time.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import simpy

from capacity.errors import CapacityError
from capacity.replay import iter_trace
from capacity.sched.base import Scheduler, Seq
from capacity.sim.autoscale import AutoscaleConfig, Autoscaler, Timeline
from capacity.sim.entities import Replica
from capacity.sim.metrics import Records
from capacity.sim.recorder import COMPACT_AT, Recorder
from capacity.sim.routing import Delay, KVTransfer, Router
from capacity.sim.sources import CappedOpenLoop, ClosedLoopUsers, SessionUsers, closed_loop, open_loop
from capacity.workload import Request, WorkloadSpec, generate


@dataclass(frozen=True)
class Disaggregation:
    """Disaggregated prefill/decode: `prefill_replicas` engines run each prompt and sample its first token, the
    prompt's KV moves over a link, and `decode_replicas` engines (their own step cost and scheduler) generate the
    rest. The simulator's main cost and scheduler are the prefill pool's."""

    prefill_replicas: int
    decode_replicas: int
    decode_cost: Any  # a step cost (mypyc: a compiled dataclass's `object` field fails at import, KeyError)
    make_decode_scheduler: Callable[[], Scheduler]
    kv_bytes_per_token: float  # the whole model's KV bytes per token (all layers, all heads): what moves
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    link_mode: Literal["per_prefill", "shared"] = "per_prefill"
    # the decode pool grows and shrinks (decode_replicas is then ignored); the prefill pool's is SimConfig.autoscale
    decode_autoscale: AutoscaleConfig | None = None

    def __post_init__(self) -> None:
        if self.prefill_replicas < 1 or self.decode_replicas < 1:
            raise CapacityError(f"disaggregation: need >= 1 prefill and decode replicas (got "
                                f"{self.prefill_replicas}:{self.decode_replicas})")
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise CapacityError(f"link bandwidth: must be a finite number > 0 (got {self.bandwidth_bytes_per_s})")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise CapacityError(f"link latency: must be a finite number >= 0 (got {self.latency_s})")
        if self.link_mode not in ("per_prefill", "shared"):
            raise CapacityError(f"link mode {self.link_mode!r}: use per_prefill or shared")


@dataclass(frozen=True)
class Service:
    """One model of a fleet simulated together: its step cost, its scheduler, its replicas, and for each replica
    the device it shares (None: a GPU of its own). Replicas that share a device take turns: one step at a time
    holds it (a SimPy Resource), so a model's steps wait for the other models' steps on that GPU, which is how
    co-located engines time-slice one GPU (each CUDA context runs its kernels in turn; MPS and MIG, which would
    overlap or partition them, are not modelled). A replica on a shared device runs step by step (no decode
    stretches: another model may take the device between any two steps) and plans each step when it asks for
    the device (`Replica._shared_step`). Requests name their service
    (`Request.service`).

    `swap_s` switches a shared device to swapping (SimConfig.device_sharing "swap"): one model resident at a time,
    with the whole GPU; it keeps the device until it has nothing in flight, then the model that asked first
    loads, paying the outgoing model's `sleep_s` and its own `swap_s` (vLLM's sleep mode level 1: weights copied
    to host memory, KV cache discarded, which is why a model gives the GPU up only when idle; wake-up copies
    the weights back)."""

    name: str
    cost: Any  # a step cost (mypyc: as Disaggregation.decode_cost)
    make_scheduler: Callable[[], Scheduler]
    replicas: int = 1
    devices: tuple[int | None, ...] | None = None  # per replica: a shared device id, or None
    swap_s: float = 0.0  # swap mode: time to make this model resident (weights host -> GPU), s
    sleep_s: float = 0.0  # swap mode: time to put it to sleep (weights GPU -> host), s

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise CapacityError(f"service {self.name}: replicas must be >= 1 (got {self.replicas})")
        if self.devices is not None and len(self.devices) != self.replicas:
            raise CapacityError(f"service {self.name}: {len(self.devices)} devices for {self.replicas} replicas")
        for f in ("swap_s", "sleep_s"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0):
                raise CapacityError(f"service {self.name}: {f} must be a finite number >= 0 (got {v})")


ROUTERS = ("round_robin", "least_outstanding", "affinity", "queue")


@dataclass
class SimConfig:
    replicas: int = 1
    router: Literal["round_robin", "least_outstanding", "affinity", "queue"] = "round_robin"
    router_max_ongoing: int | None = None  # "queue": requests per replica before the router holds them (None: max_num_seqs)
    fast_forward: bool = True
    max_stretch: int = 1 << 30
    saturation_queue: int | None = None  # default: max(1000, 8 x the scheduler's batch cap)
    max_sim_s: float = math.inf
    timeseries: bool = True
    overload_fraction: float = 0.1  # queued share of all arrivals at the last arrival that means overload
    frontend_s: float = 0.0  # front-end latency before the router (seen in TTFT/E2E, costs no engine time)
    frontend_s_per_input_token: float = 0.0  # + this x prompt tokens on one serial worker (the tokeniser), FIFO
    frontend_images: Any = None  # per-image work of requests with images (capacity.engine.image_cpu.ImageFrontEnd)
    autoscale: AutoscaleConfig | None = None  # a pool that grows and shrinks (replicas is then ignored); with
    # disagg, the prefill pool
    disagg: Disaggregation | None = None  # prefill and decode pools (replicas is then ignored)
    services: tuple[Service, ...] | None = None  # several models (cost and scheduler then come from each)
    device_sharing: Literal["timeslice", "swap"] = "timeslice"  # shared devices: steps take turns, or models swap

    def __post_init__(self) -> None:
        if self.replicas <= 0:
            raise CapacityError(f"replicas: must be > 0 (got {self.replicas})")
        if self.router not in ROUTERS:
            raise CapacityError(f"router: use {', '.join(ROUTERS)} (got {self.router!r})")
        if self.router_max_ongoing is not None and (isinstance(self.router_max_ongoing, bool)
                                                    or not isinstance(self.router_max_ongoing, int)
                                                    or self.router_max_ongoing < 1):
            raise CapacityError(f"router_max_ongoing: must be a whole number >= 1 (got {self.router_max_ongoing!r})")
        if self.device_sharing not in ("timeslice", "swap"):
            raise CapacityError(f"device_sharing: use timeslice or swap (got {self.device_sharing!r})")
        if not 0 <= self.frontend_s < math.inf:
            raise CapacityError(f"frontend_s: must be a finite number >= 0 (got {self.frontend_s})")
        if not 0 <= self.frontend_s_per_input_token < 1:
            raise CapacityError(f"frontend_s_per_input_token: must be in [0, 1) s (got {self.frontend_s_per_input_token})")


@dataclass
class SimResult:
    records: Records
    itl_values: np.ndarray
    itl_weights: np.ndarray
    itl_times: np.ndarray  # when each ITL sample's token was emitted
    timeseries: np.ndarray  # columns: time_s, waiting, running, kv_blocks_used, replica
    saturated: bool = False
    saturation: str = ""
    capacity_req_per_s: float | None = None
    rejected: list[tuple[int, str]] = field(default_factory=list)
    time_in_system_area: float = 0.0  # integral of (requests in system) dt, kept by its own counter
    end_s: float = 0.0
    steps: int = 0
    events: int = 0
    preemptions: int = 0
    cost_source: str = ""
    kv_blocks_total: int = 0  # per replica: the denominator of the time series' KV column
    autoscale: Timeline | None = None  # the pool over time, when it autoscaled (disaggregated: the prefill pool)
    autoscale_decode: Timeline | None = None  # disaggregated: the decode pool over time, when it autoscaled
    transfer_waits: np.ndarray | None = None  # disaggregated: per KV transfer, time queued for the link, s
    transfer_times: np.ndarray | None = None  # disaggregated: per KV transfer, time on the link, s
    swaps: list[tuple[float, int, int]] = field(default_factory=list)  # swap mode: (start, from replica, to replica)
    client_waits: np.ndarray | None = None  # a client's cap (arrivals.max_concurrency): per request, in records' order, s


class Simulation:
    """One run: the clock, the entities, and the state they share (see capacity.sim.entities)."""

    def __init__(self, cost, make_scheduler: Callable[[], Scheduler], rng: np.random.Generator,
                 cfg: SimConfig) -> None:
        self.env = simpy.Environment()
        self.cost, self.rng, self.cfg = cost, rng, cfg
        self.recorder = Recorder(self.env, cfg.timeseries)
        d = cfg.disagg
        self.routers: list[Router] = []
        self.replicas: list[Replica] = []
        self.transfer: KVTransfer | None = None
        if cfg.services is not None:
            if d is not None or cfg.autoscale is not None:
                raise CapacityError("a fleet of several models is simulated without autoscaling or disaggregation")
            devices: dict[int, simpy.Resource] = {}
            for sv in cfg.services:
                mine = []
                for j in range(sv.replicas):
                    rep = Replica(self, len(self.replicas), sv.make_scheduler(), cost=sv.cost)
                    dev = sv.devices[j] if sv.devices is not None else None
                    if dev is not None:
                        rep.device = devices.setdefault(dev, simpy.Resource(self.env, capacity=1))
                        rep.swap = (sv.sleep_s, sv.swap_s) if cfg.device_sharing == "swap" else None
                    self.replicas.append(rep)
                    mine.append(rep)
                self.routers.append(Router(self, mine, cfg.router, cfg.router_max_ongoing))
            self.router = self.routers[0]
        elif d is not None:
            if cfg.router == "queue":
                raise CapacityError("router queue: not modelled for disaggregated serving (use least_outstanding)")
            n_pre = cfg.autoscale.max_replicas if cfg.autoscale is not None else d.prefill_replicas
            n_dec = d.decode_autoscale.max_replicas if d.decode_autoscale is not None else d.decode_replicas
            pre = [Replica(self, i, make_scheduler(), "prefill") for i in range(n_pre)]
            dec = [Replica(self, n_pre + i, d.make_decode_scheduler(), "decode", d.decode_cost)
                   for i in range(n_dec)]
            if not all(hasattr(r.sched, "resume") for r in dec):
                raise CapacityError("disaggregation needs a continuous-batching decode pool (not static batching)")
            self.replicas = pre + dec
            self.router = Router(self, pre, cfg.router)
            self.decode_router = Router(self, dec, cfg.router)
            self.transfer = KVTransfer(self, d, n_pre)
        else:
            n = cfg.autoscale.max_replicas if cfg.autoscale is not None else cfg.replicas
            self.replicas = [Replica(self, i, make_scheduler()) for i in range(n)]
            self.router = Router(self, list(self.replicas), cfg.router, cfg.router_max_ongoing)
        self.queue_routers = [r for r in (self.routers or [self.router]) if r.policy == "queue"]
        if d is None and cfg.autoscale is None and cfg.services is None:  # nothing reads the sequences back
            self.recorder.compact_at = COMPACT_AT  # a long run folds finished ones (capacity.sim.recorder)
        # each pool that autoscales has its controller; a disaggregated pool holds only part of each request's
        # time in the system, so its concurrency is its own (sampled), not the system's integral
        self.autoscaler = (Autoscaler(self, cfg.autoscale, self.router, whole=d is None)
                           if cfg.autoscale is not None else None)
        self.decode_autoscaler = (Autoscaler(self, d.decode_autoscale, self.decode_router, whole=False)
                                  if d is not None and d.decode_autoscale is not None else None)
        front = cfg.frontend_s > 0 or cfg.frontend_s_per_input_token > 0 or cfg.frontend_images is not None
        if front and self.routers:
            raise CapacityError("a front-end delay in a fleet of several models is not modelled")
        self.delay = Delay(self.env, cfg.frontend_s, self.router.from_front_end) if front else None
        self.sat_queue = cfg.saturation_queue or max(1000, 8 * self.replicas[0].sched.max_running)
        self.stop = self.env.event()
        self.waiters: dict[int, Any] = {}  # closed-loop users waiting for their request (a clock event, or DrivenUsers)
        self.users: ClosedLoopUsers | None = None  # the closed-loop source, when there is one
        self.offline = False  # an offline batch: the queue is the batch, never a sign of overload
        self.entered = 0  # requests sent so far (the SLA planner's request count)
        self.seen_images: set[int] = set()  # identical images the front end has processed (its processor cache)
        self.next_arrival_s = math.inf  # the next time a source sends a request (the fast path's horizon)
        self.steps = self.events = 0
        self.swaps: list[tuple[float, int, int]] = []  # swap mode: (time, device's previous replica, new one)
        # (start, end, tokens, finished before it, in flight at its start) of the longest backlog
        self.longest_backlog: tuple[float, float, int, int, int] = (0.0, 0.0, 0, 0, 0)
        self.overload: tuple[int, int, float] | None = None  # (queued, requests, time) at the last arrival
        self.result = SimResult(Records(*[np.array([])] * 9), np.array([]), np.array([]), np.array([]),
                                np.empty((0, 5)), cost_source=getattr(cost, "source", type(cost).__name__),
                                kv_blocks_total=self.replicas[0].sched.kv_blocks_total)

    # ---- shared actions -------------------------------------------------------------------------------
    def enter(self, req: Request) -> None:
        """A request leaves its client: through the front-end delay, if any, to the router (its service's)."""
        self.entered += 1
        if self.delay is not None:
            self.recorder.count(+1)  # in the system from its send: Little's law counts its time in the front end
            fi = self.cfg.frontend_images  # a request's images: decoded on a pool (lag), processed on the serial worker
            lag, work = fi.work(req, self.seen_images) if req.images and fi is not None else (0.0, 0.0)
            self.delay.put(req, self.cfg.frontend_s_per_input_token * req.prompt_tokens + work, self.recorder.clock_s, lag)
        elif self.routers:
            self.routers[req.service].dispatch(req)
        else:
            self.router.dispatch(req)

    def next_entry_s(self) -> float:
        """When the next request can reach a scheduler: the fast path must not run past it."""
        if self.delay is None:
            return self.next_arrival_s
        return min(self.delay.next_due_s, self.next_arrival_s + self.delay.latency_s)

    def reject(self, req: Request, why: str) -> None:
        self.result.rejected.append((req.id, why))
        w = self.waiters.pop(req.id, None)
        if w is not None:
            w.succeed(self.users.answered(req, self.recorder.clock_s) if self.users else None)

    def finish(self, done: list[Seq], t: float = -1.0) -> None:
        """Sequences done at `t` (default: now; an engine running ahead gives its own time)."""
        for s in done:
            if s.phase == 1:  # a prefill done: the request goes on to the decode pool, which pulls its KV
                assert self.transfer is not None
                self.transfer.hold(s)
                continue
            self.recorder.finished(s, t)
            w = self.waiters.pop(s.req.id, None)
            if w is not None:  # a closed-loop user: when it will send again is known now (the fast path's horizon)
                w.succeed(self.users.answered(s.req, t) if self.users else None)
        for r in self.queue_routers:  # a replica has room now: the router's queue moves
            r.pull()

    def router_queued(self) -> int:
        """Requests held in routers' queues (router "queue"): waiting, though no replica holds them."""
        return sum(len(r.queue) for r in self.queue_routers)

    def backlog_rate(self, t0: float, t1: float, tokens: int) -> float | None:
        """Requests/s served over [t0, t1] while the queue was never empty: output tokens emitted per second
        divided by the mean output length of the requests admitted so far. Tokens, not finishes: a request
        admitted at the start of a short backlog has not finished by its end, but its tokens were served."""
        rec = self.recorder
        if t1 <= t0 or tokens <= 0 or not rec.admitted_total:
            return None
        return tokens / (t1 - t0) / rec.mean_output

    def check_saturation(self, rep: Replica, now: float = -1.0) -> bool:
        """After a step of `rep` that ended at `now` (default: the clock's time)."""
        rec, res, now = self.recorder, self.result, self.env.now if now < 0 else now
        q = rep.num_waiting + (len(rep.router.queue) if rep.router is not None else 0)
        if q == 0:
            if rec.backlog_since is not None:  # a backlogged period ends: keep the longest (the capacity sample)
                t0, f0, k0, r0 = rec.backlog_since
                if now - t0 > self.longest_backlog[1] - self.longest_backlog[0]:
                    self.longest_backlog = (t0, now, rec.tokens_total - k0, f0, r0)
            rec.backlog_since = None
            return False
        if rec.backlog_since is None:
            rec.backlog_since = (now, rec.finished_total, rec.tokens_total,
                                 sum(len(r.sched.running) for r in self.replicas))
        if (q > self.sat_queue and not self.stop.triggered and not self.offline and self.autoscaler is None
                and self.decode_autoscaler is None):
            t0, _, k0, _ = rec.backlog_since
            cap = self.backlog_rate(t0, now, rec.tokens_total - k0)
            res.saturated = True
            res.capacity_req_per_s = cap
            cap_txt = f"{cap:.3g} req/s" if cap else "unknown (nothing was served while backlogged)"
            res.saturation = (f"saturated: replica {rep.idx}'s queue reached {q} waiting requests at "
                              f"t={now:.1f} s; the deployment sustained about {cap_txt} while backlogged")
            self.stop.succeed()
            return True
        return False

    def check_overload(self, n_requests: int, now: float = -1.0) -> None:
        """At the last arrival: a stable system has a short queue; an overloaded one has been piling up
        (lambda - mu) x T requests. More than `overload_fraction` of all arrivals still waiting = overloaded,
        which catches runs too short for the queue to reach `saturation_queue` (needs enough requests spread
        over time: a burst of a few requests at t=0 is not an overload)."""
        waiting = sum(r.num_waiting for r in self.replicas) + self.router_queued()
        res, now = self.result, self.env.now if now < 0 else now
        if n_requests >= 50 and now > 0 and waiting > self.cfg.overload_fraction * n_requests and not res.saturated:
            res.saturated = True
            # the run goes on until the queue drains; the served rate is measured then (see _overload_capacity)
            self.overload = (waiting, n_requests, now)

    def _overload_capacity(self) -> None:
        """The rate an overloaded run sustained, measured over its longest backlogged period (see backlog_rate).
        At the last arrival itself few requests may have finished (a burst of long requests), so that moment is
        no measure of the rate."""
        assert self.overload is not None
        waiting, n, t_last = self.overload
        rec, res = self.recorder, self.result
        t0, t1, tokens, f0, r0 = self.longest_backlog
        if rec.backlog_since is not None and self.env.now - rec.backlog_since[0] > t1 - t0:
            t0, f0, k0, r0 = rec.backlog_since
            t1, tokens = self.env.now, rec.tokens_total - k0
        cap = self.backlog_rate(t0, t1, tokens)
        how = f"while backlogged ({t1 - t0:.1f} s)"
        # A burst: no request came after that backlog and the run went on until every one finished. The
        # backlog ended when the last prompt was admitted, so it held mostly prefills, whose tokens the rate above
        # does not count; the engine was busy from t0 to the end, so the requests finished since t0 over that time
        # measure it too, less those in flight at t0 (partly served before it; all of them, so the count is low
        # rather than high, as the batch shrinking at the end makes it). The larger of the two is kept.
        done = not any(r.has_work for r in self.replicas) and not self.router_queued()
        if done and t_last <= t1 and self.env.now > t0:
            drained = (rec.finished_total - f0 - r0) / (self.env.now - t0)
            if cap is None or drained > cap:
                cap, how = drained, f"from the backlog's start to the last finish ({self.env.now - t0:.1f} s)"
        if cap is None:
            cap, how = rec.finished_total / max(self.env.now, 1e-12), "over the whole run"
        res.capacity_req_per_s = cap
        res.saturation = (f"saturated: {waiting} of {n} requests were still queued when the last one arrived "
                          f"(t={t_last:.1f} s); the deployment served about {cap:.3g} req/s {how}")

    # ---- the run --------------------------------------------------------------------------------------
    def run(self, workload: WorkloadSpec | Iterable[Request]) -> SimResult:
        env, cfg, res = self.env, self.cfg, self.result
        closed = isinstance(workload, WorkloadSpec) and workload.arrivals.kind == "closed"
        capped = isinstance(workload, WorkloadSpec) and workload.arrivals.max_concurrency is not None
        if isinstance(workload, WorkloadSpec) and workload.sessions is not None:
            self.users = SessionUsers(self, workload)
            self.users.start()
        elif closed:  # one engine drives its users where it can (sources.drives), else they are clock processes
            self.users = closed_loop(self, workload)  # type: ignore[arg-type]
        elif capped:
            self.recorder.compact_at = 0  # its waits are matched to the sequences at the end
            self.users = CappedOpenLoop(self, workload, generate(workload, self.rng))  # type: ignore[arg-type]
            self.users.start()
        else:
            self.offline = isinstance(workload, WorkloadSpec) and workload.arrivals.kind == "offline"
            reqs: Iterable[Request] = workload if not isinstance(workload, WorkloadSpec) else (
                iter_trace(workload.trace, workload) if workload.arrivals.kind == "trace" and workload.trace
                else generate(workload, self.rng))  # a trace streams (capacity.replay)
            open_loop(self, reqs)  # one engine drives its source where it can (sources.drives), else a clock process
        for rep in self.replicas:
            rep.proc = env.process(rep.run())
        for a in (self.autoscaler, self.decode_autoscaler):
            if a is not None:
                env.process(a.run())
        until = self.stop if not math.isfinite(cfg.max_sim_s) else env.any_of([self.stop, env.timeout(cfg.max_sim_s)])
        try:
            env.run(until=until)
        except RuntimeError as exc:  # SimPy: "No scheduled events left but "until" event was not triggered"
            if "No scheduled events" not in str(exc):
                raise
        rec = self.recorder
        rec.count(0)
        for r in self.queue_routers:  # still queued at the router when the run stopped: never scheduled
            for req in r.queue:
                rec.admitted(Seq(req), counted=True)
        if self.overload is not None:
            self._overload_capacity()
        res.end_s = env.now
        res.time_in_system_area = rec.area
        res.steps, res.events = self.steps, self.events
        res.preemptions = sum(r.sched.num_preemptions for r in self.replicas)
        res.swaps = self.swaps
        if not res.saturated and math.isfinite(cfg.max_sim_s) and env.now >= cfg.max_sim_s:
            res.saturation = f"stopped at max_sim_s={cfg.max_sim_s} s with requests unfinished"
        res.records = rec.records()
        if isinstance(self.users, CappedOpenLoop):  # in the records' order (Recorder.records)
            w = self.users.waits
            res.client_waits = np.array([w[s.req.id] for s in sorted(rec.seqs, key=lambda s: (s.req.arrival_s, s.req.id))])
        res.itl_values, res.itl_weights, res.itl_times = rec.itl()
        res.timeseries = rec.timeseries_array()
        if self.autoscaler is not None:
            res.autoscale = self.autoscaler.close()
        if self.decode_autoscaler is not None:
            res.autoscale_decode = self.decode_autoscaler.close()
        if self.transfer is not None:
            res.transfer_waits = np.array(self.transfer.waits)
            res.transfer_times = np.array(self.transfer.times)
        return res


def simulate(workload: WorkloadSpec | Iterable[Request], cost, make_scheduler: Callable[[], Scheduler],
             rng: np.random.Generator, cfg: SimConfig | None = None) -> SimResult:
    """Run the simulation to completion (or saturation). `make_scheduler()` builds one replica's policy."""
    return Simulation(cost, make_scheduler, rng, cfg or SimConfig()).run(workload)


def littles_law(result: SimResult) -> tuple[float, float]:
    """(L, lambda x W) over [0, end]: time-average number in system from the simulator's own counter, and
    arrival rate x mean time in system from the per-request records. Equal when every request finished."""
    r = result.records
    T = result.end_s
    if T <= 0 or len(r) == 0:
        return (0.0, 0.0)
    sojourn = np.where(np.isnan(r.finish), T, r.finish) - r.arrival
    return (result.time_in_system_area / T, len(r) / T * float(sojourn.mean()))
