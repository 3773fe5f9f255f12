"""Workloads: who arrives when, with how many prompt and output tokens, in which class.

A `WorkloadSpec` (pydantic, from YAML/JSON or CLI flags) describes arrivals (Poisson, Gamma with a CV knob
for burstiness, constant, closed-loop users with think time, a trace, or a Poisson process whose rate follows a
`RateCurve` such as a daily load curve), length distributions (fixed, uniform, lognormal, empirical), request
classes with their priority and SLOs, and shared-prefix groups (system prompts / templates, for prefix caching).
`generate(spec, rng)` draws the open-loop requests; all randomness comes from the `np.random.Generator` passed in,
so a run is reproducible from its seed.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capacity.errors import ConfigError
from capacity.files import read_mapping, read_text, short, validate

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(gt=0)]


@dataclass(slots=True)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cls: int = 0  # index into WorkloadSpec.classes
    priority: int = 0  # lower is served first (vLLM convention)
    prefix_group: int = -1  # -1: no shared prefix
    prefix_tokens: int = 0  # leading prompt tokens shared with the group
    service: int = 0  # which model serves it, in a simulation of several (capacity.sim.simulator.Service)


class _Strict(BaseModel):
    # strict: `true` is not a rate, "8" is not a count, 8.0 is not a whole number of requests
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Lengths(_Strict):
    """Token-count distribution. fixed: `value`; uniform: [low, high]; lognormal: `mean` and `cv` (of the
    lognormal itself, not of its log), clipped to [low, high]; empirical: draw from `values`."""

    kind: Literal["fixed", "uniform", "lognormal", "empirical"] = "fixed"  # the distribution; each kind needs its fields below
    value: PosInt | None = None  # fixed: the length, tokens
    low: PosInt = 1  # uniform: lowest length; lognormal: clipped below here
    high: PosInt | None = None  # uniform: highest length; lognormal: clipped above here (none: no cap)
    mean: PosFloat | None = None  # lognormal: mean length, tokens
    cv: PosFloat | None = None  # lognormal: coefficient of variation (sd / mean) of the length
    values: list[PosInt] | None = None  # empirical: lengths drawn uniformly from this list

    @model_validator(mode="after")
    def _check(self) -> Lengths:
        need = {"fixed": ("value",), "uniform": ("high",), "lognormal": ("mean", "cv"), "empirical": ("values",)}
        for f in need[self.kind]:
            if getattr(self, f) is None:
                raise ValueError(f"{self.kind} lengths need `{f}`")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.kind == "empirical" and not self.values:
            raise ValueError("empirical lengths need at least one value")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # the validator guarantees the fields each kind needs (value; high; values; mean and cv)
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, (self.high or self.low) + 1, size=n)
        if self.kind == "empirical":
            return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
        cv, mean = float(self.cv or 0.0), float(self.mean or 0.0)
        sigma2 = np.log1p(cv ** 2)
        mu = np.log(mean) - sigma2 / 2
        x = np.rint(rng.lognormal(mu, np.sqrt(sigma2), size=n)).astype(np.int64)
        return np.clip(x, self.low, self.high if self.high is not None else np.iinfo(np.int64).max)

    @property
    def expected(self) -> float:
        if self.kind == "fixed":
            return float(self.value or 0)
        if self.kind == "uniform":
            return (self.low + (self.high or self.low)) / 2
        if self.kind == "empirical":
            return float(np.mean(self.values or [0]))
        return float(self.mean or 0.0)


def fixed(n: int) -> Lengths:
    return Lengths(kind="fixed", value=n)


MAX_CURVE_POINTS = 100_000  # points in one rate curve (an hourly year is 8,760; a per-second day 86,400)


class _Knots:
    """A curve's points as arrays (the rate times `scale`), built once per use: rate and cumulative count at any
    time in closed form. Segment i runs from x[i] to the next point (to `period` for the last one of a periodic
    curve, forever for a non-periodic one) with rate r[i] + slope[i] * (t - x[i])."""

    def __init__(self, c: RateCurve) -> None:
        pts = np.asarray(c.points, dtype=float).reshape(-1, 2)
        self.x, self.r = pts[:, 0].copy(), pts[:, 1] * c.scale
        self.period = c.period_s
        n = self.x.size
        ends = np.append(self.x[1:], self.period if self.period is not None else self.x[-1])
        width = ends - self.x  # the last segment of a non-periodic curve has no end (width 0 here)
        self.slope = np.zeros(n)
        if c.shape == "linear":
            nxt = np.append(self.r[1:], self.r[0] if self.period is not None else self.r[-1])  # a period wraps to t=0
            np.divide(nxt - self.r, width, out=self.slope, where=width > 0)
        seg = self.r * width + self.slope * width ** 2 / 2  # expected arrivals over each (finite) segment
        self.cum = np.concatenate(([0.0], np.cumsum(seg)[:-1]))  # expected arrivals in [0, x[i]]
        self.per_period = float(np.sum(seg))  # periodic: expected arrivals in one period

    def _at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(periods before t, segment index, time into the segment) for each t."""
        if self.period is not None:
            k = np.floor(t / self.period)
            tau = t - k * self.period
        else:
            k, tau = np.zeros_like(t), t
        i = np.clip(np.searchsorted(self.x, tau, side="right") - 1, 0, self.x.size - 1)
        return k, i, np.maximum(tau - self.x[i], 0.0)

    def rate(self, t: np.ndarray) -> np.ndarray:
        _, i, u = self._at(t)
        out = self.r[i] + self.slope[i] * u
        return out if self.period is not None else np.where(t < 0, 0.0, out)  # nothing arrives before t=0

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        k, i, u = self._at(t)
        out = k * self.per_period + self.cum[i] + self.r[i] * u + self.slope[i] * u ** 2 / 2
        return out if self.period is not None else np.where(t <= 0, 0.0, out)


