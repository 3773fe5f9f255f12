"""Multi-turn sessions (issue 51 item 2): each turn resends the context so far, the next turn is released a think
time after the answer completes, turn k+1 hits turn k's blocks in the prefix cache, and the affinity router keeps
a session's turns where its blocks are. Numbers are hand-computed from the lengths and a linear step cost."""
import numpy as np
import pytest

from capacity.cost.step import LinearCost
from capacity.sched import make_scheduler
from capacity.sessions import Sessions, expected_prompt_tokens
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Arrivals, Lengths, WorkloadSpec, fixed
from tests.conftest import run_cli

CB = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16, num_blocks=4000)
STEP = LinearCost(fixed_s=0.010, per_token_s=0.001)  # a step: 10 ms + 1 ms per token computed


def one_session(think_s: float = 1.0) -> WorkloadSpec:
    """One session (the next would start at 100 s, after this one's 4 turns are issued): first prompt 100
    tokens, 20 out per turn, 30 new tokens per later turn, a fixed think time."""
    return WorkloadSpec(arrivals=Arrivals(kind="constant", rate_per_s=0.01), input_len=fixed(100),
                        output_len=fixed(20), num_requests=4,
                        sessions=Sessions(turns=fixed(4), new_tokens=fixed(30), think_s=think_s, think_cv=0.0))


def run(spec, caching=True, cfg=None, cost=STEP, seed=0):
    kw = dict(CB, prefix_caching=caching)
    return simulate(spec, cost, lambda: make_scheduler("continuous", **kw), np.random.default_rng(seed),
                    cfg or SimConfig())


def test_each_turn_resends_the_context_and_hits_the_last_turns_blocks():
    """Prompts 100, 150, 200, 250 (100 + (k - 1) x (20 + 30)). Turn k+1 finds turn k's prompt and output up to
    its last full block of computed tokens (its last output token is sampled, never computed): 119 // 16 = 7
    blocks (112 tokens), 169 // 16 = 10 (160), 219 // 16 = 13 (208). TTFT is one prefill step: 10 ms + 1 ms per
    token computed: 110 ms, then 38, 40 and 42 tokens: 48, 50, 52 ms (without the cache 160, 210, 260 ms). Turn
    1 finishes 19 decode steps of 11 ms after its first token, and turn 2 is sent 1 s later."""
    r = run(one_session()).records
    assert list(r.prompt_tokens) == [100, 150, 200, 250]
    assert [expected_prompt_tokens(one_session(), k) for k in (1, 2, 3, 4)] == [100, 150, 200, 250]
    assert list(r.cached_tokens) == [0, 112, 160, 208]
    np.testing.assert_allclose(r.first_token - r.arrival, [0.110, 0.048, 0.050, 0.052], atol=1e-12)
    np.testing.assert_allclose(r.finish - r.first_token, 19 * 0.011, atol=1e-12)
    np.testing.assert_allclose(r.arrival[1:] - r.finish[:-1], 1.0, atol=1e-12)
    assert r.arrival[0] == pytest.approx(100.0)  # constant starts at 0.01/s: the first at 1/rate
    off = run(one_session(), caching=False).records
    assert not off.cached_tokens.any()
    np.testing.assert_allclose(off.first_token - off.arrival, [0.110, 0.160, 0.210, 0.260], atol=1e-12)


def test_turns_arrive_at_sessions_per_s_times_mean_turns():
    """Uncongested (a step of 1 ms + 1 us per token; each turn ~25 ms): sessions start every 0.5 s, each sends 3
    turns 0.2 s after each answer, so in steady state turns arrive at 2 x 3 = 6/s; between 50 s and 200 s every
    session has its 3 turns inside the window but the last one or two straddling its edges."""
    cheap = LinearCost(fixed_s=0.001, per_token_s=1e-6)
    spec = WorkloadSpec(arrivals=Arrivals(kind="constant", rate_per_s=2.0), input_len=fixed(200),
                        output_len=fixed(20), num_requests=1500,
                        sessions=Sessions(turns=fixed(3), new_tokens=fixed(50), think_s=0.2, think_cv=0.0))
    a = run(spec, cost=cheap).records.arrival
    assert len(a) == 1500
    assert abs(((a >= 50) & (a < 200)).sum() - 6 * 150) <= 3
    # a distribution of turns: uniform 1..5 (mean 3), exponential think times; 600 sessions over 300 s, the
    # count of turns in the window has a standard deviation of about sqrt(300 x Var(turns) = 2) = 24 (2.7%)
    spec = spec.model_copy(update={"num_requests": 1800, "sessions": Sessions(
        turns=Lengths(kind="uniform", low=1, high=5), new_tokens=fixed(50), think_s=0.2)})
    a = run(spec, cost=cheap, seed=1).records.arrival
    assert ((a >= 50) & (a < 250)).sum() / 200 == pytest.approx(6.0, rel=0.08)


