"""A/B comparison and the regression gate (issue 23): hand-built runs whose true change is known."""
import json

import numpy as np
import pytest

from capacity.errors import CapacityError
from capacity.truth.compare import Requests, compare, gate, parse_rules
from tests.conftest import run_cli


def make_run(n=300, seed=0, ttft_scale=1.0, time_scale=1.0, rate=4.0):
    """n requests: Poisson sends at `rate`, TTFT lognormal around 40 ms (x ttft_scale), 64 output tokens at
    10 ms each; time_scale stretches every time (a slower server: the same work over a longer window)."""
    rng = np.random.default_rng(seed)
    sent = np.cumsum(rng.exponential(1 / rate, n))
    ttft = rng.lognormal(np.log(0.04), 0.4, n) * ttft_scale
    decode = 63 * rng.normal(0.010, 0.001, n)
    reqs = [{"id": i, "status": "ok", "sent_s": float(sent[i] * time_scale),
             "first_token_s": float(sent[i] * time_scale + ttft[i]),
             "finish_s": float(sent[i] * time_scale + ttft[i] + decode[i] * time_scale), "output_tokens": 64,
             "prompt_tokens": 128} for i in range(n)]
    return {"requests": reqs}


def by_metric(changes):
    return {c.metric: c for c in changes}


def test_a_known_ttft_rise_is_found_and_its_interval_holds_the_truth():
    """B's TTFTs are A's x 1.3, request by request: every TTFT statistic is exactly +30%; TPOT is unchanged."""
    a = Requests.of_run(make_run())
    b = Requests.of_run(make_run(ttft_scale=1.3))
    ch = by_metric(compare(a, b, resamples=1000))
    for s in ("mean", "p50", "p90", "p95"):
        c = ch[f"{s}_ttft"]
        assert c.change == pytest.approx(0.3, rel=1e-9) and c.low < 0.3 < c.high and c.verdict == "worse", c
    assert ch["mean_tpot"].change == pytest.approx(0.0, abs=1e-12) and ch["mean_tpot"].verdict == "no significant change"
    assert gate(list(ch.values()), parse_rules("p50_ttft:+10%")) and not gate(list(ch.values()), parse_rules("p50_ttft:+50%"))


def test_a_slower_server_loses_throughput_and_the_gate_names_it():
    """Every time x 1.25 (sends, decode): the same tokens over a 25% longer window, throughput -20%."""
    a, b = Requests.of_run(make_run()), Requests.of_run(make_run(time_scale=1.25))
    ch = by_metric(compare(a, b, resamples=1000))
    t = ch["throughput"]
    assert t.change == pytest.approx(1 / 1.25 - 1, rel=0.02) and t.verdict == "worse" and t.low < -0.2 < t.high
    failed = gate(list(ch.values()), parse_rules("throughput:-5%,p95_ttft:+10%"))
    assert len(failed) == 1 and failed[0].startswith("throughput:")


def test_two_runs_of_the_same_system_rarely_differ():
    """20 pairs of independent runs of one system: at 95%, mean TTFT is called different about once in 20
    (P(more than 4 of 20) = 0.3% if the interval holds its level)."""
    calls = 0
    for k in range(20):
        ch = by_metric(compare(Requests.of_run(make_run(seed=2 * k)), Requests.of_run(make_run(seed=2 * k + 1)),
                               resamples=400, seed=k))
        calls += ch["mean_ttft"].verdict != "no significant change"
    assert calls <= 4


def test_rules_and_runs_are_checked():
    assert parse_rules("p95_ttft:+10%, throughput:-5%") == {"p95_ttft": 0.10, "throughput": -0.05}
    for bad, why in (("p95_ttft:-10%", "a regression of p95_ttft is a rise"), ("latency:+5%", "unknown metric"),
                     ("p95_ttft:10", "expected METRIC"), ("throughput:+5%", "is a drop")):
        with pytest.raises(CapacityError, match=why):
            parse_rules(bad)
    with pytest.raises(CapacityError, match="needs at least 10"):
        Requests.of_run(make_run(n=5))