def _points_problem(t: np.ndarray, r: np.ndarray) -> tuple[int, str] | None:
    """(index, what is wrong) for the first bad point of a curve, or None (index -1: the curve as a whole)."""
    if t.size == 0:
        return -1, "a curve needs at least one point"
    if t.size > MAX_CURVE_POINTS:
        return -1, f"{t.size:,} points, more than the {MAX_CURVE_POINTS:,} allowed (MAX_CURVE_POINTS)"
    nonfinite = np.flatnonzero(~np.isfinite(t) | ~np.isfinite(r))
    if nonfinite.size:
        i = int(nonfinite[0])
        return i, f"t={t[i]:g}, rate={r[i]:g}: times and rates must be finite numbers"
    if t[0] != 0:
        return 0, f"the first point must be at t=0 (got t={t[0]:g})"
    back = np.flatnonzero(np.diff(t) <= 0)
    if back.size:
        i = int(back[0]) + 1
        return i, f"t={t[i]:g} is not after the previous point's t={t[i - 1]:g} (times must increase strictly)"
    negative = np.flatnonzero(r < 0)
    if negative.size:
        i = int(negative[0])
        return i, f"rate {r[i]:g} is negative"
    if not np.any(r > 0):
        return -1, "every rate is 0: a curve needs a positive rate somewhere"
    return None


