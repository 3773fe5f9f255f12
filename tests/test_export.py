"""The capacity-review workbook, read back with openpyxl; formulas recomputed by LibreOffice when present. Cells
are found by their labels, never by address, and expected values come from the plan itself."""
import json
import shutil
import subprocess

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
                                    tp=[1]))
    p = make_plan(sc, load_model_card(ROOT / "models/llama-3.1-8b.yaml"), SerialExecutor(cache=False))
    return json.loads(json.dumps(p.as_dict(), default=float))  # exactly what `plan --json` would save


def row_of(ws, label: str) -> int:
    rows = [c.row for c in ws["A"] if c.value == label]
    assert len(rows) == 1, f"{ws.title}: no single row labelled {label!r}"
    return rows[0]


def value(ws, label: str):
    return ws.cell(row_of(ws, label), 2).value


@pytest.fixture(scope="module")
def book(plan, tmp_path_factory):
    path = tmp_path_factory.mktemp("x") / "review.xlsx"
    write_review(path, plan, sweep_rows=[{"workload.input_len": {"kind": "fixed", "value": 512}, "ttft_p99_s": 0.1}])
    return path


def test_sheet_names_and_headers_snapshot(book):
    wb = openpyxl.load_workbook(book)
    assert wb.sheetnames == list(SHEETS)
    assert [c.value for c in wb["Frontier"][1]][:10] == [
        "max_num_seqs", "max_model_len", "fits memory", "covers workload", "P99 TTFT (ms)", "P99 TPOT (ms)",
        "peak output tokens/s", "KV tokens", "meets SLO", "status / why not"]
    assert [c.value for c in wb["Percentiles"][1]] == [
        "max_num_seqs", "metric", "mean (ms)", "P50 (ms)", "P90 (ms)", "P95 (ms)", "P99 (ms)", "P99 95% CI low (ms)",
        "P99 95% CI high (ms)"]
    assert [c.value for c in wb["Memory"][1]][:2] == ["term", "GiB"]
    assert len(wb["Memory"]._charts) == 1 and len(wb["Percentiles"]._charts) == 2


def test_values_equal_the_json_plan_and_are_numbers(book, plan):
    wb = openpyxl.load_workbook(book)
    s = {r[0]: r[1] for r in wb["Summary"].iter_rows(values_only=True) if r[0]}
    assert s["GPUs"] == plan["gpus"] and s["Replicas"] == plan["replicas"] and s["Tensor parallel size"] == plan["tp"]
    assert s["Target rate (requests/s)"] == 12.0 and s["SLO P99 TTFT (ms)"] == pytest.approx(1500)
    assert s["Verified P99 TTFT (ms)"] == pytest.approx(plan["verification"]["p_ttft_s"] * 1e3)
    assert s["Price per GPU-hour (USD) - edit me"] == 2.5 and str(s["Cost per hour (USD)"]).startswith("=")
    # the cost's denominator is the plan's class-weighted mean output length, not the base distribution's
    assert s["Mean output tokens per request"] == pytest.approx(plan["mean_output_tokens"]) == 0.75 * 256 + 0.25 * 1024
    rows = list(wb["Frontier"].iter_rows(min_row=2, max_col=10, values_only=True))
    assert len(rows) == len(plan["frontier"])
    for row, cell in zip(rows, plan["frontier"]):
        assert row[0] == cell["max_num_seqs"] and row[1] == cell["max_model_len"]
        assert row[2] == ("yes" if cell["feasible"] else "no")
        if cell["p_ttft"] is not None and cell["p_ttft"] < float("inf"):
            assert isinstance(row[4], float) and row[4] == pytest.approx(cell["p_ttft"] * 1e3)
    mem = {r[0]: r[1] for r in wb["Memory"].iter_rows(min_row=2, max_row=7, values_only=True)}
    assert mem["weights"] == pytest.approx(plan["budget"]["weights_bytes"] / GiB)
    assert mem["KV cache budget"] == pytest.approx(plan["budget"]["kv_budget_bytes"] / GiB)
    pct = [r for r in wb["Percentiles"].iter_rows(min_row=2, values_only=True) if r[1] == "TPOT" and r[0] == 256]
    stats = next(c["stats"] for c in plan["frontier"] if c["max_num_seqs"] == 256 and c["feasible"])
    assert pct[0][6] == pytest.approx(stats["tpot"]["p99"] * 1e3)
    sweep = list(wb["Sweep"].iter_rows(values_only=True))
    assert sweep[1] == (512, 0.1)


def test_csv_and_json_hold_the_same_tables(book, plan):
    import csv

    head, rows = tables(plan)["Frontier"]
    with book.with_name("review.frontier.csv").open() as f:
        got = list(csv.reader(f))
    assert got[0] == head and len(got) == len(rows) + 1
    assert json.loads(book.with_suffix(".json").read_text())["plan"]["gpus"] == plan["gpus"]


def test_never_overwrites_and_writes_atomically(plan, tmp_path, monkeypatch):
    path = tmp_path / "r.xlsx"
    write_review(path, plan)
    before = path.read_bytes()
    with pytest.raises(CapacityError, match="exists; pass --force"):
        write_review(path, plan)
    assert path.read_bytes() == before

    import capacity.io.export as ex

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ex, "_workbook", boom)
    with pytest.raises(RuntimeError):
        write_review(tmp_path / "new.xlsx", plan)
    assert not (tmp_path / "new.xlsx").exists() and not list(tmp_path.glob(".new.xlsx.*"))


def _recalc(src, outdir):
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        pytest.skip("LibreOffice (soffice) is not installed: apt-get install libreoffice-calc-nogui to recalculate "
                    "the workbook's formulas in this test")
    subprocess.run([soffice, "--headless", "--norestore", "--convert-to", "xlsx", "--outdir", str(outdir), str(src)],
                   check=True, capture_output=True, timeout=180)
    return openpyxl.load_workbook(outdir / src.name, data_only=True)


def test_formulas_recompute_in_libreoffice(book, plan, tmp_path):
    wb = _recalc(book, tmp_path / "a")
    s = wb["Summary"]
    rate, gpus = plan["target_rate"], plan["gpus"]
    assert value(s, "Cost per hour (USD)") == pytest.approx(gpus * 2.5)
    assert value(s, "Cost per 1M output tokens (USD)") == pytest.approx(plan["cost_per_million_tokens"])
    assert value(s, "Cost per 1M output tokens (USD)") == pytest.approx(
        gpus * 2.5 / (rate * plan["mean_output_tokens"] * 3600) * 1e6)
    assert value(s, "TTFT margin (ms)") == pytest.approx(1500 - plan["verification"]["p_ttft_s"] * 1e3)
    m = wb["Memory"]
    derived = next(r for r in m.iter_rows(values_only=True) if r[0] and str(r[0]).startswith("KV budget re-derived"))
    assert derived[1] == pytest.approx(plan["budget"]["kv_budget_bytes"] / GiB)
    # a reviewer edits the price: the cost follows
    wb2 = openpyxl.load_workbook(book)
    ws = wb2["Summary"]
    ws.cell(row_of(ws, "Price per GPU-hour (USD) - edit me"), 2).value = 4.0
    edited = tmp_path / "edited.xlsx"
    wb2.save(edited)
    s = _recalc(edited, tmp_path / "b")["Summary"]
    assert value(s, "Cost per 1M output tokens (USD)") == pytest.approx(plan["cost_per_million_tokens"] * 4.0 / 2.5)


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
