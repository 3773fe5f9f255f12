"""The capacity-review workbook, read back with openpyxl and recomputed and rendered by LibreOffice (CI installs
it). Cells are found by their labels, never by address; expected values come from the plan itself."""
import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from capacity.errors import CapacityError
from capacity.io.export import SHEETS, tables, write_review
from tests.conftest import ROOT, run_cli

openpyxl = pytest.importorskip("openpyxl")  # in the dev extra: CI has it

GiB = 2**30


@pytest.fixture(scope="module")
def plan():
    from capacity.model.card import load_model_card
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Scenario, SearchSpec, make_plan
    from capacity.workload import WorkloadSpec

    # two classes with different output lengths: the workbook's cost must use the plan's class-weighted mean
    wl = WorkloadSpec.model_validate({"classes": [{"name": "chat", "weight": 3},
                                                  {"name": "long", "weight": 1,
                                                   "output_len": {"kind": "fixed", "value": 1024}}]})
    sc = Scenario(model="llama-3.1-8b", price_per_gpu_hour=2.5, target_rate_per_s=12.0, workload=wl,
                  search=SearchSpec(seeds=2, requests=300, max_num_seqs=[16, 64, 256], max_model_len=[4096, 131072],
                                    tp=[1], contexts=[1024, 16384]))
    p = make_plan(sc, load_model_card(ROOT / "models/llama-3.1-8b.yaml"), SerialExecutor(cache=False))
    from capacity.files import strict_json

    return strict_json(p.as_dict())  # exactly what `plan --json` would save


def row_of(ws, label: str) -> int:
    rows = [c.row for c in ws["A"] if c.value == label]
    assert len(rows) == 1, f"{ws.title}: no single row labelled {label!r}"
    return rows[0]


def value(ws, label: str):
    return ws.cell(row_of(ws, label), 2).value


def starts(ws, prefix: str):
    """The value of the row whose label starts with `prefix` (labels that carry a rate or a percentile)."""
    rows = [c.row for c in ws["A"] if isinstance(c.value, str) and c.value.startswith(prefix)]
    assert len(rows) == 1, (ws.title, prefix)
    return ws.cell(rows[0], 2).value


@pytest.fixture(scope="module")
def book(plan, tmp_path_factory):
    path = tmp_path_factory.mktemp("x") / "review.xlsx"
    write_review(path, plan, sweep_rows=[{"workload.input_len": {"kind": "fixed", "value": 512}, "ttft_p99_s": 0.1}],
                 tables_too=True)
    return path


def _recalc(src, outdir, to="xlsx"):
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        pytest.skip("LibreOffice (soffice) is not installed: apt-get install libreoffice-calc-nogui to recalculate "
                    "and render the workbook in this test")
    subprocess.run([soffice, "--headless", "--norestore", "--convert-to", to, "--outdir", str(outdir), str(src)],
                   check=True, capture_output=True, timeout=180)
    return outdir / src.with_suffix("." + to).name


@pytest.fixture(scope="module")
def recalculated(book, tmp_path_factory):
    return openpyxl.load_workbook(_recalc(book, tmp_path_factory.mktemp("lo")), data_only=True)