@pytest.mark.slow  # over 5 s: in CI (`pytest -m slow`), not in the default local run
def test_cli_compare_and_gate_exit_codes(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(make_run()))
    b.write_text(json.dumps(make_run(ttft_scale=1.5)))
    r = run_cli("compare", str(a), str(a), "--fail-on", "p95_ttft:+10%")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0] == f"A (baseline): {a}" and max(len(line) for line in rows[2:]) <= 80
    r = run_cli("compare", str(a), str(b), "--fail-on", "p95_ttft:+10%", "--json")
    assert r.returncode == 3
    out = json.loads(r.stdout)
    assert out["failed"] and out["failed"][0].startswith("p95_ttft:")
    r = run_cli("compare", str(a), str(b), "--fail-on", "p95_tft:+10%")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "p95_tft" in r.stderr


@pytest.mark.slow  # issue 20: keeps the default run under 6 minutes; CI runs the slow group
def test_simulated_runs_compare_like_measured_ones(tmp_path):
    """`simulate --save-run` writes the measured requests in the load test's format: a smaller batch cap under
    the same load is a significant P99 TTFT regression, and the same configuration twice is no change."""
    base = ["simulate", "-m", "llama-3.1-8b", "--rate", "4", "-n", "400", "--json"]
    files = {}
    for name, extra in (("a", []), ("a2", []), ("b", ["--max-num-seqs", "16"])):
        files[name] = tmp_path / f"{name}.json"
        r = run_cli(*base, *extra, "--save-run", str(files[name]), timeout=300)
        assert r.returncode == 0, r.stderr
    r = run_cli("compare", str(files["a"]), str(files["a2"]), "--fail-on", "p99_ttft:+10%", "--json")
    assert r.returncode == 0 and not json.loads(r.stdout)["failed"]
    r = run_cli("compare", str(files["a"]), str(files["b"]), "--fail-on", "p99_ttft:+10%", "--json")
    assert r.returncode == 3, r.stderr
    # one workload, one seed: the same requests at the same times, resampled in pairs (common random numbers),
    # which gives a narrower interval than resampling the two runs independently
    from capacity.truth.compare import same_requests
    from capacity.truth.fit import load_run

    a, b = (Requests.of_run(load_run(files[k])) for k in ("a", "b"))
    assert same_requests(a, b)
    paired = by_metric(compare(a, b, resamples=1000))["mean_e2e"]
    b.ids = None  # the same data, resampled independently
    unpaired = by_metric(compare(a, b, resamples=1000))["mean_e2e"]
    assert paired.paired and not unpaired.paired
    assert paired.high - paired.low < 0.8 * (unpaired.high - unpaired.low)


def test_cdf_plot_overlays_both_runs(tmp_path):
    pytest.importorskip("plotly")
    from capacity.truth.compare import cdf_figure

    a, b = Requests.of_run(make_run()), Requests.of_run(make_run(ttft_scale=2.0))
    fig = cdf_figure(a, b)
    assert len(fig.data) == 6  # TTFT, TPOT, E2E x two runs
    ttft_b = fig.data[1]
    assert ttft_b.y[-1] == 1.0 and float(np.median(ttft_b.x)) == pytest.approx(2 * float(np.median(fig.data[0].x)))
    f = tmp_path / "a.json"
    f.write_text(json.dumps(make_run()))
    r = run_cli("compare", str(f), str(f), "--plot", str(tmp_path / "cdf.html"))
    assert r.returncode == 0 and (tmp_path / "cdf.html").read_text().count("<html") == 1
    r = run_cli("compare", str(f), str(f), "--plot", str(tmp_path / "cdf.svg"))
    assert r.returncode == 1 and "use a .html or .png file" in r.stderr


def test_png_plot_for_a_ci_comment(tmp_path):
    pytest.importorskip("matplotlib")
    f = tmp_path / "a.json"
    f.write_text(json.dumps(make_run()))
    g = tmp_path / "b.json"
    g.write_text(json.dumps(make_run(ttft_scale=2.0)))
    png = tmp_path / "cdf.png"
    r = run_cli("compare", str(f), str(g), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    r = run_cli("compare", str(f), str(g), "--plot", str(png))  # never overwritten without --force
    assert r.returncode == 1 and "--force" in r.stderr
