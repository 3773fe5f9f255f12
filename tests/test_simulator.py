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
from capacity.workload import Arrivals, Request, RequestClass, WorkloadSpec, fixed


def one_at_a_time():
    return make_scheduler("continuous", max_num_seqs=1, max_num_batched_tokens=1 << 20, num_blocks=1 << 22)


def mean_wait(res):
    r = res.records
    return float((r.first_scheduled - r.arrival).mean())


# ---- M/D/1 and M/G/1 (Pollaczek-Khinchine) at batch size 1 ----------------------------------------------
# Two checks per queue instead of one huge run: (1) the simulator's wait of every request equals Lindley's
# recursion W[n+1] = max(0, W[n] + S[n] - A[n+1]) on the same arrivals and service times (exact, per request,
# so 25k requests are plenty), and (2) Lindley's recursion itself, vectorised over 4M requests, meets the
# closed form within its batch-means confidence interval. Together: the simulator is the queue, and the queue
# has the textbook mean, with more statistical power than the earlier 1.5M-request runs at a fraction of the
# time.
def lindley(arrival: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Waits of a FIFO single server: W[n] = U[n] - min(U[0..n]), U the running sum of S[k] - A[k+1]."""
    u = np.concatenate([[0.0], np.cumsum(service[:-1] - np.diff(arrival))])
    return u - np.minimum.accumulate(u)


def batch_means(x: np.ndarray, k: int = 40) -> tuple[float, float]:
    """Mean and its standard error from k batch means (the first 5% dropped as warm-up)."""
    b = np.array([c.mean() for c in np.array_split(x[len(x) // 20:], k)])
    return float(b.mean()), float(b.std(ddof=1) / np.sqrt(k))


def mg1(rho: float, n: int, service, seed: int):
    rng = np.random.default_rng(seed)
    s = service(rng, n)
    return np.cumsum(rng.exponential(s.mean() / rho, n)), s


MD1 = (0.01, lambda rng, n: np.full(n, 0.01))  # D = 10 ms
P, C = 1 / 500, 2e-5  # tokens ~ Geometric(1/500) on {1, 2, ...}; service = C x tokens (M/M/1 up to discreteness)
MG1 = (None, lambda rng, n: C * rng.geometric(P, n))


@pytest.mark.parametrize("kind", ["md1", "mg1"])
@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_simulator_is_the_fifo_queue_request_by_request(kind, rho):
    """Batch size 1, one token out: each request is one step whose time is its service time. 25,000 requests
    hold over 2,300 busy periods even at rho = 0.9 (the means are checked against Pollaczek-Khinchine below,
    over millions of requests through the same recursion)."""
    d, service = MD1 if kind == "md1" else MG1
    t, s = mg1(rho, 25_000, service, 11)
    if kind == "md1":
        reqs = [Request(i, float(t[i]), 1, 1) for i in range(len(t))]
        cost = LinearCost(fixed_s=d)
    else:
        reqs = [Request(i, float(t[i]), int(round(s[i] / C)), 1) for i in range(len(t))]
        cost = LinearCost(per_token_s=C)
    res = simulate(reqs, cost, one_at_a_time, np.random.default_rng(0), SimConfig(timeseries=False))
    waits = res.records.first_scheduled - res.records.arrival
    np.testing.assert_allclose(waits, lindley(t, s), rtol=1e-9, atol=1e-9)
    L, lw = littles_law(res)
    assert L == pytest.approx(lw, rel=1e-9)


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_the_queue_meets_pollaczek_khinchine(rho):
    """Wq = lambda E[S^2] / (2 (1 - rho)): M/D/1 gives rho D / (2 (1 - rho)); the geometric service
    (CV^2 = 0.998) gives M/M/1's rho E[S] / (1 - rho) to 1%. Within 3 standard errors of 4M-request batch means
    (about 1% at rho = 0.9)."""
    for d, service, exact in ((MD1[0], MD1[1], lambda lam, es, es2: rho * MD1[0] / (2 * (1 - rho))),
                              (None, MG1[1], lambda lam, es, es2: lam * es2 / (2 * (1 - rho)))):
        t, s = mg1(rho, 4_000_000, service, 2024)
        es = C / P if d is None else d
        es2 = C * C * (2 - P) / P ** 2 if d is None else d * d
        want = exact(rho / es, es, es2)
        m, se = batch_means(lindley(t, s))
        assert abs(m - want) <= 3 * se + 0.002 * want, (rho, d, m, want, se)
        assert se < 0.02 * want  # the test has the power to see a 5% error
    assert C * C * (2 - P) / P ** 2 * (rho / (C / P)) / (2 * (1 - rho)) == pytest.approx(rho * (C / P) / (1 - rho), rel=0.01)


# ---- M/M/c: a pool of replicas behind one queue at the router (issue 21) ------------------------------------
# Router "queue" holds requests in one FIFO and sends the head to a replica with room (Ray Serve's
# max_ongoing_requests, Knative's containerConcurrency). With one request per replica the pool is M/G/c; with
# geometric service (CV^2 0.998) Erlang C's mean wait applies. Same two-part check as above: (1) per request, the
# simulator's waits are the FCFS multi-server recursion's (the Kiefer-Wolfowitz workload vector, kept as a heap
# of the servers' free times), (2) that recursion over 2M requests meets Erlang C within batch-means error.
def mgc_waits(arrival: np.ndarray, service: np.ndarray, c: int) -> np.ndarray:
    """FCFS c-server waits: each request takes the server that frees first, when it frees (or on arrival)."""
    import heapq

    free = [0.0] * c
    w = np.empty(len(arrival))
    for i, (t, x) in enumerate(zip(arrival.tolist(), service.tolist())):
        start = max(heapq.heappop(free), t)
        w[i] = start - t
        heapq.heappush(free, start + x)
    return w


def erlang_c_wait(lam: float, mu: float, c: int) -> float:
    """Mean wait in queue of M/M/c: P(wait) / (c mu - lambda), P(wait) by Erlang C (hand-coded from the
    textbook sums, not the code under test: the simulator has no queueing formula)."""
    from math import factorial

    a = lam / mu
    rho = a / c
    top = a ** c / factorial(c) / (1 - rho)
    p_wait = top / (sum(a ** k / factorial(k) for k in range(c)) + top)
    return p_wait / (c * mu - lam)


def test_erlang_c_by_hand():
    """c = 2, lambda = 1, mu = 1 (a = 1, rho = 0.5): P(wait) = (1/2 / 0.5) / (1 + 1 + 1) = 1/3, Wq = 1/3."""
    assert erlang_c_wait(1.0, 1.0, 2) == pytest.approx(1 / 3, rel=1e-12)
    assert erlang_c_wait(0.5, 1.0, 1) == pytest.approx(1.0, rel=1e-12)  # M/M/1: rho / (mu - lambda)


@pytest.mark.parametrize("c, rho", [(2, 0.7), (4, 0.85)])
def test_router_queue_is_the_multi_server_fifo_request_by_request(c, rho):
    rng = np.random.default_rng(c)
    n = 40_000
    tok = rng.geometric(P, n)
    t = np.cumsum(rng.exponential(C / P / (rho * c), n))
    reqs = [Request(i, float(t[i]), int(tok[i]), 1) for i in range(n)]
    res = simulate(reqs, LinearCost(per_token_s=C), one_at_a_time, np.random.default_rng(0),
                   SimConfig(replicas=c, router="queue", timeseries=False))
    waits = res.records.first_scheduled - res.records.arrival
    np.testing.assert_allclose(waits, mgc_waits(t, C * tok, c), rtol=1e-9, atol=1e-12)
    L, lw = littles_law(res)  # requests waiting at the router count as in the system
    assert L == pytest.approx(lw, rel=1e-9)
    # the other routers are not M/M/c: round-robin splits the stream into c slower M/G/1 queues
    rr = simulate([Request(i, float(t[i]), int(tok[i]), 1) for i in range(n)], LinearCost(per_token_s=C),
                  one_at_a_time, np.random.default_rng(0), SimConfig(replicas=c, router="round_robin",
                                                                     timeseries=False))
    assert mean_wait(rr) > 1.4 * float(waits.mean())  # measured 1.67x at c = 2, rho = 0.7; 2.9x at c = 4


@pytest.mark.parametrize("c, rho", [(2, 0.8), (4, 0.9)])
def test_the_pool_meets_erlang_c(c, rho):
    """Mean wait of 2M requests through the c-server recursion vs Erlang C, within 3 batch-means standard
    errors plus 0.3% (the geometric service's CV^2 of 0.998 shifts Wq by about 0.1%)."""
    rng = np.random.default_rng(2026 + c)
    n = 2_000_000
    s = C * rng.geometric(P, n)
    lam = rho * c * P / C
    t = np.cumsum(rng.exponential(1 / lam, n))
    want = erlang_c_wait(lam, P / C, c)
    m, se = batch_means(mgc_waits(t, s, c))
    assert abs(m - want) <= 3 * se + 0.003 * want, (c, rho, m, want, se)
    assert se < 0.02 * want


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
    ("continuous", dict(CB, max_num_seqs=8), 3, "queue"),
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


@pytest.mark.parametrize("layout", ["plain", "prefix", "sliding"])
def test_fast_forward_is_exact_with_async_scheduling(roofline, layout):
    """vLLM's async scheduling (a finished sequence keeps its blocks and batch slot until the next step is
    scheduled; sliding windows free and prefix blocks cache one token behind) under KV pressure, open and
    closed loop: the fast path gives the step-by-step answer."""
    from capacity.workload import Lengths, PrefixGroups

    kw = dict(CB, num_blocks=500, async_scheduling=True)
    extra = {}
    if layout == "prefix":
        kw["prefix_caching"] = True
        extra["prefix"] = PrefixGroups(groups=3, tokens=300, share=0.7)
    if layout == "sliding":
        kw.update(num_blocks=700, kv_groups=(1, 1, 9, 128), inflight_tokens=2 * CB["max_num_batched_tokens"])
    for arr in (Arrivals(kind="poisson", rate_per_s=25.0), Arrivals(kind="closed", users=20)):
        spec = WorkloadSpec(arrivals=arr, input_len=Lengths(kind="uniform", low=64, high=1200),
                            output_len=Lengths(kind="uniform", low=16, high=400), num_requests=300, **extra)
        fast, slow = (simulate(spec, roofline, lambda: make_scheduler("continuous", **kw), np.random.default_rng(3),
                               SimConfig(fast_forward=f, saturation_queue=10_000)) for f in (True, False))
        assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
        assert fast.events < slow.events
        for attr in ("first_scheduled", "first_token", "finish"):
            np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("closed", [False, True])
def test_closed_form_decode_runs_equal_the_array_path(roofline, closed):
    """With a roofline cost a decode run is kept as (f0, g, k) and its stops solved in closed form; the same
    cost without `decode_line` takes the array path (cumulative sums, searchsorted). Same steps, same stops,
    the same ITL samples (values, weights, times) to float rounding, closed loops (stretches cut by requests
    nobody foresaw) included."""
    class ArrayPath:
        source = roofline.source

        def step_s(self, plan):
            return roofline.step_s(plan)

        def breakdown(self, plan):
            return roofline.breakdown(plan)

        def decode_run_s(self, contexts, k):
            return roofline.decode_run_s(contexts, k)

    from capacity.workload import Lengths

    arr = Arrivals(kind="closed", users=12, think_s=0.05) if closed else Arrivals(kind="poisson", rate_per_s=6.0)
    spec = WorkloadSpec(arrivals=arr, input_len=Lengths(kind="uniform", low=64, high=1500),
                        output_len=Lengths(kind="uniform", low=16, high=400), num_requests=500)
    line, arrays = (simulate(spec, c, lambda: make_scheduler("continuous", **CB), np.random.default_rng(5),
                             SimConfig(fast_forward=True)) for c in (roofline, ArrayPath()))
    assert line.steps == arrays.steps and line.events == arrays.events
    for attr in ("first_scheduled", "first_token", "finish"):
        np.testing.assert_allclose(getattr(line.records, attr), getattr(arrays.records, attr), rtol=1e-12)
    a, b = np.lexsort((line.itl_values, line.itl_times)), np.lexsort((arrays.itl_values, arrays.itl_times))
    np.testing.assert_allclose(line.itl_times[a], arrays.itl_times[b], rtol=1e-12)
    np.testing.assert_allclose(line.itl_values[a], arrays.itl_values[b], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(line.itl_weights[a], arrays.itl_weights[b])


@pytest.mark.parametrize("closed", [False, True])
def test_fast_forward_is_exact_with_sliding_window_layers(roofline, closed):
    """vLLM's hybrid allocator (a full and a sliding-window group; the window frees blocks at every step) under
    KV pressure: a decode stretch takes its blocks and frees as the k steps would, so the fast path gives the
    step-by-step answer, preemptions included."""
    from capacity.workload import Lengths

    arr = Arrivals(kind="closed", users=24) if closed else Arrivals(kind="poisson", rate_per_s=30.0)
    spec = WorkloadSpec(arrivals=arr, input_len=Lengths(kind="uniform", low=64, high=1500),
                        output_len=Lengths(kind="uniform", low=16, high=400), num_requests=400)
    kw = dict(CB, num_blocks=700, kv_groups=(1, 1, 9, 128))
    fast, slow = (simulate(spec, roofline, lambda: make_scheduler("continuous", **kw), np.random.default_rng(7),
                           SimConfig(fast_forward=f, saturation_queue=10_000)) for f in (True, False))
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions > 0
    assert fast.events < slow.events  # stretches ran (with a queue waiting for blocks they cannot: the window
    for attr in ("arrival", "first_scheduled", "first_token", "finish"):  # frees blocks as it decodes)
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("closed", [False, True])
def test_fast_forward_is_exact_with_prefix_caching(roofline, closed):
    """vLLM's block-level prefix cache under KV pressure (shared prefixes that end inside a block, preempted
    requests that find their own blocks again, evictions): a decode stretch takes and caches its blocks k steps
    at once, in another order than k single steps, and evicts the same cached blocks, so the fast path gives the
    step-by-step answer."""
    from capacity.workload import Lengths, PrefixGroups

    arr = Arrivals(kind="closed", users=20) if closed else Arrivals(kind="poisson", rate_per_s=25.0)
    spec = WorkloadSpec(arrivals=arr, input_len=Lengths(kind="uniform", low=64, high=1200),
                        output_len=Lengths(kind="uniform", low=16, high=400), num_requests=400,
                        prefix=PrefixGroups(groups=3, tokens=300, share=0.7))
    kw = dict(CB, num_blocks=500, prefix_caching=True)
    fast, slow = (simulate(spec, roofline, lambda: make_scheduler("continuous", **kw), np.random.default_rng(3),
                           SimConfig(fast_forward=f, saturation_queue=10_000)) for f in (True, False))
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions > 0
    assert fast.events < slow.events
    for attr in ("arrival", "first_scheduled", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


def test_a_benchmarks_reused_prompts_hit_the_prefix_cache_in_turn():
    """genai-perf sends its dataset entries in turn; `assign: round_robin` gives request j prefix j mod groups.
    One closed-loop user, 2 prompts of 64 tokens (63 shared: the whole prompt less its last token), 2 output
    tokens each, blocks of 16, steps of 10 ms + 1 ms per token. Requests 0 and 1 miss: the prefill step computes
    64 tokens, TTFT 74 ms. Every later request finds 3 full blocks of its prompt (48 tokens; vLLM never hits the
    block holding the last token) and computes 16: TTFT 26 ms. Each decode step (1 token) takes 11 ms."""
    from capacity.workload import Lengths, PrefixGroups, draw_attributes

    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=1), input_len=Lengths(kind="fixed", value=64),
                        output_len=Lengths(kind="fixed", value=2), num_requests=6,
                        prefix=PrefixGroups(groups=2, tokens=63, assign="round_robin"))
    reqs = draw_attributes(spec, np.random.default_rng(0), 5, start_id=3)
    assert [r.prefix_group for r in reqs] == [1, 0, 1, 0, 1] and {r.prefix_tokens for r in reqs} == {63}
    kw = dict(CB, num_blocks=100, prefix_caching=True)
    res = simulate(spec, LinearCost(fixed_s=0.010, per_token_s=0.001), lambda: make_scheduler("continuous", **kw),
                   np.random.default_rng(0), SimConfig())
    r = res.records
    np.testing.assert_allclose(r.first_token - r.arrival, [0.074, 0.074, 0.026, 0.026, 0.026, 0.026], atol=1e-12)
    np.testing.assert_allclose(r.finish - r.first_token, 0.011, atol=1e-12)


@pytest.mark.parametrize("think, frontend", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.004), (0.05, 0.004)])
def test_fast_forward_is_exact_in_closed_loop(roofline, think, frontend):
    """Closed-loop users (varied lengths, no think time or some, with and without a front end): a user answered
    at the end of a step sends again at once, and the fast path must stop its decode stretch there exactly as
    one step at a time does. (It used to run the next stretch first: mean TTFT 310 ms instead of 37 ms.)"""
    from capacity.workload import Lengths

    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=6, think_s=think),
                        input_len=Lengths(kind="uniform", low=64, high=2048),
                        output_len=Lengths(kind="uniform", low=16, high=400), num_requests=400)
    runs = []
    for fast in (True, False):
        res = simulate(spec, roofline, lambda: make_scheduler("continuous", **CB), np.random.default_rng(5),
                       SimConfig(fast_forward=fast, frontend_s=frontend))
        runs.append(res)
    fast, slow = runs
    assert fast.steps == slow.steps and fast.events < slow.events / 3
    for attr in ("arrival", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("router, think", [("round_robin", 0.0), ("round_robin", 0.05), ("least_outstanding", 0.05),
                                           ("queue", 0.0)])
def test_fast_forward_is_exact_in_closed_loop_over_several_replicas(roofline, router, think):
    """Closed-loop users over three replicas: a user answered by one replica sends its next request while another
    replica is inside a decode stretch that could not foresee it. The stretch must stop at the end of the step in
    progress, as one step at a time admits it. (Before the cut, round robin with no think time gave a mean TTFT
    of 318 ms instead of 34 ms.)"""
    from capacity.workload import Lengths

    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=12, think_s=think),
                        input_len=Lengths(kind="uniform", low=64, high=2048),
                        output_len=Lengths(kind="uniform", low=16, high=400), num_requests=300)
    kw = dict(CB, max_num_seqs=8)
    fast, slow = (simulate(spec, roofline, lambda: make_scheduler("continuous", **kw), np.random.default_rng(5),
                           SimConfig(fast_forward=f, replicas=3, router=router)) for f in (True, False))
    assert fast.steps == slow.steps and fast.events < slow.events / 3
    for attr in ("arrival", "first_token", "finish", "replica"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("policy, extra, closed", [
    ("continuous", {}, True), ("continuous", {}, False), ("priority", {}, False),
    ("continuous", {"reserve_output": True}, True), ("continuous", {"chunked_prefill": False}, True),
    ("continuous", {"reserve_full_input": False}, True)])
def test_fast_forward_is_exact_when_the_queue_waits_for_kv(roofline, policy, extra, closed):
    """A KV-limited queue (more users than blocks: the head of the queue waits for blocks while the batch
    decodes): the fast path runs decode stretches while the head cannot be admitted and must give exactly the
    step-by-step answer, preemptions included, for every admission rule (reserve the whole input, the output
    too, or only the first chunk; without chunked prefill)."""
    from capacity.workload import Lengths

    arr = (Arrivals(kind="closed", users=40) if closed else Arrivals(kind="poisson", rate_per_s=40.0))
    spec = WorkloadSpec(arrivals=arr, input_len=Lengths(kind="uniform", low=64, high=1500),
                        output_len=Lengths(kind="uniform", low=16, high=300), num_requests=500,
                        classes=[RequestClass(name="a", priority=0), RequestClass(name="b", priority=1)])
    kw = dict(CB, num_blocks=600, **extra)
    runs = []
    for fast in (True, False):
        res = simulate(spec, roofline, lambda: make_scheduler(policy, **kw), np.random.default_rng(7),
                       SimConfig(fast_forward=fast, saturation_queue=10_000))
        runs.append(res)
    fast, slow = runs
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert fast.events < slow.events / 2  # the stretches do run
    for attr in ("arrival", "first_scheduled", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)
    for a, b in ((fast.itl_values, slow.itl_values), (fast.itl_weights, slow.itl_weights)):
        assert a.sum() == pytest.approx(b.sum(), rel=1e-9)


@pytest.mark.parametrize("max_ongoing", [None, 4, 12])
def test_fast_forward_is_exact_behind_the_router_queue(roofline, max_ongoing):
    """Router "queue" sends requests at replicas' finishes as well as at arrivals; the fast path must still give
    the step-by-step answer, whether a replica takes as many as it batches (None: max_num_seqs 8), fewer, or
    more (the rest wait in its own queue)."""
    from capacity.workload import Lengths

    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=30.0),
                        input_len=Lengths(kind="uniform", low=64, high=1500),
                        output_len=Lengths(kind="uniform", low=16, high=300), num_requests=600)
    runs = []
    for fast in (True, False):
        runs.append(simulate(spec, roofline, lambda: make_scheduler("continuous", **dict(CB, max_num_seqs=8)),
                             np.random.default_rng(9), SimConfig(replicas=3, router="queue", fast_forward=fast,
                                                                 router_max_ongoing=max_ongoing)))
    fast, slow = runs
    assert fast.steps == slow.steps and fast.events < slow.events / 2
    for attr in ("arrival", "first_scheduled", "first_token", "finish", "replica"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)
    held = fast.timeseries[:, 1] + fast.timeseries[:, 2]  # a replica's waiting + running
    assert held.max() == (max_ongoing or 8)  # never more than the router lets it hold, and that many at peak
    assert (fast.records.first_scheduled - fast.records.arrival).max() > 0.05  # the router's queue was used


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


