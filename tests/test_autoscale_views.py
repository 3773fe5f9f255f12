"""The autoscale report (capacity.plan.autoscale.autoscale_report) where people read it: `capacity autoscale --json` prints
it, the dashboard's Autoscale tab shows it, `capacity export --autoscale` writes it as a workbook sheet. Expected
numbers come from the library for the inputs each view says it used; bad input is one error line, not a trace."""
import json
import shutil
import subprocess

import pytest

from capacity.errors import CapacityError
from tests.conftest import ROOT, run_cli

WORKLOAD = {"arrivals": {"kind": "curve", "curve": {"points": [[0, 2], [120, 30], [240, 2]], "period_s": 360}},
            "input_len": {"kind": "fixed", "value": 256}, "output_len": {"kind": "fixed", "value": 64},
            "num_requests": 1200}


def library(card: dict | str, gpu: str, engine: dict, workload: dict, autoscale: dict, static=None, *,
            window_s: float, slo_ttft_s=None, slo_tpot_s=None, price=None, seed: int = 0, profile=None) -> dict:
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard, load_model_card, resolve_model_path
    from capacity.model.gpus import get_gpu
    from capacity.plan.autoscale import autoscale_report
    from capacity.sim.autoscale import AutoscaleConfig
    from capacity.workload import WorkloadSpec

    c = load_model_card(resolve_model_path(card)) if isinstance(card, str) else ModelCard.model_validate(card)
    spec = WorkloadSpec.model_validate(workload)
    asc = AutoscaleConfig(**autoscale, curve=spec.arrivals.rate_curve() if autoscale["policy"] == "predictive" else None)
    return autoscale_report(c, get_gpu(gpu), EngineConfig.model_validate(engine), spec, asc, static, window_s=window_s,
                            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, price=price, seed=seed, profile=profile)


@pytest.fixture(scope="module")
def report():
    asc = {"min_replicas": 1, "max_replicas": 6, "policy": "concurrency", "target": 4.0, "interval_s": 5.0,
           "startup_s": 30.0, "cooldown_s": 30.0}
    return library("llama-3.1-8b", "h100-sxm", {"max_model_len": 4096}, WORKLOAD, asc, window_s=60.0,
                   slo_ttft_s=0.3, price=2.0)