class RateCurve(_Strict):
    """An arrival rate that varies with time (a daily load curve): `points` (t_s, rate_per_s) from t=0 in
    increasing time. step: a rate holds until the next point; linear: interpolated between points. With
    `period_s` the curve repeats (86400: a day; a linear curve runs from its last point back to the first
    point's rate at t=period_s); without it, the last point's rate holds forever. Rates are multiplied by `scale`."""

    points: list[tuple[float, float]]  # (t_s, rate_per_s) pairs, t from 0 strictly increasing, rates >= 0
    shape: Literal["step", "linear"] = "step"  # step: piecewise constant; linear: interpolated between points
    period_s: PosFloat | None = None  # the curve repeats with this period, s (86400: a day); None: it does not
    scale: PosFloat = 1.0  # every rate is multiplied by this (the same day at twice the traffic: 2)

    @field_validator("points", mode="before")
    @classmethod
    def _pairs(cls, v: object) -> object:
        # YAML and JSON give [t, rate] lists; a pair is a tuple to pydantic's strict mode. Bounded before the
        # items are validated, so a million-point file costs no validation time.
        if isinstance(v, list):
            if len(v) > MAX_CURVE_POINTS:
                raise ValueError(f"{len(v):,} points, more than the {MAX_CURVE_POINTS:,} allowed (MAX_CURVE_POINTS)")
            return [tuple(p) if isinstance(p, list) else p for p in v]
        return v

    @model_validator(mode="after")
    def _check(self) -> RateCurve:
        pts = np.asarray(self.points, dtype=float).reshape(-1, 2)
        bad = _points_problem(pts[:, 0], pts[:, 1])
        if bad is not None:
            raise ValueError(f"points[{bad[0]}]: {bad[1]}" if bad[0] >= 0 else f"points: {bad[1]}")
        last = float(pts[-1, 0])
        if self.period_s is not None and self.period_s <= last:
            raise ValueError(f"period_s {self.period_s:g} must be after the last point's t={last:g} "
                             "(the point at t=period_s is the point at t=0)")
        if not math.isfinite(float(pts[:, 1].max()) * self.scale):
            raise ValueError(f"scale {self.scale:g} times the largest rate {pts[:, 1].max():g} is not finite")
        return self

    def rate(self, t: np.ndarray | float) -> np.ndarray:
        """The arrival rate (requests/s) at each time in `t`, s (0 before t=0 unless the curve is periodic)."""
        return _Knots(self).rate(np.asarray(t, dtype=float))

    def cumulative(self, t: np.ndarray | float) -> np.ndarray:
        """Expected arrivals in [0, t] for each time in `t` (the integral of the rate, exact for both shapes)."""
        return _Knots(self).cumulative(np.asarray(t, dtype=float))

    def integral(self, t0: float, t1: float) -> float:
        """Expected arrivals in [t0, t1], s: the integral of the rate, exact (closed form), across periods."""
        if not t1 >= t0:
            raise ValueError(f"integral: t1={t1} is before t0={t0}")
        c = _Knots(self).cumulative(np.array([t0, t1], dtype=float))
        return float(c[1] - c[0])

    @property
    def max_rate(self) -> float:
        """The highest rate anywhere, requests/s (at a point: between points a linear curve is in between)."""
        return max(r for _, r in self.points) * self.scale

    @property
    def tail_rate(self) -> float | None:
        """A non-periodic curve's rate after its last point (None for a periodic curve)."""
        return None if self.period_s is not None else self.points[-1][1] * self.scale

    @property
    def mean_rate(self) -> float:
        """Mean rate, requests/s: over one period; without a period over the span of the points, [0, last t]
        (a single point: its rate; the rate held after the last point does not count)."""
        span = self.period_s if self.period_s is not None else self.points[-1][0]
        return self.integral(0.0, span) / span if span > 0 else self.max_rate


class Arrivals(_Strict):
    """poisson: exponential gaps at `rate_per_s`; gamma: Gamma gaps with coefficient of variation `cv`
    (cv=1 is Poisson, >1 bursty); constant: equal gaps; closed: `users` each send, wait for the answer,
    think `think_s` (exponential with that mean), repeat; trace: timestamps from `trace`; offline: every request
    at t=0 (a batch job: `vllm bench throughput`, MLPerf Offline), measured by its makespan; curve: a Poisson
    process whose rate follows `curve` or `curve_file` (a daily load curve; one curve for the whole workload,
    classes drawn by weight as for the others; a curve per class is a later step)."""

    kind: Literal["poisson", "gamma", "constant", "closed", "trace", "offline", "curve"] = "poisson"  # arrival process (see above)
    rate_per_s: PosFloat | None = None  # requests/s, all replicas (a plan supplies it from its target)
    cv: PosFloat = 1.0  # gamma: coefficient of variation of the gaps (1 = Poisson, > 1 bursty)
    users: PosInt | None = None  # closed: concurrent users
    think_s: NonNegFloat = 0.0  # closed: mean think time between a reply and the next request, s
    curve: RateCurve | None = None  # curve: the rate over time, inline (or curve_file)
    curve_file: str | None = None  # curve: a CSV or YAML rate curve file (see load_curve), read when requests are drawn
    duration_s: PosFloat | None = None  # curve: stop at this time, s, even with fewer than num_requests arrived

    @model_validator(mode="after")
    def _check(self) -> Arrivals:
        # rate_per_s may be left out of a planning scenario (the planner supplies it); generate() checks it
        if self.kind == "closed" and self.users is None:
            raise ValueError("closed-loop arrivals need users")
        if self.kind == "curve":
            if (self.curve is None) == (self.curve_file is None):
                raise ValueError("curve arrivals need one of curve (inline points) or curve_file")
            if self.rate_per_s is not None:
                raise ValueError(f"rate_per_s {self.rate_per_s:g}: curve arrivals take their rate from the curve "
                                 "(scale it with curve.scale)")
        else:
            for f in ("curve", "curve_file", "duration_s"):
                if getattr(self, f) is not None:
                    raise ValueError(f"{f}: only curve arrivals take it (kind is {self.kind})")
        if self.users is not None:
            _bounded("users", self.users, "users")
        return self

    def rate_curve(self) -> RateCurve:
        """The curve of curve arrivals: inline, or read from curve_file (a ConfigError names the file)."""
        if self.curve is not None:
            return self.curve
        if self.curve_file is None:
            raise ConfigError(f"arrivals: {self.kind} arrivals have no rate curve")
        return load_curve(self.curve_file)


