"""The capacity-review workbook's fleet sheets: Autoscale (an autoscale report, aggregated or disaggregated) and
Fleet day (a fleet-day report), from capacity.io.fleet's and capacity.io.fleetday's tables (the same as the CSV).
Split from `capacity.io.workbook`, which writes the plan's sheets; the cells' helpers are `capacity.io.workbook_cells`."""
from __future__ import annotations

from capacity.io.fleet import DECODE_HEAD, summary_table, window_table
from capacity.io.fleetday import day_table, totals_table
from capacity.io.tables import ms
from capacity.io.workbook_cells import _styles, _table, put


def autoscale_sheet(wb, report: dict) -> None:
    """Autoscaled against static (the summary), the settings, a chart of the ready replicas and the P99 TTFT per
    window against the SLO, and the per-window table (capacity.io.fleet's tables, the same as the CSV)."""
    from openpyxl.chart import LineChart, Reference
    from openpyxl.chart.axis import TextAxis

    st = _styles()
    ws = wb.create_sheet("Autoscale")
    a, s, slo, d = report["autoscaled"], report["static"], report["slo"], report.get("decode")
    put(ws, 1, 1, f"Autoscaling {report['model']} on {report['gpu']} (TP {report['tp']}): {report['policy']} policy "
                  f"against {s['replicas']} static replicas" if d is None else
                  f"Autoscaling {report['model']} on {report['gpu']}, disaggregated: prefill TP {report['tp']} "
                  f"({report['policy']}) and decode TP {d['tp']} ({d['policy']}), against {s['replicas']} + "
                  f"{s['decode_replicas']} static replicas").font = st["title"]
    saved = 1 - a["gpu_hours"] / s["gpu_hours"] if s["gpu_hours"] else 0.0
    put(ws, 2, 1, f"{a['requests']:,} requests over {a['simulated_s'] / 3600:.2f} h of the load curve; autoscaling "
                  f"uses {saved:.0%} fewer GPU-hours than the static pool" + _from_bound(report)).font = st["dim"]
    head, rows = summary_table(report)
    first = 4
    end = _table(ws, (head, rows), first)
    for i in range(first + 1, end + 1):
        label = ws.cell(i, 1).value
        fmt = "#,##0.00" if label == "Cost" or str(label).startswith("GPU-hours") else "#,##0.0" if "P99" in str(label) or "minutes" in str(
            label) else "#,##0"
        for j in (2, 3):
            if isinstance(ws.cell(i, j).value, (int, float)):
                ws.cell(i, j).number_format = fmt
    units = {"concurrency": "requests in flight per replica", "queue": "requests waiting per ready replica",
             "kv": "share of the KV cache"}
    settings = [
        ("Policy", report["policy"], "concurrency, queue, kv, predictive or sla"),
        ("Target", report["target"], units.get(report["policy"], "(not used)")),
        ("Start-up delay", report["startup_s"], "s (model load + engine start)"),
        ("Cooldown", report["cooldown_s"], "s"),
        ("Window", report["window_s"], "s (the P99s and the SLO per window)"),
        ("SLO P99 TTFT per window", ms(slo.get("ttft_s")), "ms" if slo.get("ttft_s") else "ms (none)"),
        ("SLO P99 TPOT per window", ms(slo.get("tpot_s")), "ms" if slo.get("tpot_s") else "ms (none)"),
        ("Load curve mean rate", report["curve_mean_rate_per_s"], "requests/s"),
        ("Load curve peak rate", report["curve_peak_rate_per_s"], "requests/s"),
    ]
    if d is not None:  # disaggregated: the settings above are the prefill pool's
        settings[:2] = [("Prefill policy", report["policy"], settings[0][2]), ("Prefill target", *settings[1][1:])]
        settings[2:4] = [("Prefill start-up delay", *settings[2][1:]), ("Prefill cooldown", *settings[3][1:])]
        settings += [("Decode policy", d["policy"], "the decode pool's controller"),
                     ("Decode target", d["target"], units.get(d["policy"], "(not used)")),
                     ("Decode start-up delay", d["startup_s"], "s"), ("Decode cooldown", d["cooldown_s"], "s"),
                     ("KV link", d["link"], "prefill to decode")]
    r0 = end + 2
    for j, h in enumerate(("setting", "value", "", "unit"), 1):
        put(ws, r0, j, h).font = st["bold"]
    for i, (label, val, unit) in enumerate(settings, r0 + 1):
        put(ws, i, 1, label)
        put(ws, i, 2, val, "#,##0.00" if isinstance(val, float) else None)
        put(ws, i, 4, unit)
    # the chart beside the summary, the per-window table below both
    top = max(r0 + len(settings) + 2, first + 24)
    put(ws, top - 1, 1, "Per window: the requests arriving in it, the pool at its start, their P99s (blank: no "
                        "request, or one that never finished)").font = st["bold"]
    wt = window_table(report)
    last = _table(ws, wt, top)
    ws.print_title_rows = f"{top}:{top}"
    ws.column_dimensions["A"].width = 50
    ws.column_dimensions["D"].width = max(ws.column_dimensions["D"].width or 0, 26)
    for j, h in enumerate(wt[0], 1):
        if h == "meets SLO" or h == "static meets SLO":
            for i, row in enumerate(wt[1], top + 1):
                if row[j - 1] == "no":
                    ws.cell(i, j).fill = st["red"]
    if not wt[1]:
        return
    col = {h: j for j, h in enumerate(wt[0], 1)}
    pool = "prefill " if d is not None else ""
    reps = LineChart()
    reps.title = "Ready replicas and P99 TTFT per window" + (", SLO dashed" if slo.get("ttft_s") else "")
    reps.add_data(Reference(ws, min_col=col[f"{pool}ready replicas (at start)"], min_row=top, max_row=last),
                  titles_from_data=True)
    if d is not None:  # the decode pool's ready replicas beside the prefill pool's
        reps.add_data(Reference(ws, min_col=col[DECODE_HEAD[0]], min_row=top, max_row=last), titles_from_data=True)
    reps.set_categories(Reference(ws, min_col=col["window start (min)"], min_row=top + 1, max_row=last))
    reps.x_axis.title = "window start (min)"
    reps.x_axis.number_format = "General"
    reps.y_axis.title = "replicas"
    reps.y_axis.majorGridlines = None
    latency = LineChart()
    latency.add_data(Reference(ws, min_col=col["P99 TTFT (ms)"], min_row=top, max_row=last), titles_from_data=True)
    if slo.get("ttft_s"):
        latency.add_data(Reference(ws, min_col=col["SLO P99 TTFT (ms)"], min_row=top, max_row=last),
                         titles_from_data=True)
        latency.series[1].graphicalProperties.line.dashStyle = "dash"
    latency.y_axis.axId = 200  # the secondary axis, on the right, against a hidden category axis of its own
    latency.y_axis.title = "P99 TTFT (ms)"
    latency.y_axis.crosses = "max"
    latency.x_axis = TextAxis(axId=500, crossAx=200, delete=True)
    latency.y_axis.crossAx = 500
    for chart in (reps, latency):
        for series in chart.series:
            series.smooth = False
    for axis in (reps.x_axis, reps.y_axis, latency.y_axis):
        axis.delete = False  # openpyxl 3.1 hides axes unless told
    reps.display_blanks = "gap"  # a window without a P99 is a gap, not a zero
    reps += latency
    reps.legend.position = "b"
    reps.height, reps.width = 10, 20
    ws.add_chart(reps, "F4")


