"""Where requests go between the clock's events: `Router` sends each request to a replica (round-robin, least
outstanding, or from one queue at the router to whichever replica has room) or rejects what a replica can never
run; `Delay` is a fixed latency in front of the router (the front end); `KVTransfer` moves a finished prefill's
KV cache to the decode pool over a link that carries one transfer at a time. Wired by
`capacity.sim.simulator.Simulation`.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import simpy

from capacity.workload import Request

if TYPE_CHECKING:
    from capacity.sched.base import Seq
    from capacity.sim.entities import Replica
    from capacity.sim.simulator import Disaggregation, Simulation
    from capacity.sim.sources import Driven


# SGLang's cache-aware router (sgl-router / SMG `--policy cache_aware`): the load counts as imbalanced when the
# busiest replica holds more than BALANCE_ABS requests above the idlest AND more than BALANCE_REL times as many;
# then it routes by load, else by cache (its defaults: --balance-abs-threshold 64, --balance-rel-threshold 1.5)
BALANCE_ABS, BALANCE_REL = 64, 1.5


def imbalanced(most: int, least: int) -> bool:
    """SGLang's cache-aware router's test on the busiest and the idlest replica's requests (see above)."""
    return most - least > BALANCE_ABS and most > BALANCE_REL * least


class Router:
    """Dispatch to replicas: round-robin, least outstanding, session affinity, or one FIFO queue at the router
    ("queue").

    "affinity" sends a multi-turn session's next turn (capacity.sessions) to the replica that served its last
    one, whose prefix cache holds its context, unless the load is imbalanced (SGLang's cache-aware rule above,
    its prefix-tree match reduced to the session's last replica); a session's first turn, a request of no
    session and an imbalanced pool go to the least outstanding replica.

    "queue" holds every request at the router and sends the head to the least-loaded replica with fewer than
    `max_ongoing` requests (default: the replica's max_num_seqs) the moment one has room: at an arrival, or
    when a replica finishes one (Ray Serve's `max_ongoing_requests`, Knative's `containerConcurrency` with its
    activator queue). With one request per replica that pool is the textbook M/G/c queue. A request waiting
    here counts as in the system (Little's law, the autoscaler's in-flight metric). Rejects what a replica can
    never run."""

    def __init__(self, sim: Simulation, replicas: list[Replica], policy: str, max_ongoing: int | None = None) -> None:
        self.sim, self.replicas, self.policy = sim, replicas, policy
        self.rr = 0
        self.queue: deque[Request] = deque()
        self.max_ongoing = max_ongoing
        self.home: dict[int, Replica] = {}  # "affinity": session -> the replica of its last turn
        for rep in replicas:
            rep.router = self

    def pick(self, req: Request | None = None) -> Replica:
        if self.policy == "round_robin":
            rep = self.replicas[self.rr % len(self.replicas)]
            self.rr += 1
            return rep
        least = min(self.replicas, key=lambda r: (r.outstanding, r.idx))
        if self.policy != "affinity" or req is None or req.session < 0:
            return least
        home = self.home.get(req.session)
        if home is None or home not in self.replicas:  # a first turn, or its replica left the pool
            rep = least
        else:
            rep = least if imbalanced(max(r.outstanding for r in self.replicas), least.outstanding) else home
        self.home[req.session] = rep
        return rep

    def dispatch_seq(self, seq: Seq) -> bool:
        """A sequence from the prefill pool (disaggregated serving) to a decode replica; False if it cannot run
        there (rejected)."""
        rep = self.pick()
        why = rep.sched.admissible(seq.req)
        if why:
            self.sim.recorder.count(-1)  # it leaves the system unanswered
            self.sim.reject(seq.req, f"decode pool: {why}")
            return False
        rep.resume(seq)
        return True

    def from_front_end(self, req: Request) -> None:
        """A request through the server's front end (Simulation.enter counted it in the system at its send)."""
        self.sim.recorder.count(-1)  # the replica (or this router's queue) counts it again from here
        self.dispatch(req)

    def dispatch(self, req: Request) -> None:
        if self.policy == "queue":
            why = self.replicas[0].sched.admissible(req) if self.replicas else ""
            if why:
                self.sim.reject(req, why)
                return
            self.sim.recorder.count(+1)  # in the system from now, though no replica holds it yet
            self.queue.append(req)
            self.pull()
            return
        rep = self.pick(req)
        why = rep.sched.admissible(req)
        if why:
            self.sim.reject(req, why)
            return
        rep.admit(req)

    def pull(self) -> None:
        """Send queued requests to replicas with room, least outstanding first (ties: the lowest index)."""
        q = self.queue
        while q:
            best = None
            for r in self.replicas:
                n = r.outstanding
                if n < (self.max_ongoing or r.sched.max_running) and (best is None or n < best[0]):
                    best = (n, r)
            if best is None:
                return
            best[1].admit(q.popleft(), counted=True)