class RequestClass(_Strict):
    name: str = "default"  # unique; results are reported per class under it
    weight: PosFloat = 1.0  # share of arrivals
    priority: int = 0  # lower is served first
    input_len: Lengths | None = None  # None: the spec's default
    output_len: Lengths | None = None  # this class's output lengths (None: the workload's)
    slo_ttft_s: PosFloat | None = None  # this class's TTFT SLO, s (goodput; the planner holds the class to it)
    slo_tpot_s: PosFloat | None = None  # this class's TPOT SLO, s


class PrefixGroups(_Strict):
    """`groups` distinct shared prefixes of `tokens` each; a request has one with probability `share`."""

    groups: PosInt = 1  # distinct shared prefixes (system prompts, templates)
    tokens: PosInt
    share: Annotated[float, Field(ge=0, le=1)] = 1.0  # probability that a request carries one


class WorkloadSpec(_Strict):
    arrivals: Arrivals = Arrivals(rate_per_s=1.0)  # who arrives when
    input_len: Lengths = fixed(1024)  # prompt tokens per request
    output_len: Lengths = fixed(256)  # output tokens per request
    num_requests: PosInt = 1000  # requests per simulation
    classes: list[RequestClass] = [RequestClass()]  # request classes (interactive, batch ...), drawn by weight
    prefix: PrefixGroups | None = None  # shared prefixes, for prefix caching
    trace: str | None = None  # JSONL/CSV path for kind=trace or empirical replay

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        _bounded("requests", self.num_requests, "num_requests")
        if self.arrivals.kind == "trace" and not self.trace:
            raise ValueError("trace arrivals need `trace` (a JSONL or CSV file)")
        if not self.classes:
            raise ValueError("classes: need at least one class")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: names must be unique (got {names})")
        return self

    def class_lengths(self, c: int) -> tuple[Lengths, Lengths]:
        k = self.classes[c]
        return k.input_len or self.input_len, k.output_len or self.output_len

    @property
    def mean_output_tokens(self) -> float:
        w = np.array([k.weight for k in self.classes])
        return float(sum(wi * self.class_lengths(i)[1].expected for i, wi in enumerate(w / w.sum())))


def interarrival_gaps(arr: Arrivals, rng: np.random.Generator, n: int) -> np.ndarray:
    if arr.kind == "curve":
        raise ConfigError("arrivals.kind curve: the gaps change with time; draw the times with curve_arrivals()")
    if arr.rate_per_s is None:
        raise ConfigError(f"arrivals.rate_per_s: {arr.kind} arrivals need a rate")
    mean = 1.0 / arr.rate_per_s
    if arr.kind == "poisson":
        return rng.exponential(mean, size=n)
    if arr.kind == "gamma":
        shape = 1.0 / arr.cv ** 2  # CV of a Gamma(k, theta) is 1/sqrt(k)
        return rng.gamma(shape, mean / shape, size=n)
    if arr.kind == "constant":
        return np.full(n, mean)
    raise ConfigError(f"arrivals.kind {arr.kind}: no open-loop gaps (closed-loop users are simulated)")


def draw_attributes(spec: WorkloadSpec, rng: np.random.Generator, n: int, start_id: int = 0,
                    arrivals: np.ndarray | None = None) -> list[Request]:
    """Class, lengths and prefix group for `n` requests (arrival times given or 0)."""
    w = np.array([k.weight for k in spec.classes], dtype=float)
    cls = rng.choice(len(w), size=n, p=w / w.sum()) if len(w) > 1 else np.zeros(n, dtype=np.int64)
    prompt = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for c in range(len(w)):
        idx = np.flatnonzero(cls == c)
        if idx.size:
            li, lo = spec.class_lengths(c)
            prompt[idx], out[idx] = li.draw(rng, idx.size), lo.draw(rng, idx.size)
    group = np.full(n, -1, dtype=np.int64)
    ptoks = np.zeros(n, dtype=np.int64)
    if spec.prefix is not None:
        has = rng.random(n) < spec.prefix.share
        group[has] = rng.integers(0, spec.prefix.groups, size=int(has.sum()))
        prompt[has] = np.maximum(prompt[has], spec.prefix.tokens + 1)  # a prefix leaves >= 1 token to compute
        ptoks[has] = spec.prefix.tokens
    arr = np.zeros(n) if arrivals is None else arrivals
    return [Request(start_id + i, float(arr[i]), int(prompt[i]), int(out[i]), int(cls[i]),
                    spec.classes[int(cls[i])].priority, int(group[i]), int(ptoks[i])) for i in range(n)]


