"""Capacity-review exports: an XLSX workbook a reviewer can read without this tool, plus CSV and JSON of
the same tables. Everything is written from the plan's JSON form (`report.plan_dict`), so `capacity export`
can rebuild a workbook from a saved plan or sweep.

Sheets: Summary (recommendation, SLO margins, GPUs, cost with a live price cell), Assumptions (scenario,
step-cost source and calibration provenance, tool version, seeds), Memory (every budget term in GiB with a
formula re-deriving the KV budget, the batch x context table), Frontier (P99 TTFT/TPOT and tokens/s per
max_num_seqs x max_model_len, green/red against the SLO by conditional formatting), Percentiles
(P50/P90/P95/P99 with the P99 interval per configuration), Sweep (raw rows), and native charts (P99 vs max
batch, memory breakdown). Numbers are numbers; units live in the headers. Writes are atomic (temp file, then
rename) and never overwrite an existing file unless `force`.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path

from capacity.errors import CapacityError

GiB = 2**30
SHEETS = ("Summary", "Assumptions", "Memory", "Frontier", "Context", "Percentiles", "Sweep")


def _atomic_write(path: Path, write, force: bool) -> None:
    if path.exists() and not force:
        raise CapacityError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_destination(path: str | Path, force: bool) -> None:
    p = Path(path)
    if p.suffix.lower() != ".xlsx":
        raise CapacityError(f"{p}: the workbook name must end in .xlsx")
    from capacity.errors import require

    require("openpyxl", "xlsx", "the capacity-review workbook (--xlsx)")
    if p.exists() and not force:
        raise CapacityError(f"{p} exists; pass --force to overwrite it")


def load_saved(plan_file: str | None, sweep_file: str | None) -> tuple[dict | None, list[dict] | None]:
    """A plan JSON (as `capacity plan --json` prints it, or an export's .json) and/or sweep rows."""
    if not plan_file and not sweep_file:
        raise CapacityError("give --plan and/or --sweep")
    plan = rows = None
    for f, kind in ((plan_file, "plan"), (sweep_file, "sweep")):
        if not f:
            continue
        from capacity.files import read_json

        p = Path(f)
        data = read_json(p, f"{kind} file")
        if kind == "plan":
            plan = data.get("plan", data) if isinstance(data, dict) else None
            if not isinstance(plan, dict) or "frontier" not in plan or "budget" not in plan:
                raise CapacityError(f"{p}: not a plan (no frontier/budget): write one with `capacity plan --json`")
            from capacity.plan.results import Plan

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


def tables(plan: dict | None, sweep_rows: list[dict] | None = None) -> dict[str, tuple[list[str], list[list]]]:
    """The export's tables as (header, rows), shared by XLSX, CSV and the tests."""
    out: dict[str, tuple[list[str], list[list]]] = {}
    if plan:
        slo = plan["slo"]
        pct = slo["percentile"]
        out["Frontier"] = (
            ["max_num_seqs", "max_model_len", "fits memory", "covers workload", f"P{pct} TTFT (ms)",
             f"P{pct} TPOT (ms)", "peak output tokens/s", "KV tokens", "meets SLO", "status / why not"],
            [[c["max_num_seqs"], c["max_model_len"], _yn(c["feasible"]), _yn(c["covers_workload"]),
              _ms(c["p_ttft"]), _ms(c["p_tpot"]), c["capacity_tokens_per_s"], c["kv_tokens"], _yn(c["meets_slo"]),
              c["why"] or ("saturated at this load" if c["feasible"] and c["p_ttft"] is not None
                           and not _finite(c["p_ttft"]) else "")]
             for c in plan["frontier"]])
        rows = []
        seen = set()
        for c in plan["frontier"]:
            if not c["feasible"] or not c["stats"] or c["max_num_seqs"] in seen:
                continue
            seen.add(c["max_num_seqs"])
            for metric in ("ttft", "tpot", "itl", "e2e"):
                st = c["stats"].get(metric, {})
                rows.append([c["max_num_seqs"], metric.upper(), *(_ms(st.get(k)) for k in
                             ("mean", "p50", "p90", "p95", "p99", "p99_ci_low", "p99_ci_high"))])
        out["Percentiles"] = (["max_num_seqs", "metric", "mean (ms)", "P50 (ms)", "P90 (ms)", "P95 (ms)", "P99 (ms)",
                               "P99 95% CI low (ms)", "P99 95% CI high (ms)"], rows)
        b = plan["budget"]
        out["Memory"] = (["term", "GiB"], [
            ["usable (total x gpu_memory_utilization)", b["usable_bytes"] / GiB],
            ["weights", b["weights_bytes"] / GiB], ["activation peak", b["activation_bytes"] / GiB],
            ["non-torch", b["non_torch_bytes"] / GiB],
            ["CUDA graphs (in budget)" if b["cuda_graphs_in_budget"] else "CUDA graphs (outside budget)",
             b["cuda_graph_bytes"] / GiB],
            ["KV cache budget", b["kv_budget_bytes"] / GiB]])
        if plan.get("context_frontier"):
            out["Context"] = (
                ["context (tokens)", "max_num_seqs", "fits memory", f"P{pct} TTFT (ms)", f"P{pct} TPOT (ms)",
                 "P99 queue wait (ms)", "preemptions", "peak output tokens/s", "requests the KV cache holds",
                 "meets SLO", "status / why not"],
                [[c["context"], c["max_num_seqs"], _yn(c["feasible"]), _ms(c["p_ttft"]), _ms(c["p_tpot"]),
                  _ms(c["queue_wait_p99"]), c["preemptions"], c["capacity_tokens_per_s"], c["kv_concurrency"],
                  _yn(c["meets_slo"]), c["why"] or ("saturated at 80% of its peak" if c["saturated"] else "")]
                 for c in plan["context_frontier"]])
        out["Memory table"] = (["batch", "context (tokens)", "KV needed (GiB)", "share of KV budget", "fits", "why"],
                               [[r["batch"], r["context"], r["kv_bytes"] / GiB, r["kv_fraction"], _yn(r["fits"]), r["reason"]]
                                for r in plan.get("memory_table", [])])
    if sweep_rows:
        keys = list(dict.fromkeys(k for r in sweep_rows for k in r))
        out["Sweep"] = (keys, [[_cell(r.get(k)) for k in keys] for r in sweep_rows])
    return out


def _yn(b) -> str:
    return "yes" if b else "no"


def _finite(x) -> bool:
    return x is not None and x == x and x not in (float("inf"), float("-inf"))


def _ms(x):
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x * 1e3


def _cell(v):
    if isinstance(v, dict):
        return v.get("value", json.dumps(v))
    if isinstance(v, (list, tuple)):
        return json.dumps(v)
    return v


def write_review(path: str | Path, plan=None, sweep_rows: list[dict] | None = None,
                 force: bool = False) -> list[Path]:
    """Write the workbook and, next to it, `<stem>.json` and `<stem>.<table>.csv`. `plan` is a `Plan` or its
    JSON form. Returns the paths written."""
    if plan is not None and not isinstance(plan, dict):
        from capacity.files import strict_json

        plan = strict_json(plan.as_dict())  # the same form `capacity plan --json` saves
    if plan is None and not sweep_rows:
        raise CapacityError("nothing to export: give a plan or sweep rows")
    path = Path(path)
    check_destination(path, force)
    tabs = tables(plan, sweep_rows)
    written = []
    _atomic_write(path, lambda tmp: _workbook(tmp, plan, tabs), force)
    written.append(path)
    jp = path.with_suffix(".json")
    from capacity.files import dumps

    _atomic_write(jp, lambda tmp: tmp.write_text(dumps({"plan": plan, "sweep": sweep_rows}, indent=1) + "\n"), force)
    written.append(jp)
    for name, (head, rows) in tabs.items():
        cp = path.with_name(f"{path.stem}.{name.lower().replace(' ', '_')}.csv")

        def w(tmp, head=head, rows=rows):
            with tmp.open("w", newline="") as f:
                cw = csv.writer(f)
                cw.writerow(head)
                cw.writerows(rows)
        _atomic_write(cp, w, force)
        written.append(cp)
    return written


def _workbook(dest: Path, plan: dict | None, tabs: dict) -> None:
    from openpyxl import Workbook
    from openpyxl.chart import BarChart, LineChart, Reference
    from openpyxl.formatting.rule import FormulaRule
    from openpyxl.styles import Alignment, Font, PatternFill

    bold = Font(bold=True)
    green = PatternFill(start_color="C6EFCE", end_color="C6EFCE", fill_type="solid")
    red = PatternFill(start_color="FFC7CE", end_color="FFC7CE", fill_type="solid")
    wb = Workbook()
    wb.remove(wb.active)

    def fmt(h: str) -> str | None:
        if "(ms)" in h or "(GiB)" in h or h == "GiB":
            return "0.00"
        if "share" in h:
            return "0.0%"
        if "tokens" in h or h in ("batch", "max_num_seqs", "max_model_len"):
            return "#,##0"
        return None

    def table(ws, head, rows, start_row=1):
        for j, h in enumerate(head, 1):
            ws.cell(start_row, j, h).font = bold
        formats = [fmt(str(h)) for h in head]
        for i, r in enumerate(rows, start_row + 1):
            for j, v in enumerate(r, 1):
                c = ws.cell(i, j, v)
                if formats[j - 1] and isinstance(v, (int, float)) and not isinstance(v, bool):
                    c.number_format = formats[j - 1]
        for j, h in enumerate(head, 1):
            dim = ws.column_dimensions[ws.cell(start_row, j).column_letter]
            dim.width = max(dim.width or 0, 12, min(48, len(str(h)) + 2))
        return start_row + len(rows)

    if plan:
        slo, pct = plan["slo"], plan["slo"]["percentile"]
        v = plan["verification"]
        rec = plan["recommended"] or {}
        s = wb.create_sheet("Summary")
        s.column_dimensions["A"].width = 44
        s.column_dimensions["B"].width = 28
        rows = [
            ("Model", plan["model"]), ("GPU", plan["gpu"]), ("Tensor parallel size", plan["tp"]),
            ("max_num_seqs (recommended)", rec.get("max_num_seqs")),
            ("max_model_len (recommended)", rec.get("max_model_len")),
            ("Replicas", plan["replicas"]), ("GPUs", plan["gpus"]),
            ("Target rate (requests/s)", plan["target_rate"]),
            ("Mean output tokens per request", _mean_output_tokens(plan)),
            ("Price per GPU-hour (USD) - edit me", (plan["scenario"].get("price_per_gpu_hour") or 0.0)),
            ("Cost per hour (USD)", "=B7*B10"),
            ("Output tokens/s at the target", "=B8*B9"),
            ("Cost per 1M output tokens (USD)", "=IF(B12>0,B11/(B12*3600)*1000000,0)"),
            (f"SLO P{pct} TTFT (ms)", slo["ttft_s"] * 1e3),
            (f"Verified P{pct} TTFT (ms)", _ms(v["p_ttft_s"])),
            ("TTFT margin (ms)", "=B14-B15"),
            (f"SLO P{pct} TPOT (ms)", slo["tpot_s"] * 1e3),
            (f"Verified P{pct} TPOT (ms)", _ms(v["p_tpot_s"])),
            ("TPOT margin (ms)", "=B17-B18"),
            ("Verification passed", v["passed"]),
            ("vllm serve command", plan["vllm_command"]), ("SGLang command", plan["sglang_command"]),
            ("Step-cost source", plan["source"]),
        ]
        for i, (k, val) in enumerate(rows, 1):
            s.cell(i, 1, k).font = bold
            s.cell(i, 2, val)
        s["B10"].fill = PatternFill(start_color="FFF2CC", end_color="FFF2CC", fill_type="solid")
        s.column_dimensions["B"].width = 90
        for r in (21, 22, 23):
            s.cell(r, 2).alignment = Alignment(wrap_text=True, vertical="top")
            s.row_dimensions[r].height = 30
        for r in (13, 15, 16, 18, 19):
            s.cell(r, 2).number_format = "0.00"
        for i, line in enumerate(plan["tradeoffs"], len(rows) + 2):
            s.cell(i, 1, line)

        a = wb.create_sheet("Assumptions")
        a.column_dimensions["A"].width = 40
        a.column_dimensions["B"].width = 80
        flat = _flatten(plan["scenario"])
        flat += [("step_cost_source", plan["source"]), ("tool_version", plan["tool_version"]),
                 ("verification seeds", json.dumps(v["seeds"]))]
        if plan.get("provenance"):
            flat += [(f"calibration.{k}", val) for k, val in _flatten(plan["provenance"])]
        table(a, ["field", "value"], [[k, _cell(val)] for k, val in flat])

        m = wb.create_sheet("Memory")
        m.column_dimensions["A"].width = 44
        head, rows_m = tabs["Memory"]
        end = table(m, head, rows_m)
        m.cell(end + 1, 1, "KV budget re-derived (usable - weights - activation - non-torch - graphs if in budget)")
        graphs = "-B6" if plan["budget"]["cuda_graphs_in_budget"] else ""
        m.cell(end + 1, 2, f"=B2-B3-B4-B5{graphs}").number_format = "0.00"
        b = plan["budget"]
        extra = [("KV blocks", b["num_blocks"]), ("block size (tokens)", b["block_size"]),
                 ("KV tokens", b["kv_tokens"]), ("KV bytes per token", b["kv_bytes_per_token"]),
                 ("max_num_seqs", b["max_num_seqs"]), ("max_model_len", b["max_model_len"])]
        for i, (k, val) in enumerate(extra, end + 3):
            m.cell(i, 1, k)
            m.cell(i, 2, val)
        mt_head, mt_rows = tabs["Memory table"]
        mt_start = end + 4 + len(extra)
        table(m, mt_head, mt_rows, start_row=mt_start)
        bar = BarChart()
        bar.type = "bar"
        bar.title = "Memory per rank (GiB)"
        bar.add_data(Reference(m, min_col=2, min_row=1, max_row=7), titles_from_data=True)
        bar.set_categories(Reference(m, min_col=1, min_row=2, max_row=7))
        bar.height, bar.width = 8, 16
        m.add_chart(bar, "H2")

        f = wb.create_sheet("Frontier")
        head, rows_f = tabs["Frontier"]
        end = table(f, head, rows_f)
        f.cell(1, 12, f"SLO P{pct} TTFT (ms)").font = bold
        f.cell(2, 12, slo["ttft_s"] * 1e3)
        f.cell(1, 13, f"SLO P{pct} TPOT (ms)").font = bold
        f.cell(2, 13, slo["tpot_s"] * 1e3)
        if end >= 2:
            for col, ref in (("E", "$L$2"), ("F", "$M$2")):
                rng = f"{col}2:{col}{end}"  # blank = saturated or does not fit: no colour
                f.conditional_formatting.add(rng, FormulaRule(formula=[f"AND(ISNUMBER({col}2),{col}2<={ref})"], fill=green))
                f.conditional_formatting.add(rng, FormulaRule(formula=[f"AND(ISNUMBER({col}2),{col}2>{ref})"], fill=red))

        if "Context" in tabs:
            cx = wb.create_sheet("Context")
            head, rows_c = tabs["Context"]
            table(cx, head, rows_c)
        else:
            wb.create_sheet("Context").cell(1, 1, "no context trade-off in this plan (search.contexts: [])")

        pc = wb.create_sheet("Percentiles")
        head, rows_p = tabs["Percentiles"]
        table(pc, head, rows_p)
        # chart: P99 TTFT and TPOT vs max batch (one row per max_num_seqs for each metric)
        seqs = sorted({r[0] for r in rows_p})
        if seqs:
            ch = pc.max_row + 3
            pc.cell(ch, 1, "max_num_seqs").font = bold
            pc.cell(ch, 2, f"P{pct} TTFT (ms)").font = bold
            pc.cell(ch, 3, f"P{pct} TPOT (ms)").font = bold
            for i, sq in enumerate(seqs, ch + 1):
                pc.cell(i, 1, sq)
                pc.cell(i, 2, next((r[6] for r in rows_p if r[0] == sq and r[1] == "TTFT"), None))
                pc.cell(i, 3, next((r[6] for r in rows_p if r[0] == sq and r[1] == "TPOT"), None))
            for ycol, title, anchor in ((2, f"P{pct} TTFT vs max batch", "K2"), (3, f"P{pct} TPOT vs max batch", "K20")):
                lc = LineChart()
                lc.title = title
                lc.x_axis.title = "max_num_seqs"
                lc.y_axis.title = "ms"
                lc.add_data(Reference(pc, min_col=ycol, min_row=ch, max_row=ch + len(seqs)), titles_from_data=True)
                lc.set_categories(Reference(pc, min_col=1, min_row=ch + 1, max_row=ch + len(seqs)))
                lc.height, lc.width = 8, 16
                pc.add_chart(lc, anchor)
    if "Sweep" in tabs:
        sw = wb.create_sheet("Sweep")
        head, rows_s = tabs["Sweep"]
        table(sw, head, rows_s)
    for ws in wb.worksheets:  # print/PDF: landscape, one page wide
        ws.page_setup.orientation = "landscape"
        ws.sheet_properties.pageSetUpPr.fitToPage = True
        ws.page_setup.fitToWidth = 1
        ws.page_setup.fitToHeight = 0
    wb.save(dest)


def _mean_output_tokens(plan: dict) -> float | None:
    """The plan's own class-weighted mean output length (plans saved before it was recorded: the base
    length distribution's mean)."""
    if plan.get("mean_output_tokens"):
        return plan["mean_output_tokens"]
    out = plan["scenario"]["workload"]["output_len"]
    return out.get("value") or _mean_len(out)


def _mean_len(spec: dict) -> float | None:
    if spec.get("kind") == "uniform":
        return (spec["low"] + spec["high"]) / 2
    if spec.get("kind") == "lognormal":
        return spec.get("mean")
    if spec.get("kind") == "empirical" and spec.get("values"):
        return sum(spec["values"]) / len(spec["values"])
    return spec.get("value")


def _flatten(d, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += _flatten(v, key + ".")
        else:
            out.append((key, v))
    return out