def _from_bound(report: dict) -> str:
    """'; N% (X GPU-hours) above a perfect system, M SLO-miss minutes' when the report has the lower bound."""
    b = report.get("lower_bound")
    if b is None:
        return ""
    v = report["autoscaled"]["vs_bound"]
    pct = f"{v['pct']:.0f}% ({v['gpu_hours']:.2f} GPU-hours)" if v["pct"] is not None else f"{v['gpu_hours']:.2f} GPU-hours"
    return (f"; {pct} above a perfect system's {b['gpu_hours']:.2f} (no start-up delay, "
            f"{b['per_replica_rate_per_s']:.3g} req/s per replica), {v['violation_minutes']:.0f} SLO-miss minutes")


def fleet_day_sheet(wb, report: dict) -> None:
    """A fleet over a day: the fleet per layout (GPU-hours, cost, SLO-miss minutes), a bar chart of them, and one
    row per model and layout (capacity.io.fleetday's tables, the same as the CSV)."""
    from openpyxl.chart import BarChart, Reference

    st = _styles()
    ws = wb.create_sheet("Fleet day")
    put(ws, 1, 1, f"{len(report['models'])} models on {report['gpu']} over a day: static, reactive and predictive "
                  "scaling per model, and shared GPUs").font = st["title"]
    price = report.get("price_per_gpu_hour")
    put(ws, 2, 1, f"Start-up delay {report['startup_s']:g} s; SLO windows of {report['window_s'] / 60:g} min; "
                  + (f"{price:g} USD per GPU-hour" if price else "no price given")).font = st["dim"]
    th = totals_table(report)
    first = 4
    end = _table(ws, th, first)
    for i in range(first + 1, end + 1):
        for j, fmt in ((3, "#,##0.0"), (4, "#,##0"), (5, "#,##0")):
            if isinstance(ws.cell(i, j).value, (int, float)):
                ws.cell(i, j).number_format = fmt
    chart = BarChart()
    chart.title = "GPU-hours per day, by layout"
    chart.add_data(Reference(ws, min_col=3, min_row=first, max_row=end), titles_from_data=True)
    chart.set_categories(Reference(ws, min_col=1, min_row=first + 1, max_row=end))
    chart.y_axis.title = "GPU-hours"
    for axis in (chart.x_axis, chart.y_axis):
        axis.delete = False
    chart.legend = None
    chart.height, chart.width = 7, 14
    ws.add_chart(chart, "H4")
    top = max(end + 3, first + 16)
    put(ws, top - 1, 1, "Per model and layout").font = st["bold"]
    dt = day_table(report)
    last = _table(ws, dt, top)
    for i in range(top + 1, last + 1):
        for j, fmt in ((4, "#,##0.0"), (5, "#,##0"), (6, "#,##0"), (7, "#,##0"), (8, "#,##0.0"), (9, "#,##0")):
            if isinstance(ws.cell(i, j).value, (int, float)):
                ws.cell(i, j).number_format = fmt
        if ws.cell(i, 6).value not in (None, 0, 0.0):
            ws.cell(i, 6).fill = st["red"]
    r = last + 2
    put(ws, r, 1, "How each figure is obtained").font = st["bold"]
    for k, m in enumerate(report["models"], r + 1):
        put(ws, k, 1, f"{m['model']}: {m['per_replica_rate']:.3g} req/s per replica ({m['rate_source']}); reactive "
                      f"target {m['target']:.3g} in flight ({m['target_source']}); peak {m['peak_rate_per_s']:.3g}, "
                      f"mean {m['mean_rate_per_s']:.3g} req/s")
    ws.column_dimensions["A"].width = 22
    ws.column_dimensions["F"].width = max(ws.column_dimensions["F"].width or 0, 18)
