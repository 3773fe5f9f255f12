"""`Recorder`: everything a run measures: per-request timelines, ITL samples (single steps and whole decode runs),
time series of queue, batch and KV use, the time-in-system integral (Little's law) and the finished count
(saturation). Moved out of `capacity.sim.entities`, whose `Replica` fills it.

Bounded per request: a long run (a replayed trace of a million requests) would otherwise hold every request's
`Seq` and `Request` objects and its ITL samples as Python floats (32 bytes each) to the end (with the time series,
6.5 kB a request measured: docs/traces.md, "Memory").
With `compact_at` set (`Simulation` sets it where nothing else reads the sequences back: one model, no autoscaling,
no disaggregation, no client cap), once that many sequences are held the finished ones are folded into one row of
`COLUMNS` float64s each (88 bytes a request), and once `compact_at` ITL sample groups are held they are folded into
arrays of (value, weight, time) float64s (24 bytes a sample; a sample is a step's group of sequences, not a token).
The arrays `records()` and `itl()` return are the same as without folding (`records` in the same order; the ITL
samples in another order, which no statistic of them depends on)."""
from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np
import simpy

from capacity.sim.metrics import Records

if TYPE_CHECKING:
    from capacity.sched.base import Seq
    from capacity.sim.entities import Replica

# a folded request's row: Records' fields (the last six whole numbers, exact in float64 below 2**53) and its id
COLUMNS = ("arrival", "first_scheduled", "first_token", "finish", "prompt_tokens", "output_tokens", "cls",
           "preemptions", "replica", "cached_tokens", "id")
COMPACT_AT = 1 << 16  # sequences (or ITL groups) held before the finished ones are folded into arrays


def _row(s: Seq) -> tuple[float, ...]:
    q = s.req
    return (q.arrival_s, s.first_scheduled_s, s.first_token_s, s.finish_s, q.prompt_tokens, q.output_tokens, q.cls,
            s.preemptions, s.replica, s.cached_tokens, q.id)