def test_a_burst_reports_the_rate_it_was_served_at_not_its_prefill_phase():
    """300 requests at once that all fit in the batch: the queue empties once the last prompt is admitted, a
    backlog of mostly prefills (their tokens are not output tokens). The rate reported is what the run served:
    300 requests, less the one in flight when the backlog began (the end of the first step, which took the
    first prompt alone: the others came 1 ns apart, after it started), from then to the last finish. The
    backlog's output tokens alone gave 6.8 req/s, 0.28 of it."""
    reqs = [Request(i, i * 1e-9, 1000, 500) for i in range(300)]
    sched = lambda: make_scheduler("continuous", max_num_seqs=512, max_num_batched_tokens=2048, block_size=16,
                                   num_blocks=100_000)
    res = simulate(reqs, LinearCost(fixed_s=0.005, per_token_s=2e-5), sched, np.random.default_rng(0))
    assert res.saturated
    end, first = float(res.records.finish.max()), 0.005 + 1000 * 2e-5  # the first step: one prompt
    assert res.capacity_req_per_s == pytest.approx(299 / (end - first), rel=1e-12)
    assert 0.99 * 300 / end < res.capacity_req_per_s < 300 / end
    assert "from the backlog's start to the last finish" in res.saturation


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


# ---- offline batches and throughput windows (issue 25, 5) ------------------------------------------------
def test_offline_batch_makespan_by_hand():
    """8 requests of 100 prompt + 3 output tokens, all at t=0, at most 4 running, step = 10 ms + 1 ms per token.
    Wave 1: one step prefills 4 x 100 tokens (0.41 s, first tokens), two decode steps of 4 (0.014 s each);
    wave 2 the same: makespan 2 x 0.438 = 0.876 s, 24 output tokens / 0.876 s = 27.40 tokens/s. 8 requests >
    nothing like saturation: an offline batch is never cut short by the queue guard (saturation_queue 2)."""
    cost = LinearCost(fixed_s=0.01, per_token_s=0.001)
    spec = WorkloadSpec(arrivals=Arrivals(kind="offline"), input_len=fixed(100), output_len=fixed(3), num_requests=8)
    res = simulate(spec, cost, lambda: make_scheduler("continuous", max_num_seqs=4, max_num_batched_tokens=4096,
                                                      block_size=16, num_blocks=1000),
                   np.random.default_rng(0), SimConfig(saturation_queue=2))
    assert not res.saturated and res.records.finished.all()
    assert res.records.finish.max() == pytest.approx(0.876, abs=1e-12)
    s = summarize(res.records, res.itl_values, res.itl_weights, np.random.default_rng(0), ci=False)
    assert s.window_s == pytest.approx(0.876) and s.output_tokens_per_s == pytest.approx(24 / 0.876)


