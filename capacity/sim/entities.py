"""The simulator's entities. Each owns its state and, where it has one, its SimPy process (`run()`):

- `Replica`: one engine instance: its scheduler, its step loop, the exact decode fast path.

`capacity.sim.routing` holds the Router, the front end's Delay and the KV transfer of disaggregated serving;
`capacity.sim.sources` the open-loop source and the closed-loop users; `capacity.sim.recorder` the `Recorder`
(per-request timelines, ITL samples, time series, the time-in-system integral) that a Replica fills.

`capacity.sim.simulator.Simulation` wires them together and holds what they share (the clock, the stop
event, the time of the next arrival that the fast path must not run past).
"""
from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from capacity.cost.step import decode_run_s, first_step_ending_at
from capacity.sched.base import NAN
from capacity.sim.lag import SCHED_CALL, InputLag
from capacity.workload import Request

if TYPE_CHECKING:
    from capacity.sched.base import Scheduler, Seq
    from capacity.sim.routing import Router
    from capacity.sim.simulator import Simulation
    from capacity.sim.sources import Driven


def lags_input(sched: Any) -> bool:
    """Does the engine take requests a step late (`Replica._take_lagged`): async scheduling or an overlap one?"""
    return bool(getattr(getattr(sched, "cfg", None), "async_scheduling", False) or getattr(sched, "overlap", False))


def runs_ahead(rep: Replica, lag_ok: bool = False) -> bool:
    """Whether nothing but the next request's entry can touch this engine or read its state between two of its
    steps: then it applies the steps that end before that entry (or the time limit) one after another without a
    clock event for each (the same steps, times and records: the clock is only how long the others wait). One
    engine fed by an open-loop source (a front-end delay included), no one waiting on its answers (closed-loop
    users, a client's cap), no router queue, no autoscaling, disaggregation, shared device or input lag (`lag_ok`:
    an engine that drives its source takes its input at the same points as step by step, `sources.drives`)."""
    sim = rep.sim
    return (len(sim.replicas) == 1 and rep.device is None and (lag_ok or not rep.lags_input) and rep.role == "both"
            and sim.users is None and sim.transfer is None and not sim.queue_routers and sim.autoscaler is None
            and sim.decode_autoscaler is None and sim.cfg.services is None)


