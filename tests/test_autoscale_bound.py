"""Issue 52: the perfect system's lower bound (hand-integrated curves), the SLA planner's rule (a hand-made
interval), the start-up estimate's capture sizes (vLLM's rule by hand), the sweep's cliff, a trace replay's
report, and bad input as one line naming the field and value."""
import json
from types import SimpleNamespace

import pytest

from capacity.curves import RateCurve
from capacity.errors import ConfigError
from tests.conftest import ROOT, run_cli


def test_step_curve_bound_by_hand():
    # 3 req/s for 600 s, 7 for 600 s, 0.5 for 600 s; a replica takes 2 req/s:
    # ceil(3/2) = 2, ceil(7/2) = 4, ceil(0.5/2) = 1 -> 600 x (2 + 4 + 1) = 4200 replica-seconds, at most 4
    from capacity.plan.autoscale_bound import lower_bound, perfect_replica_seconds

    c = RateCurve(points=[(0.0, 3.0), (600.0, 7.0), (1200.0, 0.5)], shape="step")
    assert perfect_replica_seconds(c, 2.0, 1800.0) == pytest.approx((4200.0, 4))
    b = lower_bound(c, 2.0, 1800.0, tp=2, source="given")
    assert b["gpu_hours"] == pytest.approx(4200 * 2 / 3600)  # 2.333 GPU-hours at TP 2
    assert b["replicas_max"] == 4 and b["violation_minutes"] == 0
    # a rate exactly at 2 x R needs 2 replicas, not 3
    assert perfect_replica_seconds(RateCurve(points=[(0.0, 4.0)]), 2.0, 100.0) == pytest.approx((200.0, 2))


def test_linear_and_periodic_curve_bounds_by_hand():
    from capacity.plan.autoscale_bound import perfect_replica_seconds

    # rate 0.1 t over [0, 100], R = 4: 1 replica on (0, 40), 2 on (40, 80), 3 on (80, 100) -> 40 + 80 + 60 = 180
    lin = RateCurve(points=[(0.0, 0.0), (100.0, 10.0)], shape="linear")
    assert perfect_replica_seconds(lin, 4.0, 100.0) == pytest.approx((180.0, 3))
    # 2 req/s then 6 req/s, repeating every 100 s, R = 4: 50 x 1 + 50 x 2 = 150 per period; 250 s = 150 + 150 + 50
    per = RateCurve(points=[(0.0, 2.0), (50.0, 6.0)], shape="step", period_s=100.0)
    assert perfect_replica_seconds(per, 4.0, 250.0) == pytest.approx((350.0, 2))


def test_distance_from_the_bound():
    from capacity.plan.autoscale_bound import distance

    d = distance({"gpu_hours": 3.0, "violation_minutes": 5.0}, {"gpu_hours": 2.0})
    assert d == {"gpu_hours": 1.0, "pct": 50.0, "violation_minutes": 5.0}


def _seq(arrival, first, finish, out):
    return SimpleNamespace(req=SimpleNamespace(arrival_s=arrival, output_tokens=out), first_token_s=first,
                           finish_s=finish)


def test_sla_planner_rule_by_hand():
    # profile: a replica at R = 2 req/s shows TTFT 0.5 s and TPOT 50 ms. In the last 10 s: 30 requests sent
    # (predicted 3 req/s); two finished with TTFT 1.0 s (p = 2) and TPOT 0.1 s (d = 2).
    # prefill rule: ceil(3 x min(1, 2) / 2) = 2; decode rule: ceil(3 x 2 / 2) = 3 -> 3 replicas.
    from capacity.sim.sla_planner import SlaPlanner

    seqs = [_seq(0.0, 1.0, 1.0 + 0.1 * 9, 10), _seq(1.0, 2.0, 2.0 + 0.1 * 4, 5), _seq(5.0, float("nan"),
                                                                                     float("nan"), 8)]
    sim = SimpleNamespace(recorder=SimpleNamespace(seqs=seqs), env=SimpleNamespace(now=10.0), entered=30)
    p = SlaPlanner(sim, 2.0, 0.5, 0.05)  # type: ignore[arg-type]
    assert p.desired() == 3
    assert p.p_correction == pytest.approx(2.0) and p.d_correction == pytest.approx(2.0)
    # next interval: nothing sent, nothing finished: the factors are kept, the prediction is 0
    sim.env.now = 20.0
    assert p.desired() == 0 and p.d_correction == pytest.approx(2.0)


def test_startup_estimate_counts_vllm_capture_sizes():
    # vLLM V1's default capture sizes for max_num_seqs 256: 1, 2, 4, 8..248 by 8 (31), 256..512 by 16 (17) = 51
    from capacity.engine.config import EngineConfig
    from capacity.engine.startup import CAPTURE_S_PER_SIZE, estimate_startup
    from capacity.model.card import load_named_card
    from capacity.model.gpus import get_gpu

    card, gpu = load_named_card("llama-3.1-8b"), get_gpu("h100-sxm")
    est = estimate_startup(card, gpu, EngineConfig(max_model_len=8192, max_num_seqs=256), 2.0)
    assert est["capture_sizes"] == 51
    assert est["terms"]["capture_s"] == pytest.approx([51 * x for x in CAPTURE_S_PER_SIZE["v1"]])
    # twice the bandwidth, half the load time
    fast = estimate_startup(card, gpu, EngineConfig(max_model_len=8192, max_num_seqs=256), 4.0)
    assert fast["terms"]["load_s"][0] == pytest.approx(est["terms"]["load_s"][0] / 2)
    assert est["total_s"][0] == pytest.approx(sum(v[0] for v in est["terms"].values()))
    eager = estimate_startup(card, gpu, EngineConfig(max_model_len=8192, enforce_eager=True), 2.0)
    assert eager["capture_sizes"] == 0 and eager["terms"]["compile_s"] == [0.0, 0.0]
    with pytest.raises(ConfigError, match="--storage-gbps 0"):
        estimate_startup(card, gpu, EngineConfig(), 0.0)


