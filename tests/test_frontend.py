"""The server's front end (capacity/engine/frontend.py): a per-request latency and a per-prompt-token tokenising time
on one FIFO worker, before the router; the engine settings that set them and the engines' measured defaults."""
import json

import numpy as np
import pytest
import simpy

from capacity.cost.roofline import RooflineCost
from capacity.cost.step import LinearCost
from capacity.engine import frontend
from capacity.engine.config import EngineConfig
from capacity.errors import CapacityError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.sched import make_scheduler
from capacity.sim.routing import Delay
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Arrivals, Lengths, Request, WorkloadSpec
from tests.conftest import ROOT, run_cli

CB = dict(max_num_seqs=8, max_num_batched_tokens=8192, block_size=16, num_blocks=10_000)
COST = LinearCost(fixed_s=0.01, per_token_s=1e-5, per_seq_s=0.0)  # a step: 10 ms + 10 us per token


def test_delay_tokenises_on_one_worker_in_order():
    """Three requests at t=0 of 1000, 10 and 500 tokens at 2 us/token on one worker, then 5 ms each:
    done tokenising at 2, 2.02, 3.02 ms; delivered at 7, 7.02, 8.02 ms (by hand)."""
    env = simpy.Environment()
    got: list[tuple[str, float]] = []
    d = Delay(env, 0.005, lambda x: got.append((x, env.now)))
    for name, n in (("a", 1000), ("b", 10), ("c", 500)):
        d.put(name, 2e-6 * n)
    assert d.next_due_s == pytest.approx(0.007)
    env.run()
    assert [g[0] for g in got] == ["a", "b", "c"]
    np.testing.assert_allclose([g[1] for g in got], [0.007, 0.00702, 0.00802], rtol=0, atol=1e-12)


def test_delay_worker_idles_between_requests():
    """A request arriving after the worker is free starts at once: 1 ms of tokenising at t=0, the next at t=0.1."""
    env = simpy.Environment()
    got: list[float] = []
    d = Delay(env, 0.0, lambda x: got.append(env.now))
    d.put(1, 0.001)

    def later():
        yield env.timeout(0.1)
        d.put(2, 0.001)

    env.process(later())
    env.run()
    np.testing.assert_allclose(got, [0.001, 0.101], rtol=0, atol=1e-12)


def _one(frontend_s: float, per_tok: float, fast: bool = True):
    reqs = [Request(0, 0.0, 1000, 4), Request(1, 5.0, 200, 4)]
    return simulate(reqs, COST, lambda: make_scheduler("continuous", **CB), np.random.default_rng(0),
                    SimConfig(frontend_s=frontend_s, frontend_s_per_input_token=per_tok, fast_forward=fast))


@pytest.mark.parametrize("fast", [True, False])
def test_ttft_grows_by_the_front_end_alone(fast):
    """An idle engine: TTFT = 10 ms + 2 ms per request + 3 us x prompt tokens (by hand: 1000 tokens -> 15 ms more,
    200 -> 2.6 ms more); the engine's steps (TPOT) are untouched."""
    base, fe = _one(0.0, 0.0, fast), _one(0.002, 3e-6, fast)
    d_ttft = (fe.records.first_token - fe.records.arrival) - (base.records.first_token - base.records.arrival)
    np.testing.assert_allclose(d_ttft, [0.005, 0.0026], rtol=0, atol=1e-12)
    np.testing.assert_allclose(fe.records.finish - fe.records.first_token,
                               base.records.finish - base.records.first_token, rtol=0, atol=1e-12)


def test_sim_config_refuses_a_bad_per_token_time():
    with pytest.raises(CapacityError, match="frontend_s_per_input_token"):
        SimConfig(frontend_s_per_input_token=-1e-6)


def test_engine_defaults_are_the_measured_conservative_end():
    """vLLM: the recipe fits' highest per-request figure (14.4 ms) and the tokeniser's slower text (1.89 us/token,
    bench/results/frontend.json); SGLang and TensorRT-LLM: no measured per-request figure (0)."""
    assert frontend.terms(EngineConfig()) == pytest.approx((0.0144, 1.89e-6))
    assert frontend.terms(EngineConfig(engine="vllm@0.11")) == pytest.approx((0.0144, 1.89e-6))
    assert frontend.terms(EngineConfig(engine="sglang")) == pytest.approx((0.0, 1.89e-6))
    assert frontend.terms(EngineConfig(engine="trtllm", frontend_ms=3.0, frontend_us_per_input_token=0.0)) == \
        pytest.approx((0.003, 0.0))
    assert frontend.defaults("vllm", "middle") == pytest.approx((13.9, 1.46))
    assert frontend.family("vllm@0.9.2:v0") == "vllm"


