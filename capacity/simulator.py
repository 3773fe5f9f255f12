"""The discrete-event simulator of a serving deployment. SimPy is the clock; this is the only module that
imports it.

Requests arrive (open loop from a workload, or closed loop: N users who send, wait, think, repeat), a router
sends each to a replica (round-robin or least outstanding), and each replica's engine process loops: ask its
scheduler for a step, advance the clock by the step cost, apply the step, record token times. Per-request
timelines (arrival, first scheduled, first token, finish, preemptions) and the ITL of every token are kept;
time series of queue length, running batch and KV blocks in use are sampled at each engine event.

Fast path: when every running sequence is decoding and nothing else can happen (no admission possible,
no finish, no block shortage, no arrival that could be admitted), k decode steps are one event whose k
durations come vectorised and exact from the cost model (`decode_run_s`). With `fast_forward=False` every
step is its own event; both must agree (tests and bench/sim_speed.py check it).

Overload: if a replica's queue grows past `saturation_queue`, the run stops and reports "saturated" with
the throughput the replicas sustained while backlogged (the capacity estimate); a run too short for that
is also "saturated" when more than `overload_fraction` of its requests are still queued at the last arrival. A run never goes forever:
`max_sim_s` bounds simulated time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
import simpy

from capacity.costs import decode_run_s
from capacity.errors import CapacityError
from capacity.metrics import Records
from capacity.workload import Request, WorkloadSpec, draw_attributes, generate


@dataclass
class SimConfig:
    replicas: int = 1
    router: Literal["round_robin", "least_outstanding"] = "round_robin"
    fast_forward: bool = True
    max_stretch: int = 1 << 30
    saturation_queue: int | None = None  # default: max(1000, 8 x max_num_seqs)
    max_sim_s: float = math.inf
    timeseries: bool = True
    overload_fraction: float = 0.1  # queued share of all arrivals at the last arrival that means overload

    def __post_init__(self) -> None:
        if self.replicas <= 0:
            raise CapacityError(f"replicas: must be > 0 (got {self.replicas})")
        if self.router not in ("round_robin", "least_outstanding"):
            raise CapacityError(f"router: use round_robin or least_outstanding (got {self.router!r})")


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


class _Replica:
    def __init__(self, idx: int, sched) -> None:
        self.idx, self.sched = idx, sched
        self.wake: simpy.Event | None = None


def simulate(workload: WorkloadSpec | list[Request], cost, make_scheduler: Callable[[], object],
             rng: np.random.Generator, cfg: SimConfig | None = None) -> SimResult:
    """Run the simulation to completion (or saturation). `make_scheduler()` builds one replica's policy."""
    cfg = cfg or SimConfig()
    env = simpy.Environment()
    reps = [_Replica(i, make_scheduler()) for i in range(cfg.replicas)]
    max_seqs = getattr(reps[0].sched.cfg, "max_num_seqs", getattr(reps[0].sched.cfg, "max_batch", 1))
    sat_queue = cfg.saturation_queue or max(1000, 8 * max_seqs)
    closed = isinstance(workload, WorkloadSpec) and workload.arrivals.kind == "closed"
    if isinstance(workload, WorkloadSpec) and not closed:
        requests = generate(workload, rng)
    elif closed:
        requests = []
    else:
        requests = list(workload)
    seqs: list = []
    itl_v: list[np.ndarray] = []  # ITL samples of decode stretches (arrays, one weight per array)
    itl_w: list[np.ndarray] = []
    itl_t: list[np.ndarray] = []
    stretches: list[tuple] = []  # (durations, end times, weight of the first, weight of the rest)
    gap_v: list[float] = []  # ITL samples of single steps (one token each)
    gap_t: list[float] = []
    ts: list[tuple] = []
    st = {"n_sys": 0, "area": 0.0, "t_last": 0.0, "rr": 0, "next_arrival": math.inf, "steps": 0, "events": 0,
          "backlog_since": None, "finished_total": 0, "finished_at_backlog": 0}
    result = SimResult(Records(*[np.array([])] * 9), np.array([]), np.array([]), np.array([]), np.empty((0, 5)),
                       cost_source=getattr(cost, "source", type(cost).__name__))
    stop = env.event()
    waiters: dict[int, simpy.Event] = {}

    def count(delta: int) -> None:
        st["area"] += st["n_sys"] * (env.now - st["t_last"])
        st["t_last"] = env.now
        st["n_sys"] += delta

    def dispatch(req: Request) -> None:
        if cfg.router == "round_robin":
            rep = reps[st["rr"] % len(reps)]
            st["rr"] += 1
        else:
            rep = min(reps, key=lambda r: (r.sched.outstanding, r.idx))
        why = rep.sched.admissible(req)
        if why:
            result.rejected.append((req.id, why))
            if req.id in waiters:
                waiters.pop(req.id).succeed()
            return
        seq = rep.sched.add(req)
        seq.replica = rep.idx
        seqs.append(seq)
        count(+1)
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()

    def finish(done: list, rep: _Replica) -> None:
        for s in done:
            count(-1)
            st["finished_total"] += 1
            w = waiters.pop(s.req.id, None)
            if w is not None:
                w.succeed()

    def check_saturation(rep: _Replica) -> bool:
        q = len(rep.sched.waiting)
        if q == 0:
            st["backlog_since"] = None
            return False
        if st["backlog_since"] is None:
            st["backlog_since"] = (env.now, st["finished_total"])
        if q > sat_queue and not stop.triggered:
            t0, f0 = st["backlog_since"]
            span = env.now - t0
            cap = (st["finished_total"] - f0) / span if span > 0 and st["finished_total"] > f0 else None
            result.saturated = True
            result.capacity_req_per_s = cap
            cap_txt = f"{cap:.3g} req/s" if cap else "unknown (nothing finished while backlogged)"
            result.saturation = (f"saturated: replica {rep.idx}'s queue reached {q} waiting requests at "
                                 f"t={env.now:.1f} s; the deployment sustained about {cap_txt} while backlogged")
            stop.succeed()
            return True
        return False

    def arrivals_open():
        for i, req in enumerate(requests):
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            st["next_arrival"] = requests[i + 1].arrival_s if i + 1 < len(requests) else math.inf
            dispatch(req)
        # End of arrivals: a stable system has a short queue now; an overloaded one has been piling up
        # (lambda - mu) x T requests. More than `overload_fraction` of all arrivals still waiting = overloaded,
        # which catches runs too short for the queue to reach `saturation_queue`.
        # (Needs enough requests spread over time: a burst of a few requests at t=0 is not an overload.)
        waiting = sum(len(r.sched.waiting) for r in reps)
        if (len(requests) >= 50 and env.now > 0 and waiting > cfg.overload_fraction * len(requests)
                and not result.saturated):
            cap = st["finished_total"] / env.now
            result.saturated = True
            result.capacity_req_per_s = cap
            result.saturation = (f"saturated: {waiting} of {len(requests)} requests were still queued when the last "
                                 f"one arrived (t={env.now:.1f} s); about {cap:.3g} req/s were served")

    def user(u: int, spec: WorkloadSpec, issued: list[int]):
        while issued[0] < spec.num_requests:
            rid = issued[0]
            issued[0] += 1
            req = draw_attributes(spec, rng, 1, start_id=rid)[0]
            req.arrival_s = env.now
            done = env.event()
            waiters[rid] = done
            dispatch(req)
            yield done
            if spec.arrivals.think_s > 0:
                think = rng.exponential(spec.arrivals.think_s)
                st["next_arrival"] = min(st["next_arrival"], env.now + think)
                yield env.timeout(think)


    def engine(rep: _Replica):
        sched = rep.sched
        while True:
            if not sched.has_work:
                rep.wake = env.event()
                yield rep.wake
                rep.wake = None
                continue
            now = env.now
            st["events"] += 1
            k = sched.decode_stretch(cfg.max_stretch) if cfg.fast_forward else 0
            if k:
                run = sched.running
                durs = decode_run_s(cost, [s.computed for s in run], k)
                cum = np.cumsum(durs)
                if len(run) < max_seqs and st["next_arrival"] < now + cum[-1]:
                    # stop at the end of the step during which the next request arrives
                    j = int(np.searchsorted(cum, st["next_arrival"] - now, side="left"))
                    k = j + 1
                if k >= 2:
                    # ITL of the first step: the step itself for sequences that emitted at `now` (nearly
                    # all), the gap since their last token for the rest; then k-1 steps x every sequence.
                    first_end = now + float(cum[0])
                    same = 0
                    for s in run:
                        if s.last_token_s == now:
                            same += 1
                        else:
                            gap_v.append(first_end - s.last_token_s)
                            gap_t.append(first_end)
                    stretches.append((durs[:k], now + cum[:k], same, len(run)))
                    yield env.timeout(float(cum[k - 1]))
                    st["steps"] += k
                    finish(sched.advance_decodes(k, env.now), rep)
                    if cfg.timeseries:
                        ts.append((env.now, len(sched.waiting), len(sched.running), sched.pool.used, rep.idx))
                    continue
            out = sched.schedule(now)
            if isinstance(out, float):  # static batching: the batch window is open
                rep.wake = env.event()
                if math.isfinite(out):
                    yield env.any_of([rep.wake, env.timeout(max(0.0, out - now))])
                else:
                    yield rep.wake
                rep.wake = None
                continue
            if out.plan.num_tokens == 0:  # nothing schedulable until something arrives
                rep.wake = env.event()
                yield rep.wake
                rep.wake = None
                continue
            prev = [(s, s.last_token_s) for s, _ in out.scheduled if s.generated > 0]
            yield env.timeout(cost.step_s(out.plan))
            st["steps"] += 1
            end = env.now
            emitted, done = sched.complete(out, end)
            for s, t in prev:
                if s.last_token_s == end:  # it emitted a token in this step
                    gap_v.append(end - t)
                    gap_t.append(end)
            finish(done, rep)
            if cfg.timeseries:
                ts.append((env.now, len(sched.waiting), len(sched.running), sched.pool.used, rep.idx))
            if check_saturation(rep):
                return

    if closed:
        issued = [0]
        for u in range(workload.arrivals.users):
            env.process(user(u, workload, issued))
    else:
        if requests:
            st["next_arrival"] = requests[0].arrival_s
        env.process(arrivals_open())
    for rep in reps:
        env.process(engine(rep))
    until = stop if not math.isfinite(cfg.max_sim_s) else env.any_of([stop, env.timeout(cfg.max_sim_s)])
    try:
        env.run(until=until)
    except RuntimeError as exc:  # SimPy: "No scheduled events left but "until" event was not triggered"
        if "No scheduled events" not in str(exc):
            raise
    count(0)
    result.end_s = env.now
    result.time_in_system_area = st["area"]
    result.steps, result.events = st["steps"], st["events"]
    result.preemptions = sum(r.sched.num_preemptions for r in reps)
    if not result.saturated and math.isfinite(cfg.max_sim_s) and env.now >= cfg.max_sim_s:
        result.saturation = f"stopped at max_sim_s={cfg.max_sim_s} s with requests unfinished"
    seqs.sort(key=lambda s: (s.req.arrival_s, s.req.id))
    f = lambda attr: np.array([getattr(s, attr) for s in seqs], dtype=float)  # noqa: E731
    result.records = Records(
        arrival=np.array([s.req.arrival_s for s in seqs], dtype=float), first_scheduled=f("first_scheduled_s"),
        first_token=f("first_token_s"), finish=f("finish_s"),
        prompt_tokens=np.array([s.req.prompt_tokens for s in seqs], dtype=np.int64),
        output_tokens=np.array([s.req.output_tokens for s in seqs], dtype=np.int64),
        cls=np.array([s.req.cls for s in seqs], dtype=np.int64),
        preemptions=np.array([s.preemptions for s in seqs], dtype=np.int64),
        replica=np.array([s.replica for s in seqs], dtype=np.int64))
    for durs, ends, first_w, rest_w in stretches:
        w = np.full(len(durs), float(rest_w))
        w[0] = first_w
        itl_v.append(durs)
        itl_w.append(w)
        itl_t.append(ends)
    result.itl_values = np.concatenate([np.array(gap_v, dtype=float), *itl_v])
    result.itl_weights = np.concatenate([np.ones(len(gap_v)), *itl_w])
    result.itl_times = np.concatenate([np.array(gap_t, dtype=float), *itl_t])
    keep = result.itl_weights > 0
    result.itl_values, result.itl_weights, result.itl_times = (
        result.itl_values[keep], result.itl_weights[keep], result.itl_times[keep])
    result.timeseries = np.array(ts, dtype=float) if ts else np.empty((0, 5))
    return result


def littles_law(result: SimResult) -> tuple[float, float]:
    """(L, lambda x W) over [0, end]: time-average number in system from the simulator's own counter, and
    arrival rate x mean time in system from the per-request records. Equal when every request finished."""
    r = result.records
    T = result.end_s
    if T <= 0 or len(r) == 0:
        return (0.0, 0.0)
    sojourn = np.where(np.isnan(r.finish), T, r.finish) - r.arrival
    return (result.time_in_system_area / T, len(r) / T * float(sojourn.mean()))
