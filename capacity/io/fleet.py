"""Autoscaling against static provisioning, rendered: the report that `capacity autoscale --json` prints (computed by
capacity.plan.autoscale.autoscale_report), which the dashboard's Autoscale tab shows and `capacity export
--autoscale` turns into a workbook sheet.

`check_report` reads such a report back (a saved file) with one-line errors; `window_table` and `summary_table` are
its tables, in the units of their headers.
"""
from __future__ import annotations

import bisect
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from capacity.errors import CapacityError
from capacity.files import read_json, validate
from capacity.io.tables import Table, ms, yn


# ---- a saved report, read back --------------------------------------------------------------------------------
class _Model(BaseModel):
    # a later version may add fields; the ones read here must be right, and strict: `true` is not 1, "4" not 4
    model_config = ConfigDict(extra="ignore", strict=True)


class _Window(_Model):
    start_s: list[NonNegativeFloat]
    requests: list[NonNegativeFloat]
    ttft_s: list[NonNegativeFloat | None]
    tpot_s: list[NonNegativeFloat | None]
    met: list[bool]

    @model_validator(mode="after")
    def _same_length(self) -> _Window:
        n = {k: len(getattr(self, k)) for k in ("start_s", "requests", "ttft_s", "tpot_s", "met")}
        if len(set(n.values())) > 1:
            raise ValueError("window: start_s, requests, ttft_s, tpot_s and met must have one value per window "
                             f"(lengths {', '.join(f'{k} {v}' for k, v in n.items())})")
        return self


class _Replicas(_Model):
    t_s: list[NonNegativeFloat]
    ready: list[NonNegativeInt]
    starting: list[NonNegativeInt]
    draining: list[NonNegativeInt]
    min: NonNegativeInt
    max: PositiveInt

    @model_validator(mode="after")
    def _same_length(self) -> _Replicas:
        n = {k: len(getattr(self, k)) for k in ("t_s", "ready", "starting", "draining")}
        if len(set(n.values())) > 1 or not self.t_s:
            raise ValueError("replicas: t_s, ready, starting and draining must have one value per change of the "
                             f"pool, at least one (lengths {', '.join(f'{k} {v}' for k, v in n.items())})")
        if any(b < a for a, b in zip(self.t_s, self.t_s[1:])):
            raise ValueError("replicas: t_s must not decrease")
        return self


class _Layout(_Model):
    gpu_hours: NonNegativeFloat
    cost_usd: NonNegativeFloat | None
    violation_minutes: NonNegativeFloat
    windows: NonNegativeInt
    p99_ttft_s: NonNegativeFloat | None
    p99_tpot_s: NonNegativeFloat | None
    simulated_s: NonNegativeFloat
    requests: NonNegativeInt
    saturated: bool
    window: _Window


class _Distance(_Model):
    gpu_hours: float  # above the bound (a static pool run longer than the arrivals can be below it)
    pct: float | None
    violation_minutes: NonNegativeFloat


class _Bound(_Model):
    gpu_hours: NonNegativeFloat
    replicas_max: NonNegativeInt
    per_replica_rate_per_s: PositiveFloat
    rate_source: str
    span_s: NonNegativeFloat
    violation_minutes: NonNegativeFloat


class _Events(_Model):
    up: NonNegativeInt
    down: NonNegativeInt


class _Autoscaled(_Layout):
    replicas: _Replicas
    vs_bound: _Distance | None = None
    scale_events: _Events | None = None


class _Static(_Layout):
    replicas: PositiveInt
    vs_bound: _Distance | None = None


class _Slo(_Model):
    ttft_s: PositiveFloat | None
    tpot_s: PositiveFloat | None