class Recorder:
    """Everything measured during a run (see module docstring); `records()` and `itl()` build the arrays once."""

    def __init__(self, env: simpy.Environment, timeseries: bool) -> None:
        self.env = env
        self.timeseries = timeseries
        self.seqs: list[Seq] = []  # held sequences (all of them unless folded: `compact_at`)
        self.compact_at = 0  # 0: never fold
        self.folded: list[np.ndarray] = []  # (rows, len(COLUMNS)) float64 blocks of finished requests
        self.admitted_total = 0  # sequences recorded, folded or not, and the sum of their output lengths
        self.output_total = 0
        self.n_sys = 0
        self.clock_s = -1.0  # >= 0: the time of an event an engine handles ahead of the clock (OpenLoopSource.pull)
        self.area = 0.0  # integral of requests in system over time
        self.t_last = 0.0
        self.finished_total = 0
        self.tokens_total = 0  # output tokens emitted (the capacity estimate of an overloaded run counts them)
        # (start, finished, tokens, in flight) at the start of the queue's backlog
        self.backlog_since: tuple[float, int, int, int] | None = None
        self.gap_v: array = array("d")  # ITL samples of single steps
        self.gap_t: array = array("d")
        self.gap_w: array = array("d")  # how many tokens saw each (those that emitted at the step's start share one)
        self.stretches: list[tuple[np.ndarray, np.ndarray, int, int]] = []  # durations, ends, first weight, rest
        # decode runs whose step j lasts f0 + g x j (a linear cost): (start, f0, g, steps, first weight, rest)
        self.lines: list[tuple[float, float, float, int, int, int]] = []
        self.itl_folded: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.ts: list[tuple[float, int, int, int, int]] = []

    def now(self) -> float:
        """The time of the event being handled: a driven source's own (`clock_s`), else the clock's."""
        return self.clock_s if self.clock_s >= 0 else self.env.now

    def count(self, delta: int, t: float = -1.0) -> None:
        """Requests in the system change by `delta` at `t` (default: the clock's time; an engine running ahead of
        the clock gives its own, `capacity.sim.entities.runs_ahead`)."""
        now = t if t >= 0 else self.clock_s if self.clock_s >= 0 else self.env.now
        self.area += self.n_sys * (now - self.t_last)
        self.t_last = now
        self.n_sys += delta

    def admitted(self, seq: Seq, counted: bool = False) -> None:
        self.seqs.append(seq)
        self.admitted_total += 1
        self.output_total += seq.output
        if not counted:
            self.count(+1)
        if self.compact_at and len(self.seqs) >= self.compact_at:
            self._fold_seqs()
        if self.compact_at and len(self.stretches) + len(self.lines) + len(self.gap_v) >= self.compact_at:
            self._fold_itl()

    @property
    def mean_output(self) -> float:
        """Mean output length of the requests recorded so far."""
        return self.output_total / self.admitted_total if self.admitted_total else 0.0

    def finished(self, seq: Seq, t: float = -1.0) -> None:
        self.count(-1, t)
        self.finished_total += 1

    def gaps(self, prev: list[tuple[Seq, float]], end: float) -> None:
        """ITL samples of a step that ended at `end`: each sequence of (sequence, its previous token time) that
        emitted a token in it."""
        for s, t in prev:
            if s.last_token_s == end:
                self.gap_v.append(end - t)
                self.gap_t.append(end)
                self.gap_w.append(1)

    def sample(self, rep: Replica, t: float = -1.0) -> None:
        """One time-series row at `t` (default: now; callers check `timeseries` first: this runs at every engine
        event)."""
        s = rep.sched
        self.ts.append((self.env.now if t < 0 else t, rep.num_waiting, len(s.running), s.kv_blocks_used, rep.idx))

    def _fold_seqs(self) -> None:
        """The finished sequences into a block of rows; the rest stay (their times are still to come)."""
        done = [s for s in self.seqs if s.finish_s == s.finish_s]  # not NaN
        if done:
            self.folded.append(np.array([_row(s) for s in done], dtype=float))
            self.seqs = [s for s in self.seqs if s.finish_s != s.finish_s]
        # a backlog of unfinished sequences: fold again only when it has doubled (no quadratic rescans)
        self.compact_at = max(self.compact_at, 2 * len(self.seqs))

    def _fold_itl(self) -> None:
        self.itl_folded.append(self._itl_parts(held=False))
        self.gap_v, self.gap_t, self.gap_w = array("d"), array("d"), array("d")
        self.stretches, self.lines = [], []

    def records(self) -> Records:
        if self.folded:  # rows of every request, in (arrival, id) order, as below
            rows = np.concatenate(self.folded + [np.array([_row(s) for s in self.seqs], dtype=float).reshape(
                -1, len(COLUMNS))])
            self.folded, self.seqs = [rows], []  # all folded now (a second call gives the same)
            order = np.lexsort((rows[:, 10], rows[:, 0]))
            col = {k: rows[order, i] if i < 4 else rows[order, i].astype(np.int64) for i, k in enumerate(COLUMNS[:10])}
            return Records(**col)
        seqs = sorted(self.seqs, key=lambda s: (s.req.arrival_s, s.req.id))

        def f(attr: str, dtype: type = float, req: bool = False) -> np.ndarray:
            return np.array([getattr(s.req if req else s, attr) for s in seqs], dtype=dtype)

        return Records(arrival=f("arrival_s", req=True), first_scheduled=f("first_scheduled_s"),
                       first_token=f("first_token_s"), finish=f("finish_s"),
                       prompt_tokens=f("prompt_tokens", np.int64, True), output_tokens=f("output_tokens", np.int64, True),
                       cls=f("cls", np.int64, True), preemptions=f("preemptions", np.int64),
                       replica=f("replica", np.int64), cached_tokens=f("cached_tokens", np.int64))

    def itl(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, weights, emission times) of every ITL sample; a decode run's step counts once per sequence."""
        return self._itl_parts()

    def _itl_parts(self, held: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The samples not yet folded, and with `held` those folded before them."""
        old = self.itl_folded if held else []
        vs = [np.array(self.gap_v, dtype=float)] + [f[0] for f in old]
        ws = [np.array(self.gap_w, dtype=float)] + [f[1] for f in old]
        ts = [np.array(self.gap_t, dtype=float)] + [f[2] for f in old]
        for durs, ends, first_w, rest_w in self.stretches:
            w = np.full(len(durs), float(rest_w))
            w[0] = first_w
            vs.append(durs)
            ws.append(w)
            ts.append(ends)
        if self.lines:  # expanded at once: step j of a run lasts f0 + g j and ends f0 (j + 1) + g j (j + 1) / 2 in
            # (first_ws, rest_ws: arrays, not the loop's ints above: mypyc keeps one type per local)
            start, f0, g, k, first_ws, rest_ws = np.array(self.lines, dtype=float).T
            steps = k.astype(np.int64)
            heads = np.cumsum(steps) - steps
            j = np.arange(int(steps.sum())) - np.repeat(heads, steps)
            f0r, gr = np.repeat(f0, steps), np.repeat(g, steps)
            vs.append(f0r + gr * j)
            ts.append(np.repeat(start, steps) + (f0r * (j + 1) + gr * (j * (j + 1) // 2)))
            w = np.repeat(rest_ws, steps)
            w[heads] = first_ws
            ws.append(w)
        v, w, t = np.concatenate(vs), np.concatenate(ws), np.concatenate(ts)
        keep = w > 0
        return v[keep], w[keep], t[keep]

    def timeseries_array(self) -> np.ndarray:
        return np.array(self.ts, dtype=float) if self.ts else np.empty((0, 5))
