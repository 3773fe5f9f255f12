"""Is a run's answer a steady state? The TTFT trend test (by hand, and its false-alarm and detection rates on
FIFO queues of known stability), the capacity `capacity simulate` sets the offered rate against (the planner's
own measure), and what a slowly growing overload now says in the library, the CLI and the planner."""
import numpy as np
import pytest

from capacity.sim.metrics import TREND_BATCHES, Dist, ttft_trend
from tests.conftest import ROOT, run_cli
from tests.test_simulator import lindley


def test_the_trend_of_a_ramp_by_hand():
    """1,000 requests one second apart whose TTFT is 0.1 s + 0.01 x arrival time: 20 batches of 50, batch k's
    mean arrival 24.5 + 50 k and mean TTFT 0.1 + 0.01 x that: slope 0.01, first batch 0.345 s, last 9.845 s,
    fitted rise 0.01 x 950 = 9.5 s against a mean of 0.1 + 0.01 x 499.5 = 5.095 s: rising."""
    t = np.arange(1000.0)
    tr = ttft_trend(t, t + 0.1 + 0.01 * t)
    assert TREND_BATCHES == 20
    assert tr.slope == pytest.approx(0.01) and tr.first_s == pytest.approx(0.345) and tr.last_s == pytest.approx(9.845)
    assert tr.rise_s == pytest.approx(9.5) and tr.mean_s == pytest.approx(5.095) and tr.p_value < 1e-12
    assert tr.rising
    falling = ttft_trend(t, t + 10.0 - 0.005 * t)  # significant, but down: a queue draining its start-up burst
    assert falling.p_value > 0.99 and not falling.rising
    # significant but small: the line ends at 1.47x where it starts (rise 0.475 s, mean 1.25 s), not above 5/3
    assert not ttft_trend(t, t + 1.0 + 0.0005 * t + 0.01 * np.sin(t)).rising
    assert ttft_trend(t, t + 0.25) is None  # every TTFT the same: nothing to test
    assert not ttft_trend(t, t + 0.2).rising  # the same up to rounding (which alone can be "significant")
    assert ttft_trend(t[:199], t[:199] + 0.1 * t[:199]) is None  # fewer than 10 requests per batch
    unfinished = t + 0.1
    unfinished[-1] = np.nan
    assert ttft_trend(t, unfinished) is None


def test_the_backlogged_stretch_by_hand():
    """Ten requests of 50 output tokens from a loop of 2 users, finishing at 1, 2, ..., 10 s. The stretch with every
    user in the loop runs from the 2nd completion (2 s) to the one that frees the last send, the 8th (8 s): 6
    completions. Tokens come at 200/s before and after it and 100/s inside it (one every 10 ms), so the rate is
    100 tokens/s, 100 / 50 = 2 requests/s; the whole run's completions (10 in 10 s) would say 1 and its tokens
    (1,600 in 10 s) 3.2. The slope of a staircase of 10-ms steps reads within 0.2% of the line."""
    from capacity.sim.metrics import Records, backlogged

    n = 10
    fin = np.arange(1.0, n + 1)
    zeros = np.zeros(n)
    rec = Records(zeros, zeros, zeros, fin, np.full(n, 100), np.full(n, 50), zeros.astype(int), zeros.astype(int),
                  zeros.astype(int))
    t = np.round(np.arange(1, 1001) * 0.01, 6)
    w = np.where((t > 2) & (t <= 8), 1.0, 2.0)
    b = backlogged(rec, 2, t, w)
    assert (b.start_s, b.end_s, b.completions) == (2.0, 8.0, 6)
    assert b.tokens_per_s == pytest.approx(100, rel=2e-3) and b.requests_per_s == pytest.approx(2.0, rel=2e-3)
    assert backlogged(rec, 4, t, w) is None  # 4 users: the 4th to the 6th completion, fewer than 4: too short
    assert backlogged(rec, 2, t, w, skip=7) is None  # the 7th to the 8th: 1 completion, fewer than 2
    rec.finish[-1] = np.nan
    assert backlogged(rec, 2, t, w) is None  # a request never finished: no stretch to read


