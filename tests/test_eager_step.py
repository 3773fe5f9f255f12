"""One eager-step model (capacity/cost/piecewise.py, `layer_eager_s` / `eager_step_cost`): vLLM's `enforce_eager`
(V0 and V1), its release-forced eager mode and SGLang's/TensorRT-LLM's eager steps, pinned by hand (issue 47)."""
from __future__ import annotations

import pytest

from capacity.cli.common import load_card
from capacity.cost.piecewise import PiecewiseGraphCost, layer_eager_s
from capacity.cost.roofline import RooflineCost
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.engine.graphs import graph_wrap
from capacity.model.gpus import get_gpu
from tests.conftest import run_cli

OP = 19.308e-3 / (32 * 42)  # the stack's eager "decode 1 @ 1k" step over 32 layers x 42 ops (H200 host), 14.37 us
VIEW = 5e-6  # the high end of the 0-5 us view range: an eager step takes the conservative (longer) dispatch
CALL = (42 * OP - 12 * VIEW) / 42  # one kernel-launching call: the stack's op with its 12 views a layer taken out
SMALL = "tests/data/hf/llama-3.2-1b.json"  # 16 Llama layers


def test_one_eager_llama_layer_by_hand():
    card = load_card("llama-3.1-8b")
    # tp 1: 10 calls (2 norms, 4 linears, rope, KV write, attention, silu_and_mul) and 25 dispatches that launch
    # nothing (split, cos_sin_cache.to, Attention.forward's empty + 4 views + custom op + view, SiluAndMul's empty;
    # FlashAttention's unbind and 2 slices; 12 nn.Module calls)
    assert layer_eager_s(card, 1) == pytest.approx(10 * CALL + 25 * VIEW)
    assert layer_eager_s(card, 1) == pytest.approx(254.375e-6, abs=0.01e-6)  # 10 x 12.9375 + 25 x 5 us
    # tp 2: + 2 all-reduce calls, each with its custom-op entry and its empty_like
    assert layer_eager_s(card, 2) == pytest.approx(12 * CALL + 29 * VIEW)
    # the view range's two ends: 10 x 14.37 us (views free) .. 10 x (14.37 - 60/42) + 25 x 5 us
    assert layer_eager_s(card, 1, view_s=0.0) == pytest.approx(10 * OP)
    assert layer_eager_s(card, 1, view_s=5e-6) == pytest.approx(10 * (42 * OP - 60e-6) / 42 + 125e-6)
    assert layer_eager_s(card, 1, view_s=2.5e-6) == pytest.approx(199.0e-6, abs=0.1e-6)  # the range's middle
    # the measured stack layer (42 unfused ops, 0.603 ms) is 2.4x vLLM's fused layer: the per-op cost, not the count
    assert 42 * OP / layer_eager_s(card, 1) == pytest.approx(2.37, abs=0.01)  # 603.375 / 254.375 us


@pytest.mark.parametrize("spec", ["vllm@0.9", "vllm@0.9.2:v0", "vllm@0.4", "vllm"])
def test_enforce_eager_makes_every_vllm_step_eager(spec):
    card, gpu = load_card(SMALL), get_gpu("h100-sxm")
    inner = RooflineCost(card, gpu, 1)
    cfg = EngineConfig(engine=spec, enforce_eager=True)
    w = graph_wrap(inner, get_engine(spec), cfg, card, 2e-3, None)
    assert isinstance(w, PiecewiseGraphCost) and w.decode_line is None
    eager = 16 * (10 * CALL + 25 * VIEW)  # 4.07 ms of dispatch
    assert f"no CUDA graphs: {eager * 1e3:.2f} ms of eager dispatch" in w.source
    one = StepPlan((), (1024,))  # a 1B model's decode of one sequence: the GPU's work is well under 3 ms
    assert inner.step_s(one) < 2e-3 + eager
    assert w.step_s(one) == pytest.approx(2e-3 + eager)
    assert w.breakdown(one)["eager dispatch"] == pytest.approx(2e-3 + eager - inner.step_s(one))
    big = StepPlan((PrefillChunk(8192, 0),), ())  # the GPU is the longer: the step as it was, to the bit
    assert inner.step_s(big) > 2e-3 + eager and w.step_s(big) == inner.step_s(big)
    ctx = [1024] * 1
    assert list(w.decode_run_s(ctx, 3)) == pytest.approx([2e-3 + eager] * 3)


def test_without_enforce_eager_or_with_a_profile_nothing_is_eager():
    card, gpu = load_card(SMALL), get_gpu("h100-sxm")
    inner = RooflineCost(card, gpu, 1)
    one = StepPlan((), (1024,))
    v0 = graph_wrap(inner, get_engine("vllm@0.4"), EngineConfig(engine="vllm@0.4"), card, 2e-3, None)
    assert v0 is inner  # V0 replays full decode graphs
    v1 = graph_wrap(inner, get_engine("vllm@0.9"), EngineConfig(engine="vllm@0.9"), card, 2e-3, None)
    assert v1.eager_s == 0.0 and v1.step_s(one) < 2e-3 + 16 * layer_eager_s(card, 1)  # piecewise, not eager
    cfg = EngineConfig(engine="vllm@0.9", enforce_eager=True)
    assert graph_wrap(inner, get_engine("vllm@0.9"), cfg, card, 2e-3, "profile.json") is inner


def test_sglang_enforce_eager_is_the_same_model():
    from capacity.engine.sglang.config import SglangConfig

    card, gpu = load_card(SMALL), get_gpu("h100-sxm")
    inner = RooflineCost(card, gpu, 1)
    s = graph_wrap(inner, get_engine("sglang@0.5.5"), SglangConfig(engine="sglang@0.5.5", enforce_eager=True), card,
                   2e-3, None)
    v = graph_wrap(inner, get_engine("vllm@0.9"), EngineConfig(engine="vllm@0.9", enforce_eager=True), card, 2e-3,
                   None)
    one = StepPlan((), (1024,))
    assert s.eager_s == v.eager_s == pytest.approx(16 * (10 * CALL + 25 * VIEW))
    assert s.step_s(one) == v.step_s(one)


def test_a_bad_enforce_eager_is_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-3.1-8b\ngpu: h100-sxm\nengine: {enforce_eager: maybe}\nworkload:\n"
                 "  arrivals: {kind: poisson}\n  input_len: {kind: fixed, value: 128}\n"
                 "  output_len: {kind: fixed, value: 16}\nslo: {ttft_s: 1.0, tpot_s: 0.05, percentile: 99}\n"
                 "target_rate_per_s: 1\nsearch: {seeds: 1, requests: 100, max_num_seqs: [8], max_model_len: [4096], "
                 "tp: [1]}\n")
    r = run_cli("plan", "-m", str(f))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "engine.enforce_eager" in r.stderr and "'maybe'" in r.stderr
