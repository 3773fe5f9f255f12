"""`capacity fleet-day`: several models over a day (capacity.plan.fleetday): static provisioning for the peak,
reactive and predictive autoscaling per model, shared GPUs; and its one-line errors for bad fleet files."""
import json

import pytest

from tests.conftest import run_cli

CURVE = "{shape: step, period_s: 3600, points: [[0, %s], [1200, %s], [2400, %s]]}"


def fleet_yaml(tmp_path, extra: str = "", slo: str = "slo_ttft_s: 0.5\n    slo_tpot_s: 0.05", curve=(2, 10, 2),
               startup: str = "60") -> str:
    """Two models over an hour: a 20-minute peak 5x the rest. The per-replica rates and targets are given (the
    planner's search is its own tests' business), so each layout's replica count is known by hand."""
    body = f"""gpu: h100-sxm
price_per_gpu_hour: 3
startup_s: {startup}
cooldown_s: 120
interval_s: 10
window_s: 300
{extra}
models:
  - model: llama-3.1-8b
    {slo}
    per_replica_rate: 4.0
    target: 6
    engine: {{max_model_len: 4096}}
    workload:
      arrivals: {{kind: curve, duration_s: 3600, curve: {CURVE % curve}}}
      input_len: {{kind: fixed, value: 512}}
      output_len: {{kind: fixed, value: 64}}
      num_requests: 100000
  - model: mistral-7b
    slo_ttft_s: 0.5
    per_replica_rate: 6.0
    target: 8
    engine: {{max_model_len: 4096}}
    workload:
      arrivals: {{kind: curve, duration_s: 3600, curve: {CURVE % (1, 5, 1)}}}
      input_len: {{kind: fixed, value: 256}}
      output_len: {{kind: fixed, value: 32}}
      num_requests: 100000
"""
    p = tmp_path / "day.yaml"
    p.write_text(body)
    return str(p)


