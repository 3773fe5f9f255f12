"""A fleet-over-a-day report (`capacity fleet-day --json`, capacity.plan.fleetday) read back and as tables: the
same (header, rows) feed the terminal, the workbook's "Fleet day" sheet and its CSV. `check_day_report` reads a
saved report with one-line errors."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from capacity.errors import CapacityError
from capacity.files import read_json, validate
from capacity.io.tables import Table, ms, yn

LAYOUTS = ("static", "reactive", "predictive")
DAY_HEAD = ["model", "layout", "replicas (fewest-most)", "GPU-hours", "cost (USD)", "SLO-miss minutes",
            "P99 TTFT (ms)", "P99 TPOT (ms)", "requests", "saturated"]
TOTALS_HEAD = ["layout", "GPUs", "GPU-hours", "cost (USD)", "SLO-miss minutes", "note"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # `true` is not 1, "4" not 4


class _Layout(_Model):
    gpu_hours: NonNegativeFloat
    cost_usd: NonNegativeFloat | None
    violation_minutes: NonNegativeFloat
    p99_ttft_s: NonNegativeFloat | None
    p99_tpot_s: NonNegativeFloat | None
    requests: NonNegativeInt
    saturated: bool
    replicas_min: PositiveInt
    replicas_max: PositiveInt


class _Layouts(_Model):
    static: _Layout
    reactive: _Layout
    predictive: _Layout


class _DayModel(_Model):
    model: str
    tp: PositiveInt
    per_replica_rate: PositiveFloat
    rate_source: str
    target: PositiveFloat
    target_source: str
    peak_rate_per_s: NonNegativeFloat
    mean_rate_per_s: NonNegativeFloat
    layouts: _Layouts


class _Total(_Model):
    gpu_hours: NonNegativeFloat
    cost_usd: NonNegativeFloat | None
    violation_minutes: NonNegativeFloat | None


class _Shared(_Model):
    gpus: PositiveInt | None
    hours: NonNegativeFloat
    why: str


class DayReport(_Model):
    gpu: str
    price_per_gpu_hour: PositiveFloat | None
    startup_s: NonNegativeFloat
    window_s: PositiveFloat
    models: list[_DayModel]
    totals: dict[str, _Total]
    shared: _Shared | None = None
    wall_s: NonNegativeFloat


def check_day_report(data: Any, source: str) -> dict[str, Any]:
    """`data` as a fleet-day report, or one CapacityError naming `source`; returns it as given."""
    if not isinstance(data, dict) or "models" not in data or "totals" not in data:
        raise CapacityError(f"{source}: not a fleet-day report (no models/totals): write one with "
                            "`capacity fleet-day --json`")

    validate(DayReport, data, f"{source}: not a complete fleet-day report")
    for lay in LAYOUTS:
        if lay not in data["totals"]:
            raise CapacityError(f"{source}: totals.{lay}: missing")
    return data


def load_day_report(path: str) -> dict[str, Any]:
    data = read_json(path, "fleet-day report")
    if isinstance(data, dict) and "models" not in data and isinstance(data.get("fleet_day"), dict):
        data = data["fleet_day"]  # an export's .json
    return check_day_report(data, path)


def day_table(report: dict) -> Table:
    """One row per model and layout."""
    rows = []
    for m in report["models"]:
        for lay in LAYOUTS:
            r = m["layouts"][lay]
            reps = str(r["replicas_max"]) if lay == "static" else f"{r['replicas_min']}-{r['replicas_max']}"
            rows.append([m["model"], lay, reps, r["gpu_hours"], r["cost_usd"], r["violation_minutes"],
                         ms(r["p99_ttft_s"]), ms(r["p99_tpot_s"]), r["requests"], yn(r["saturated"])])
    return DAY_HEAD, rows


def totals_table(report: dict) -> Table:
    """The fleet per layout: GPU-hours, cost and SLO-miss minutes summed over the models; the shared GPUs."""
    rows: list[list] = []
    sh = report.get("shared")
    for lay, t in report["totals"].items():
        if lay == "shared":
            rows.append([lay, sh["gpus"] if sh else None, t["gpu_hours"], t["cost_usd"], None,
                         "static all day; checked with every model at its peak at once"])
        else:
            rows.append([lay, None, t["gpu_hours"], t["cost_usd"], t["violation_minutes"],
                         {"static": "each model: ceil(peak / per-replica rate) all day",
                          "reactive": "in-flight target per replica, start-up delay",
                          "predictive": "the curve ahead by the start-up delay / per-replica rate"}.get(lay, "")])
    if sh is not None and sh.get("gpus") is None:
        rows.append(["shared", None, None, None, None, f"not possible: {sh['why']}"])
    return TOTALS_HEAD, rows