def generate(spec: WorkloadSpec, rng: np.random.Generator) -> list[Request]:
    """Open-loop requests in arrival order (closed-loop requests are made by the simulator)."""
    if spec.arrivals.kind == "trace":
        assert spec.trace is not None  # the validator requires it for trace arrivals
        return load_trace(spec.trace, spec)[: spec.num_requests]
    if spec.arrivals.kind == "closed":
        raise ConfigError("closed-loop workloads are generated by the simulator, not up front")
    if spec.arrivals.kind == "offline":
        return draw_attributes(spec, rng, spec.num_requests, arrivals=np.zeros(spec.num_requests))
    if spec.arrivals.kind == "curve":
        arr = spec.arrivals
        curve = arr.rate_curve()
        times = curve_arrivals(curve, rng, spec.num_requests, arr.duration_s)
        if not times.size:
            raise ConfigError(f"arrivals.duration_s: no request arrived in the first {arr.duration_s:g} s of the curve "
                              f"(about {curve.integral(0.0, arr.duration_s or 0.0):.3g} expected)")
        return draw_attributes(spec, rng, times.size, arrivals=times)
    times = np.cumsum(interarrival_gaps(spec.arrivals, rng, spec.num_requests))
    return draw_attributes(spec, rng, spec.num_requests, arrivals=times)


def _bounded(name: str, value: int, what: str) -> None:
    from capacity.limits import check

    try:
        check(name, value, what)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


MAX_TRACE_ROWS = 10_000_000  # rows read when no spec says how many requests a simulation takes
MAX_TRACE_LINE = 1 << 20  # bytes in one trace line


