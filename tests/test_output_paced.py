"""The server's per-token output handling beside the GPU (capacity/cost/overlap.py, `--output-cpu-us`): a step lasts
max(the GPU step, us per token x tokens it emits). Hand-computed steps, the closed-form output cap of a loop the CPU
paces, the fast path still exact, and bad values as one line."""
import numpy as np
import pytest

from capacity.cost.overlap import OutputPacedCost
from capacity.cost.roofline import RooflineCost
from capacity.cost.step import LinearCost, PrefillChunk, StepPlan, decode_run_s
from capacity.model.gpus import get_gpu
from capacity.sched import make_scheduler
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Arrivals, Lengths, WorkloadSpec, fixed
from tests.conftest import MODELS, run_cli

GPU = LinearCost(fixed_s=1e-3, per_token_s=20e-6)  # a step: 1 ms + 20 us per new token


def test_a_step_lasts_the_longer_of_the_gpu_and_the_output_handling():
    paced = OutputPacedCost(GPU, 77e-6)
    hundred = StepPlan(decode_contexts=(50,) * 100)  # GPU 1 + 2 = 3 ms; CPU 100 x 77 us = 7.7 ms
    assert paced.step_s(hundred) == pytest.approx(7.7e-3, rel=1e-12)
    ten = StepPlan(decode_contexts=(50,) * 10)  # GPU 1.2 ms; CPU 0.77 ms: the GPU's
    assert paced.step_s(ten) == pytest.approx(1.2e-3, rel=1e-12)
    mixed = StepPlan(prefills=(PrefillChunk(300), PrefillChunk(100, emits_token=False)), decode_contexts=(9,) * 40)
    # GPU 1 + 440 x 0.02 = 9.8 ms; 41 tokens emitted (the unfinished chunk emits none) x 77 us = 3.157 ms
    assert paced.step_s(mixed) == pytest.approx(9.8e-3, rel=1e-12)
    b = paced.breakdown(hundred)
    assert b["output handling"] == pytest.approx(4.7e-3, rel=1e-9) and sum(b.values()) == pytest.approx(7.7e-3)
    assert "output handling" not in paced.breakdown(ten)


def test_decode_stretches_are_paced_step_by_step():
    from capacity.model.card import load_model_card

    paced = OutputPacedCost(RooflineCost(load_model_card(MODELS / "llama-3.1-8b.yaml"), get_gpu("h100-sxm")), 40e-6)
    assert paced.decode_line is None  # the closed-form line of the roofline would skip the pacing
    for contexts in ([100] * 8, [300] * 250, list(range(10, 4000, 20))):
        run = paced.decode_run_s(contexts, 50)
        each = [paced.step_s(StepPlan(decode_contexts=tuple(c + j for c in contexts))) for j in range(50)]
        np.testing.assert_allclose(run, each, rtol=1e-12)
        np.testing.assert_allclose(decode_run_s(paced, contexts, 50), each, rtol=1e-12)


def test_a_closed_loop_the_cpu_paces_delivers_one_token_per_us_per_token():
    """64 users, a GPU step far shorter than the output handling: every step lasts 77 us per token it emits, so
    the output rate is 1 / 77 us = 12,987 tokens/s exactly, whatever the batch (Little's law for tokens)."""
    fast_gpu = LinearCost(fixed_s=1e-5, per_token_s=1e-7)
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=64), input_len=fixed(32), output_len=fixed(64),
                        num_requests=2000)
    res = simulate(spec, OutputPacedCost(fast_gpu, 77e-6),
                   lambda: make_scheduler("continuous", max_num_seqs=256, max_num_batched_tokens=4096, block_size=16,
                                          num_blocks=4000), np.random.default_rng(0), SimConfig())
    tokens = res.records.output_tokens.sum()
    span = res.records.finish.max() - res.records.first_token.min()
    assert tokens / span == pytest.approx(1 / 77e-6, rel=2e-3)  # the span leaves out only the first step


@pytest.mark.parametrize("think", [0.0, 0.02])
def test_the_fast_path_stays_exact_with_output_pacing(think):
    from capacity.model.card import load_model_card

    cost = OutputPacedCost(RooflineCost(load_model_card(MODELS / "llama-3.1-8b.yaml"), get_gpu("h100-sxm")), 60e-6)
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=40, think_s=think),
                        input_len=Lengths(kind="uniform", low=64, high=1024),
                        output_len=Lengths(kind="uniform", low=16, high=300), num_requests=300)
    kw = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16, num_blocks=4000)
    fast, slow = (simulate(spec, cost, lambda: make_scheduler("continuous", **kw), np.random.default_rng(5),
                           SimConfig(fast_forward=f)) for f in (True, False))
    assert fast.steps == slow.steps and fast.events < slow.events / 2  # stretches do run as one event
    for attr in ("arrival", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


def test_simulate_takes_it_and_bad_values_are_one_line():
    base = ["simulate", "-m", "llama-3.1-8b", "--arrival", "closed", "--users", "64", "-n", "400", "--input-len",
            "200", "--output-len", "100", "--json"]
    import json

    plain, paced = (json.loads(run_cli(*base, *extra).stdout)["summary"]["output_tokens_per_s"]
                    for extra in ([], ["--output-cpu-us", "200"]))
    assert paced < plain and paced <= 1 / 200e-6 * 1.01  # capped at 5,000 tokens/s
    for bad in ("0", "-5", "nan", "1e9"):
        r = run_cli(*base, "--output-cpu-us", bad)
        assert r.returncode == 1 and "Traceback" not in r.stderr and "output_cpu_us_per_token" in r.stderr, bad
        assert len(r.stderr.strip().splitlines()) == 1


def test_the_planner_caps_a_replica_at_the_output_handling_rate():
    """With 500 us per token the server hands out at most 2,000 tokens/s: 7.8125 requests/s of 256 output tokens.
    The planner's capacity (its backlogged closed loop, read while every user is in it) sits at it: within 0.5%
    below, and above by no more than the slope of a staircase can read (tokens come a step at a time: 1e-4); the
    whole run, start-up and drain included, read 0-3% under it. Its max rate under the SLOs is at or below, and
    the plan names the term beside its step costs (23.5 req/s without it: the GPU's limit)."""
    import json

    r = run_cli("plan", "--model", str(MODELS / "llama-3.1-8b.yaml"), "--gpu", "h200", "--output-cpu-us", "500",
                "--requests", "200", "--json", timeout=300)  # 200: the rate probes' size (the capacity loop's is its own)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    cap = 1 / 500e-6 / d["mean_output_tokens"]
    assert d["mean_output_tokens"] == 256 and cap == pytest.approx(7.8125)
    assert 0.995 * cap <= d["rec_search"]["capacity_rate"] <= cap * (1 + 1e-4)
    assert d["rec_search"]["max_rate"] <= d["rec_search"]["capacity_rate"]
    assert d["source"].endswith("; output handling 500 us/token beside the GPU")
