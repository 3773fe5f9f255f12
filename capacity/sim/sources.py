"""Where requests come from: `OpenLoopSource` (generated or traced arrival times), `ClosedLoopUsers` (users
who send, wait for the answer, think, and send again; `DrivenUsers` the same without SimPy processes),
`CappedOpenLoop` (arrival times behind a client's cap on requests in flight) and `SessionUsers` (multi-turn
sessions, capacity.sessions). Wired by `capacity.sim.simulator.Simulation`.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from capacity.draws import draw_one
from capacity.sched.static import StaticScheduler
from capacity.sessions import first_turn, next_turn, session_starts
from capacity.sim.entities import runs_ahead
from capacity.workload import Request, WorkloadSpec

if TYPE_CHECKING:
    from capacity.sim.routing import Delay
    from capacity.sim.simulator import Simulation


def drives(sim: Simulation, users: int = 0) -> bool:
    """Whether the one engine can drive its source itself (`Replica.source`: no clock event per step or request):
    `runs_ahead` (asked before the source is set; async scheduling's input lag allowed: the source's events are
    handled after the step they come during is planned, as the clock handles them step by step), no time limit, not static batching (its batch window is a
    clock event), and fewer users than a queue that stops the run as saturated (the stop is a clock event that
    users answered at the same time would come before). A front end (`Delay`) is driven with the source where the
    clocked run goes step by step (users; an engine with the input lag); an open-loop source behind one, feeding an
    engine without the lag, stays a clock process (that engine runs ahead between entries, and which steps it
    groups into one decode stretch depends on what the clock has seen: driven, times could move by a rounding)."""
    rep = sim.replicas[0]
    return (not math.isfinite(sim.cfg.max_sim_s) and runs_ahead(rep, lag_ok=True)
            and not isinstance(rep.sched, StaticScheduler) and users <= sim.sat_queue)


def drive(sim: Simulation, src: Driven) -> None:
    """The one engine drives `src` (and the front end's deliveries, if there is one)."""
    sim.replicas[0].source = src
    if sim.delay is not None:
        sim.delay.driver, src.front = src, sim.delay


class Driven:
    """A source its engine drives (`Replica.source`, `Replica._arrivals`): when the next clock event of the source
    or of the front end's deliveries would fire (`due`, inf: none), that event's creation number (`eid`: SimPy
    orders events of one time by it), and the next number to give (`eids`: the engine takes one for each step's
    end, the front end one for each delivery). A subclass keeps its own next event in `own_due`, `own_eid`."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.due = math.inf
        self.eid = 0
        self.eids = 0
        self.own_due = math.inf
        self.own_eid = 0
        self.front: Delay | None = None  # the front end, driven with the source (its deliveries' events in `fires`)

    def start(self) -> None:
        """What the source does at time 0, before the engine's first step."""

    def own_pull(self) -> None:
        """The source's own next clock event (at `own_due`), handled."""

    def merge(self) -> None:
        """`due`, `eid`: the earlier of the source's next event and the front end's next delivery."""
        f = self.front
        if f is not None and f.fires and f.fires[0] < (self.own_due, self.own_eid):
            self.due, self.eid = f.fires[0]
        else:
            self.due, self.eid = self.own_due, self.own_eid

    def pull(self) -> None:
        """The next clock event (at `due`), handled: a delivery through the front end, or the source's own."""
        f = self.front
        if f is not None and f.fires and f.fires[0] < (self.own_due, self.own_eid):
            rec = self.sim.recorder
            rec.clock_s = f.fires[0][0]
            f.fire()
            rec.clock_s = -1.0
        else:
            self.own_pull()
        self.merge()

    def wake(self) -> float:
        """The engine is idle (asleep on its wake-up event): events in order until one admits a request, which
        creates that wake-up event; then the events of that time created before it (the engine resumes after
        them). The engine's time then (the last event's, if none admitted a request)."""
        rec = self.sim.recorder
        t = woke = self.due
        eid = -1
        while self.due < math.inf and (eid < 0 or (self.due == woke and self.eid < eid)):
            t = self.due
            n = rec.admitted_total
            self.pull()
            if eid < 0 and rec.admitted_total > n:
                woke, eid = t, self.eids
                self.eids += 1
        return t


class OpenLoopSource(Driven):
    """Requests at their generated (or traced) arrival times; at the end, the overload check of short runs.
    `requests` may be a stream (a replayed trace, `capacity.replay.iter_trace`): each is pulled when the clock
    reaches the one before it (the next arrival is the fast path's horizon), so only one waits in memory."""

    def __init__(self, sim: Simulation, requests: Iterable[Request]) -> None:
        super().__init__(sim)
        self.requests: Iterator[Request] = iter(requests)
        self.head: Request | None = next(self.requests, None)
        if self.head is not None:
            sim.next_arrival_s = self.head.arrival_s
        self.n = 0  # driven by its engine instead of run(): the requests sent so far

    def start(self) -> None:
        """Driven: what run() does at time 0 (the first of the clock's events)."""
        req = self.head
        if req is None:
            self.sim.check_overload(0, 0.0)
        elif req.arrival_s > 0.0:
            self.own_due, self.own_eid, self.eids = 0.0 + (req.arrival_s - 0.0), self.eids, self.eids + 1
        else:
            self.own_due = 0.0
            self.own_pull()
        self.merge()

    def own_pull(self) -> None:
        """Driven: what run() does when its clock event fires at `own_due`: the request due then, and any due at
        the same time, sent; the next event's time as the clock computes it (its time plus the gap)."""
        sim, t, req = self.sim, self.own_due, self.head
        sim.recorder.clock_s = t
        while req is not None:
            nxt = next(self.requests, None)
            sim.next_arrival_s = nxt.arrival_s if nxt is not None else math.inf
            sim.enter(req)
            self.n += 1
            req = nxt
            if req is not None and req.arrival_s > t:
                break
        sim.recorder.clock_s = -1.0
        self.head = req
        if req is None:
            self.own_due = math.inf
            sim.check_overload(self.n, t)
        else:
            self.own_due, self.own_eid, self.eids = t + (req.arrival_s - t), self.eids, self.eids + 1

    def run(self) -> Generator:
        sim, env, reqs = self.sim, self.sim.env, self.requests
        req, n = self.head, 0
        self.head = None
        while req is not None:
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            nxt = next(reqs, None)
            sim.next_arrival_s = nxt.arrival_s if nxt is not None else math.inf
            sim.enter(req)
            n += 1
            req = nxt
        sim.check_overload(n)


class ClosedLoopUsers(Driven):
    """`users` users, each: send, wait for the answer (or a rejection), think (exponential), repeat, until the
    workload's request count is issued.

    When an answer arrives, the user's next send time (now + think, drawn then) goes into a heap whose minimum is
    the simulation's `next_arrival_s`: the fast path stops a decode stretch at the step during which a user sends
    again, exactly as one step at a time would (a user answered at the end of a step, with no think time, joins
    the step after the one the engine has already started)."""

    def __init__(self, sim: Simulation, spec: WorkloadSpec) -> None:
        super().__init__(sim)
        self.spec = spec
        self.issued = 0
        self.promised = 0  # answered users that will send again (their due times are in `dues`)
        self.dues: list[float] = []

    def start(self) -> None:
        for _ in range(self.spec.arrivals.users or 0):
            self.sim.env.process(self.user())

    def answered(self, req: Request, now: float = -1.0) -> float | None:
        """A user got its answer at `now` (default: the clock's time): when it sends its next request, or None
        when the workload is issued."""
        if self.issued + self.promised >= self.spec.num_requests:
            return None
        self.promised += 1
        think = float(self.sim.rng.exponential(self.spec.arrivals.think_s)) if self.spec.arrivals.think_s > 0 else 0.0
        t = (now if now >= 0 else self.sim.env.now) + think
        heapq.heappush(self.dues, t)
        self.sim.next_arrival_s = self.dues[0]
        return t

    def user(self) -> Generator[Any, float | None, None]:  # sent: the answer's due time (mypyc checks it)
        sim, env, spec = self.sim, self.sim.env, self.spec
        while self.issued < spec.num_requests:
            rid = self.issued
            self.issued += 1
            req = draw_one(spec, sim.rng, rid)
            req.arrival_s = env.now
            done = env.event()
            sim.waiters[rid] = done
            sim.enter(req)
            due = yield done
            if due is None:
                return
            if due > env.now:
                yield env.timeout(due - env.now)
            heapq.heappop(self.dues)  # this user's due time: the smallest, as the clock has reached it
            self.promised -= 1
            sim.next_arrival_s = self.dues[0] if self.dues else math.inf


class DrivenUsers(ClosedLoopUsers):
    """The closed loop driven by its one engine (`drives`), as `OpenLoopSource` is: no user processes and no clock
    events. Each event a user's process would wait for is kept in `events` with its time and the creation number
    SimPy orders it by: the answer (created when the engine finishes or rejects the request, `answered`) and,
    after a think time, the wake-up (created when the answer is handled: after the engine has begun its next
    step, or in turn while it is idle). The engine handles them in that order (`Replica._arrivals`, `wake`), so
    each request is sent at the same time, in the same order, with the same draws as by `ClosedLoopUsers.user`."""

    def __init__(self, sim: Simulation, spec: WorkloadSpec) -> None:
        super().__init__(sim, spec)
        self.events: list[tuple[float, int, float]] = []  # (time, creation number, send time; < 0: a wake-up)

    def start(self) -> None:
        """Every user sends at time 0, in turn (each user process's first step)."""
        rec = self.sim.recorder
        rec.clock_s = 0.0
        for _ in range(self.spec.arrivals.users or 0):
            if self.issued >= self.spec.num_requests:
                break
            self._send(0.0)
        rec.clock_s = -1.0
        self._head()

    def _send(self, t: float) -> None:
        sim = self.sim
        rid = self.issued
        self.issued += 1
        req = draw_one(self.spec, sim.rng, rid)
        req.arrival_s = t
        sim.waiters[rid] = self  # Simulation.finish and .reject call answered() (which keeps the answer), then succeed()
        sim.enter(req)

    def succeed(self, due: float | None) -> None:
        """(The waiter's part: `answered` has kept the answer.)"""

    def answered(self, req: Request, now: float = -1.0) -> float | None:
        assert now >= 0  # the engine's time (it runs ahead of the clock)
        due = super().answered(req, now)
        if due is not None:
            heapq.heappush(self.events, (now, self.eids, due))
            self.eids += 1
            self._head()
        return due

    def _head(self) -> None:
        if self.events:
            self.own_due, self.own_eid = self.events[0][0], self.events[0][1]
        else:
            self.own_due = math.inf
        self.merge()

    def own_pull(self) -> None:
        """The next event: an answer after which the user thinks (its wake-up, created now, is kept), or an
        answer with no think time or a wake-up: the user sends now (as `ClosedLoopUsers.user` after its yield)."""
        sim = self.sim
        t, _, due = heapq.heappop(self.events)
        if due > t:  # the clock's time for the wake-up: t + (due - t), as a timeout of due - t from t lands
            heapq.heappush(self.events, (t + (due - t), self.eids, -1.0))
            self.eids += 1
        else:
            heapq.heappop(self.dues)
            self.promised -= 1
            sim.next_arrival_s = self.dues[0] if self.dues else math.inf
            sim.recorder.clock_s = t
            self._send(t)
            sim.recorder.clock_s = -1.0
        self._head()


def closed_loop(sim: Simulation, spec: WorkloadSpec) -> ClosedLoopUsers:
    """The closed loop's users: driven by the engine where it can (`drives`), else user processes (started)."""
    if drives(sim, spec.arrivals.users or 0):
        users: ClosedLoopUsers = DrivenUsers(sim, spec)
        drive(sim, users)
    else:
        users = ClosedLoopUsers(sim, spec)
        users.start()
    return users


def open_loop(sim: Simulation, requests: Iterable[Request]) -> OpenLoopSource:
    """The open-loop source: driven by the engine where it can (`drives`; behind a front end, only an engine with
    the input lag, whose clocked run goes step by step), else a clock process."""
    src = OpenLoopSource(sim, requests)
    if drives(sim) and (sim.delay is None or sim.replicas[0].lags_input):
        drive(sim, src)
    else:
        sim.env.process(src.run())
    return src


class CappedOpenLoop(ClosedLoopUsers):
    """Open-loop arrival times behind a client that keeps at most `max_concurrency` requests in flight, as `vllm
    bench serve --request-rate R --max-concurrency C` does (every request an asyncio task from its arrival, an
    asyncio.Semaphore(C) around the send; its clock starts after the semaphore, so TTFT leaves the wait at the
    client out). C slots: a slot freed by an answer (or a rejection) takes the oldest request not yet sent, at
    once if it has arrived, else at its arrival; `waits[id]` is a sent request's time at the client.

    The slots are the closed loop's users with "wait for the next arrival" in place of thinking, so the fast path's
    horizon (`next_arrival_s`, the earliest pending send) is kept the same way. Slots take requests in the order
    they are freed and send in id order (a send time is max(freed, arrival), both non-decreasing)."""

    def __init__(self, sim: Simulation, spec: WorkloadSpec, requests: list[Request]) -> None:
        super().__init__(sim, spec)
        self.requests = requests
        self.taken = 0  # requests given to a slot (sent, or due at their send time)
        self.sent = 0
        self.waits: dict[int, float] = {}

    def start(self) -> None:
        for _ in range(min(self.spec.arrivals.max_concurrency or 1, len(self.requests))):
            t = self._take()
            assert t is not None
            self.sim.env.process(self.slot(t))

    def _take(self) -> float | None:
        """A slot is free now: when it sends the oldest request not yet given to a slot (None: none left)."""
        if self.taken >= len(self.requests):
            return None
        t = max(self.sim.env.now, self.requests[self.taken].arrival_s)
        self.taken += 1
        heapq.heappush(self.dues, t)
        self.sim.next_arrival_s = self.dues[0]
        return t

    def answered(self, req: Request, now: float = -1.0) -> float | None:
        return self._take()

    def slot(self, due: float | None) -> Generator[Any, float | None, None]:
        sim, env = self.sim, self.sim.env
        while due is not None:
            if due > env.now:
                yield env.timeout(due - env.now)
            heapq.heappop(self.dues)
            sim.next_arrival_s = self.dues[0] if self.dues else math.inf
            req = self.requests[self.sent]
            self.waits[req.id] = env.now - req.arrival_s
            self.sent += 1
            req.arrival_s = env.now  # the tool's clock starts at the send
            done = env.event()
            sim.waiters[req.id] = done
            sim.enter(req)
            due = yield done


class SessionUsers(ClosedLoopUsers):
    """Multi-turn sessions (capacity.sessions): sessions start at the workload's arrival times; a session sends
    a turn, waits for its answer (or rejection), thinks, and sends the next turn, its context grown by the answer
    and new tokens, until its turns are done or the workload's request count is issued. A rejected turn ends its
    session. The next send times (session starts and turns due after thinking) are kept as the closed loop keeps
    its users' (`due`, whose minimum is the fast path's horizon)."""

    def __init__(self, sim: Simulation, spec: WorkloadSpec) -> None:
        super().__init__(sim, spec)
        self.starts = session_starts(spec, sim.rng, spec.num_requests)
        self.left: dict[int, int] = {}  # session -> turns still to send after the one in flight
        self.sessions = 0

    def start(self) -> None:
        self.sim.env.process(self.starter())

    def _wait(self, t: float) -> Generator:
        """Until `t`, kept in `due` meanwhile (the simulation's next arrival)."""
        sim = self.sim
        heapq.heappush(self.dues, t)
        sim.next_arrival_s = self.dues[0]
        if t > sim.env.now:
            yield sim.env.timeout(t - sim.env.now)
        heapq.heappop(self.dues)  # the smallest: the clock has reached it
        sim.next_arrival_s = self.dues[0] if self.dues else math.inf

    def _send(self, req: Request) -> Any:
        sim = self.sim
        self.issued += 1
        done = sim.env.event()
        sim.waiters[req.id] = done
        sim.enter(req)
        if self.issued == self.spec.num_requests:
            sim.check_overload(self.issued)
        return done

    def starter(self) -> Generator:
        for t in self.starts:
            if self.issued + self.promised >= self.spec.num_requests:
                return
            yield from self._wait(float(t))
            if self.issued + self.promised >= self.spec.num_requests:
                return
            req, turns = first_turn(self.spec, self.sim.rng, self.sessions, self.issued)
            req.arrival_s = self.sim.env.now
            self.sessions += 1
            self.left[req.session] = turns - 1
            # sent here, at the start time, so that no engine step at this instant misses it
            self.sim.env.process(self.session(req, self._send(req)))

    def answered(self, req: Request, now: float = -1.0) -> float | None:
        """A turn was answered (or rejected) now: when its session sends the next, or None when it ends."""
        sim, res = self.sim, self.sim.result
        rejected = bool(res.rejected) and res.rejected[-1][0] == req.id
        if rejected or self.left.get(req.session, 0) <= 0 or self.issued + self.promised >= self.spec.num_requests:
            self.left.pop(req.session, None)
            return None
        self.left[req.session] -= 1
        self.promised += 1
        sess = self.spec.sessions
        assert sess is not None
        t = sim.env.now + sess.think(sim.rng)
        heapq.heappush(self.dues, t)
        sim.next_arrival_s = self.dues[0]
        return t

    def session(self, req: Request, done: Any) -> Generator[Any, float | None, None]:
        sim, env = self.sim, self.sim.env
        while True:
            due = yield done
            if due is None:
                return
            if due > env.now:
                yield env.timeout(due - env.now)
            heapq.heappop(self.dues)  # this session's due time: the smallest, as the clock has reached it
            self.promised -= 1
            sim.next_arrival_s = self.dues[0] if self.dues else math.inf
            req = next_turn(self.spec, sim.rng, req, self.issued, env.now)
            done = self._send(req)