def test_the_capacity_loop_reads_what_a_long_loop_reads():
    """The 8B on an L40S, batch cap 64, 1,024/256 tokens (a golden case's engine): the capacity loop (128 users, 4
    requests each) reads its stretch within 1.5% of the same stretch of a loop of 30 requests per user. Read over the
    whole run (no warm-up), 2 requests per user are 3% low: the start-up burst. The run's summary leaves out the
    start-up cohort and counts each warm-up request by the share of its output emitted in its window: within 1%
    at 2 and 30 requests per user (+0.9%, +0.2%). Counting the warm-up requests that finish in the window whole,
    as the summary did, read 1.7% high at 30, and would read 27% high at 2 with the cohort left out (its 128
    finishes). `bench/steady_state.py
    --capacity-only` has six more workloads."""
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, prepare, run
    from capacity.steady import capacity_loop

    d = Deployment(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("l40s"), EngineConfig(max_num_seqs=64))
    p = prepare(d)
    loop = capacity_loop(d.engine, p.budget, spec(1.0, 10), 0)
    assert loop.arrivals.users == 128 and loop.num_requests == 512
    res = {k: run(d, loop.model_copy(update={"num_requests": k * 128}), RunOptions(ci=False, timeseries=False),
                  prepared=p) for k in (2, 4, 30)}
    ref = res[30].backlogged.requests_per_s
    assert res[4].backlogged.requests_per_s == pytest.approx(ref, rel=0.015)
    assert res[2].backlogged is None and res[2].warmup_requests == 128
    whole = run(d, loop.model_copy(update={"num_requests": 256}), RunOptions(ci=False, timeseries=False,
                                                                               warmup_fraction=0.0), prepared=p)
    assert whole.summary.requests_per_s < 0.975 * ref
    for k in (2, 30):
        assert res[k].summary.requests_per_s == pytest.approx(ref, rel=0.01)
        # fixed 256-token outputs: requests/s and tokens/s count the same work
        assert res[k].summary.output_tokens_per_s == pytest.approx(256 * res[k].summary.requests_per_s, rel=1e-9)


def alarms(rho: float, n: int, seeds: int = 300) -> float:
    """Share of M/D/1 runs (D = 10 ms, TTFT = wait + D, the first tenth left out as warm-up) the test flags."""
    hits = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        a = np.cumsum(rng.exponential(0.01 / rho, n))
        s = np.full(n, 0.01)
        w = lindley(a, s)
        m = n // 10
        hits += ttft_trend(a[m:], a[m:] + w[m:] + 0.01).rising
    return hits / seeds


def test_false_alarms_and_detection_on_a_queue_of_known_stability():
    """Lindley's recursion gives the FIFO queue's exact waits (the simulator equals it request by request:
    tests/test_simulator.py). Stable at rho 0.8 over 2,000 requests: never flagged in 300 seeds; rho 0.9:
    at most 1%; overloaded by 5%: flagged in at least 90% (a 2,000-request run sees (rho - 1) x 2,000 = 100
    services of growth against a random walk of about sqrt(2,000) = 45), by 10%: always. At rho 0.9 over only
    500 requests the queue has not settled (its relaxation time is hundreds of services), and 3-15% of runs are
    flagged: their TTFT is still rising there (the `Trend` docstring says so)."""
    assert alarms(0.8, 2000) == 0.0
    assert alarms(0.9, 2000) <= 0.01
    assert alarms(1.05, 2000) >= 0.9
    assert alarms(1.1, 2000) == 1.0
    assert 0.03 <= alarms(0.9, 500) <= 0.15