def test_defaults_match_the_recorded_measurement():
    """The constants are the figures bench/frontend_cost.py recorded, not numbers typed beside them."""
    rec = json.loads((ROOT / "bench/results/frontend.json").read_text())
    per_tok = sorted(m["us_per_token_min_short"] for m in rec["tokenisation"].values())
    assert frontend.TOKENISE_US_PER_TOKEN == pytest.approx(tuple(per_tok), abs=0.01)
    ms = rec["per_request_from_recipe_fits"]["recipe_fidelity-vllm.json"]["frontend_ms"]
    assert frontend.PER_REQUEST_MS["vllm"] == pytest.approx((min(ms), max(ms)), abs=0.06)


def test_pipeline_adds_the_engine_front_end():
    """sim_terms: the deployment's own latency on top of the engine's."""
    assert frontend.sim_terms(EngineConfig(frontend_ms=1.0), 0.002) == pytest.approx(
        {"frontend_s": 0.003, "frontend_s_per_input_token": 1.89e-6})


@pytest.mark.parametrize("flag, value, field", [("--frontend-ms", "-5", "frontend_ms"),
                                                ("--frontend-us-per-token", "-1", "frontend_us_per_input_token"),
                                                ("--frontend-ms", "nan", "frontend_ms")])
def test_bad_front_end_setting_is_one_line(flag, value, field):
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "1", "-n", "10", flag, value)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [ln for ln in (r.stderr + r.stdout).strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], lines


def test_cli_shift_is_the_front_end():
    """One request at a time (rate 0.01/s, 1024-token prompts): the mean TTFT with the default front end is the
    TTFT without one + 14.4 ms + 1.89 us x 1024 = + 16.335 ms."""
    def ttft(*extra: str) -> float:
        r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "0.01", "-n", "20", "--input-len",
                    "1024", "--output-len", "16", "--json", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["summary"]["ttft_s"]["mean"]

    off = ttft("--frontend-ms", "0", "--frontend-us-per-token", "0")
    assert ttft() - off == pytest.approx(0.0144 + 1.89e-6 * 1024, abs=1e-9)


@pytest.mark.parametrize("kind", ["closed", "poisson"])
def test_fast_forward_is_exact_with_a_tokeniser_queue(kind):
    """Varied prompts through the per-token front end: the fast path's horizon (arrival + the per-request part, a
    lower bound of any request's entry) keeps it identical to one step at a time."""
    cost = RooflineCost(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm"))
    arr = Arrivals(kind="closed", users=6, think_s=0.02) if kind == "closed" else Arrivals(kind="poisson",
                                                                                         rate_per_s=20.0)
    spec = WorkloadSpec(arrivals=arr, input_len=Lengths(kind="uniform", low=64, high=8000),
                        output_len=Lengths(kind="uniform", low=16, high=300), num_requests=300)
    fast, slow = (simulate(spec, cost, lambda: make_scheduler("continuous", **dict(CB, max_num_seqs=16)),
                           np.random.default_rng(3), SimConfig(fast_forward=f, frontend_s=0.004,
                                                               frontend_s_per_input_token=5e-6))
                  for f in (True, False))
    assert fast.steps == slow.steps and fast.events < slow.events
    for attr in ("arrival", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)


def test_littles_law_counts_the_front_end():
    """A request is in the system from its send: the time-in-system integral equals lambda x W with W timed from
    the client's send, the front end included (it read 16 ms x lambda short before)."""
    from capacity.sim.simulator import littles_law

    cost = RooflineCost(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm"))
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=10.0),
                        input_len=Lengths(kind="uniform", low=64, high=4000), output_len=Lengths(kind="fixed", value=50),
                        num_requests=300)
    res = simulate(spec, cost, lambda: make_scheduler("continuous", **dict(CB, max_num_seqs=16)),
                   np.random.default_rng(1), SimConfig(frontend_s=0.0144, frontend_s_per_input_token=1.89e-6))
    L, lam_w = littles_law(res)
    assert L == pytest.approx(lam_w, rel=1e-9)


def test_a_run_says_when_the_engines_front_end_adds_to_ttft():
    note = frontend.note
    (line,) = note(EngineConfig())  # vLLM's defaults: the high ends of the measured ranges, said with the ranges
    assert "14.4 ms per request (measured 13.4-14.4)" in line and "1.89 us per prompt token" in line
    assert "--frontend-ms" in line
    (sg,) = note(EngineConfig(engine="sglang"))  # no per-request figure measured: 0, and it says so
    assert "0 ms per request (not measured for this engine)" in sg
    assert note(EngineConfig(frontend_ms=5.0, frontend_us_per_input_token=0.0)) == []  # the user's own figures
    assert note(EngineConfig(engine="sglang", frontend_us_per_input_token=0.0)) == []  # nothing added