class Replica:
    """One engine: asks its scheduler for a step, advances the clock by the step's cost, applies it; decode-only
    stretches run as one event with exact per-step durations (`decode_run_s`)."""

    def __init__(self, sim: Simulation, idx: int, sched: Scheduler, role: str = "both", cost=None) -> None:
        self.sim, self.idx, self.sched = sim, idx, sched
        self.role = role  # both | prefill | decode (disaggregated serving)
        self.cost = cost if cost is not None else sim.cost
        self.wake_event: simpy.Event | None = None
        self.proc: simpy.Process | None = None
        self.device: simpy.Resource | None = None  # a GPU shared with other models' replicas (one step at a time)
        self.swap: tuple[float, float] | None = None  # swap mode on that device: (sleep_s, swap_s) of this model
        self.stretching = False  # in a decode stretch that a new request or a delivered sequence may cut
        self.cut_before = 0.0  # the start of the stretch's last step: a request that comes earlier cuts it
        self.router: Router | None = None  # the router that sends it requests (set by the router)
        # async scheduling's input lag (`capacity.sim.lag`): what came and is not yet taken by a schedule call, the
        # time of the last call, whether it gave the GPU work
        self.lags_input = lags_input(sched)
        self.lagged = InputLag()
        self.schedule_s = NAN
        self.busy = False
        # running ahead (`runs_ahead`): the engine's own time, at or past the clock's, up to which its steps are
        # applied; the clock is brought there only when something else could happen first
        self.ahead = False
        self.vt = 0.0
        self.source: Driven | None = None  # its source, when it drives it (Simulation.run): no clock at all

    @property
    def outstanding(self) -> int:
        """Requests sent here and not finished (a router's count), those in the engine's input queue with them."""
        return self.sched.outstanding + self.lagged.requests

    @property
    def num_waiting(self) -> int:
        return self.sched.num_waiting + self.lagged.requests

    @property
    def has_work(self) -> bool:
        return self.sched.has_work or bool(self.lagged)

    def admit(self, req: Request, counted: bool = False) -> None:
        """`counted`: already in the system's count (it waited in the router's queue)."""
        if self.busy:  # async scheduling, a step in flight: the engine takes it between two schedule calls
            if not counted:
                self.sim.recorder.count(+1)
            self.lagged.hold("new", req, self.sim.recorder.now())
            self._cut()
            return
        self._enter(req, counted)
        self._cut()
        self._wake()

    def _take_lagged(self, before_s: float) -> None:  # the held input that came before the last call, taken
        for kind, obj in self.lagged.take(before_s):
            self._apply(kind, obj)

    def _apply(self, kind: str, obj: Any) -> None:
        if kind == "new":
            self._enter(obj, True)
        else:  # disaggregated serving: a handoff, a KV read done here, a KV read from here done
            getattr(self.sched, SCHED_CALL[kind])(obj)

    def _take(self, kind: str, seq: Seq) -> None:
        """Input from the other pool: taken now, or held while a step runs (async scheduling: `capacity.sim.lag`)."""
        if self.busy:
            self.lagged.hold(kind, seq, self.sim.env.now)
        else:
            self._apply(kind, seq)

    def _enter(self, req: Request, counted: bool) -> None:
        seq = self.sched.add(req)
        seq.replica = self.idx
        if self.role == "prefill":  # the prefill pool computes the prompt and samples the first token only
            seq.output, seq.phase = 1, 1
        self.sim.recorder.admitted(seq, counted)

    def _cut(self) -> None:
        """A request or a sequence came during a decode stretch that did not foresee it (a closed-loop user
        answered by another replica, a KV transfer): stop the stretch at the end of the step in progress, where
        a step-by-step run would first see it. One that comes during the stretch's last step needs no cut."""
        if (self.stretching and self.sim.env.now < self.cut_before and self.proc is not None
                and len(self.sched.running) < self.sched.max_running):
            self.stretching = False
            self.proc.interrupt("arrival")

    def resume(self, seq: Seq) -> None:
        """A sequence from the prefill pool, its KV transferred: decoded here (the decode pool). Deliveries come
        at times no one knew when a decode stretch began, so one that arrives during a stretch cuts it at the
        end of the step in progress, exactly where a step-by-step run would first see it."""
        seq.replica = self.idx
        self._take("resume", seq)
        self._cut()
        self._wake()

    def released(self, seq: Seq) -> None:
        """A decode replica has read the KV of a prefill done here: its blocks are free (it may admit more)."""
        self._take("released", seq)
        self._wake()

    def loaded(self, seq: Seq) -> None:
        """A sequence admitted here has its prompt's KV now (disaggregated serving): it can run (a stretch in
        progress is cut as for a delivery)."""
        self._take("loaded", seq)
        self._cut()
        self._wake()

    def _wake(self) -> None:
        if self.wake_event is not None and not self.wake_event.triggered:
            self.wake_event.succeed()

    def _sleep(self, until: float | None = None) -> Generator:
        env = self.sim.env
        self.wake_event = env.event()
        if until is not None and math.isfinite(until):
            yield env.any_of([self.wake_event, env.timeout(max(0.0, until - env.now))])
        else:
            yield self.wake_event
        self.wake_event = None

    def _horizon(self) -> float:
        """Running ahead: the engine may apply steps that end before this without yielding to the clock (the next
        request's entry, or the run's time limit)."""
        sim = self.sim
        nxt = sim.next_arrival_s if sim.delay is None else sim.next_entry_s()
        return min(nxt, sim.cfg.max_sim_s)

    def _arrivals(self, end: float) -> None:
        """Driving its source: a step (or decode stretch) begun now ends at `end`; the source's arrivals that the
        clock would have run before that end (earlier, or at the same time from an event created earlier), first,
        at their times."""
        src = self.source
        assert src is not None
        eid = src.eids  # the step's end: the clock event it would be, created now
        src.eids += 1
        while src.due < end or (src.due == end and src.eid < eid):
            src.pull()

    def _sync(self) -> Generator:
        """The clock brought to the engine's own time (`vt`) after it ran ahead (an exact landing, checked when
        `vt` moved)."""
        env = self.sim.env
        if self.vt != env.now:
            yield env.timeout(self.vt - env.now)

    def run(self) -> Generator:
        sim, sched, rec = self.sim, self.sched, self.sim.recorder
        env, cost, cfg = sim.env, self.cost, sim.cfg
        line = getattr(cost, "decode_line", None)
        self.ahead = runs_ahead(self)
        self.vt = env.now
        src = self.source
        if src is not None:
            src.start()
        while True:
            if not self.has_work:
                self.busy = False
                if src is not None and src.due < math.inf:  # idle until the next request: it comes now
                    self.vt = src.wake()
                    continue
                yield from self._sync()
                yield from self._sleep()
                self.vt = env.now
                continue
            now = self.vt
            sim.events += 1
            if self.device is not None:
                yield from (self._swap_turn() if self.swap is not None else self._shared_step())
                self.vt = env.now
                if sim.stop.triggered:
                    return
                continue
            if self.lagged:  # async scheduling: what came before the last schedule call is in the queue now
                self._take_lagged(self.schedule_s)
            # (a stretch would not see the requests still held back: step by step until they are taken)
            k = sched.decode_stretch(cfg.max_stretch) if cfg.fast_forward and not self.lagged else 0
            if k and (yield from self._decode_run(k, line)):
                continue
            out = sched.schedule(now)
            if isinstance(out, float):  # static batching: the batch window is open
                yield from self._sync()
                yield from self._sleep(out)
                self.vt = env.now
                continue
            for s in out.loads:  # disaggregated: admitted with their prompt's blocks, their KV read now
                sim.transfer.start(s)  # type: ignore[union-attr]
            if self.lags_input:
                self.schedule_s = now
                self.busy = out.plan.num_tokens > 0
                if self.lagged and not self.busy:  # nothing to run: an idle engine takes its input at once
                    self._take_lagged(math.inf)
                    continue
            if out.plan.num_tokens == 0:  # nothing schedulable until something arrives
                if sched.num_waiting and getattr(sched, "retired_after", False):
                    continue  # blocks just freed after the decision (async scheduling): the engine asks again
                if src is not None and src.due < math.inf:  # nothing runnable until the next request
                    self.vt = src.wake()
                    continue
                yield from self._sync()
                yield from self._sleep()
                self.vt = env.now
                continue
            # ITL of the tokens this step emits: the sequences that emitted at `now` (the end of this replica's
            # previous step: nearly the whole batch) are decodes, which always emit, and share one sample
            # weighted by their count; the others (after a pause or a preemption) are looked at one by one
            last = [s.last_token_s for s, _ in out.scheduled]
            same = last.count(now)
            prev = None
            if same + last.count(NAN) < len(last):
                prev = [(s, t) for (s, _), t in zip(out.scheduled, last) if t != now and s.generated > 0]
            dur = cost.step_s(out.plan) + out.load_s
            end = now + dur
            if src is not None:
                self._arrivals(end)
            else:
                t = env.now
                if not (self.ahead and end < self._horizon() and t + (end - t) == end):  # else: run ahead
                    if t == now:
                        yield env.timeout(dur)
                    elif t + (end - t) == end:
                        yield env.timeout(end - t)
                    else:  # (a step's end the clock cannot reach from where it is in one timeout: two)
                        yield env.timeout(now - t)
                        yield env.timeout(dur)
            self.vt = end
            sim.steps += 1
            drafts = getattr(sched, "drafts_accepted", 0)
            emitted, done = sched.complete(out, end)
            rec.tokens_total += len(emitted) + getattr(sched, "drafts_accepted", 0) - drafts
            if same:
                rec.gap_v.append(end - now)
                rec.gap_t.append(end)
                rec.gap_w.append(same)
            if prev:
                rec.gaps(prev, end)
            if done:
                sim.finish(done, end)
            if rec.timeseries:
                rec.sample(self, end)
            if self.vt != env.now and self.num_waiting > sim.sat_queue and not sim.offline:
                yield from self._sync()  # the run may stop here: the clock must be at its time
            if sim.check_saturation(self, end):
                return


    def _decode_run(self, k: int, line) -> Generator[Any, Any, bool]:
        """Up to k decode-only steps as one event, with exact per-step times: the stretch stops at the end of the
        step during which the next request arrives, or, cut by one nobody foresaw (a closed-loop user answered
        by another replica, a KV transfer), at the end of the step in progress. With a cost whose decode steps
        grow linearly (`decode_line`: step j lasts f0 + g j) the step ends are closed-form, each stop the root of
        a quadratic, and the ITL samples scalars expanded at the end; else the cost's `decode_run_s` array.
        False (nothing done) if the next request arrives during the first step: a normal step instead."""
        sim, sched, rec, env = self.sim, self.sched, self.sim.recorder, self.sim.env
        now, run = self.vt, sched.running
        nxt = sim.next_arrival_s if sim.delay is None else sim.next_entry_s()
        cuts = len(run) < sched.max_running  # an arrival can be admitted: it ends the stretch
        cum = None
        if line is not None:
            f0, g = line([s.computed for s in run])
            end_k = f0 * k + g * (k * (k - 1) // 2)  # the end of step k, from `now`
            if cuts and nxt < now + end_k:
                k = first_step_ending_at(f0, g, nxt - now, k)
                end_k = f0 * k + g * (k * (k - 1) // 2)
        else:
            durs = decode_run_s(self.cost, [s.computed for s in run], k)
            cum = np.cumsum(durs)
            if cuts and nxt < now + cum[k - 1]:
                k = int(np.searchsorted(cum[:k], nxt - now, side="left")) + 1
            end_k = float(cum[k - 1])
        if k < 2:
            return False
        # ITL of the first step: the step itself for sequences that emitted at `now` (nearly all), the gap since
        # their last token for the rest; then k - 1 steps x every sequence
        lasts = [s.last_token_s for s in run]
        same = lasts.count(now)
        if same < len(lasts):
            first_end = now + (f0 if cum is None else float(cum[0]))
            for last in lasts:
                if last != now:
                    rec.gap_v.append(first_end - last)
                    rec.gap_t.append(first_end)
                    rec.gap_w.append(1)
        end = now + end_k
        interrupted = False
        if self.source is not None:
            self._arrivals(end)
        elif not (self.ahead and end < self._horizon() and env.now + (end - env.now) == end):  # else: run ahead
            t = env.now
            self.stretching = True
            self.cut_before = now + (f0 * (k - 1) + g * ((k - 1) * (k - 2) // 2) if cum is None else
                                     float(cum[k - 2]))
            try:
                if t == now:
                    yield env.timeout(end_k)
                elif t + (end - t) == end:  # (ahead: no interrupt can come, see `runs_ahead`)
                    yield env.timeout(end - t)
                else:
                    yield env.timeout(now - t)
                    yield env.timeout(end_k)
            except simpy.Interrupt:  # an unforeseen request: stop at the end of the step in progress
                interrupted = True
        if interrupted:  # (outside the except block: mypyc leaks a handled exception past a yield inside one)
            x = env.now - now
            if cum is None:
                k = first_step_ending_at(f0, g, x, k)
                end_k = f0 * k + g * (k * (k - 1) // 2)
            else:
                k = int(np.searchsorted(cum[:k], x, side="left")) + 1
                end_k = float(cum[k - 1])
            stop = now + end_k
            while env.now < stop:
                try:
                    yield env.timeout(stop - env.now)
                except simpy.Interrupt:
                    pass
            end = env.now
        self.stretching = False
        self.vt = end
        if cum is None:  # the ITL samples as scalars, expanded at the end
            rec.lines.append((now, f0, g, k, same, len(run)))
        else:
            rec.stretches.append((durs[:k], now + cum[:k], same, len(run)))
        sim.steps += k
        rec.tokens_total += k * len(run)
        # the start of its last step, the step-by-step run's last schedule call (k = 1 after a cut: not cum[-1])
        self.schedule_s = now + (f0 * (k - 1) + g * ((k - 1) * (k - 2) // 2) if cum is None else
                                 float(cum[k - 2]) if k > 1 else 0.0)
        sim.finish(sched.advance_decodes(k, end), end)
        if rec.timeseries:
            rec.sample(self, end)
        return True

    def _swap_turn(self) -> Generator:
        """Swap mode: take the device, make this model resident if it is not (the resident one sleeps, this one
        wakes), then run step by step until nothing is left in flight; the model stays resident after."""
        sim, env, dev = self.sim, self.sim.env, self.device
        assert dev is not None and self.swap is not None
        out = None
        with dev.request() as req:
            yield req
            prev = getattr(dev, "resident", None)
            if prev is not self:
                sim.swaps.append((env.now, prev.idx if prev is not None else -1, self.idx))
                yield env.timeout((prev.swap[0] if prev is not None and prev.swap else 0.0) + self.swap[1])
                dev.resident = self  # type: ignore[attr-defined]
            while self.has_work and not sim.stop.triggered:  # resident: steps back to back
                out = self._plan(env.now)
                if out is None:
                    continue
                if isinstance(out, float) or out.plan.num_tokens == 0:
                    break  # nothing runnable now: give the device up until something arrives
                yield from self._run_step(out)
        if self.sched.has_work and not sim.stop.triggered:
            yield from self._sleep(out if isinstance(out, float) else None)

    def _run_step(self, out) -> Generator:
        sim, sched, rec, env = self.sim, self.sched, self.sim.recorder, self.sim.env
        sim.events += 1
        prev = [(s, s.last_token_s) for s, _ in out.scheduled if s.generated > 0]
        yield env.timeout(self.cost.step_s(out.plan) + out.load_s)
        sim.steps += 1
        end = env.now
        drafts = getattr(sched, "drafts_accepted", 0)
        emitted, done = sched.complete(out, end)
        rec.tokens_total += len(emitted) + getattr(sched, "drafts_accepted", 0) - drafts
        rec.gaps(prev, end)
        if done:
            sim.finish(done)
        if rec.timeseries:
            rec.sample(self)
        sim.check_saturation(self)

    def _plan(self, now: float):
        """A step planned at `now` by an engine that steps one at a time (a shared device), with async
        scheduling's input lag (`capacity.sim.lag`); None: nothing to run, held input just taken (ask again)."""
        if self.lagged:
            self._take_lagged(self.schedule_s)
        out = self.sched.schedule(now)
        if self.lags_input:
            self.schedule_s, self.busy = now, not (isinstance(out, float) or out.plan.num_tokens == 0)
            if self.lagged and not self.busy:  # an idle engine takes its input at once
                self._take_lagged(math.inf)
                return None
        return out

    def _shared_step(self) -> Generator:
        """One step on a device shared with other models (capacity.sim.simulator.Service). The engine plans it
        when it asks for the device: its CPU schedules and launches the step, whose kernels then wait their turn,
        so a request that comes while it waits is not in it."""
        assert self.device is not None
        out = self._plan(self.sim.env.now)
        if out is not None and not isinstance(out, float) and out.plan.num_tokens:
            with self.device.request() as req:
                yield req
                yield from self._run_step(out)
        elif out is not None and not (self.sched.num_waiting and getattr(self.sched, "retired_after", False)):
            yield from self._sleep(out if isinstance(out, float) else None)  # (else blocks were freed: ask again)
