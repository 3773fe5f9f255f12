"""Arrival-rate curves: a rate that varies with time (a daily load curve) as step or linear points, optionally
periodic; arrivals that follow it (a non-homogeneous Poisson process, drawn by thinning); curve files (CSV or
YAML, per second, minute or hour); and a curve fitted from a trace's timestamps. `capacity.workload`'s curve
arrivals (`Arrivals(kind="curve")`) draw their times here.
"""
from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capacity.errors import ConfigError
from capacity.files import read_mapping, read_text, short, validate, write_atomic

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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


def sum_curves(curves: list[RateCurve]) -> RateCurve:
    """The total rate of independent streams, exactly, as one curve: the rates summed at the union of the curves'
    points, with their shape and period (each curve is linear, or constant, between its own points, so the sum
    is between consecutive union points). The curves must share shape and period (ConfigError otherwise)."""
    if len(curves) == 1:
        return curves[0]
    shapes, periods = {c.shape for c in curves}, {c.period_s for c in curves}
    if len(shapes) > 1 or len(periods) > 1:
        raise ConfigError("curves of a workload's classes are summed into its total rate: they need one shape and "
                          f"one period_s (got shapes {sorted(shapes)}, periods {sorted(map(str, periods))})")
    t = np.unique(np.concatenate([np.asarray(c.points, dtype=float)[:, 0] for c in curves]))
    total = sum((c.rate(t) for c in curves), np.zeros(t.size))
    return RateCurve(points=[(float(a), float(b)) for a, b in zip(t, total)], shape=curves[0].shape,
                     period_s=curves[0].period_s)


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
        write_atomic(p, "\n".join(lines) + "\n")
        return
    import yaml

    data: dict = {"shape": curve.shape, "scale": curve.scale, "points": [[t, r] for t, r in curve.points]}
    if curve.period_s is not None:
        data["period_s"] = curve.period_s
    write_atomic(p, yaml.safe_dump(data, default_flow_style=None, sort_keys=False))


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