def test_cli_prints_the_library_report(report, tmp_path):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(WORKLOAD))
    r = run_cli("autoscale", "-m", "llama-3.1-8b", "--workload", str(wl), "--max-model-len", "4096", "--target", "4",
                "--max", "6", "--startup-s", "30", "--cooldown-s", "30", "--interval-s", "5", "--window-s", "60",
                "--slo-ttft-ms", "300", "--price-per-gpu-hour", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # with an SLO the CLI adds the perfect system's bound (tests/test_autoscale_bound.py); the rest is the library's
    bound = out.pop("lower_bound")
    for k in ("autoscaled", "static"):
        assert out[k].pop("vs_bound")["gpu_hours"] == pytest.approx(out[k]["gpu_hours"] - bound["gpu_hours"])
    assert out == report
    a, s = report["autoscaled"], report["static"]
    assert a["windows"] == len(a["window"]["start_s"]) and s["replicas"] == a["replicas"]["max"]


# ---- the dashboard tab ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    at.session_state["tab"] = "Autoscale"  # the tabs are lazy: only the open one runs
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown_inputs(at) -> dict:
    blocks = [c.value for c in at.code if c.value.lstrip().startswith('{\n "autoscale"')]
    assert len(blocks) == 1
    return json.loads(blocks[0])["autoscale"]


def test_tab_shows_the_library_numbers(app):
    at = app
    at.select_slider(key="as_requests").set_value(2000)
    at.number_input(key="as_target_concurrency").set_value(16.0)
    at.button(key="run_autoscale").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    args = shown_inputs(at)
    assert args["workload"]["num_requests"] == 2000 and args["autoscale"]["target"] == 16.0
    assert args["workload"]["arrivals"]["curve"]["period_s"] == pytest.approx(600)  # the day played in 10 minutes
    want = library(**args)
    a, s = want["autoscaled"], want["static"]
    m = {x.label: x.value for x in at.metric}
    assert m["GPU-hours, autoscaled"] == f"{a['gpu_hours']:.3f}"
    assert m[f"GPU-hours, static ({s['replicas']})"] == f"{s['gpu_hours']:.3f}"
    assert m["SLO-miss minutes, autoscaled"] == f"{a['violation_minutes']:g}"
    tables = [d.value for d in at.dataframe if "GPU-hours" in d.value.columns]
    assert len(tables) == 1
    rows = {r["layout"]: r for _, r in tables[0].iterrows()}
    for name, d in (("autoscaled", a), ("static", s)):
        assert rows[name]["GPU-hours"] == pytest.approx(d["gpu_hours"], rel=1e-12)
        assert rows[name]["cost (USD)"] == pytest.approx(d["cost_usd"], rel=1e-12)
        assert rows[name]["SLO-miss minutes"] == d["violation_minutes"]
        assert rows[name]["P99 TTFT (ms)"] == pytest.approx(d["p99_ttft_s"] * 1e3)
        assert rows[name]["requests"] == d["requests"]
    assert rows["autoscaled"]["replicas"] == f"{a['replicas']['min']}-{a['replicas']['max']}"
    chart = next(c for c in at.get("plotly_chart") if "ready replicas" in c.proto.spec)
    spec = json.loads(chart.proto.spec)
    names = [t["name"] for t in spec["data"]]
    assert {"arrival rate (req/s)", "ready replicas", "starting replicas", "P99 TTFT per window (ms)",
            "SLO P99 TTFT"} <= set(names)
    ready = next(t for t in spec["data"] if t["name"] == "ready replicas")
    assert ready["line"]["shape"] == "hv" and list(ready["y"]) == a["replicas"]["ready"]


def test_pasted_curve_with_a_negative_rate_is_one_error(app):
    at = app
    at.radio(key="as_source").set_value("paste a curve").run()
    at.text_area(key="as_curve_text").input("t,rate\n0,2\n60,-3\n120,5\n").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == ["curve pasted curve: line 3: rate -3 is negative"]
    at.text_area(key="as_curve_text").input("points: [[0, 2], [60, -3]]\n").run()
    assert [e.value for e in at.error] == ["curve pasted curve: points[1]: rate -3 is negative"]


# ---- the workbook sheet -----------------------------------------------------------------------------------------
def row_of(ws, label: str) -> int:
    rows = [c.row for c in ws["A"] if c.value == label]
    assert len(rows) == 1, f"no single row labelled {label!r}"
    return rows[0]


@pytest.fixture(scope="module")
def book(report, tmp_path_factory):
    pytest.importorskip("openpyxl")
    from capacity.io.export import write_review

    path = tmp_path_factory.mktemp("as") / "auto.xlsx"
    written = write_review(path, autoscale=report, tables_too=True)
    assert [p.name for p in written] == ["auto.xlsx", "auto.json", "auto.autoscale.csv"]
    return path


def test_workbook_sheet_reads_back_the_report(book, report):
    import openpyxl

    from capacity.io.fleet import WINDOW_HEAD

    wb = openpyxl.load_workbook(book)
    assert wb.sheetnames == ["Autoscale"]
    ws = wb["Autoscale"]
    a, s = report["autoscaled"], report["static"]
    for label, key in (("GPU-hours", "gpu_hours"), ("Cost", "cost_usd"), ("SLO-miss minutes", "violation_minutes"),
                       ("Requests", "requests"), ("Simulated time", "simulated_s")):
        r = row_of(ws, label)
        assert ws.cell(r, 2).value == pytest.approx(a[key]) and ws.cell(r, 3).value == pytest.approx(s[key]), label
    r = row_of(ws, "P99 TTFT (whole run)")
    assert ws.cell(r, 2).value == pytest.approx(a["p99_ttft_s"] * 1e3) and ws.cell(r, 4).value == "ms"
    assert ws.cell(row_of(ws, "Replicas (autoscaled: fewest ready to peak provisioned)"), 3).value == s["replicas"]
    assert ws.cell(row_of(ws, "SLO P99 TTFT per window"), 2).value == pytest.approx(300)
    assert ws.cell(row_of(ws, "Policy"), 2).value == "concurrency"
    # the per-window table: one row per window of the report, in its units
    top = next(c.row for c in ws["A"] if c.value == WINDOW_HEAD[0])
    assert [c.value for c in ws[top]][:len(WINDOW_HEAD)] == WINDOW_HEAD
    rows = list(ws.iter_rows(min_row=top + 1, max_col=len(WINDOW_HEAD), values_only=True))
    w = a["window"]
    assert len(rows) == len(w["start_s"]) == a["windows"]
    col = {h: i for i, h in enumerate(WINDOW_HEAD)}
    for i, row in enumerate(rows):
        assert row[col["window start (s)"]] == pytest.approx(w["start_s"][i])
        assert row[col["requests"]] == w["requests"][i]
        want = w["ttft_s"][i]
        assert row[col["P99 TTFT (ms)"]] == (None if want is None else pytest.approx(want * 1e3))
        assert row[col["meets SLO"]] == ("yes" if w["met"][i] else "no")
        static = s["window"]["ttft_s"][i]
        assert row[col["static P99 TTFT (ms)"]] == (None if static is None else pytest.approx(static * 1e3))
    # the pool at each window's start, from the timeline
    reps = a["replicas"]
    for i, row in enumerate(rows):
        k = max(j for j, t in enumerate(reps["t_s"]) if t <= w["start_s"][i])
        assert row[col["ready replicas (at start)"]] == reps["ready"][k]
    # one native chart: ready replicas on the left axis, P99 TTFT and its SLO on a secondary axis
    (chart,) = ws._charts
    assert len(chart.series) == 1 and len(chart._charts) == 2
    latency = chart._charts[1]
    assert len(latency.series) == 2 and latency.y_axis.axId != chart.y_axis.axId
    assert json.loads(book.with_suffix(".json").read_text())["autoscale"] == report


@pytest.mark.slow  # LibreOffice renders the workbook: in CI (`pytest -m slow`), not in the default local run
def test_workbook_sheet_renders(book, tmp_path):
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        pytest.skip("LibreOffice (soffice) is not installed")
    subprocess.run([soffice, "--headless", "--norestore", "--convert-to", "pdf", "--outdir", str(tmp_path), str(book)],
                   check=True, capture_output=True, timeout=180)
    from pypdf import PdfReader

    pages = PdfReader(str(tmp_path / "auto.pdf")).pages
    assert len(pages) == 1  # one page wide, and these few windows fit one page
    text = pages[0].extract_text()
    assert "Autoscaling llama-3.1-8b on h100-sxm" in text and "window start (s)" in text


def test_export_cli_writes_the_sheet_and_refuses_an_incomplete_report(report, tmp_path):
    import openpyxl

    good = tmp_path / "report.json"
    good.write_text(json.dumps(report))
    out = tmp_path / "cli.xlsx"
    r = run_cli("export", "--autoscale", str(good), "--xlsx", str(out))
    assert r.returncode == 0, r.stderr
    ws = openpyxl.load_workbook(out)["Autoscale"]
    assert ws.cell(row_of(ws, "GPU-hours"), 2).value == pytest.approx(report["autoscaled"]["gpu_hours"])
    broken = json.loads(json.dumps(report))
    del broken["autoscaled"]["gpu_hours"]
    del broken["static"]["window"]["met"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    r = run_cli("export", "--autoscale", str(bad), "--xlsx", str(tmp_path / "bad.xlsx"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not a complete autoscale report" in r.stderr and "autoscaled.gpu_hours: Field required" in r.stderr
    assert "static.window.met: Field required" in r.stderr
    assert not (tmp_path / "bad.xlsx").exists()
    plan_like = tmp_path / "plan.json"
    plan_like.write_text('{"frontier": []}')
    r = run_cli("export", "--autoscale", str(plan_like), "--xlsx", str(tmp_path / "p.xlsx"))
    assert r.returncode == 1 and "not an autoscale report" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_write_review_checks_the_report(report, tmp_path):
    from capacity.io.export import write_review

    broken = json.loads(json.dumps(report))
    broken["autoscaled"]["window"]["ttft_s"] = broken["autoscaled"]["window"]["ttft_s"][:-1]
    with pytest.raises(CapacityError, match="one value per window"):
        write_review(tmp_path / "x.xlsx", autoscale=broken)
    assert not list(tmp_path.iterdir())


def test_a_disaggregated_report_exports_each_pool(tmp_path):
    """A prefill pool (TP 1) and a decode pool (TP 2), each autoscaled: the export's summary gives each pool's
    replicas and the GPU-hours of both; the per-window table names its pools and adds the decode pool's ready
    and starting replicas, read here from the report's own timeline; the chart plots both pools. A report whose
    decode pool lost its timeline is one error line naming the field."""
    import openpyxl

    from capacity.engine.config import EngineConfig
    from capacity.io.export import write_review
    from capacity.io.fleet import DECODE_HEAD
    from capacity.model.card import load_model_card, resolve_model_path
    from capacity.model.gpus import get_gpu
    from capacity.plan.autoscale import autoscale_report
    from capacity.sim.autoscale import AutoscaleConfig
    from capacity.workload import WorkloadSpec

    asc = AutoscaleConfig(min_replicas=1, max_replicas=4, target=1.0, interval_s=5.0, startup_s=30.0, cooldown_s=30.0)
    dasc = AutoscaleConfig(min_replicas=1, max_replicas=4, target=4.0, interval_s=5.0, startup_s=30.0, cooldown_s=30.0)
    wl = WorkloadSpec.model_validate({**WORKLOAD, "num_requests": 800, "input_len": {"kind": "fixed", "value": 2048},
                                      "output_len": {"kind": "fixed", "value": 128}})
    rep = autoscale_report(load_model_card(resolve_model_path("llama-3.1-8b")), get_gpu("h100-sxm"),
                           EngineConfig(max_model_len=4096), wl, asc, None, window_s=60.0, slo_ttft_s=0.3, price=2.0,
                           decode=(EngineConfig(max_model_len=4096, tensor_parallel_size=2), dasc, "nvlink"))
    a, s, dr = rep["autoscaled"], rep["static"], rep["autoscaled"]["decode_replicas"]
    assert dr["min"] < dr["max"] and a["replicas"]["min"] < a["replicas"]["max"]  # both pools scale
    path = tmp_path / "d.xlsx"
    write_review(path, autoscale=rep)
    ws = openpyxl.load_workbook(path)["Autoscale"]
    assert "disaggregated: prefill TP 1 (concurrency) and decode TP 2 (concurrency)" in ws.cell(1, 1).value
    pre = row_of(ws, "Prefill replicas (autoscaled: fewest ready to peak provisioned)")
    dec = row_of(ws, "Decode replicas (autoscaled: fewest ready to peak provisioned)")
    assert [ws.cell(pre, j).value for j in (2, 3, 4)] == [f"{a['replicas']['min']}-{a['replicas']['max']}",
                                                           s["replicas"], "replicas (TP 1)"]
    assert [ws.cell(dec, j).value for j in (2, 3, 4)] == [f"{dr['min']}-{dr['max']}", s["decode_replicas"],
                                                           "replicas (TP 2)"]
    gh = row_of(ws, "GPU-hours")
    assert ws.cell(gh, 2).value == pytest.approx(a["gpu_hours"]) and "decode TP 2" in ws.cell(gh, 4).value
    assert ws.cell(row_of(ws, "Decode target"), 2).value == 4.0
    top = next(c.row for c in ws["A"] if c.value == "window start (s)")
    head = [c.value for c in ws[top] if c.value is not None]
    assert head[-2:] == DECODE_HEAD and "prefill ready replicas (at start)" in head
    rows = list(ws.iter_rows(min_row=top + 1, max_col=len(head), values_only=True))
    assert len(rows) == a["windows"]
    for i, row in enumerate(rows):
        k = max(j for j, t in enumerate(dr["t_s"]) if t <= a["window"]["start_s"][i])
        assert (row[-2], row[-1]) == (dr["ready"][k], dr["starting"][k])
    (chart,) = ws._charts
    assert len(chart.series) == 2  # the prefill pool's ready replicas and the decode pool's
    broken = json.loads(json.dumps(rep))
    del broken["autoscaled"]["decode_replicas"]
    with pytest.raises(CapacityError, match="autoscaled.decode_replicas: Field required"):
        write_review(tmp_path / "x.xlsx", autoscale=broken)
    lax = json.loads(json.dumps(rep))
    lax["decode"]["tp"] = True  # strict: a JSON boolean is not a TP size of 1
    with pytest.raises(CapacityError, match=r"decode.tp: Input should be a valid integer \(got True\)"):
        write_review(tmp_path / "y.xlsx", autoscale=lax)


def test_a_curve_whose_every_request_is_rejected_is_one_error(tmp_path):
    """Prompts longer than max_model_len: nothing is served, and autoscale says why in one line (it used to
    fail inside the per-window metrics), aggregated or disaggregated."""
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({**WORKLOAD, "num_requests": 100, "input_len": {"kind": "fixed", "value": 4096}}))
    for extra in ([], ["--decode-tp", "1"]):
        r = run_cli("autoscale", "-m", "llama-3.1-8b", "--workload", str(wl), "--max-model-len", "4096", *extra)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "no request was served (100 rejected: prompt + output = 4160 tokens exceeds max_model_len 4096)" \
            in r.stderr