def test_sheets_and_every_table_read_back(book, plan):
    """Every number of every table in the workbook equals the table computed from the plan."""
    wb = openpyxl.load_workbook(book)
    assert wb.sheetnames == list(SHEETS)
    tabs = tables(plan, [{"workload.input_len": {"kind": "fixed", "value": 512}, "ttft_p99_s": 0.1}])
    for name, (head, rows) in tabs.items():
        if name == "Memory table":  # shown as a batch x context grid
            ws = wb["Memory"]
            top = next(i for i, r in enumerate(ws.iter_rows(values_only=True), 1) if r[0] == "batch \\ context")
            ctx = [c.value for c in ws[top]][1:]
            for batch, context, gib, _, fits, _ in rows:
                i = next(i for i in range(top + 1, ws.max_row + 1) if ws.cell(i, 1).value == batch)
                c = ws.cell(i, 2 + ctx.index(context))
                assert c.value == pytest.approx(gib)
                assert c.fill.start_color.rgb.endswith("C6EFCE" if fits == "yes" else "FFC7CE")
            continue
        ws = wb[name]
        found = [r for r in ws.iter_rows(values_only=True) if list(r[:len(head)]) == head]
        assert found, f"{name}: header row not found"
        start = next(i for i, r in enumerate(ws.iter_rows(values_only=True), 1) if list(r[:len(head)]) == head)
        got = [list(r[:len(head)]) for r in ws.iter_rows(min_row=start + 1, max_row=start + len(rows), values_only=True)]
        for want, have in zip(rows, got):
            for w, h in zip(want, have):
                if isinstance(w, float):
                    assert h == pytest.approx(w), (name, want, have)
                else:
                    assert h == (w if w != "" else None), (name, want, have)
    assert len(wb["Memory"]._charts) == 1 and len(wb["Percentiles"]._charts) == 2


def test_summary_labels_units_and_inputs(book, plan):
    s = openpyxl.load_workbook(book)["Summary"]
    assert s["A1"].value == f"Capacity review: {plan['model']} on {plan['gpu']}"
    assert f"capacity {plan['tool_version']}" in s["A2"].value
    line = s["A3"].value
    for bit in ("llama-3.1-8b", "a100" if plan["gpu"].startswith("a100") else plan["gpu"], "12 req/s", "P99 TTFT <="):
        assert bit in line
    assert "mean 448 over 2 classes" in line
    r = row_of(s, "Target rate")
    assert s.cell(r, 2).value == 12.0 and "input" in s.cell(r, 3).value and s.cell(r, 2).fill.start_color.rgb.endswith("FFF2CC")
    assert value(s, "Price per GPU-hour") == 2.5 and value(s, "Headroom: share of the max rate each replica runs at") == 0.8
    assert value(s, "Mean output tokens per request") == pytest.approx(plan["mean_output_tokens"]) == 448
    for label, unit in (("Cost per 1M output tokens", "USD per 1M output tokens"), ("Cost per hour", "USD per hour"),
                        ("Tensor parallel size", "GPUs per replica")):
        assert s.cell(row_of(s, label), 3).value == unit
    assert value(s, "Verification at the planned rate") in ("passed", "FAILED")  # a word, not TRUE/FALSE


def test_formulas_follow_the_inputs_honestly(recalculated, book, plan, tmp_path):
    s = recalculated["Summary"]
    gpus, rate = plan["gpus"], plan["target_rate"]
    assert value(s, "Replicas") == plan["replicas"] and value(s, "GPUs") == gpus
    assert value(s, "Cost per hour") == pytest.approx(gpus * 2.5)
    assert value(s, "Cost per 1M output tokens") == pytest.approx(plan["cost_per_million_tokens"])
    assert value(s, "Cost per 1M output tokens") == pytest.approx(gpus * 2.5 / (rate * plan["mean_output_tokens"] * 3600) * 1e6)
    assert value(s, "TTFT margin") == pytest.approx(1500 - plan["verification"]["p_ttft_s"] * 1e3)
    derived = next(r for r in recalculated["Memory"].iter_rows(values_only=True)
                   if r[0] and str(r[0]).startswith("KV budget re-derived"))
    assert derived[1] == pytest.approx(plan["budget"]["kv_budget_bytes"] / GiB, abs=0.01)
    # a reviewer raises the target rate 4x: replicas follow ceil(rate / (max rate x headroom)), GPUs and cost too
    wb = openpyxl.load_workbook(book)
    ws = wb["Summary"]
    ws.cell(row_of(ws, "Target rate"), 2).value = rate * 4
    ws.cell(row_of(ws, "Price per GPU-hour"), 2).value = 4.0
    edited = tmp_path / "edited.xlsx"
    wb.save(edited)
    s = openpyxl.load_workbook(_recalc(edited, tmp_path / "b"), data_only=True)["Summary"]
    max_rate = plan["rec_search"]["max_rate"]
    import math

    reps = math.ceil(rate * 4 / (max_rate * 0.8))
    assert value(s, "Replicas") == reps and value(s, "GPUs") == reps * plan["tp"]
    assert value(s, "Cost per 1M output tokens") == pytest.approx(
        reps * plan["tp"] * 4.0 / (rate * 4 * plan["mean_output_tokens"] * 3600) * 1e6)


