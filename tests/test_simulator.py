"""The simulator against closed-form queueing results, Little's law, the fast path against step-by-step,
static batching's batch-size/P99 trade-off, saturation, closed loops and routing."""

import numpy as np
import pytest

from capacity.cost.roofline import RooflineCost
from capacity.cost.step import LinearCost
from capacity.model.gpus import get_gpu
from capacity.sched import make_scheduler
from capacity.sim.metrics import summarize
from capacity.sim.simulator import SimConfig, littles_law, simulate
from capacity.workload import Arrivals, Request, WorkloadSpec, fixed


def one_at_a_time():
    return make_scheduler("continuous", max_num_seqs=1, max_num_batched_tokens=1 << 20, num_blocks=1 << 22)


def mean_wait(res):
    r = res.records
    return float((r.first_scheduled - r.arrival).mean())


# ---- M/D/1 and M/G/1 (Pollaczek-Khinchine) at batch size 1 ----------------------------------------------
@pytest.mark.parametrize("rho,n", [(0.5, 100_000), (0.7, 200_000), (0.9, 1_000_000)])
def test_md1_mean_wait(rho, n):
    """One token in, one token out, one sequence at a time: every request is one step of D seconds, so the
    engine is an M/D/1 queue: Wq = rho D / (2 (1 - rho))."""
    D = 0.01
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=rho / D), input_len=fixed(1),
                        output_len=fixed(1), num_requests=n)
    res = simulate(spec, LinearCost(fixed_s=D), one_at_a_time, np.random.default_rng(2024),
                   SimConfig(timeseries=False))
    assert mean_wait(res) == pytest.approx(rho * D / (2 * (1 - rho)), rel=0.03)
    L, lw = littles_law(res)
    assert L == pytest.approx(lw, rel=1e-9)


@pytest.mark.parametrize("rho,n", [(0.5, 100_000), (0.7, 300_000), (0.9, 1_500_000)])
def test_mm1_mean_wait(rho, n):
    """Service time proportional to a geometric prompt length (mean 500 tokens, CV^2 = 0.998): M/M/1 up to
    the discreteness; compared with the exact M/G/1 value, Wq = lambda E[S^2] / (2 (1 - rho))."""
    rng = np.random.default_rng(7)
    p, c = 1 / 500, 2e-5  # tokens ~ Geometric(p) on {1, 2, ...}; service = c x tokens
    es, es2 = c / p, c * c * (2 - p) / p ** 2
    lam = rho / es
    t = np.cumsum(rng.exponential(1 / lam, n))
    tokens = rng.geometric(p, n)
    reqs = [Request(i, float(t[i]), int(tokens[i]), 1) for i in range(n)]
    res = simulate(reqs, LinearCost(per_token_s=c), one_at_a_time, rng, SimConfig(timeseries=False))
    pk = lam * es2 / (2 * (1 - rho))
    assert mean_wait(res) == pytest.approx(pk, rel=0.03)
    assert pk == pytest.approx(rho * es / (1 - rho), rel=0.01)  # and that is M/M/1's rho/(mu - lambda)


# ---- Little's law, every policy ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def roofline(card):
    return RooflineCost(card("llama-3.1-8b"), get_gpu("h100-sxm"))


@pytest.fixture(scope="module")
def card():
    from capacity.model.card import load_model_card
    from tests.conftest import MODELS

    return lambda name: load_model_card(MODELS / f"{name}.yaml")


CB = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16, num_blocks=4000)


@pytest.mark.parametrize("policy,kw,replicas,router", [
    ("continuous", CB, 1, "round_robin"),
    ("continuous", dict(CB, num_blocks=300), 1, "round_robin"),  # KV-starved: preemptions
    ("priority", CB, 2, "least_outstanding"),
    ("static", dict(max_batch=8, max_wait_s=0.2), 1, "round_robin"),
])
def test_littles_law_holds(roofline, policy, kw, replicas, router):
    spec = WorkloadSpec(arrivals=Arrivals(kind="gamma", rate_per_s=6.0, cv=2.0),
                        input_len=fixed(512), output_len=fixed(128), num_requests=600)
    res = simulate(spec, roofline, lambda: make_scheduler(policy, **kw), np.random.default_rng(3),
                   SimConfig(replicas=replicas, router=router))
    assert not res.saturated and np.isfinite(res.records.finish).all()
    L, lw = littles_law(res)
    assert L == pytest.approx(lw, rel=1e-9)
    if kw.get("num_blocks") == 300:
        assert res.preemptions > 0


