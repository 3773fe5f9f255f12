"""Roofline step cost: hand-computed limits (memory-bound decode, compute-bound prefill) and invariants."""
import pytest

from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.model.gpus import get_gpu
from capacity.model.weights import weight_bytes_per_rank

NO_FIXED = RooflineParams(kernel_launch_s=0.0, step_overhead_s=0.0, allreduce_latency_s=0.0,
                          measured_gemm_floor=False)  # the formulas alone: no fixed or measured terms


def test_decode_batch1_is_weight_bandwidth_bound(card):
    # One decode token of Llama-3.1-8B reads every linear weight + the LM head once:
    # (8,030,261,248 - 128,256 x 4096 embedding) params x 2 B over 3.35 TB/s x 0.8.
    c, g = card("llama-3.1-8b"), get_gpu("h100-sxm")
    m = RooflineCost(c, g, params=NO_FIXED)
    br = m.breakdown(StepPlan(decode_contexts=(0,)))
    read = (8_030_261_248 - 128_256 * 4096) * 2
    assert br["gemm"] == pytest.approx(read / (3.35e12 * 0.8), rel=0.01)
    assert br["attention"] < 0.01 * br["gemm"]


def test_long_prefill_is_compute_bound(card):
    # 8192-token prefill: GEMMs 2 x 7,504,924,672 linear params (excl. embedding and LM head) x 8192 FLOPs at
    # 989.4 TFLOP/s x 0.7; causal attention 8192 x 8192.5 / 2 pairs x 32 heads x 4 x 128 FLOPs x 32 layers at x 0.5.
    c, g = card("llama-3.1-8b"), get_gpu("h100-sxm")
    br = RooflineCost(c, g, params=NO_FIXED).breakdown(StepPlan(prefills=(PrefillChunk(8192),)))
    linear = 8_030_261_248 - 2 * 128_256 * 4096
    lm = 2 * 128_256 * 4096 / (989.4e12 * 0.7)  # one sampled row; memory-bound in fact
    assert br["gemm"] - lm == pytest.approx(2 * linear * 8192 / (989.4e12 * 0.7), rel=0.01)
    pairs = 8192 * (8192 + 1) / 2
    assert br["attention"] == pytest.approx(32 * pairs * 32 * 4 * 128 / (989.4e12 * 0.5), rel=0.001)


def test_more_work_never_cheaper(card):
    m = RooflineCost(card("llama-3.1-8b"), get_gpu("h100-sxm"))
    decode = [m.step_s(StepPlan(decode_contexts=(1024,) * b)) for b in (1, 8, 64, 256)]
    assert decode == sorted(decode)
    ctx = [m.step_s(StepPlan(decode_contexts=(c,) * 32)) for c in (128, 1024, 8192, 32768)]
    assert ctx == sorted(ctx)
    chunk = [m.step_s(StepPlan(prefills=(PrefillChunk(512, cached),))) for cached in (0, 2048, 16384)]
    assert chunk == sorted(chunk)


def test_tp_speeds_up_large_steps(card):
    c, g = card("llama-3.1-70b"), get_gpu("h100-sxm")
    plan = StepPlan(prefills=(PrefillChunk(4096),))
    t = [RooflineCost(c, g, tp=tp).step_s(plan) for tp in (2, 4, 8)]
    assert t == sorted(t, reverse=True)
    assert RooflineCost(c, g, tp=4).breakdown(plan)["communication"] > 0


def test_moe_decode_reads_only_touched_experts(card):
    c, g = card("mixtral-8x7b"), get_gpu("h100-sxm")
    m = RooflineCost(c, g, params=NO_FIXED)
    one = m.breakdown(StepPlan(decode_contexts=(0,)))["gemm"]
    many = m.breakdown(StepPlan(decode_contexts=(0,) * 256))["gemm"]
    w = weight_bytes_per_rank(c, 1)
    all_experts = (w["experts_gate_up"] + w["experts_down"]) / (3.35e12 * 0.8)
    assert one < 0.4 * all_experts  # 2 of 8 experts per layer
    assert many > 0.9 * all_experts  # 256 tokens touch (almost) all of them


def test_dense_packed_attention_costs_more_when_mixed(card):
    c, g = card("tiny"), get_gpu("h100-sxm")
    plan = StepPlan(prefills=(PrefillChunk(256, 0), PrefillChunk(256, 0)), decode_contexts=(512,) * 8)
    ideal = RooflineCost(c, g, params=NO_FIXED).breakdown(plan)["attention"]
    packed = RooflineCost(c, g, params=NO_FIXED.model_copy(update={"attention": "dense_packed"})).breakdown(plan)
    assert packed["attention"] > 2 * ideal
    assert plan.num_tokens == 520 and plan.num_sampled == 10


def test_empty_step_is_free(card):
    assert RooflineCost(card("tiny"), get_gpu("l4")).step_s(StepPlan()) == 0.0