# ---- the run pipeline ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dep():
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment

    return Deployment(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm"), EngineConfig())


def spec(rate: float, n: int):
    from capacity.workload import WorkloadSpec

    return WorkloadSpec.model_validate({"arrivals": {"kind": "poisson", "rate_per_s": rate}, "num_requests": n,
                                        "input_len": {"kind": "fixed", "value": 1024},
                                        "output_len": {"kind": "fixed", "value": 256}})


def test_a_slowly_growing_overload_is_saturated(dep):
    """The 8B on an H100 at 22 req/s, 1,024/256 tokens: its capacity (the closed loop that keeps the queue from
    emptying) is about 21 req/s, the queue only grows about 1 request a second, and after 10,000 requests fewer
    than 10% are queued at the last arrival, so the run used to pass as steady with P99 TTFT in the tens of
    seconds. Its TTFT rises through the run: with the capacity measured it is saturated; without, a note says
    the run is not steady."""
    from capacity.pipeline import RunOptions, run

    res = run(dep, spec(22.0, 10_000), RunOptions(ci=False, capacity_check=True))
    assert res.rising and res.trend.last_s > 10 * res.trend.first_s
    assert 20.0 < res.capacity.req_per_s < 22.0 and res.capacity.users == 834
    assert res.sim.saturated and res.sim.saturation.startswith("saturated: TTFT rose from")
    assert res.sim.capacity_req_per_s == res.capacity.req_per_s
    assert not res.as_dict()["stopped_early"]  # every request finished: the run was not cut short
    plain = run(dep, spec(22.0, 10_000), RunOptions(ci=False))
    assert not plain.sim.saturated and plain.capacity is None
    assert [n for n in plain.notes if n.startswith("not steady: TTFT rose")]
    assert plain.summary.ttft_s.p99 == res.summary.ttft_s.p99  # the same run, only judged differently


def test_a_steady_run_says_nothing_and_the_planner_measures_the_same_capacity(dep):
    """At 10 req/s (half the capacity) neither check speaks. The capacity `simulate` sets the rate against is the
    planner's, figure for figure, for the same engine and number of requests (one door, one answer)."""
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Planner, Scenario, SearchSpec

    pl = Planner(Scenario(model="llama-3.1-8b", gpu="h100-sxm", workload=spec(10.0, 1000),
                          search=SearchSpec(requests=1000)), dep.card, SerialExecutor(cache=False, progress=False))
    e = pl.engine(1)
    res = run(Deployment(dep.card, dep.gpu, e), spec(10.0, 1000), RunOptions(ci=False, capacity_check=True))
    assert not res.rising and not res.sim.saturated
    assert not [n for n in res.notes if "capacity" in n or "steady" in n]
    assert res.capacity.req_per_s == pl.capacity(e, pl.budget(e).max_num_seqs).capacity_rates[0]
    assert res.as_dict()["capacity_check"]["offered_over_capacity"] == pytest.approx(10.0 / res.capacity.req_per_s)


def test_the_planner_fails_a_probe_whose_ttft_still_rises(card8b_planner):
    from capacity.plan.tasks import TaskResult

    d = Dist(1000, 0.1, 0.1, 0.1, 0.1, 0.1)
    ok = TaskResult(d, Dist(1000, 0.01, 0.01, 0.01, 0.01, 0.01), d, d, 1000.0, 4.0, False, None, "roofline")
    assert card8b_planner.judge([ok, ok])[0]
    rising = TaskResult(**{**ok.__dict__, "rising": True})
    passed, pt, pp = card8b_planner.judge([ok, rising])
    assert not passed and pt == pytest.approx(0.1)  # the percentiles stay reported


@pytest.fixture
def card8b_planner(dep):
    from capacity.plan.planner import Planner, Scenario, SLOSpec

    return Planner(Scenario(model="llama-3.1-8b", gpu="h100-sxm", slo=SLOSpec(ttft_s=1.0, tpot_s=0.05)),
                   dep.card, None)


def test_simulate_says_when_the_offered_rate_is_at_the_capacity():
    """`capacity simulate` at 21 req/s (2,000 requests, whose closed loop measures 20.7 req/s: 101%; 20.4 over the
    whole of a loop of two requests per user, start-up burst and drain included, before the capacity was read over
    the stretch with every user in the loop; 20.5 before the measured GEMM floor, whose bf16 kernels dip 1-3% below
    the roofline at 128-256 tokens; a loop of 30 requests per user reads 20.5): a note, in the table's output, that
    the rate is at or above the capacity; at 10 req/s none. The capacity line is always there."""
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "21", "--frontend-ms", "0", "--frontend-us-per-token", "0")
    assert r.returncode == 0, r.stderr
    assert "note: at or above capacity: the offered 21 req/s is 101% of 20.7 req/s" in r.stdout
    assert "capacity: 20.7 requests/s with the queue never empty (a closed loop of 834 users" in r.stdout
    assert "offered 21 req/s is 101% of it" in r.stdout
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "10", "-n", "500")
    assert r.returncode == 0 and "note: near capacity" not in r.stdout and "steady" not in r.stdout
    assert "offered 10 req/s is 48% of it" in r.stdout  # the figure is always shown (the dashboard's metric too)