def test_closed_loop_throughput_counts_the_warm_up_requests_tokens():
    """4 users, no think time, fixed lengths: the engine always holds 4 requests, so by Little's law its output rate
    is 4 x 64 tokens per mean E2E. Counting only the measured requests' tokens over their window (which opens while
    3 warm-up requests are still decoding) reported less than that."""
    from capacity.sim.metrics import Records

    cost = LinearCost(fixed_s=0.01, per_token_s=0.0005)
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=4), input_len=fixed(256), output_len=fixed(64),
                        num_requests=40)
    res = simulate(spec, cost, lambda: make_scheduler("continuous", **CB), np.random.default_rng(0), SimConfig())
    rec: Records = res.records
    warm = np.arange(len(rec)) < 10
    s = summarize(rec.subset(~warm), res.itl_values, res.itl_weights, np.random.default_rng(0), ci=False,
                  others=rec.subset(warm))
    little = 4 * 64 / s.e2e_s.mean
    assert s.output_tokens_per_s == pytest.approx(little, rel=0.03)
    assert s.requests_per_s == pytest.approx(4 / s.e2e_s.mean, rel=0.03)
    naive = summarize(rec.subset(~warm), res.itl_values, res.itl_weights, np.random.default_rng(0), ci=False)
    assert naive.output_tokens_per_s < 0.95 * little