def _line(raw: bytes, p: Path, i: int) -> str:
    if len(raw) > MAX_TRACE_LINE:
        raise ConfigError(f"trace {p}: line {i} is longer than {MAX_TRACE_LINE:,} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"trace {p}: line {i}: not UTF-8 text") from None


def load_trace(path: str | Path, spec: WorkloadSpec | None = None, max_rows: int | None = None) -> list[Request]:
    """JSONL or CSV with `timestamp` (s), `input_tokens`, `output_tokens` and optional `class` (a class
    name from the spec). Rows must be in time order with non-negative timestamps (an error names the row
    otherwise); time is shifted so the first arrival is at 0."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"trace {p}: file not found")
    # streamed: only the rows a simulation uses are read, each line bounded, so a huge trace costs no memory
    want = max_rows if max_rows is not None else (spec.num_requests if spec is not None else MAX_TRACE_ROWS)
    rows: list[dict] = []
    try:
        with p.open("rb") as fb:
            if p.suffix == ".csv":
                text = (_line(raw, p, i) for i, raw in enumerate(fb, 1))
                for r in csv.DictReader(text):
                    rows.append(r)
                    if len(rows) >= want:
                        break
            else:
                for i, raw in enumerate(fb, 1):
                    line = _line(raw, p, i)
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except (json.JSONDecodeError, RecursionError) as exc:
                        raise ConfigError(f"trace {p}: line {i}: not valid JSON ({getattr(exc, 'msg', 'too deep')})") from None
                    if not isinstance(row, dict):
                        raise ConfigError(f"trace {p}: line {i}: expected a JSON object, got {type(row).__name__}")
                    rows.append(row)
                    if len(rows) >= want:
                        break
    except OSError as exc:
        raise ConfigError(f"trace {p}: cannot read it ({exc.strerror or exc})") from None
    except csv.Error as exc:
        raise ConfigError(f"trace {p}: not valid CSV ({exc})") from None
    names = {k.name: i for i, k in enumerate(spec.classes)} if spec else {"default": 0}
    out = []
    prev = -math.inf
    for i, r in enumerate(rows, 1):
        try:
            t, a, b = float(r["timestamp"]), int(r["input_tokens"]), int(r["output_tokens"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(f"trace {p}: row {i}: needs numeric timestamp, input_tokens, output_tokens ({exc})") from None
        if a <= 0 or b <= 0 or not np.isfinite(t):
            raise ConfigError(f"trace {p}: row {i}: token counts must be > 0 and time finite (got {a}, {b}, {t})")
        if t < 0:
            raise ConfigError(f"trace {p}: row {i}: timestamp {t} is negative")
        if t < prev:
            raise ConfigError(f"trace {p}: row {i}: timestamp {t} is before the previous row's {prev} "
                              "(a trace must be in time order)")
        prev = t
        cls = r.get("class", "default")
        c = names.get(cls, None) if isinstance(cls, str) else None
        if c is None:
            raise ConfigError(f"trace {p}: row {i}: class {short(cls)} is not one of {sorted(names)}")
        prio = spec.classes[c].priority if spec else 0
        out.append(Request(i - 1, t, a, b, c, prio))
    if not out:
        raise ConfigError(f"trace {p}: no rows")
    t0 = out[0].arrival_s
    for i, q in enumerate(out):
        q.arrival_s -= t0
        q.id = i
    return out


# ---- rate curves: arrivals, files, fits ----------------------------------------------------------------

MAX_THINNING_CANDIDATES = 100_000_000  # candidate times drawn for one curve workload (peak / mean x requests)
_CHUNK = 1 << 18  # candidate times drawn per numpy batch (bounded memory, few Python iterations)


def curve_arrivals(curve: RateCurve, rng: np.random.Generator, n: int, duration_s: float | None = None) -> np.ndarray:
    """Sorted arrival times of a non-homogeneous Poisson process with the curve's rate: the first `n`, or those
    before `duration_s` if it comes first. Thinning (Lewis and Shedler, 1979): candidates from a Poisson process
    at the curve's peak rate, each kept with probability rate(t) / peak, drawn in numpy batches."""
    k = _Knots(curve)
    peak, mean = curve.max_rate, curve.mean_rate
    tail, last_t = curve.tail_rate, curve.points[-1][0]
    # the work, bounded up front: candidates arrive at the peak rate until n arrivals are expected (a spike far
    # above the mean costs peak/mean candidates per arrival)
    if tail is None:
        span = n / mean + (curve.period_s or 0.0)
    else:
        short_by = n - float(k.cumulative(np.array(last_t)))
        span = last_t + (short_by / tail if tail > 0 else 0.0) if short_by > 0 else last_t
    span = min(span, duration_s) if duration_s is not None else span
    if peak * span > MAX_THINNING_CANDIDATES:
        raise ConfigError(f"arrivals.curve: {n:,} requests take about {span:.3g} s of the curve, {peak * span:.3g} "
                          f"candidate times at its peak {peak:g}/s (mean {mean:g}/s), more than the "
                          f"{MAX_THINNING_CANDIDATES:,} allowed (flatten the peak, or set fewer requests or a duration_s)")
    out: list[np.ndarray] = []
    got, drawn, t = 0, 0, 0.0
    accept = max(mean / peak, 1e-3)  # expected share of candidates kept (sizes the batches only)
    while got < n:
        m = int(min(max((n - got) / accept * 1.1 + 64, 1024), _CHUNK))
        if duration_s is not None:
            m = int(min(m, max(peak * (duration_s - t) * 1.1 + 64, 1024)))
        cand = t + np.cumsum(rng.exponential(1.0 / peak, size=m))
        keep = rng.random(m) * peak < k.rate(cand)
        t, drawn = float(cand[-1]), drawn + m
        if duration_s is not None:
            keep &= cand <= duration_s
        acc = cand[keep][: n - got]
        out.append(acc)
        got += acc.size
        if got >= n or (duration_s is not None and t > duration_s):
            break
        if tail == 0 and t > last_t:  # nothing arrives after the last point of a curve ending at rate 0
            if duration_s is not None:
                break
            raise ConfigError(f"arrivals.curve: the rate is 0 from t={last_t:g} s on, and only {got:,} of {n:,} "
                              "requests arrived before it (set period_s to repeat the curve, duration_s to stop "
                              "there, or fewer num_requests)")
        if drawn > MAX_THINNING_CANDIDATES:
            raise ConfigError(f"arrivals.curve: {drawn:,} candidate times drew only {got:,} of {n:,} requests "
                              f"(the limit is {MAX_THINNING_CANDIDATES:,}); the curve's rate is mostly far below "
                              f"its peak {peak:g}/s")
    return np.concatenate(out) if out else np.zeros(0)


_TIME_COLUMNS = {"t": 1.0, "t_s": 1.0, "time_s": 1.0, "second": 1.0, "seconds": 1.0,
                 "minute": 60.0, "minutes": 60.0, "t_min": 60.0, "hour": 3600.0, "hours": 3600.0, "t_h": 3600.0}
_RATE_COLUMNS = {"rate": 1.0, "rate_per_s": 1.0, "rate_per_second": 1.0, "rate_per_min": 60.0,
                 "rate_per_minute": 60.0, "rate_per_hour": 3600.0, "rate_per_h": 3600.0}
_TIME_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}  # YAML time_unit: seconds per unit
_RATE_UNITS = {"per_s": 1.0, "per_min": 60.0, "per_hour": 3600.0}  # YAML unit: the rate is divided by this
_CSV_SETTING = re.compile(r"^#\s*(shape|period_s|scale)\s*:\s*(\S+)\s*$")


