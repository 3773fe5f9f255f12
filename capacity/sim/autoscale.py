"""Autoscaling a replica pool during a simulation: replicas start (after a start-up delay: model load and engine
start-up), serve, and drain (the router stops sending them requests; they leave once their in-flight requests are
done), as a Kubernetes HPA / KServe-style controller drives them.

Every `interval_s` the controller reads the pool and computes the replicas it wants:

- `concurrency`: ceil(requests in the pool (running + waiting) / target), the HPA rule on a per-replica average
  of in-flight requests (KServe/Knative's concurrency target);
- `queue`: ready x (1 + 1 per `target` requests waiting per ready replica), a queue-length rule;
- `kv`: ceil(KV blocks in use / (target x blocks per replica)), target being a share of the cache (0.8);
- `predictive`: ceil(rate(t + startup_s) / `per_replica_rate`), the arrival curve read ahead by the start-up
  delay and divided by the rate one replica sustains under the SLO (the planner's max_rate): with a perfect
  forecast and a correct per-replica rate, replicas are ready before the load comes;
- `sla`: a throughput-based planner with a correction factor, modelled on NVIDIA Dynamo's SLA planner: the last
  interval's arrival rate / `per_replica_rate`, corrected by observed / profiled TTFT and TPOT
  (capacity.sim.sla_planner, where its source is cited).

clamped to [min_replicas, max_replicas]. More than provisioned (ready + starting): start the difference, ready
`startup_s` later. Fewer, continuously for `cooldown_s`: drain the newest ready replicas (never below
min_replicas ready). GPU time counts every provisioned replica (starting, ready, draining) x GPUs per replica.

The run records each change of the pool (`Timeline`); `window_metrics` turns the per-request records into P99
TTFT/TPOT per window against an SLO (violation minutes), the output of `capacity autoscale`.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from capacity.errors import ConfigError

if TYPE_CHECKING:
    from capacity.curves import RateCurve
    from capacity.sim.entities import Replica
    from capacity.sim.metrics import Records
    from capacity.sim.routing import Router
    from capacity.sim.simulator import Simulation

POLICIES = ("concurrency", "queue", "kv", "predictive", "sla")


@dataclass(frozen=True)
class AutoscaleConfig:
    min_replicas: int = 1
    max_replicas: int = 8
    policy: Literal["concurrency", "queue", "kv", "predictive", "sla"] = "concurrency"
    target: float = 32.0  # concurrency: requests per replica; queue: waiting per ready replica; kv: cache share
    interval_s: float = 15.0  # the controller's period
    # the metric is averaged over this window before the rule is applied (Knative's stable window, 60 s):
    # in-flight requests as a time average (exact, from the simulation's time-in-system integral), queue and KV
    # as the mean of the controller's samples. 0: the instantaneous value.
    window_s: float = 60.0
    startup_s: float = 120.0  # from the decision to a replica that takes requests (model load + engine start)
    cooldown_s: float = 300.0  # scale down only after wanting fewer replicas for this long
    initial: int | None = None  # replicas ready at t=0 (default: min_replicas)
    per_replica_rate: float | None = None  # predictive: requests/s one replica sustains under the SLO
    curve: RateCurve | None = None  # predictive: the arrival curve it reads ahead (the workload's)
    # sla: the profile, what one replica shows at per_replica_rate (mean TTFT and TPOT, s; steady_point)
    profile_ttft_s: float | None = None
    profile_tpot_s: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"autoscale policy {self.policy!r}: use {', '.join(POLICIES)}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ConfigError(f"autoscale replicas: need 1 <= min ({self.min_replicas}) <= max ({self.max_replicas})")
        if self.max_replicas > 1024:
            raise ConfigError(f"autoscale max_replicas: at most 1024 (got {self.max_replicas})")
        for name in ("target", "interval_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"autoscale {name}: must be a finite number > 0 (got {v})")
        for name in ("startup_s", "cooldown_s", "window_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"autoscale {name}: must be a finite number >= 0 (got {v})")
        if self.initial is not None and not self.min_replicas <= self.initial <= self.max_replicas:
            raise ConfigError(f"autoscale initial: must be within [{self.min_replicas}, {self.max_replicas}] "
                              f"(got {self.initial})")
        if self.policy == "predictive" and (self.per_replica_rate is None or self.per_replica_rate <= 0
                                            or self.curve is None):
            raise ConfigError("autoscale policy predictive: needs per_replica_rate > 0 (a replica's max rate under "
                              "the SLO, from `capacity plan`) and curve arrivals")
        if self.policy == "sla" and (self.per_replica_rate is None or self.per_replica_rate <= 0
                                     or not self.profile_ttft_s or not self.profile_tpot_s):
            raise ConfigError("autoscale policy sla: needs per_replica_rate > 0 and the profile at that rate "
                              "(profile_ttft_s, profile_tpot_s > 0: capacity.plan.autoscale_bound.steady_point)")
        if self.policy == "kv" and self.target > 1:
            raise ConfigError(f"autoscale target: the kv policy's target is a share of the cache, <= 1 (got {self.target})")


@dataclass
class Timeline:
    """The pool over time: one row per change (and per controller decision)."""

    t: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)
    draining: list[int] = field(default_factory=list)
    desired: list[int] = field(default_factory=list)
    replica_seconds: float = 0.0  # integral of provisioned replicas (starting + ready + draining) over time

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(getattr(self, k)) for k in ("t", "ready", "starting", "draining", "desired")}


class Autoscaler:
    """The controller process of one pool, the replicas behind `router` (see the module docstring). Replicas
    beyond the ready set exist from the start but receive nothing until they are started and ready.

    `whole`: the pool holds every request in the system (an aggregated deployment), so the concurrency policy
    reads the exact time-average of requests in the system. A pool of a disaggregated deployment (prefill or
    decode) holds each request for part of its time only: its concurrency is the mean of the controller's
    samples of the requests its replicas hold (running + waiting), like the queue and KV policies' metrics."""

    def __init__(self, sim: Simulation, cfg: AutoscaleConfig, router: Router | None = None,
                 whole: bool = True) -> None:
        self.sim, self.cfg, self.whole = sim, cfg, whole
        self.router = router or sim.router
        n0 = cfg.initial if cfg.initial is not None else cfg.min_replicas
        self.ready: list[Replica] = self.router.replicas  # the router's list: mutated in place
        self.spare: list[Replica] = list(self.ready[n0:])  # never started, or drained and empty
        del self.ready[n0:]
        self.starting = 0
        self.draining: list[Replica] = []
        self.want_fewer_since: float | None = None
        self.timeline = Timeline()
        self._t_last = 0.0
        self._samples: deque[tuple[float, float, float]] = deque()  # (time, in-system integral, sample)
        self.sla = None
        if cfg.policy == "sla":
            from capacity.sim.sla_planner import SlaPlanner

            assert cfg.per_replica_rate and cfg.profile_ttft_s and cfg.profile_tpot_s
            self.sla = SlaPlanner(sim, cfg.per_replica_rate, cfg.profile_ttft_s, cfg.profile_tpot_s)
        self._record(n0)

    @property
    def provisioned(self) -> int:
        return len(self.ready) + self.starting + len(self.draining)

    def _record(self, desired: int) -> None:
        now = self.sim.env.now
        tl = self.timeline
        if tl.t:
            tl.replica_seconds += (now - self._t_last) * (tl.ready[-1] + tl.starting[-1] + tl.draining[-1])
        self._t_last = now
        tl.t.append(now)
        tl.ready.append(len(self.ready))
        tl.starting.append(self.starting)
        tl.draining.append(len(self.draining))
        tl.desired.append(desired)

    def _averaged(self, sample: float) -> tuple[float, float]:
        """(time-average of requests in the system, mean of `sample`) over the last window_s."""
        sim, cfg = self.sim, self.cfg
        now = sim.env.now
        rec = sim.recorder
        rec.count(0)  # bring the time-in-system integral up to now
        self._samples.append((now, rec.area, sample))
        while len(self._samples) > 1 and self._samples[0][0] < now - cfg.window_s - 1e-9:
            self._samples.popleft()
        t0, a0, _ = self._samples[0]
        in_flight = (rec.area - a0) / (now - t0) if now > t0 else float(rec.n_sys)
        return in_flight, sum(s for _, _, s in self._samples) / len(self._samples)

    def desired(self) -> int:
        cfg, ready = self.cfg, self.ready
        pool = ready + self.draining
        if cfg.policy == "concurrency":
            if self.whole:
                in_flight, _ = self._averaged(0.0)
            else:
                _, in_flight = self._averaged(sum(r.outstanding for r in pool))
            want = math.ceil(in_flight / cfg.target - 1e-9)
        elif cfg.policy == "queue":
            _, waiting = self._averaged(sum(r.num_waiting for r in pool) + len(self.router.queue))
            want = len(ready) + math.ceil(waiting / (cfg.target * max(1, len(ready))) - 1e-9)
        elif cfg.policy == "kv":
            _, used = self._averaged(sum(r.sched.kv_blocks_used for r in pool))
            want = math.ceil(used / (cfg.target * max(1, ready[0].sched.kv_blocks_total if ready else 1)) - 1e-9)
        elif self.sla is not None:
            want = self.sla.desired()
        else:
            assert cfg.curve is not None and cfg.per_replica_rate is not None
            ahead = float(cfg.curve.rate(self.sim.env.now + cfg.startup_s))
            want = math.ceil(ahead / cfg.per_replica_rate - 1e-9)
        return min(cfg.max_replicas, max(cfg.min_replicas, want))

    def _start_one(self, rep: Replica) -> Generator:
        if self.cfg.startup_s > 0:
            yield self.sim.env.timeout(self.cfg.startup_s)
        self.starting -= 1
        self.ready.append(rep)
        self.router.pull()  # router "queue": what waits there goes to the new replica now
        self._record(self.timeline.desired[-1])

    def _drain_one(self) -> None:
        rep = self.ready.pop()  # the newest: the router sends it nothing from now on
        self.draining.append(rep)

    def _reap(self) -> None:
        """Drained replicas with nothing left in flight leave the pool."""
        done = [r for r in self.draining if not r.has_work]
        if done:
            self.draining = [r for r in self.draining if r.has_work]
            self.spare.extend(done)

    def run(self) -> Generator:
        env, cfg = self.sim.env, self.cfg
        while True:
            yield env.timeout(cfg.interval_s)
            if self.sim.stop.triggered:
                return
            if self.sim.next_arrival_s == math.inf and not any(r.has_work for r in self.sim.replicas):
                return  # every request is answered and none will come: the run may end
            self._reap()
            want = self.desired()
            have = len(self.ready) + self.starting
            if want > have:
                self.want_fewer_since = None
                for _ in range(min(want - have, len(self.spare))):
                    self.starting += 1
                    env.process(self._start_one(self.spare.pop()))
            elif want < have:
                if self.want_fewer_since is None:
                    self.want_fewer_since = env.now
                if env.now - self.want_fewer_since >= cfg.cooldown_s:
                    for _ in range(min(have - want, len(self.ready) - cfg.min_replicas)):
                        self._drain_one()
                    self.want_fewer_since = None
            else:
                self.want_fewer_since = None
            self._record(want)

    def close(self) -> Timeline:
        self._reap()
        self._record(self.timeline.desired[-1])
        return self.timeline