def test_guaranteed_no_evict_reserves_outputs_and_never_preempts():
    """Two requests of 16 prompt + 32 output tokens, 16-token blocks, a pool of 4 blocks; step = 10 ms + 1 ms per
    token. TensorRT-LLM's GUARANTEED_NO_EVICT reserves 3 blocks (48 tokens) per request at admission, so the second
    waits for the first: each takes one 16-token prefill step (26 ms) and 31 decode steps of one (11 ms), 367 ms,
    back to back: makespan 734 ms, no preemption. vLLM's rule (reserve the prompt) admits both and must preempt
    when their outputs outgrow the pool."""
    cost = LinearCost(fixed_s=0.01, per_token_s=0.001)
    spec = WorkloadSpec(arrivals=Arrivals(kind="offline"), input_len=fixed(16), output_len=fixed(32), num_requests=2)
    runs = {}
    for reserve in (True, False):
        runs[reserve] = simulate(spec, cost, lambda r=reserve: make_scheduler(
            "continuous", max_num_seqs=8, max_num_batched_tokens=512, block_size=16, num_blocks=4, reserve_output=r),
            np.random.default_rng(0), SimConfig())
    assert runs[True].preemptions == 0 and runs[True].records.finish.max() == pytest.approx(0.734, abs=1e-12)
    assert runs[False].preemptions > 0