def test_affinity_router_keeps_a_session_on_its_blocks():
    """Four replicas, 1 session/s of 6 turns (prompts 500 + (k - 1) x 150, 50 out, 100 new), 2 s of think.
    The affinity router sends every later turn to the replica of the last, so each finds exactly the blocks an
    unbounded cache would hold: (P_k - 100 - 1) // 16 x 16 tokens. Least outstanding spreads a session over the
    replicas and finds fewer; its TTFT is longer."""
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=1.0), input_len=fixed(500),
                        output_len=fixed(50), num_requests=600,
                        sessions=Sessions(turns=fixed(6), new_tokens=fixed(100), think_s=2.0))
    got = {}
    for router in ("affinity", "least_outstanding"):
        r = run(spec, cfg=SimConfig(replicas=4, router=router)).records
        got[router] = r
    aff, lo = got["affinity"], got["least_outstanding"]
    later = aff.prompt_tokens > 500
    assert np.array_equal(aff.cached_tokens[later], (aff.prompt_tokens[later] - 101) // 16 * 16)
    assert not aff.cached_tokens[~later].any()
    # the unbounded cache's share over whole sessions: prompts 500, 650, .., 1250 sum to 5,250, hits
    # 544 + 688 + 848 + 992 + 1136 = 4,208 tokens: 80.2% (a little less over the run: its last sessions are cut
    # short at 600 turns, so first turns weigh more)
    full = aff.cached_tokens.sum() / aff.prompt_tokens.sum()
    assert full == pytest.approx(4208 / 5250, abs=0.01) and full < 4208 / 5250
    assert lo.cached_tokens.sum() < 0.7 * aff.cached_tokens.sum()
    ttft = {k: float((v.first_token - v.arrival).mean()) for k, v in got.items()}
    assert ttft["affinity"] < 0.8 * ttft["least_outstanding"]


@pytest.mark.parametrize("most, least, by_load", [
    (70, 10, False),  # 60 above the idlest: within 64
    (100, 10, True),  # 90 above and 10 x as many
    (300, 210, False),  # 90 above but only 1.43 x as many (SGLang needs both)
    (330, 210, True),  # 120 above and 1.57 x
])
def test_affinity_gives_way_to_load_when_imbalanced(most, least, by_load):
    """SGLang's cache-aware rule: imbalanced when the busiest replica holds more than 64 requests above the idlest
    and more than 1.5 x as many; then the router sends by load."""
    from capacity.sim.routing import imbalanced

    assert imbalanced(most, least) is by_load


def test_the_fast_path_is_exact_with_sessions():
    from capacity.cost.roofline import RooflineCost
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from tests.conftest import MODELS

    cost = RooflineCost(load_model_card(MODELS / "llama-3.1-8b.yaml"), get_gpu("h100-sxm"))
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=3.0),
                        input_len=Lengths(kind="uniform", low=64, high=1200),
                        output_len=Lengths(kind="uniform", low=16, high=300), num_requests=300,
                        sessions=Sessions(turns=Lengths(kind="uniform", low=1, high=6),
                                          new_tokens=Lengths(kind="uniform", low=10, high=200), think_s=0.5))
    kw = dict(CB, num_blocks=600, prefix_caching=True)
    fast, slow = (simulate(spec, cost, lambda: make_scheduler("continuous", **kw), np.random.default_rng(2),
                           SimConfig(fast_forward=f, replicas=2, router="affinity")) for f in (True, False))
    assert fast.events < slow.events and fast.records.cached_tokens.any()
    for attr in ("arrival", "first_token", "finish", "cached_tokens"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("args, needle", [
    (["--turns", "0"], "--turns"),
    (["--turns", "3", "--think-s", "-1"], "think_s"),
    (["--turns", "3", "--think-cv", "-0.5"], "think_cv"),
    (["--turns", "3", "--turn-tokens", "0"], "--turn-tokens"),
    (["--turns", "3", "--arrival", "closed", "--users", "4"], "sessions: start at poisson"),
    (["--turn-tokens", "64"], "apply to --turns"),
    (["--router", "sticky"], "router"),
])
def test_bad_session_input_is_one_line_exit_1(args, needle):
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "10", *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_workload_file_declares_sessions(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("arrivals: {kind: poisson, rate_per_s: 0.5}\ninput_len: {kind: fixed, value: 500}\n"
                 "output_len: {kind: fixed, value: 50}\nnum_requests: 40\n"
                 "sessions: {turns: {kind: fixed, value: 4}, new_tokens: {kind: fixed, value: 100}, think_s: 1}\n")
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--workload", str(f), "--prefix-caching", "--json")
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["summary"]["prefix_hit_rate"] > 0.5
    # 0.5 sessions/s x 4 turns; prompts 500 + (k - 1) x (50 + 100)
    assert any("0.5 new/s x 4 turns = 2 turns/s" in n and "500 + (k - 1) x 150 tokens" in n for n in out["notes"])
    f.write_text("sessions: {turns: {kind: fixed, value: 4}, think_s: -2}\n")
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--workload", str(f))
    assert r.returncode == 1 and "sessions.think_s" in r.stderr and "Traceback" not in r.stderr