# ---- the fast path is exact -------------------------------------------------------------------------
def test_fast_forward_agrees_with_step_by_step(roofline):
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=4.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=800)
    runs = []
    for fast in (True, False):
        res = simulate(spec, roofline, lambda: make_scheduler("continuous", **CB), np.random.default_rng(11),
                       SimConfig(fast_forward=fast))
        runs.append((res, summarize(res.records, res.itl_values, res.itl_weights, np.random.default_rng(0), ci=False)))
    (fast, sf), (slow, ss) = runs
    assert fast.events < slow.events / 5  # the point of it
    assert fast.steps == slow.steps
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s"):
        for stat in ("mean", "p50", "p90", "p99"):
            assert getattr(sf, key).stat(stat) == pytest.approx(getattr(ss, key).stat(stat), rel=5e-3, abs=1e-9), (key, stat)
    assert sf.output_tokens_per_s == pytest.approx(ss.output_tokens_per_s, rel=5e-3)
    np.testing.assert_allclose(fast.records.finish, slow.records.finish, rtol=1e-9)


# ---- static batching: bigger batches, longer tails at the same load ---------------------------------------
def test_static_batching_p99_rises_with_batch_size(roofline):
    """1 req/s, 512/64 tokens (a batch of one takes ~0.5 s, so batch size 1 is stable at rho ~0.5); the
    server waits up to 30 s to fill its batch, as a "collect, then run" server does: the tail grows with
    the batch size because the first member waits for the rest."""
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=1.0), input_len=fixed(512),
                        output_len=fixed(64), num_requests=400)
    p99 = []
    for b in (1, 4, 16):
        res = simulate(spec, roofline, lambda b=b: make_scheduler("static", max_batch=b, max_wait_s=30.0),
                       np.random.default_rng(5))
        assert not res.saturated
        s = summarize(res.records, res.itl_values, res.itl_weights, np.random.default_rng(0), ci=False)
        p99.append(s.ttft_s.p99)
    assert p99[0] < p99[1] < p99[2]
    assert p99[2] > 10.0  # ~15 arrivals at 1/s before a batch of 16 starts


# ---- overload ------------------------------------------------------------------------------------------
def test_saturation_is_detected_with_the_capacity_bound():
    D = 0.01  # capacity 100 req/s
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=150.0), input_len=fixed(1),
                        output_len=fixed(1), num_requests=1_000_000)
    res = simulate(spec, LinearCost(fixed_s=D), one_at_a_time, np.random.default_rng(1))
    assert res.saturated and res.saturation.startswith("saturated")
    assert res.capacity_req_per_s == pytest.approx(100.0, rel=0.02)
    assert len(res.records) < 100_000  # stopped early, did not run the million


# ---- closed loop and routing -----------------------------------------------------------------------
def test_closed_loop_without_think_time_keeps_the_server_busy():
    """N users, batch size 1, D seconds each: every response takes N x D once the loop is running."""
    D, N = 0.01, 5
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=N), input_len=fixed(1), output_len=fixed(1),
                        num_requests=500)
    res = simulate(spec, LinearCost(fixed_s=D), one_at_a_time, np.random.default_rng(0))
    e2e = (res.records.finish - res.records.arrival)[50:]
    assert e2e == pytest.approx(np.full(len(e2e), N * D))
    assert res.end_s == pytest.approx(500 * D)


def test_round_robin_alternates_replicas():
    reqs = [Request(i, i * 1.0, 4, 2) for i in range(6)]
    res = simulate(reqs, LinearCost(fixed_s=0.1), one_at_a_time, np.random.default_rng(0), SimConfig(replicas=3))
    assert list(res.records.replica) == [0, 1, 2, 0, 1, 2]


def test_least_outstanding_beats_round_robin_on_skewed_lengths():
    rng = np.random.default_rng(4)
    n = 4000
    t = np.cumsum(rng.exponential(1 / 150.0, n))
    toks = np.where(rng.random(n) < 0.1, 50, 1)  # service 0.5 s or 0.01 s
    reqs = lambda: [Request(i, float(t[i]), int(toks[i]), 1) for i in range(n)]
    waits = {}
    for router in ("round_robin", "least_outstanding"):
        res = simulate(reqs(), LinearCost(per_token_s=0.01), one_at_a_time, np.random.default_rng(0),
                       SimConfig(replicas=16, router=router))
        waits[router] = mean_wait(res)
    assert waits["least_outstanding"] < 0.5 * waits["round_robin"]