# ---- a benchmark client's cap on requests in flight (vllm bench serve --request-rate R --max-concurrency C) ------
@pytest.mark.parametrize("cap", [1, 3, 10**5])
def test_a_clients_cap_splits_the_fifo_wait_between_client_and_server(cap):
    """M/D/1 behind a client that keeps at most `cap` requests in flight (batch size 1, one token: each request is
    one 10-ms step). A request waits first at the client for a slot, then at the server; the two waits add up to
    the uncapped queue's, request by request (Lindley's recursion on the arrival times, by hand above). With one
    slot nothing waits at the server and every TTFT, timed from the send as the tool times it, is the step; with
    more slots than requests the run is the uncapped open loop's, time for time."""
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=70.0, max_concurrency=cap),
                        input_len=fixed(1), output_len=fixed(1), num_requests=5000)
    res = simulate(spec, LinearCost(fixed_s=0.01), one_at_a_time, np.random.default_rng(3), SimConfig(timeseries=False))
    r, client = res.records, res.client_waits
    arrived = r.arrival - client  # the arrival times the client drew; the records keep the send
    server = r.first_scheduled - r.arrival
    np.testing.assert_allclose(client + server, lindley(arrived, np.full(len(r), 0.01)), rtol=1e-9, atol=1e-9)
    assert (client + server).mean() == pytest.approx(0.7 * 0.01 / (2 * 0.3), rel=0.15)  # M/D/1's rho D / (2 (1 - rho))
    if cap == 1:
        assert server.max() == 0 and client.mean() > 0.01
        np.testing.assert_allclose(r.first_token - r.arrival, 0.01, rtol=1e-9)
    elif cap == 3:
        assert 0 < client.mean() < server.mean()
    else:
        assert client.max() == 0
        free = simulate(spec.model_copy(update={"arrivals": Arrivals(kind="poisson", rate_per_s=70.0)}),
                        LinearCost(fixed_s=0.01), one_at_a_time, np.random.default_rng(3), SimConfig(timeseries=False))
        for attr in ("arrival", "first_token", "finish"):
            np.testing.assert_array_equal(getattr(r, attr), getattr(free.records, attr))
        assert free.client_waits is None