class Delay:
    """A fixed latency: `put(item)` now, `deliver(item)` is called `latency_s` later (after its `work_s` on one
    serial worker, if any), in order. Each item's delivery time is known when it is put (the worker is FIFO), so
    it costs one timeout event and no process: a plan's front end at every request is cheap."""

    def __init__(self, env: simpy.Environment, latency_s: float, deliver: Callable[[Any], None]) -> None:
        self.env, self.latency_s, self.deliver = env, latency_s, deliver
        self.due: deque[float] = deque()  # delivery times of items not yet delivered, in order
        self.items: deque[Any] = deque()  # the items, in the same order
        self.busy_until = 0.0  # when the serial worker of put(work_s) is free
        # driven with its source by the one engine (capacity.sim.sources.drive): no timeout per item, but its
        # time as the clock computes it and its creation number (from the source's count), a heap
        self.driver: Driven | None = None
        self.fires: list[tuple[float, int]] = []

    def put(self, item: Any, work_s: float = 0.0, now: float = -1.0, lag_s: float = 0.0) -> None:
        """`work_s`: time on one serial worker first (the server's tokeniser thread), FIFO (capacity.engine.frontend),
        after `lag_s` of the item's own (a pool's work, side by side with other items: capacity.engine.image_cpu).
        `now`: the time (default: the clock's; a driven source's own)."""
        now = now if now >= 0 else self.env.now
        t = now + lag_s
        if work_s > 0:
            t = self.busy_until = max(t, self.busy_until) + work_s
        t += self.latency_s
        if self.due and t < self.due[-1]:  # in order: never before the item put ahead of it
            t = self.due[-1]
        self.due.append(t)
        self.items.append(item)
        drv = self.driver
        if drv is None:
            self.env.timeout(t - now).callbacks.append(self._fire)
        else:
            heapq.heappush(self.fires, (now + (t - now), drv.eids))
            drv.eids += 1
            drv.merge()

    def fire(self) -> None:
        """Driven: the next delivery's clock event, handled (the caller gives the recorder its time)."""
        heapq.heappop(self.fires)
        self._fire(None)

    def _fire(self, _event: Any) -> None:
        self.due.popleft()
        self.deliver(self.items.popleft())

    @property
    def next_due_s(self) -> float:
        return self.due[0] if self.due else math.inf


class KVTransfer:
    """The KV cache of a finished prefill, moved to the decode pool as vLLM's NIXL connector moves it (0.32,
    nixl/pull_scheduler.py): the request goes to a decode replica as soon as its prefill is done (the proxy
    sends it on), the prefill replica keeps its blocks (`request_finished` delays the free), the decode replica
    admits it with blocks for its whole prompt and reads the KV (`start`): `latency_s + bytes / bandwidth` on a
    link that carries one transfer at a time (a SimPy Resource), so concurrent transfers queue for it. One link
    per prefill replica (its NIC, or its NVLink to the decode GPUs) or one link shared by the whole prefill
    pool. When it is read, the prefill replica frees its blocks and the decode replica runs the request."""

    def __init__(self, sim: Simulation, spec: Disaggregation, prefill_replicas: int | None = None) -> None:
        """`prefill_replicas`: the prefill pool's size when it differs from the spec's (an autoscaled pool: its
        most replicas, each with its link)."""
        self.sim, self.spec = sim, spec
        n = 1 if spec.link_mode == "shared" else (prefill_replicas or spec.prefill_replicas)
        self.links = [simpy.Resource(sim.env, capacity=1) for _ in range(n)]
        self.waits: list[float] = []  # per transfer: time queued for the link, s
        self.times: list[float] = []  # per transfer: time on the link, s
        self.source: dict[Seq, int] = {}  # a finished prefill -> its prefill replica, until its KV is read

    def hold(self, seq: Seq) -> None:
        """A prefill is done: on to a decode replica; its KV stays on the prefill replica until read."""
        self.source[seq] = seq.replica
        if not self.sim.decode_router.dispatch_seq(seq):  # no decode replica can run it: nothing will read it
            self.sim.replicas[self.source.pop(seq)].released(seq)

    def start(self, seq: Seq) -> None:
        """A decode replica admitted it (its blocks taken): the read begins."""
        src = self.source[seq]
        link = self.links[0 if len(self.links) == 1 else src]
        self.sim.env.process(self._go(seq, link))

    def _go(self, seq: Seq, link: simpy.Resource) -> Generator:
        env, sp = self.sim.env, self.spec
        t0 = env.now
        with link.request() as got:
            yield got
            t1 = env.now
            dt = sp.latency_s + seq.prompt * sp.kv_bytes_per_token / sp.bandwidth_bytes_per_s
            yield env.timeout(dt)
        self.waits.append(t1 - t0)
        self.times.append(dt)
        replicas = self.sim.replicas
        replicas[self.source.pop(seq)].released(seq)
        replicas[seq.replica].loaded(seq)