def load_curve(path: str | Path) -> RateCurve:
    """A rate curve from CSV or YAML/JSON; any bad value is one ConfigError naming the file, the line (CSV) or
    point (YAML) and the value.

    CSV: a header of a time and a rate column, then one point a row. Time columns: `t`, `t_s`, `time_s`,
    `seconds` (s); `minute`, `minutes`, `t_min` (x 60 to s); `hour`, `hours`, `t_h` (x 3600). Rate columns:
    `rate`, `rate_per_s` (requests/s); `rate_per_min`, `rate_per_minute` (/ 60); `rate_per_hour`, `rate_per_h`
    (/ 3600): `hour,rate_per_hour` with `1,3600` is one request/s at t=3600 s. Lines starting with # are comments;
    `# shape: linear`, `# period_s: 86400` and `# scale: 2` set those fields (defaults: step, no period, 1).

    YAML: `points: [[t, rate], ...]` with `shape`, `period_s` (always s), `scale`, `time_unit` (s, min, h: the
    points' t x 1, 60, 3600) and `unit` (per_s, per_min, per_hour: the rates / 1, 60, 3600)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"curve {short(str(p), 200)}: is a folder, not a file")
    if p.suffix.lower() == ".csv":
        return _curve_csv(p, read_text(p, "curve file"))
    if p.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"curve {short(str(p), 200)}: expected a .csv, .yaml or .json file")
    return _curve_yaml(p, read_mapping(p))


def _curve_points(p: Path, t: list[float], r: list[float], where: list[str]) -> list[tuple[float, float]]:
    bad = _points_problem(np.asarray(t, dtype=float), np.asarray(r, dtype=float))
    if bad is not None:
        raise ConfigError(f"curve {p}: {where[bad[0]] + ': ' if bad[0] >= 0 else ''}{bad[1]}")
    return list(zip(t, r))


def _curve_csv(p: Path, text: str) -> RateCurve:
    settings: dict[str, object] = {}
    header: tuple[float, float] | None = None
    t: list[float] = []
    r: list[float] = []
    where: list[str] = []
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _CSV_SETTING.match(s)
            if m:
                key, val = m.groups()
                try:
                    settings[key] = val if key == "shape" else float(val)
                except ValueError:
                    raise ConfigError(f"curve {p}: line {i}: {key} {short(val)} is not a number") from None
            continue
        cells = [c.strip() for c in next(csv.reader([s]))]
        if header is None:
            names = [c.lower() for c in cells]
            if len(names) != 2 or names[0] not in _TIME_COLUMNS or names[1] not in _RATE_COLUMNS:
                raise ConfigError(f"curve {p}: line {i}: header {short(s)} is not a time and a rate column (time: "
                                  f"{', '.join(_TIME_COLUMNS)}; rate: {', '.join(_RATE_COLUMNS)})")
            header = (_TIME_COLUMNS[names[0]], _RATE_COLUMNS[names[1]])
            continue
        if len(cells) != 2:
            raise ConfigError(f"curve {p}: line {i}: expected 2 values (time, rate), got {short(s)}")
        if len(t) >= MAX_CURVE_POINTS:
            raise ConfigError(f"curve {p}: line {i}: more than the {MAX_CURVE_POINTS:,} points allowed (MAX_CURVE_POINTS)")
        try:
            ti, ri = float(cells[0]), float(cells[1])
        except ValueError:
            raise ConfigError(f"curve {p}: line {i}: {short(s)} is not two numbers") from None
        t.append(ti * header[0])
        r.append(ri / header[1])
        where.append(f"line {i}")
    if header is None:
        raise ConfigError(f"curve {p}: no header (expected a time and a rate column, e.g. t,rate)")
    if not t:
        raise ConfigError(f"curve {p}: no points after the header")
    return validate(RateCurve, {**settings, "points": _curve_points(p, t, r, where)}, f"curve {p}")


def _curve_yaml(p: Path, data: dict) -> RateCurve:
    data = dict(data)
    tu, ru = data.pop("time_unit", "s"), data.pop("unit", "per_s")
    if tu not in _TIME_UNITS:
        raise ConfigError(f"curve {p}: time_unit {short(tu)} is not one of {', '.join(_TIME_UNITS)}")
    if ru not in _RATE_UNITS:
        raise ConfigError(f"curve {p}: unit {short(ru)} is not one of {', '.join(_RATE_UNITS)}")
    pts = data.pop("points", None)
    if not isinstance(pts, list) or not pts:
        raise ConfigError(f"curve {p}: points: expected a list of [t, rate] pairs, got {short(pts)}")
    if len(pts) > MAX_CURVE_POINTS:
        raise ConfigError(f"curve {p}: points: {len(pts):,}, more than the {MAX_CURVE_POINTS:,} allowed (MAX_CURVE_POINTS)")
    t: list[float] = []
    r: list[float] = []
    for i, x in enumerate(pts):
        if not (isinstance(x, list) and len(x) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)):
            raise ConfigError(f"curve {p}: points[{i}]: expected [t, rate] numbers, got {short(x)}")
        t.append(float(x[0]) * _TIME_UNITS[tu])
        r.append(float(x[1]) / _RATE_UNITS[ru])
    where = [f"points[{i}]" for i in range(len(t))]
    return validate(RateCurve, {**data, "points": _curve_points(p, t, r, where)}, f"curve {p}")


def save_curve(curve: RateCurve, path: str | Path) -> None:
    """Write a curve as CSV (`t,rate` in s and requests/s, settings in `# key: value` lines) or YAML, by the
    file's suffix; load_curve reads it back exactly (repr of each float)."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        lines = [f"# shape: {curve.shape}", f"# scale: {curve.scale!r}"]
        if curve.period_s is not None:
            lines.append(f"# period_s: {curve.period_s!r}")
        lines += ["t,rate"] + [f"{t!r},{r!r}" for t, r in curve.points]
        p.write_text("\n".join(lines) + "\n")
        return
    import yaml

    data: dict = {"shape": curve.shape, "scale": curve.scale, "points": [[t, r] for t, r in curve.points]}
    if curve.period_s is not None:
        data["period_s"] = curve.period_s
    p.write_text(yaml.safe_dump(data, default_flow_style=None, sort_keys=False))