def test_sweep_range_and_cliff():
    from capacity.plan.autoscale_sweep import cliff, parse_sweep

    assert parse_sweep("0:300:30") == [30.0 * i for i in range(11)]
    assert parse_sweep("0:100:30") == [0.0, 30.0, 60.0, 90.0]
    rows = [{"startup_s": s, "violation_minutes": m} for s, m in ((0, 0), (30, 0), (60, 5), (90, 0))]
    assert cliff(rows) == {"holds_to_s": 30, "breaks_at_s": 60}
    assert cliff(rows[:2]) == {"holds_to_s": 30, "breaks_at_s": None}
    assert cliff(rows[2:]) == {"holds_to_s": None, "breaks_at_s": 60}


DAY = ["autoscale", "-m", "llama-3.1-8b", "--max-model-len", "8192", "--workload", "examples/day.yaml",
       "--slo-ttft-ms", "2000"]


@pytest.mark.parametrize("args, needle", [
    (["--startup-s", "-5"], "--startup-s: must be >= 0 (got -5)"),
    (["--startup-sweep", "300:0:30"], "--startup-sweep '300:0:30': an empty range"),
    (["--startup-sweep", "0:300:0"], "--startup-sweep '0:300:0': an empty range"),
    (["--startup-sweep", "-30:300:30"], "--startup-sweep '-30:300:30': start-up -30 s is negative"),
    (["--startup-sweep", "0:300"], "--startup-sweep '0:300': expected LO:HI:STEP"),
    (["--startup-sweep", "0:300:30", "--storage-gbps", "0"], "--storage-gbps 0:"),
])
def test_bad_startup_input_is_one_line(args, needle):
    r = run_cli(*DAY, *args)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_a_trace_out_of_order_is_one_line(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text("\n".join(json.dumps({"timestamp": ts, "input_tokens": 100, "output_tokens": 10})
                           for ts in (0.0, 5.0, 3.0)) + "\n")
    r = run_cli("autoscale", "-m", "llama-3.1-8b", "--trace", str(t), "--slo-ttft-ms", "2000")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "line 3: timestamp goes back in time" in lines[0], r.stderr
    r = run_cli("autoscale", "-m", "llama-3.1-8b", "--trace", str(t), "--workload", "examples/day.yaml")
    assert r.returncode == 1 and "give one of --workload" in r.stderr


@pytest.fixture(scope="module")
def trace_run():
    # the Azure sample (400 requests over 106 s) with the sla policy at a given per-replica rate
    return run_cli("autoscale", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--max-model-len", "8192", "--trace",
                str(ROOT / "examples/traces/azure_conv_2023_head.csv"), "--window-s", "20", "--startup-s", "10",
                "--interval-s", "5", "--metric-window-s", "10", "--cooldown-s", "30", "--max", "8",
                "--slo-ttft-ms", "1000", "--per-replica-rate", "2", "--policy", "sla", "--json", timeout=300)


def test_trace_replay_reports_the_bound_and_scale_events(trace_run):
    r = trace_run
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    from capacity.io.fleet import check_report, summary_table

    check_report(out, "report")
    b, a = out["lower_bound"], out["autoscaled"]
    assert b["per_replica_rate_per_s"] == 2 and b["rate_source"] == "given"
    assert a["vs_bound"]["gpu_hours"] == pytest.approx(a["gpu_hours"] - b["gpu_hours"])
    assert a["scale_events"]["up"] >= 1
    assert out["policy"] == "sla" and a["requests"] == 400
    labels = [row[0] for row in summary_table(out)[1]]
    assert "GPU-hours of a perfect system (lower bound)" in labels
    bad = json.loads(r.stdout)
    bad["lower_bound"]["gpu_hours"] = -1
    from capacity.errors import CapacityError

    with pytest.raises(CapacityError, match="lower_bound.gpu_hours"):
        check_report(bad, "report")


def test_trace_replay_report_in_the_dashboard_and_the_workbook(trace_run, tmp_path):
    from streamlit.testing.v1 import AppTest

    from capacity.io.export import write_review

    rep = json.loads(trace_run.stdout)
    # the curve fitted from the trace: 20-s bins whose integral is each bin's count of arrivals
    pts = rep["curve"]["points"]
    assert sum(r * 20 for _, r in pts) == pytest.approx(400)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    from tests.test_app import open_tab

    open_tab(at, "Autoscale")
    box = next(w for w in at.text_area if w.key == "as_report_text")
    box.set_value(trace_run.stdout).run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "figure" in d.value.columns)
    row = table[table["figure"] == "GPU-hours of a perfect system (lower bound)"].iloc[0]
    assert float(row["autoscaled"]) == pytest.approx(rep["lower_bound"]["gpu_hours"])
    write_review(tmp_path / "r.xlsx", autoscale=rep)
    import openpyxl

    ws = openpyxl.load_workbook(tmp_path / "r.xlsx")["Autoscale"]
    labels = {ws.cell(i, 1).value: i for i in range(1, ws.max_row + 1)}
    i = labels["GPU-hours above the lower bound"]
    assert ws.cell(i, 2).value == pytest.approx(rep["autoscaled"]["vs_bound"]["gpu_hours"])
    assert ws._charts  # the per-window chart
