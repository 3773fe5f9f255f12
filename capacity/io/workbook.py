"""The capacity-review workbook (openpyxl), from the plan's JSON form and the review's tables (`tables.py`).

Summary: a title, the date and tool version, the question in one line, then the answer with units on every
figure. Inputs are yellow and say so (target rate, headroom, price); every figure that depends on them is a
formula that follows an edit honestly: replicas = the plan's verified count at the planned rate, otherwise
ceil(rate / (max rate per replica x headroom)); GPUs, cost per hour and per 1M output tokens follow. The
verified P99s belong to the planned rate, and the sheet says so.

User strings (model names, scenario text, commands) are written as text, never as formulas, whatever they
start with (`=`, `+`, `-`, `@`: spreadsheet formula injection); only the formulas this module builds are
formulas. Every sheet prints landscape, one page wide.
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import BinaryIO

from capacity.io.tables import GiB, Table, mean_output_tokens, ms, scenario_line
from capacity.io.workbook_cells import _styles, _table, _table_sheet, formula, put
from capacity.io.workbook_fleet import autoscale_sheet, fleet_day_sheet


def write_workbook(dest: Path | BinaryIO, plan: dict | None, tabs: dict[str, Table], autoscale: dict | None = None,
                   fleet_day: dict | None = None) -> None:
    """The review's sheets from a plan's JSON form and its tables, plus the Autoscale sheet from an autoscale
    report (`capacity autoscale --json`, checked by the caller: capacity.io.fleet.check_report) and the Fleet day
    sheet from a fleet-day report (`capacity fleet-day --json`: capacity.io.fleetday.check_day_report)."""
    from openpyxl import Workbook

    wb = Workbook()
    wb.remove(wb.active)
    if "Comparison" in tabs:
        _table_sheet(wb, "Comparison", tabs["Comparison"],
                     note="The same question on each option, cheapest first (fewest GPUs when unpriced); the sheets "
                          "after this one are the first option's plan. A caveat marks a rate resting on datasheet "
                          "peaks with efficiencies nothing measured on that part.")
    if plan:
        _summary(wb, plan)
        _table_sheet(wb, "Assumptions", tabs["Assumptions"], widths={1: 44, 2: 70, 3: 26})
        _memory(wb, plan, tabs)
        _frontier(wb, plan, tabs["Frontier"])
        if "Context" in tabs:
            _table_sheet(wb, "Context", tabs["Context"],
                         note=f"Requests of each context against each max_num_seqs at {plan.get('headroom', 0.8):.0%} "
                              "of that cell's own peak: where the KV cache runs out, capacity stops growing and "
                              "preemptions and queueing appear.")
        else:
            _table_sheet(wb, "Context", (["note"], [["no context trade-off in this plan (search.contexts: [])"]]))
        _percentiles(wb, plan, tabs["Percentiles"])
    if "Sweep" in tabs:
        _table_sheet(wb, "Sweep", tabs["Sweep"])
    if autoscale is not None:
        autoscale_sheet(wb, autoscale)
    if fleet_day is not None:
        fleet_day_sheet(wb, fleet_day)
    for ws in wb.worksheets:  # print/PDF: landscape, one page (a sweep: one page wide, as long as it needs)
        ws.page_setup.orientation = "landscape"
        ws.sheet_properties.pageSetUpPr.fitToPage = True
        ws.page_setup.fitToWidth = 1
        ws.page_setup.fitToHeight = 0 if ws.title in ("Sweep", "Autoscale", "Fleet day", "Comparison") else 1
    wb.save(dest)


# ---- Summary ---------------------------------------------------------------------------------------------------
def _summary(wb, plan: dict) -> None:
    st = _styles()
    ws = wb.create_sheet("Summary")
    pct = plan["slo"]["percentile"]
    v = plan["verification"]
    rec = plan.get("recommended") or {}
    max_rate = (plan.get("rec_search") or {}).get("max_rate") or None
    put(ws, 1, 1, f"Capacity review: {plan['model']} on {plan['gpu']}").font = st["title"]
    put(ws, 2, 1, f"{_dt.date.today().isoformat()}, capacity {plan['tool_version']}; step costs: {plan['source']}"
        ).font = st["dim"]
    put(ws, 3, 1, scenario_line(plan))
    rows: list[tuple[str, str, object, str, str]] = [  # (key, label, value or =formula, unit, kind)
        ("rate", "Target rate", plan["target_rate"], "requests/s", "input"),
        ("headroom", "Headroom: share of the max rate each replica runs at", plan.get("headroom", 1.0), "", "input"),
        ("price", "Price per GPU-hour", plan["scenario"].get("price_per_gpu_hour") or 0.0, "USD per GPU-hour", "input"),
        ("maxrate", "Max sustainable rate per replica (recommended configuration)", max_rate, "requests/s", ""),
        ("tp", "Tensor parallel size", plan["tp"], "GPUs per replica", ""),
        ("replicas", "Replicas", "=IF({rate}={planned},{plan_replicas},ROUNDUP({rate}/({maxrate}*{headroom}),0))"
         if max_rate else plan["replicas"], "", ""),
        ("gpus", "GPUs", "={replicas}*{tp}", f"x {plan['gpu']}", ""),
        ("seqs", "max_num_seqs (recommended)", rec.get("max_num_seqs"), "sequences", ""),
        ("len", "max_model_len (recommended)", rec.get("max_model_len"), "tokens", ""),
        ("mnbt", "max_num_batched_tokens (recommended)", plan["budget"].get("max_num_batched_tokens"), "tokens per step",
         ""),
        ("out", "Mean output tokens per request", mean_output_tokens(plan), "tokens (class-weighted)", ""),
        ("cost_h", "Cost per hour", "={gpus}*{price}", "USD per hour", ""),
        ("tok_s", "Output tokens/s at the target rate", "={rate}*{out}", "tokens/s", ""),
        ("cost_m", "Cost per 1M output tokens", "=IF({tok_s}>0,{cost_h}/({tok_s}*3600)*1000000,0)",
         "USD per 1M output tokens", ""),
        ("slo_t", f"SLO P{pct} TTFT", plan["slo"]["ttft_s"] * 1e3, "ms", ""),
        ("ver_t", f"Verified P{pct} TTFT at {v['rate_per_s']:g} req/s", ms(v["p_ttft_s"]), "ms (planned rate)", ""),
        ("mar_t", "TTFT margin", "=IF(ISNUMBER({ver_t}),{slo_t}-{ver_t},\"saturated\")", "ms", ""),
        ("slo_p", f"SLO P{pct} TPOT", plan["slo"]["tpot_s"] * 1e3, "ms", ""),
        ("ver_p", f"Verified P{pct} TPOT at {v['rate_per_s']:g} req/s", ms(v["p_tpot_s"]), "ms (planned rate)", ""),
        ("mar_p", "TPOT margin", "=IF(ISNUMBER({ver_p}),{slo_p}-{ver_p},\"saturated\")", "ms", ""),
        ("passed", "Verification at the planned rate", "passed" if v["passed"] else "FAILED",
         f"{v['replicas']} replicas, fresh seeds {v['seeds']}", ""),
    ]
    first = 5
    put(ws, first, 1, "figure").font = st["bold"]
    put(ws, first, 2, "value").font = st["bold"]
    put(ws, first, 3, "unit").font = st["bold"]
    refs = {key: f"B{first + 1 + i}" for i, (key, *_) in enumerate(rows)}
    refs.update(planned=repr(plan["target_rate"]), plan_replicas=str(plan["replicas"]))
    for i, (key, label, value, unit, kind) in enumerate(rows, first + 1):
        put(ws, i, 1, label)
        if isinstance(value, str) and value.startswith("="):
            c = formula(ws, i, 2, value.format(**refs))
        else:
            c = put(ws, i, 2, value)
        c.number_format = {"rate": "#,##0.00", "maxrate": "#,##0.00", "headroom": "0%", "price": "#,##0.00",
                           "cost_h": "#,##0.00", "cost_m": "#,##0.000", "tok_s": "#,##0", "out": "#,##0",
                           "seqs": "#,##0", "len": "#,##0"}.get(key, "#,##0.0" if "ms" in unit else "General")
        put(ws, i, 3, unit + (" (input: edit me)" if kind == "input" else ""))
        if kind == "input":
            c.fill = st["input"]
    r = first + len(rows) + 2
    put(ws, r, 1, "Editing the target rate, headroom or price recomputes replicas, GPUs and cost; the verified P99s "
                  "stay those of the planned rate.").font = st["dim"]
    for label, text in (("vllm serve command", plan["vllm_command"]), ("SGLang command", plan["sglang_command"])):
        r += 1
        put(ws, r, 1, label).font = st["bold"]
        c = put(ws, r, 2, text)
        c.alignment = st["wrap"]
        ws.merge_cells(start_row=r, start_column=2, end_row=r, end_column=3)
        ws.row_dimensions[r].height = 15 * (1 + len(text) // 95)
    r += 2
    put(ws, r, 1, "Trade-offs").font = st["bold"]
    for line in plan["tradeoffs"]:
        r += 1
        c = put(ws, r, 1, line)
        c.alignment = st["wrap"]
        ws.merge_cells(start_row=r, start_column=1, end_row=r, end_column=3)
        ws.row_dimensions[r].height = 15 * (1 + len(line) // 150)
    for note in plan.get("notes", []):
        r += 1
        c = put(ws, r, 1, "note: " + note)
        c.font = st["dim"]
        c.alignment = st["wrap"]
        ws.merge_cells(start_row=r, start_column=1, end_row=r, end_column=3)
        ws.row_dimensions[r].height = 15 * (1 + len(note) // 150)
    ws.column_dimensions["A"].width = 58
    ws.column_dimensions["B"].width = 48
    ws.column_dimensions["C"].width = 40


# ---- Memory ----------------------------------------------------------------------------------------------------
def _memory(wb, plan: dict, tabs: dict[str, Table]) -> None:
    from openpyxl.chart import BarChart, Reference
    from openpyxl.chart.label import DataLabelList

    st = _styles()
    ws = wb.create_sheet("Memory")
    b = plan["budget"]
    put(ws, 1, 1, f"Memory per rank of the recommended configuration (TP {b['tp']}, max_num_seqs {b['max_num_seqs']}, "
                  f"max_model_len {b['max_model_len']:,}): {b['gpu']} reports {b['total_bytes'] / GiB:.2f} GiB"
        ).font = st["bold"]
    head, rows = tabs["Memory"]
    end = _table(ws, (head, rows), 3)
    # the stacked bar: the GPU's memory split into the six parts of `usable` and what lies outside the budget
    parts = [*rows[:6], rows[7]]
    r0 = end + 3
    put(ws, r0, 1, "chart data: one series per term (GiB)").font = st["dim"]
    for i, (name, gib, _) in enumerate(parts, r0 + 1):
        put(ws, i, 1, name)
        put(ws, i, 2, round(gib, 2), "0.00")
    derived = r0 + len(parts) + 2
    put(ws, derived, 1, "KV budget re-derived: usable - weights - activation - non-torch - graphs inside the budget "
                        "- runner buffers")
    formula(ws, derived, 2, "=B10-B4-B5-B6-B7-B8", "0.00")  # rows 4-10 of the table: the terms and `usable`
    for i, (k, val) in enumerate((("KV blocks (middle of the estimate)", b["num_blocks"]),
                                  ("KV blocks the plan uses (conservative end)", b.get("planning_blocks", b["num_blocks"])),
                                  ("block size (tokens)", b["block_size"]),
                                  ("KV tokens", b["kv_tokens"]), ("KV bytes per token", b["kv_bytes_per_token"]),
                                  ("max concurrency at max_model_len", b["max_concurrency"])), derived + 1):
        put(ws, i, 1, k)
        put(ws, i, 2, val, "#,##0.00" if isinstance(val, float) and val < 1000 else "#,##0")
    chart = BarChart()
    chart.type = "bar"
    chart.grouping = "stacked"
    chart.overlap = 100
    chart.title = (f"Memory per rank: {b['total_bytes'] / GiB:.1f} GiB, of which {b['usable_bytes'] / GiB:.1f} "
                   f"usable (x {b['gpu_memory_utilization']})")
    chart.y_axis.title = "GiB"
    chart.add_data(Reference(ws, min_col=1, max_col=2, min_row=r0 + 1, max_row=r0 + len(parts)), from_rows=True,
                   titles_from_data=True)
    chart.dataLabels = DataLabelList()
    chart.dataLabels.showVal = True
    for flag in ("showSerName", "showCatName", "showLegendKey", "showPercent"):
        setattr(chart.dataLabels, flag, False)
    chart.x_axis.delete = True  # one bar: no category axis
    chart.height, chart.width = 7, 22
    chart.legend.position = "b"
    ws.add_chart(chart, "E3")
    _, mt_rows = tabs["Memory table"]
    start = derived + 9
    put(ws, start - 1, 1, "Batch x context (tokens): KV GiB needed, green = fits, red = does not (paged blocks; "
                          "the long form is in the .memory_table.csv)").font = st["bold"]
    batches = sorted({r[0] for r in mt_rows})
    contexts = sorted({r[1] for r in mt_rows})
    by = {(r[0], r[1]): r for r in mt_rows}
    put(ws, start, 1, "batch \\ context").font = st["bold"]
    for j, x in enumerate(contexts, 2):
        put(ws, start, j, x, "#,##0").font = st["bold"]
    for i, bt in enumerate(batches, start + 1):
        put(ws, i, 1, bt, "#,##0")
        for j, x in enumerate(contexts, 2):
            r = by.get((bt, x))
            if r is not None:
                put(ws, i, j, r[2], "#,##0.0").fill = st["green"] if r[4] == "yes" else st["red"]
    ws.column_dimensions["A"].width = 62


# ---- Frontier ----------------------------------------------------------------------------------------------------
def _frontier(wb, plan: dict, table: Table) -> None:
    st = _styles()
    ws = wb.create_sheet("Frontier")
    pct, slo = plan["slo"]["percentile"], plan["slo"]
    put(ws, 1, 1, f"Frontier at {plan['per_replica_rate']:.2f} req/s per replica (TP {plan['tp']}); SLO P{pct} TTFT "
                  f"<= {slo['ttft_s'] * 1e3:,.0f} ms, P{pct} TPOT <= {slo['tpot_s'] * 1e3:,.0f} ms; the recommended "
                  "row is blue, rows that saturate or miss the SLO are red").font = st["bold"]
    head, rows = table
    end = _table(ws, table, 3)
    i_rec, i_ok = head.index("recommended"), head.index("meets SLO")
    for i, r in enumerate(rows, 4):
        fill = st["rec"] if r[i_rec] == "yes" else (st["red"] if r[i_ok] == "no" else None)
        if fill is not None:
            for j in range(1, len(head) + 1):
                ws.cell(i, j).fill = fill
    ws.freeze_panes = "B4"
    del end


# ---- Percentiles -----------------------------------------------------------------------------------------------
def _percentiles(wb, plan: dict, table: Table) -> None:
    from openpyxl.chart import LineChart, Reference

    st = _styles()
    ws = wb.create_sheet("Percentiles")
    pct, slo = plan["slo"]["percentile"], plan["slo"]
    head, rows = table
    put(ws, 1, 1, "Percentiles per max_num_seqs at the per-replica load (ms); saturated configurations have no "
                  "latency and are left out of the charts").font = st["bold"]
    end = _table(ws, table, 3)
    seqs = sorted({r[0] for r in rows})
    if not seqs:
        return
    key = f"P{pct} (ms)"
    col = head.index(key) if key in head else head.index("P99 (ms)")
    ch = end + 3
    for j, h in enumerate(("max_num_seqs", f"P{pct} TTFT", "TTFT SLO", f"P{pct} TPOT", "TPOT SLO"), 1):
        put(ws, ch, j, h).font = st["bold"]
    first: dict[int, dict] = {}  # the cell `percentiles` shows per max_num_seqs: the first feasible one
    for c in plan["frontier"]:
        if c["feasible"] and c.get("stats"):
            first.setdefault(c["max_num_seqs"], c)
    saturated = {s for s, c in first.items() if c.get("saturated") or c.get("p_ttft") is None}
    put(ws, ch, 6, "note").font = st["bold"]
    for i, sq in enumerate(seqs, ch + 1):
        val = lambda m, sq=sq: next((r[col] for r in rows if r[0] == sq and r[1] == m), None)
        put(ws, i, 1, str(sq))  # categories as text: evenly spaced, as the grid is
        ttft, tpot = (None, None) if sq in saturated else (val("TTFT"), val("TPOT"))
        if sq in saturated:  # its queue grows without bound: a latency from it would flatten the SLO line
            put(ws, i, 6, "saturated: left out of the charts")
        put(ws, i, 2, None if ttft is None else round(ttft, 1))
        put(ws, i, 3, round(slo["ttft_s"] * 1e3, 1))
        put(ws, i, 4, None if tpot is None else round(tpot, 2))
        put(ws, i, 5, round(slo["tpot_s"] * 1e3, 2))
    last = ch + len(seqs)
    for cols, title, anchor in (((2, 3), f"P{pct} TTFT vs max_num_seqs (ms), SLO dashed", "L3"),
                                ((4, 5), f"P{pct} TPOT vs max_num_seqs (ms), SLO dashed", "L22")):
        lc = LineChart()
        lc.title = title
        lc.x_axis.title = "max_num_seqs"
        lc.y_axis.title = "ms"
        lc.add_data(Reference(ws, min_col=cols[0], max_col=cols[1], min_row=ch, max_row=last), titles_from_data=True)
        lc.set_categories(Reference(ws, min_col=1, min_row=ch + 1, max_row=last))
        for s in lc.series:
            s.smooth = False
        lc.series[1].graphicalProperties.line.dashStyle = "dash"
        lc.height, lc.width = 8, 16
        ws.add_chart(lc, anchor)


# ---- Autoscale -------------------------------------------------------------------------------------------------