def test_every_sheet_renders_one_page_wide(book, tmp_path):
    """LibreOffice prints the workbook: each sheet is one page wide (fit to width), the Summary one page, and no
    sheet spills onto extra pages: the page count is what the sheets' rows need."""
    pdf = _recalc(book, tmp_path, to="pdf")
    from pypdf import PdfReader

    pages = PdfReader(str(pdf)).pages
    assert len(pages) == len(SHEETS)  # every sheet of this plan fits one page
    import os

    if os.environ.get("SCREENSHOT_DIR") and shutil.which("pdftoppm"):  # the pages as PNG: CI artefacts
        subprocess.run(["pdftoppm", "-r", "90", "-png", str(pdf), str(Path(os.environ["SCREENSHOT_DIR"]) / "workbook")],
                       check=True, timeout=120)
    text = [p.extract_text() for p in pages]
    assert "Capacity review: llama-3.1-8b" in text[0] and "Cost per 1M output tokens" in text[0]
    assert all(t.strip() for t in text)


def test_frontier_marks_the_recommendation_and_the_misses(book, plan):
    ws = openpyxl.load_workbook(book)["Frontier"]
    head = [c.value for c in ws[3]]
    rows = list(ws.iter_rows(min_row=4, values_only=True))
    assert len(rows) == len({c["max_num_seqs"] for c in plan["frontier"]})  # one row per configuration
    rec = [r for r in rows if r[head.index("recommended")] == "yes"]
    assert len(rec) == 1 and rec[0][0] == plan["recommended"]["max_num_seqs"]
    for i, r in enumerate(rows, 4):
        fill = ws.cell(i, 1).fill.start_color.rgb
        if r[head.index("recommended")] == "yes":
            assert fill.endswith("DDEBF7")
        elif r[head.index("meets SLO")] == "no":
            assert fill.endswith("FFC7CE") and r[head.index("status")]


def test_user_strings_are_never_formulas(plan, tmp_path):
    """Spreadsheet formula injection: a model named '=HYPERLINK(...)' stays text in the workbook and is escaped
    in the CSV files."""
    evil = json.loads(json.dumps(plan))
    evil["model"] = '=HYPERLINK("http://x.invalid","click")'
    evil["scenario"]["workload"]["classes"][0]["name"] = "+cmd|' /C calc'!A0"
    path = tmp_path / "evil.xlsx"
    write_review(path, evil, tables_too=True)
    wb = openpyxl.load_workbook(path)
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for c in row:
                if isinstance(c.value, str) and ("HYPERLINK" in c.value or "calc" in c.value):
                    assert c.data_type == "s", (ws.title, c.coordinate, c.value)
    with path.with_name("evil.assumptions.csv").open() as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert "'=HYPERLINK(\"http://x.invalid\",\"click\")" in cells and not any(c.startswith("=") for c in cells)


def test_csv_and_json_hold_the_same_tables(book, plan):
    head, rows = tables(plan)["Frontier"]
    with book.with_name("review.frontier.csv").open() as f:
        got = list(csv.reader(f))
    assert got[0] == head and len(got) == len(rows) + 1
    assert json.loads(book.with_suffix(".json").read_text())["plan"]["gpus"] == plan["gpus"]


def test_never_overwrites_and_writes_the_set_or_nothing(plan, tmp_path, monkeypatch):
    path = tmp_path / "r.xlsx"
    write_review(path, plan)
    before = path.read_bytes()
    with pytest.raises(CapacityError, match="exists; pass --force"):
        write_review(path, plan)
    assert path.read_bytes() == before
    # a failure after the workbook was written (the disk fills while writing the CSVs): no file of the set lands
    import capacity.io.export as ex

    real = ex.csv_safe
    calls = {"n": 0}

    def boom(v):
        calls["n"] += 1
        if calls["n"] > 50:
            raise OSError(28, "No space left on device")
        return real(v)

    monkeypatch.setattr(ex, "csv_safe", boom)
    with pytest.raises(OSError):
        write_review(tmp_path / "new.xlsx", plan, tables_too=True)
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in tmp_path.glob("r.*")}
    assert not list(tmp_path.glob("new*")) and not list(tmp_path.glob(".new*"))