class AutoscaleReport(_Model):
    """The fields of `capacity autoscale --json` that the export reads."""

    model: str
    gpu: str
    tp: PositiveInt
    policy: str
    target: PositiveFloat
    startup_s: NonNegativeFloat
    cooldown_s: NonNegativeFloat
    window_s: PositiveFloat
    slo: _Slo
    curve_mean_rate_per_s: NonNegativeFloat
    curve_peak_rate_per_s: NonNegativeFloat
    autoscaled: _Autoscaled
    static: _Static
    lower_bound: _Bound | None = None  # the perfect system (reports from before issue 52 have none)


class _Decode(_Model):
    tp: PositiveInt
    policy: str
    target: PositiveFloat
    startup_s: NonNegativeFloat
    cooldown_s: NonNegativeFloat
    link: str


class _DisaggAutoscaled(_Autoscaled):
    decode_replicas: _Replicas


class _DisaggStatic(_Static):
    decode_replicas: PositiveInt


class DisaggAutoscaleReport(AutoscaleReport):
    """The fields of a disaggregated `capacity autoscale --decode-tp N --json` report that the export reads."""

    decode: _Decode
    autoscaled: _DisaggAutoscaled
    static: _DisaggStatic


def check_report(data: Any, source: str) -> dict[str, Any]:
    """`data` as an autoscale report (`capacity autoscale --json`), or one CapacityError naming `source` and what is
    missing or wrong. Returns the report as given (the fields checked, the rest kept)."""
    if not isinstance(data, dict):
        raise CapacityError(f"{source}: not an autoscale report (expected a JSON object): write one with "
                            "`capacity autoscale --json`")
    if "autoscaled" not in data or "static" not in data:
        raise CapacityError(f"{source}: not an autoscale report (no autoscaled/static): write one with "
                            "`capacity autoscale --json`")
    validate(DisaggAutoscaleReport if "decode" in data else AutoscaleReport, data,
             f"{source}: not a complete autoscale report")
    return data


def load_report(path: str) -> dict[str, Any]:
    """A saved `capacity autoscale --json` report, checked (one CapacityError line otherwise)."""
    data = read_json(path, "autoscale report")
    if isinstance(data, dict) and "autoscaled" not in data and isinstance(data.get("autoscale"), dict):
        data = data["autoscale"]  # an export's .json: {"plan": ..., "sweep": ..., "autoscale": ...}
    return check_report(data, path)


# ---- its tables --------------------------------------------------------------------------------------------------
def ready_at(report: dict, t: float, pool: str = "replicas") -> int:
    """Replicas of the autoscaled pool ready at time `t`, s (the last change at or before `t`); `pool`
    "decode_replicas": the decode pool's of a disaggregated report."""
    reps = report["autoscaled"][pool]
    return int(reps["ready"][max(0, bisect.bisect_right(reps["t_s"], t) - 1)])


def starting_at(report: dict, t: float, pool: str = "replicas") -> int:
    reps = report["autoscaled"][pool]
    return int(reps["starting"][max(0, bisect.bisect_right(reps["t_s"], t) - 1)])


SUMMARY_HEAD = ["figure", "autoscaled", "static", "unit"]
WINDOW_HEAD = ["window start (s)", "window start (min)", "requests", "ready replicas (at start)",
               "starting replicas (at start)", "P99 TTFT (ms)", "P99 TPOT (ms)", "meets SLO", "static P99 TTFT (ms)",
               "static meets SLO", "SLO P99 TTFT (ms)"]
DECODE_HEAD = ["decode ready replicas (at start)", "decode starting replicas (at start)"]  # disaggregated only


