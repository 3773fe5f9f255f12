"""Where a long command is, and about how long it has left (issue 48: a piped 3-GPU comparison printed nothing
for minutes). A plan runs in phases (the rate search at each TP size, the frontier, the context trade-off, the
recommended configuration's search, the verification); a comparison runs one plan per option. Piped or
redirected, each phase that ran simulations ends with one line on stderr: the option, the phase, its
simulations and seconds, the time so far and an estimate of the time left. On a terminal the progress bar
names the phase. The estimate assumes the phases left cost what the finished ones did on average: a guide, not
a promise (a bisection's length depends on where the answer lies)."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def phase(executor, name: str, done: int, tps: int) -> None:
    """Tell an executor's progress which phase of a plan runs (of about tps + 5: a rate search per TP size, the
    frontier, the context trade-off, the recommended configuration, the verification, the trade-offs)."""
    phases = getattr(executor, "phases", None)
    if phases is not None:
        phases.begin(name, done, tps + 5)


def _dur(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Phases:
    """The phase a command is in. `option(i, n, label)` moves to the i-th of n compared options (one plan each);
    `begin(name, done, total)` to a phase of the current plan, `done` of about `total` phases finished;
    `count(n)` adds simulations run. Lines go to `stream` only when it is not a terminal (a terminal has the
    bar, whose description is `label`)."""

    QUIET_S = 5.0  # no line before the command has run this long: a quick plan (or its one-line error) stays clean

    def __init__(self, enabled: bool = True, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.piped = enabled and not (hasattr(self.stream, "isatty") and self.stream.isatty())
        self.clock = clock
        self.t0 = clock()
        self.options, self.index, self.option_label = 1, 0, ""
        self.name = ""
        self.fraction = 0.0  # of the whole command, at the end of the current phase
        self.started_fraction = 0.0  # and at its start (a dashboard's bar)
        self.started = self.t0
        self.sims = 0

    @property
    def label(self) -> str:
        where = f"{self.option_label} ({self.index + 1}/{self.options}): " if self.options > 1 else ""
        return where + (self.name or "simulating")

    def option(self, index: int, total: int, label: str) -> None:
        self.end()
        self.options, self.index, self.option_label = max(1, total), index, label
        self.fraction = index / self.options

    def begin(self, name: str, done: int = 0, total: int = 1) -> None:
        self.end()
        self.name = name
        self.started_fraction = (self.index + min(done, total) / max(1, total)) / self.options
        self.fraction = (self.index + min(done + 1, total) / max(1, total)) / self.options
        self.started, self.sims = self.clock(), 0

    def count(self, n: int) -> None:
        self.sims += n

    def end(self) -> None:
        """Close the current phase: its line, when piped and it ran simulations."""
        now = self.clock()
        if not (self.piped and self.name and self.sims) or now - self.t0 < self.QUIET_S:
            self.name, self.sims = "", 0
            return
        took, so_far = now - self.started, now - self.t0
        left = ""
        if 0 < self.fraction < 1:  # the time so far bought this fraction; the rest at the same pace
            left = f"; about {_dur(so_far * (1 - self.fraction) / self.fraction)} left"
        try:
            self.stream.write(f"[{_dur(so_far)}] {self.label}: {self.sims} simulation{'s' if self.sims != 1 else ''} in {_dur(took)}{left}\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr: progress is never worth failing for
            self.piped = False
        self.name, self.sims = "", 0
