"""The capacity-review workbook's cells (openpyxl): a value as text or number (never a formula from user text:
spreadsheet formula injection), a formula this package built, the styles, a table with its header, a sheet of
one table. Shared by `capacity.io.workbook` (the plan's sheets) and `capacity.io.workbook_fleet` (the fleet's)."""
from __future__ import annotations

import math

from capacity.io.tables import Table, yn

INJECTION = ("=", "+", "-", "@", "\t", "\r")


# ---- cells ---------------------------------------------------------------------------------------------------
def put(ws, row: int, col: int, value, fmt: str | None = None):
    """A cell with a value: strings are text (never formulas), numbers keep their type."""
    c = ws.cell(row, col)
    if isinstance(value, bool):
        value = yn(value)
    c.value = value
    if isinstance(value, str) and value.startswith(INJECTION):
        c.data_type = "s"  # text, even though it looks like a formula
    if fmt and isinstance(value, (int, float)):
        c.number_format = fmt
    return c


def formula(ws, row: int, col: int, text: str, fmt: str | None = None):
    c = ws.cell(row, col)
    c.value = text  # a formula this module built from cell references, not user text
    if fmt:
        c.number_format = fmt
    return c


def _styles():
    from openpyxl.styles import Alignment, Font, PatternFill

    fill = lambda c: PatternFill(start_color=c, end_color=c, fill_type="solid")
    return {"bold": Font(bold=True), "title": Font(bold=True, size=14), "dim": Font(italic=True, color="666666"),
            "input": fill("FFF2CC"), "green": fill("C6EFCE"), "red": fill("FFC7CE"), "rec": fill("DDEBF7"),
            "wrap": Alignment(wrap_text=True, vertical="top")}


def fmt_for(header: str) -> str | None:
    h = header.lower()
    if "(ms)" in h or "gib" in h:
        return "#,##0.0"
    if "share" in h:
        return "0.0%"
    if "usd" in h:
        return "#,##0.000"
    if "tokens" in h or h in ("batch", "max_num_seqs", "kv blocks", "context (tokens)") or "req" in h:
        return "#,##0.##" if "req" in h else "#,##0"
    if "preemptions" in h:
        return "0.0"
    return None


def _table(ws, table: Table, start_row: int = 1) -> int:
    """Write a table with a bold header; returns the last row written."""
    st = _styles()
    head, rows = table
    for j, h in enumerate(head, 1):
        put(ws, start_row, j, h).font = st["bold"]
    formats = [fmt_for(str(h)) for h in head]
    for i, r in enumerate(rows, start_row + 1):
        for j, v in enumerate(r, 1):
            put(ws, i, j, v, formats[j - 1])
    for j, h in enumerate(head, 1):  # columns as wide as their values; a long header wraps, long text too
        dim = ws.column_dimensions[ws.cell(start_row, j).column_letter]
        longest = max([min(len(str(h)), 9), max(map(len, str(h).split() or [""])) + 1] + [len(f"{r[j - 1]:,.1f}" if isinstance(r[j - 1], float)
                                                    else str(r[j - 1])) for r in rows[:200] if r[j - 1] is not None])
        dim.width = max(dim.width or 0, min(36, max(10, longest + 2)))
        ws.cell(start_row, j).alignment = st["wrap"]
        if longest > 36:
            for i in range(start_row + 1, start_row + 1 + len(rows)):
                ws.cell(i, j).alignment = st["wrap"]
    lines = max(math.ceil(len(str(h)) / max(1.0, ws.column_dimensions[ws.cell(start_row, j).column_letter].width - 1))
                for j, h in enumerate(head, 1))  # a wrapped header gets its lines (a renderer keeps 15 pt otherwise)
    if lines > 1:
        ws.row_dimensions[start_row].height = 15 * lines
    ws.print_title_rows = f"{start_row}:{start_row}"
    return start_row + len(rows)


def _table_sheet(wb, name: str, table: Table, widths: dict[int, float] | None = None, note: str = ""):
    ws = wb.create_sheet(name)
    start = 1
    if note:
        put(ws, 1, 1, note).font = _styles()["dim"]
        start = 3
    _table(ws, table, start)
    for col, w in (widths or {}).items():
        ws.column_dimensions[ws.cell(1, col).column_letter].width = w
    return ws
