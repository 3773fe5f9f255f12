"""Capacity-review exports: an XLSX workbook a reviewer can read without this tool (`workbook.py`), and on request
(`--tables`) CSV and JSON of the same tables (`tables.py`). Everything is written from the plan's JSON form, so `capacity export`
can rebuild a workbook from a saved plan or sweep.

Sheets: Summary (the answer, with live input cells that the dependent figures follow), Assumptions (every
resolved setting), Memory (every term, a stacked bar, the batch x context table), Frontier (one row per
configuration, the recommended one marked), Context (the request-context trade-off), Percentiles (with
charts against the SLO), Sweep, Autoscale when given an autoscale report (`capacity autoscale --json`:
autoscaled against static, the per-window table, a chart of the pool and the P99 TTFT over time), and Fleet day
when given a fleet-day report (`capacity fleet-day --json`: the fleet per layout with a chart, one row per
model and layout). The set of files is written into a temporary folder and moved into place
only when every file was written, so a failure (a full disk) leaves no half set behind; nothing existing is
overwritten without `force`. CSV cells that a spreadsheet would run as formulas are escaped (OWASP).
"""
from __future__ import annotations

import csv
import io
import os
import tempfile
from pathlib import Path

from capacity.errors import CapacityError, ConfigError, require
from capacity.files import check_writable, dumps, read_json, short_path, strict_json
from capacity.io.fleet import check_report, window_table
from capacity.io.fleetday import check_day_report, day_table
from capacity.io.tables import tables
from capacity.io.workbook import write_workbook
from capacity.plan.results import Plan

SHEETS = ("Summary", "Assumptions", "Memory", "Frontier", "Context", "Percentiles", "Sweep")  # of a plan + sweep
AUTOSCALE_SHEET = "Autoscale"  # after them, when the export is given an autoscale report
FLEET_DAY_SHEET = "Fleet day"  # and a fleet-day report
COMPARISON_SHEET = "Comparison"  # first, when the plan is one option of a GPU or engine comparison


def check_destination(path: str | Path, force: bool) -> None:
    p = Path(path)
    if p.suffix.lower() != ".xlsx":
        raise CapacityError(f"{p}: the workbook name must end in .xlsx")

    require("openpyxl", "xlsx", "the capacity-review workbook (--xlsx)")

    check_writable(p, force, "--xlsx")  # a missing or read-only folder: said now, not after minutes of work


def load_saved(plan_file: str | None, sweep_file: str | None) -> tuple[dict | None, list[dict] | None]:
    """A plan JSON (as `capacity plan --json` prints it, or an export's .json) and/or sweep rows."""
    if not plan_file and not sweep_file:
        raise CapacityError("give --plan, --sweep, --autoscale and/or --fleet-day")
    plan = rows = None
    for f, kind in ((plan_file, "plan"), (sweep_file, "sweep")):
        if not f:
            continue

        p = Path(f)
        data = read_json(p, f"{kind} file")
        if kind == "plan":
            plan = data.get("plan", data) if isinstance(data, dict) else None
            if not isinstance(plan, dict) or "frontier" not in plan or "budget" not in plan:
                raise CapacityError(f"{p}: not a plan (no frontier/budget): write one with `capacity plan --json`")

            try:
                Plan.from_dict(plan)  # every field of the right type, or a one-line refusal
            except (ValueError, TypeError, KeyError) as exc:
                first = str(exc).splitlines()
                raise CapacityError(f"{p}: not a plan of this version ({' '.join(first[:3])[:300]})") from None
        else:
            rows = data.get("rows", data.get("sweep")) if isinstance(data, dict) else data
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise CapacityError(f"{p}: not sweep rows (a JSON list of objects)")
    return plan, rows


def write_review(path: str | Path, plan=None, sweep_rows: list[dict] | None = None,
                 force: bool = False, autoscale: dict | None = None, fleet_day: dict | None = None,
                 comparison: tuple[list[str], list[list]] | None = None, tables_too: bool = False) -> list[Path]:
    """Write the workbook and, with `tables_too`, next to it `<stem>.json` and `<stem>.<table>.csv` (one file,
    not eight, unless asked: issue 48). `plan` is a `Plan` or its
    JSON form; `autoscale` a `capacity autoscale --json` report (capacity.io.fleet), checked here; `comparison`
    the table of a GPU or engine comparison (capacity.plan.compare.comparison_table), its first sheet, with
    `plan` the first option's. Returns the paths written."""
    if plan is not None and not isinstance(plan, dict):
        plan = strict_json(plan.as_dict())  # the same form `capacity plan --json` saves
    if plan is None and not sweep_rows and autoscale is None and fleet_day is None:
        raise CapacityError("nothing to export: give a plan, sweep rows, an autoscale or a fleet-day report")
    if fleet_day is not None:
        check_day_report(fleet_day, "fleet-day report")
    if autoscale is not None:
        check_report(autoscale, "autoscale report")
    path = Path(path)
    check_destination(path, force)
    tabs = tables(plan, sweep_rows)
    if comparison is not None:
        tabs = {COMPARISON_SHEET: comparison, **tabs}
    if autoscale is not None:
        tabs[AUTOSCALE_SHEET] = window_table(autoscale)
    if fleet_day is not None:
        tabs[FLEET_DAY_SHEET] = day_table(fleet_day)
    targets = [path] + ([path.with_suffix(".json")] + [
        path.with_name(f"{path.stem}.{name.lower().replace(' ', '_')}.csv") for name in tabs] if tables_too else [])
    if not force:
        for t in targets:
            if t.exists():
                raise CapacityError(f"{t} exists; pass --force to overwrite it")
    check_writable(path, True, "--xlsx")  # the folder exists and takes files; --force was checked above
    book = io.BytesIO()  # every file in memory first: a workbook library's half-closed zip never meets the disk
    write_workbook(book, plan, tabs, autoscale, fleet_day)
    saved = {"plan": plan, "sweep": sweep_rows} | (
        {"comparison": [dict(zip(comparison[0], r)) for r in comparison[1]]} if comparison is not None else {}) | (
        {"autoscale": autoscale} if autoscale is not None else {}) | (
        {"fleet_day": fleet_day} if fleet_day is not None else {})
    contents = [book.getvalue()]
    if tables_too:  # the JSON and each table as CSV, beside the workbook only when asked
        contents.append((dumps(saved, indent=1) + "\n").encode())
    for head, rows in tabs.values() if tables_too else ():
        f = io.StringIO(newline="")
        cw = csv.writer(f)
        cw.writerow([csv_safe(h) for h in head])
        cw.writerows([[csv_safe(v) for v in r] for r in rows])
        contents.append(f.getvalue().encode())
    try:
        with tempfile.TemporaryDirectory(prefix=f".{path.stem}.", dir=path.parent) as tmpdir:
            tmp = Path(tmpdir)
            for data, target in zip(contents, targets):
                with (tmp / target.name).open("wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
            for target in targets:  # every file is complete: move the set into place
                os.replace(tmp / target.name, target)
    except OSError as exc:  # a full disk, a read-only folder: the user's path, never the temporary one
        raise ConfigError(f"--xlsx {short_path(path)}: cannot write it ({exc.strerror or exc})") from None
    return targets


def csv_safe(v):
    """A CSV cell a spreadsheet will not run: text starting with = + - @ (or a tab/CR) gets a leading quote,
    as the OWASP CSV-injection guidance says; numbers stay numbers."""
    if isinstance(v, str) and v.startswith(("=", "+", "-", "@", "\t", "\r")):
        return "'" + v
    return v