def window_metrics(records: Records, window_s: float, slo_ttft_s: float | None = None,
                   slo_tpot_s: float | None = None, pct: float = 99.0) -> dict[str, np.ndarray]:
    """P99 (or `pct`) TTFT and TPOT of the requests arriving in each window of `window_s`, their counts, and
    whether each window met the SLO (a window with no requests meets it). Requests that never finished count
    as infinitely late."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise ConfigError(f"window_s: must be a finite number > 0 (got {window_s})")
    arr = records.arrival
    if arr.size == 0:
        return {**{k: np.zeros(0) for k in ("start_s", "requests", "ttft_s", "tpot_s")}, "met": np.zeros(0, dtype=bool)}
    n = int(math.floor(float(arr.max()) / window_s)) + 1
    if n > 1_000_000:
        raise ConfigError(f"window_s {window_s:g}: {n:,} windows, too many (at most 1,000,000)")
    idx = np.minimum((arr // window_s).astype(np.int64), n - 1)
    ttft = np.where(np.isfinite(records.first_token), records.first_token - arr, np.inf)
    out_tok = records.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(np.isfinite(records.finish) & (out_tok > 1),
                        (records.finish - records.first_token) / np.maximum(out_tok - 1, 1), np.nan)
        tpot = np.where(np.isfinite(records.finish), tpot, np.inf)
    p_ttft, p_tpot, count = np.full(n, np.nan), np.full(n, np.nan), np.bincount(idx, minlength=n)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n + 1))
    for w in range(n):
        sel = order[bounds[w]:bounds[w + 1]]
        if sel.size:
            p_ttft[w] = np.percentile(ttft[sel], pct, method="inverted_cdf")
            tp = tpot[sel]
            tp = tp[~np.isnan(tp)]
            if tp.size:
                p_tpot[w] = np.percentile(tp, pct, method="inverted_cdf")
    met = np.ones(n, dtype=bool)
    if slo_ttft_s is not None:
        met &= ~(p_ttft > slo_ttft_s)
    if slo_tpot_s is not None:
        met &= ~(p_tpot > slo_tpot_s)
    return {"start_s": np.arange(n) * window_s, "requests": count.astype(float), "ttft_s": p_ttft, "tpot_s": p_tpot,
            "met": met}
