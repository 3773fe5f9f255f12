"""Where requests come from: `OpenLoopSource` (generated or traced arrival times) and `ClosedLoopUsers` (users
who send, wait for the answer, think, and send again). Wired by `capacity.sim.simulator.Simulation`.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from capacity.workload import Request, WorkloadSpec, draw_attributes

if TYPE_CHECKING:
    from capacity.sim.simulator import Simulation


class OpenLoopSource:
    """Requests at their generated (or traced) arrival times; at the end, the overload check of short runs."""

    def __init__(self, sim: Simulation, requests: list[Request]) -> None:
        self.sim, self.requests = sim, requests
        if requests:
            sim.next_arrival_s = requests[0].arrival_s

    def run(self) -> Generator:
        sim, env, reqs = self.sim, self.sim.env, self.requests
        for i, req in enumerate(reqs):
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            sim.next_arrival_s = reqs[i + 1].arrival_s if i + 1 < len(reqs) else math.inf
            sim.enter(req)
        sim.check_overload(len(reqs))


class ClosedLoopUsers:
    """`users` users, each: send, wait for the answer (or a rejection), think (exponential), repeat, until the
    workload's request count is issued.

    When an answer arrives, the user's next send time (now + think, drawn then) goes into a heap whose minimum is
    the simulation's `next_arrival_s`: the fast path stops a decode stretch at the step during which a user sends
    again, exactly as one step at a time would (a user answered at the end of a step, with no think time, joins
    the step after the one the engine has already started)."""

    def __init__(self, sim: Simulation, spec: WorkloadSpec) -> None:
        self.sim, self.spec = sim, spec
        self.issued = 0
        self.promised = 0  # answered users that will send again (their due times are in `due`)
        self.due: list[float] = []

    def start(self) -> None:
        for _ in range(self.spec.arrivals.users or 0):
            self.sim.env.process(self.user())

    def answered(self) -> float | None:
        """A user got its answer now: when it sends its next request, or None when the workload is issued."""
        if self.issued + self.promised >= self.spec.num_requests:
            return None
        self.promised += 1
        think = float(self.sim.rng.exponential(self.spec.arrivals.think_s)) if self.spec.arrivals.think_s > 0 else 0.0
        t = self.sim.env.now + think
        heapq.heappush(self.due, t)
        self.sim.next_arrival_s = self.due[0]
        return t

    def user(self) -> Generator[Any, float | None, None]:  # sent: the answer's due time (mypyc checks it)
        sim, env, spec = self.sim, self.sim.env, self.spec
        while self.issued < spec.num_requests:
            rid = self.issued
            self.issued += 1
            req = draw_attributes(spec, sim.rng, 1, start_id=rid)[0]
            req.arrival_s = env.now
            done = env.event()
            sim.waiters[rid] = done
            sim.enter(req)
            due = yield done
            if due is None:
                return
            if due > env.now:
                yield env.timeout(due - env.now)
            heapq.heappop(self.due)  # this user's due time: the smallest, as the clock has reached it
            self.promised -= 1
            sim.next_arrival_s = self.due[0] if self.due else math.inf