def fit_curve(arrival_times: np.ndarray | list[float], bin_s: float, shape: Literal["step", "linear"] = "step",
              period_s: float | None = None) -> RateCurve:
    """A rate curve from a trace's arrival times (s, from 0): the count in each bin of `bin_s` divided by the
    bin's width. step: the curve's integral over each bin is that bin's count exactly (a curve fitted from a
    trace reproduces its volume bin by bin); without `period_s` the rate is 0 after the last bin. linear: points
    at the bins' middles (t=0 holds the first bin's rate), smoother, and each bin's volume is exact only where
    its neighbours' counts are in a straight line. With `period_s` the bins cover one period (every time must fall
    in it; the last bin is cut at period_s) and the curve repeats."""
    t = np.asarray(arrival_times, dtype=float).ravel()
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ConfigError(f"fit_curve: bin_s must be a positive number of seconds (got {bin_s!r})")
    if t.size == 0:
        raise ConfigError("fit_curve: no arrival times")
    if not np.all(np.isfinite(t)) or t.min() < 0:
        raise ConfigError(f"fit_curve: arrival times must be finite and >= 0 (got {t.min()!r} .. {t.max()!r})")
    if period_s is not None and not (period_s > 0 and t.max() < period_s):
        raise ConfigError(f"fit_curve: period_s {period_s!r} must be after the last arrival ({t.max():g} s)")
    end = period_s if period_s is not None else (math.floor(t.max() / bin_s) + 1) * bin_s
    nb = math.ceil(end / bin_s - 1e-12)
    if nb + 1 > MAX_CURVE_POINTS:
        raise ConfigError(f"fit_curve: {nb:,} bins of {bin_s:g} s, more than the {MAX_CURVE_POINTS:,} points allowed "
                          "(use wider bins)")
    edges = np.minimum(np.arange(nb + 1) * bin_s, end)
    counts = np.bincount(np.minimum((t // bin_s).astype(np.int64), nb - 1), minlength=nb)
    rates = counts / np.diff(edges)
    if shape == "step":
        pts = list(zip(edges[:-1].tolist(), rates.tolist()))
        if period_s is None:
            pts.append((float(edges[-1]), 0.0))
    else:
        mids = (edges[:-1] + edges[1:]) / 2
        pts = [(0.0, float(rates[0]))] + list(zip(mids.tolist(), rates.tolist()))
    return RateCurve(points=pts, shape=shape, period_s=period_s)