@pytest.fixture(scope="module")
def day_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("day")
    r = run_cli("fleet-day", "--fleet", fleet_yaml(tmp, "shared_check_requests: 300"), "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow  # a simulated hour of two models (about 10 s): in CI, not in the default local run
def test_fleet_day_compares_static_reactive_predictive_and_shared(day_report):
    out = day_report
    a, b = out["models"]
    # static: ceil(peak / per-replica rate) all hour: ceil(10 / 4) = 3 and ceil(5 / 6) = 1
    assert a["layouts"]["static"]["replicas_max"] == 3 and b["layouts"]["static"]["replicas_max"] == 1
    for m in (a, b):
        st = m["layouts"]["static"]
        assert st["gpu_hours"] == pytest.approx(st["replicas_max"] * 1.0)  # the whole hour
        assert st["cost_usd"] == pytest.approx(3 * st["gpu_hours"])
        for lay in ("reactive", "predictive"):
            assert m["layouts"][lay]["gpu_hours"] <= st["gpu_hours"] + 1e-9
    # the predictive pool starts at ceil(2 / 4) = 1 and grows to 3 for the peak, starting 60 s ahead of it
    pa = a["layouts"]["predictive"]
    assert pa["replicas_min"] == 1 and pa["replicas_max"] == 3 and pa["gpu_hours"] < a["layouts"]["static"]["gpu_hours"]
    assert a["target"] == 6 and a["target_source"] == "given"
    assert out["router"] == "least_outstanding"  # a least-request balancer unless the file says otherwise
    w = pa["window"]
    assert len(w["ready"]) == len(w["provisioned"]) == len(w["met"]) and max(w["provisioned"]) == 3
    assert all(r <= p for r, p in zip(w["ready"], w["provisioned"]))
    # each layout's run time is a duration (a window's start once shadowed its clock: -82,759 s on a day)
    assert all(0 <= m["layouts"][lay]["wall_s"] < 600 for m in (a, b) for lay in ("static", "reactive", "predictive"))
    for lay in ("static", "reactive", "predictive"):
        t = out["totals"][lay]
        assert t["gpu_hours"] == pytest.approx(a["layouts"][lay]["gpu_hours"] + b["layouts"][lay]["gpu_hours"])
        assert t["violation_minutes"] == pytest.approx(
            a["layouts"][lay]["violation_minutes"] + b["layouts"][lay]["violation_minutes"])
    sh = out["shared"]
    assert sh["gpus"] is not None and sh["tried"][-1]["meets_slo"] and sh["gpus"] <= 4
    assert all(not t["meets_slo"] for t in sh["tried"][:-1]) and sh["tried"][0]["gpus"] == 1
    assert out["totals"]["shared"]["gpu_hours"] == pytest.approx(sh["gpus"] * sh["hours"])


@pytest.mark.slow  # a simulated hour of two models (about 10 s): in CI, not in the default local run
def test_a_saved_report_prints_and_exports_a_sheet(day_report, tmp_path):
    from openpyxl import load_workbook

    saved = tmp_path / "day.json"
    saved.write_text(json.dumps(day_report))
    r = run_cli("fleet-day", "--report", str(saved))
    assert r.returncode == 0, r.stderr
    assert "4 req/s per replica (given)" in r.stdout and "shared, " in r.stdout
    r = run_cli("export", "--fleet-day", str(saved), "--xlsx", str(tmp_path / "review.xlsx"), "--tables")
    assert r.returncode == 0, r.stderr
    ws = load_workbook(tmp_path / "review.xlsx")["Fleet day"]
    cells = {ws.cell(i, 1).value: [ws.cell(i, j).value for j in range(2, 6)] for i in range(1, ws.max_row + 1)}
    for lay in ("static", "reactive", "predictive", "shared"):
        assert cells[lay][1] == pytest.approx(day_report["totals"][lay]["gpu_hours"])
    assert len(ws._charts) == 1
    assert (tmp_path / "review.fleet_day.csv").read_text().count("\n") == 1 + 3 * 2  # header + a row per model x layout
    no_shared = {k: v for k, v in day_report.items() if k != "shared"}
    no_shared["totals"] = {k: v for k, v in day_report["totals"].items() if k != "shared"}
    saved.write_text(json.dumps(no_shared))
    r = run_cli("fleet-day", "--report", str(saved))
    assert r.returncode == 0 and "shared" not in r.stdout.lower(), r.stderr
    saved.write_text(json.dumps({"models": [], "totals": {}}))
    for cmd in (("fleet-day", "--report", str(saved)), ("export", "--fleet-day", str(saved), "--xlsx",
                                                         str(tmp_path / "b.xlsx"))):
        r = run_cli(*cmd)
        assert r.returncode == 1 and "fleet-day report" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kw, field", [
    (dict(slo="max_replicas: 4"), "no SLO"),
    (dict(startup="-5"), "startup_s"),
    (dict(curve=(2, -1, 2)), "points[1]"),
    (dict(extra="shared_gpus: 0"), "shared_gpus"),
    (dict(startup="true"), "startup_s"),  # strict: a YAML boolean is not a number of seconds
])
def test_bad_fleet_day_files_get_one_line(tmp_path, kw, field):
    r = run_cli("fleet-day", "--fleet", fleet_yaml(tmp_path, **kw))
    assert r.returncode == 1 and field in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_day_needs_a_curve(tmp_path):
    p = fleet_yaml(tmp_path)
    text = open(p).read().replace("{kind: curve, duration_s: 3600, curve: {shape: step, period_s: 3600, points: "
                                  "[[0, 1], [1200, 5], [2400, 1]]}}", "{kind: poisson, rate_per_s: 3}")
    open(p, "w").write(text)
    r = run_cli("fleet-day", "--fleet", p)
    assert r.returncode == 1 and "a day follows a load curve" in r.stderr and "Traceback" not in r.stderr


def test_a_model_whose_requests_exceed_its_context_is_one_error_before_any_run(tmp_path):
    """fleet-day and colocate: a model whose every request is longer than its max_model_len would have no
    request served, and its SLO would read 'met' (colocate printed exactly that). One line names the model,
    its limit and its shortest request (5,000 + 64 tokens)."""
    p = fleet_yaml(tmp_path)
    text = open(p).read().replace("input_len: {kind: fixed, value: 512}", "input_len: {kind: fixed, value: 5000}", 1)
    open(p, "w").write(text)
    r = run_cli("fleet-day", "--fleet", p)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "models[0] (llama-3.1-8b): max_model_len 4,096: every request of the workload is longer (at least " \
           "5,064 tokens" in r.stderr
    co = tmp_path / "co.yaml"
    co.write_text("gpu: h100-sxm\ngpus: 1\nmodels:\n"
                  "  - model: llama-3.1-8b\n    engine: {max_model_len: 4096}\n    workload:\n"
                  "      arrivals: {kind: poisson, rate_per_s: 2}\n      input_len: {kind: fixed, value: 5000}\n"
                  "      output_len: {kind: fixed, value: 64}\n      num_requests: 100\n"
                  "  - model: mistral-7b\n    engine: {max_model_len: 4096}\n    workload:\n"
                  "      arrivals: {kind: poisson, rate_per_s: 2}\n      input_len: {kind: fixed, value: 512}\n"
                  "      output_len: {kind: fixed, value: 64}\n      num_requests: 100\n")
    r = run_cli("colocate", "--fleet", str(co))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "models[0] (llama-3.1-8b): max_model_len 4,096: every request" in r.stderr