def test_a_sweep_marks_a_point_whose_ttft_still_rises():
    """A sweep point at 24 req/s for the 8B (capacity ~20.5 req/s; 2,000 requests): fewer than 10% queued at
    the last arrival, so not saturated, but its TTFT rises through the run: the table says "rising" and why."""
    r = run_cli("sweep", "-m", "llama-3.1-8b", "--vary", "engine.max_num_seqs=256", "--rate", "24", "--requests",
                "2000", "--seeds", "1", "--executor", "serial")
    assert r.returncode == 0, r.stderr
    assert "24 rising" in r.stdout and "sat." not in r.stdout
    assert "rising = TTFT still rising through the run" in r.stdout


def test_the_rate_search_never_passes_a_rate_at_or_above_the_capacity(dep):
    """With a tolerance of 1% the search's first probe is 1.05 x capacity / 1.01, above the capacity: under a
    loose SLO a finite run there could pass, but at or above the capacity the queue never drains, so that probe
    fails without a simulation and the answer stays below the capacity."""
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Planner, Scenario, SearchSpec, SLOSpec

    pl = Planner(Scenario(model="llama-3.1-8b", gpu="h100-sxm", workload=spec(10.0, 300),
                          slo=SLOSpec(ttft_s=60.0, tpot_s=1.0), search=SearchSpec(seeds=1, requests=300, tolerance=0.01)),
                 dep.card, SerialExecutor(cache=False, progress=False))
    r = pl.rate_search(pl.engine(1), 1, 256)
    first = r.probes[1]
    assert first[0] == pytest.approx(r.capacity_rate * 1.05 / 1.01) and not first[1] and first[2] == float("inf")
    assert r.max_rate < r.capacity_rate <= r.failed_rate


def test_colocate_fails_a_model_whose_ttft_still_rises():
    """`capacity colocate`, separate layout: the 8B alone at 24 req/s for 2,000 requests (above its ~20.5 req/s
    capacity, not enough requests for the queue bounds) meets a 60-s P99 TTFT SLO on paper, but its TTFT rises
    through the run, so it does not meet it; at 10 req/s it does."""
    from capacity.plan.colocate import Fleet, simulate_fleet

    def fleet(rate):
        return Fleet.model_validate({"gpu": "h100-sxm", "models": [{
            "model": "llama-3.1-8b", "slo_ttft_s": 60.0, "workload": {
                "arrivals": {"kind": "poisson", "rate_per_s": rate}, "num_requests": 2000,
                "input_len": {"kind": "fixed", "value": 1024}, "output_len": {"kind": "fixed", "value": 256}}}]})

    over = simulate_fleet(fleet(24.0), "separate")["models"][0]
    assert over["ttft_rising"] and not over["meets_slo"] and over["p99_ttft_s"] < 60.0
    ok = simulate_fleet(fleet(10.0), "separate")["models"][0]
    assert not ok["ttft_rising"] and ok["meets_slo"]


def test_a_capacity_loop_too_big_to_run_is_a_note_not_a_run(dep):
    """200 replicas of the 8B: the capacity loop would keep 2 x 417 users per replica busy (166,800 users,
    four requests each: 667,200 requests): over the 100,000-request bound, so it is not run (it would take minutes and gigabytes for a
    500-request question); the note says so and the run is still judged by its TTFT trend."""
    from capacity.pipeline import Deployment, RunOptions, run

    res = run(Deployment(dep.card, dep.gpu, dep.engine, replicas=200), spec(1.0, 500),
              RunOptions(ci=False, capacity_check=True))
    assert res.capacity is None and res.trend is not None
    assert [n for n in res.notes if n.startswith("capacity not measured: its closed loop (166,800 users over 200 "
                                                 "replicas, 667,200 requests) is over the 100,000-request bound")]