def test_export_cli_from_a_saved_plan(plan, tmp_path):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(plan))
    out = tmp_path / "cli.xlsx"
    r = run_cli("export", "--plan", str(pj), "--xlsx", str(out))
    assert r.returncode == 0 and out.is_file(), r.stderr
    r = run_cli("export", "--plan", str(pj), "--xlsx", str(out))
    assert r.returncode == 1 and "exists; pass --force" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    r = run_cli("export", "--plan", str(bad), "--xlsx", str(tmp_path / "z.xlsx"))
    assert r.returncode == 1 and "not a plan" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_one_file_unless_tables_are_asked_and_readable_numbers(plan, tmp_path):
    """Issue 48 item 9: the workbook alone by default (it wrote seven CSV/JSON files beside itself); Assumptions
    without float noise or raw byte counts (79.160000000149, 536870912); a column as wide as its values, long
    headers wrapping (the Frontier sheet rendered at about 4 pt, fit to one page across 270 characters)."""
    import copy

    p = copy.deepcopy(plan)
    p["budget"]["total_bytes"] = 79.160000000149 * GiB
    p["scenario"]["engine"].setdefault("memory_params", {})["cuda_context_bytes"] = 536870912
    written = write_review(tmp_path / "one.xlsx", p)
    assert written == [tmp_path / "one.xlsx"] and [f.name for f in tmp_path.iterdir()] == ["one.xlsx"]
    wb = openpyxl.load_workbook(tmp_path / "one.xlsx")
    a = wb["Assumptions"]
    assert value(a, "usable memory the engine sees (GiB)") == 79.16
    assert value(a, "engine.memory_params.cuda_context_gib") == 0.5
    floats = [c.value for row in a.iter_rows(min_col=2, max_col=2) for c in row if isinstance(c.value, float)]
    assert all(len(repr(f).replace(".", "").lstrip("0")) <= 7 for f in floats), floats
    f = wb["Frontier"]
    widths = [f.column_dimensions[openpyxl.utils.get_column_letter(j)].width for j in range(1, f.max_column + 1)]
    # A4 landscape holds about 135 characters of 11 pt: 200 fit across at 7 pt or more (it was ~270, ~4 pt)
    assert sum(widths) <= 200 and max(widths) <= 40, list(zip(tables(p)["Frontier"][0], widths))


def test_a_saturated_configuration_is_left_out_of_the_percentile_charts(plan, tmp_path):
    import copy

    p = copy.deepcopy(plan)
    cell = next(c for c in p["frontier"] if c["feasible"] and c["stats"])
    cell["saturated"] = True
    for m in ("ttft", "tpot"):
        cell["stats"][m]["p99"] = 600.0  # what a queue growing without bound reports
    write_review(tmp_path / "sat.xlsx", p)
    ws = openpyxl.load_workbook(tmp_path / "sat.xlsx")["Percentiles"]
    head = next(r for r in ws.iter_rows() if r[0].value == "max_num_seqs" and r[1].value and "TTFT" in str(r[1].value)
                and "SLO" not in str(r[1].value))
    rows = {ws.cell(i, 1).value: [ws.cell(i, j).value for j in range(2, 7)]
            for i in range(head[0].row + 1, ws.max_row + 1) if ws.cell(i, 1).value}
    sat = rows[str(cell["max_num_seqs"])]
    assert sat[0] is None and sat[2] is None and sat[4] == "saturated: left out of the charts"
    others = [v for k, v in rows.items() if k != str(cell["max_num_seqs"])]
    assert others and all(v[0] is not None and v[4] is None for v in others)