def summary_table(report: dict) -> Table:
    """Autoscaled against static: replicas, GPU-hours, cost, SLO-miss minutes, P99s, requests, simulated time."""
    a, s = report["autoscaled"], report["static"]
    slo = report["slo"]
    has_slo = bool(slo.get("ttft_s") or slo.get("tpot_s"))
    d = report.get("decode")
    reps = [["Replicas (autoscaled: fewest ready to peak provisioned)", f"{a['replicas']['min']}-{a['replicas']['max']}",
             s["replicas"], "replicas"]]
    tps = f"TP {report['tp']}"
    if d is not None:  # disaggregated: each pool, at its own TP
        dr = a["decode_replicas"]
        reps = [["Prefill replicas (autoscaled: fewest ready to peak provisioned)",
                 f"{a['replicas']['min']}-{a['replicas']['max']}", s["replicas"], f"replicas (TP {report['tp']})"],
                ["Decode replicas (autoscaled: fewest ready to peak provisioned)", f"{dr['min']}-{dr['max']}",
                 s["decode_replicas"], f"replicas (TP {d['tp']})"]]
        tps = f"prefill TP {report['tp']}, decode TP {d['tp']}"
    rows: list[list] = [
        *reps,
        ["GPU-hours", a["gpu_hours"], s["gpu_hours"], f"GPU-hours ({tps})"],
        ["Cost", a["cost_usd"], s["cost_usd"], "USD" if a["cost_usd"] is not None else "USD (no price given)"],
        ["SLO-miss minutes", a["violation_minutes"] if has_slo else None, s["violation_minutes"] if has_slo else None,
         f"minutes, of {a['windows'] * report['window_s'] / 60:g} in windows of {report['window_s']:g} s"
         if has_slo else "minutes (no SLO given)"],
        ["P99 TTFT (whole run)", ms(a["p99_ttft_s"]), ms(s["p99_ttft_s"]), "ms"],
        ["P99 TPOT (whole run)", ms(a["p99_tpot_s"]), ms(s["p99_tpot_s"]), "ms"],
        ["Requests", a["requests"], s["requests"], "requests"],
        ["Simulated time", a["simulated_s"], s["simulated_s"], "s"],
        ["Saturated", yn(a["saturated"]), yn(s["saturated"]), ""],
    ]
    b = report.get("lower_bound")
    if b is not None:  # the perfect system: ceil(rate / per-replica rate) replicas at every instant, no start-up
        va, vs = a["vs_bound"], s["vs_bound"]
        rows[len(reps) + 1:len(reps) + 1] = [
            ["GPU-hours of a perfect system (lower bound)", b["gpu_hours"], b["gpu_hours"],
             f"GPU-hours (ceil(rate / {b['per_replica_rate_per_s']:.3g} req/s per replica), no start-up delay)"],
            ["GPU-hours above the lower bound", va["gpu_hours"], vs["gpu_hours"], "GPU-hours"],
            ["GPU-hours above the lower bound (%)", va["pct"], vs["pct"], "% of the bound"]]
    ev = a.get("scale_events")
    if ev is not None:
        rows.append(["Scale events (up / down)", f"{ev['up']} / {ev['down']}", "0 / 0", "controller decisions"])
    return SUMMARY_HEAD, rows


def window_table(report: dict) -> Table:
    """One row per window: the requests arriving in it, the autoscaled pool at its start, the P99s of those
    requests (ms; blank: no request, or one that never finished) and whether it met the SLO; the static pool's
    P99 TTFT and verdict for the same window; the TTFT SLO (blank without one), for the chart's line."""
    a, s = report["autoscaled"], report["static"]
    slo = ms(report["slo"].get("ttft_s"))
    w, sw = a["window"], s["window"]
    dis = "decode" in report
    rows = []
    for i, t0 in enumerate(w["start_s"]):
        static_ok = i < len(sw["start_s"])
        rows.append([t0, t0 / 60, w["requests"][i], ready_at(report, t0), starting_at(report, t0),
                     ms(w["ttft_s"][i]), ms(w["tpot_s"][i]), yn(w["met"][i]),
                     ms(sw["ttft_s"][i]) if static_ok else None, yn(sw["met"][i]) if static_ok else None, slo,
                     *((ready_at(report, t0, "decode_replicas"), starting_at(report, t0, "decode_replicas"))
                       if dis else ())])
    if dis:  # the pool columns name their pool
        head = [f"prefill {h}" if h.endswith("replicas (at start)") else h for h in WINDOW_HEAD] + DECODE_HEAD
        return head, rows
    return WINDOW_HEAD, rows