@pytest.mark.parametrize("async_scheduling, frontend", [(False, 0.0), (True, 0.0), (True, 0.002)])
def test_fast_forward_is_exact_behind_a_clients_cap(roofline, async_scheduling, frontend):
    """Poisson arrivals above what 8 slots can send (so most requests wait at the client, and a slot freed by an
    answer sends at once): the fast path must stop its decode stretch where one step at a time admits the send."""
    from capacity.workload import Lengths

    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=40.0, max_concurrency=8),
                        input_len=Lengths(kind="uniform", low=64, high=2048),
                        output_len=Lengths(kind="uniform", low=16, high=400), num_requests=400)
    fast, slow = (simulate(spec, roofline, lambda: make_scheduler("continuous", async_scheduling=async_scheduling, **CB),
                           np.random.default_rng(5), SimConfig(fast_forward=f, frontend_s=frontend)) for f in (True, False))
    assert fast.steps == slow.steps and fast.events < slow.events / 3
    assert (fast.client_waits > 0).mean() > 0.9
    np.testing.assert_allclose(fast.client_waits, slow.client_waits, rtol=1e-9, atol=1e-12)
    for attr in ("arrival", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


def test_a_cap_on_requests_sent_at_once_is_the_closed_loop(roofline, tmp_path):
    """`vllm bench serve --request-rate inf --max-concurrency 16`: every request arrives at t=0 and 16 slots send
    them, each the moment the previous one is answered. That is 16 closed-loop users without think time, time for
    time (fixed lengths, so the two draw the same requests)."""
    import json

    trace = tmp_path / "burst.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 0.0, "input_tokens": 500, "output_tokens": 100}) + "\n"
                             for _ in range(200)))
    capped = WorkloadSpec(arrivals=Arrivals(kind="trace", max_concurrency=16), trace=str(trace),
                          input_len=fixed(500), output_len=fixed(100), num_requests=200)
    users = WorkloadSpec(arrivals=Arrivals(kind="closed", users=16), input_len=fixed(500), output_len=fixed(100),
                         num_requests=200)
    a, b = (simulate(w, roofline, lambda: make_scheduler("continuous", **CB), np.random.default_rng(5), SimConfig())
            for w in (capped, users))
    assert a.steps == b.steps and len(a.records) == 200
    for attr in ("arrival", "first_token", "finish"):
        np.testing.assert_array_equal(getattr(a.records, attr), getattr(b.records, attr))
    np.testing.assert_array_equal(a.client_waits, a.records.arrival)  # each waited from t=0 until its send
