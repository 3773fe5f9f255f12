"""capacity/cost/kernels.py and capacity/cost/piecewise.py (issue 47, docs/fidelity.md "Decode at small batch"):
the kernel counts read from vLLM's model code, the all-reduce vLLM picks, the piecewise-graph step. Expected
figures are counted or computed by hand here, not read from the code under test."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.cli.common import load_card
from capacity.cost.kernels import allreduce_call_s, allreduce_plan, attention_kernels, kernel_floor_extra_s, mlp_kernels
from capacity.cost.piecewise import (
    EAGER_OP_S,
    PiecewiseGraphCost,
    decode_is_piecewise,
    layer_dispatch_s,
    layer_eager_s,
    piecewise_wrap,
)
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import LinearCost, PrefillChunk, StepPlan, decode_run_s
from capacity.engine.config import EngineConfig
from capacity.engine.vllm.engine import Vllm
from capacity.model.gpus import get_gpu

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_floor_is_the_stored_graph_replay_measurement():
    prof = json.loads((ROOT / "calibrate/profiles/llama-3.1-8b-h200.json").read_text())
    assert prof["tokens"][0] == 1
    # linear.elementwise at 1 token over the 32 kernels of calibrate/stack.py's Layer.elementwise
    assert RooflineParams().kernel_floor_s == pytest.approx(prof["linear"]["elementwise"][0] / 32, rel=1e-4)


def test_eager_op_is_the_stored_eager_step_over_its_ops():
    shapes = json.loads((ROOT / "bench/results/step_shapes-llama-3.1-8b-h200.json").read_text())
    row = next(r for r in shapes["rows"] if r["shape"] == "decode 1 @ 1k")
    assert EAGER_OP_S == pytest.approx(row["eager_s"] / (32 * 42), rel=1e-3)


def test_kernels_per_layer_counted_from_vllm():
    ds, llama = load_card("deepseek-v3"), load_card("llama-3.1-8b")
    q3, q3moe = load_card("tests/data/hf/qwen3-4b.json"), load_card("tests/data/hf/qwen3-30b-a3b.json")
    assert attention_kernels(ds) == 16  # 8 projections/norms/rope + 8 of the MLA decode path
    assert attention_kernels(q3) == 8 and attention_kernels(llama) == 6  # q_norm, k_norm
    assert mlp_kernels(llama, False) == 4
    assert mlp_kernels(q3moe, True) == 8  # norm, gate, topk_softmax, align, w13, act, w2, moe_sum
    assert mlp_kernels(ds, True) == 15  # grouped_topk 4 instead of 1, shared experts 4


def test_kernel_floor_extra_deepseek_by_hand():
    ds = load_card("deepseek-v3")
    # 61 layers (3 dense, 58 MoE): 61 x 16 + 3 x 4 + 58 x 15 = 1,858 kernels; the roofline's ops:
    # 61 x 2 (attention GEMMs, attention) + 61 x 2 norms + 3 dense MLPs + 58 x 3 (experts, router, shared) = 421
    f = 53.632e-6 / 32
    assert kernel_floor_extra_s(ds, f, 4e-6, True) == pytest.approx(1858 * f - 421 * 4e-6)
    # a dense Llama layer's 10 kernels at 1.68 us are under its 5 ops x 4 us: nothing added
    assert kernel_floor_extra_s(load_card("llama-3.1-8b"), f, 4e-6, False) == 0.0


def test_roofline_adds_the_kernel_floor_as_a_constant_and_only_when_switched_on():
    ds, g = load_card("deepseek-v3", "int4"), get_gpu("h100-sxm")
    on = RooflineCost(ds, g, 8, params=RooflineParams(allreduce_algorithms=False))
    off = RooflineCost(ds, g, 8, params=RooflineParams(kernel_count_floor=False, allreduce_algorithms=False))
    for b in (1, 32):
        plan = StepPlan(decode_contexts=(1000,) * b)
        extra = kernel_floor_extra_s(ds, on.params.kernel_floor_s, 4e-6, True)
        assert on.step_s(plan) - off.step_s(plan) == pytest.approx(extra)
        assert on.breakdown(plan)["kernels"] == pytest.approx(extra)
        assert "kernels" not in off.breakdown(plan)
        assert on.decode_step_s(b, b * 1001) == pytest.approx(on.step_s(plan))


@pytest.mark.parametrize("tp,nbytes,link,algo", [
    (8, 14 * 1024, "nvlink", "one-shot"),  # DeepSeek at batch 1: 7,168 x 2 bytes
    (8, 300 * 1024, "nvlink", "two-shot"),  # >= 256 KiB at 8 GPUs
    (4, 400 * 1024, "nvlink", "one-shot"),  # < 512 KiB at <= 4 GPUs
    (4, 600 * 1024, "nvlink", "two-shot"),
    (2, 4 * 1024 * 1024, "pcie", "one-shot"),  # 2 GPUs: custom all-reduce even over PCIe, always 1 stage
    (4, 1024, "pcie", "nccl"),  # more than two PCIe-only GPUs: custom all-reduce disabled
    (8, 9 * 1024 * 1024, "nvlink", "nccl"),  # over max_size (8 MiB)
    (3, 1024, "nvlink", "nccl"),  # world size 3 is not supported by the custom kernels
])
def test_allreduce_plan_follows_vllm(tp, nbytes, link, algo):
    assert allreduce_plan(tp, nbytes, link) == algo


def test_allreduce_call_costs():
    bw = 100e9
    # one-shot: latency + each rank reads the other 7 buffers (at the link rate: (c'), the custom kernel's pull rate,
    # is off by default; with it, 61.3 GB/s where that is below the link: tests/test_allreduce_world_size.py)
    assert allreduce_call_s(8, 14336, "nvlink", bw, 8e-6) == pytest.approx(8e-6 + 7 * 14336 / bw)
    assert allreduce_call_s(8, 14336, "nvlink", bw, 8e-6, pull=True) == pytest.approx(
        8e-6 + 7 * 14336 / (1048576 / 17.1e-6))
    assert allreduce_call_s(8, 14336, "nvlink", 50e9, 8e-6) == pytest.approx(8e-6 + 7 * 14336 / 50e9)
    # NCCL ring, LL protocol, 4 PCIe GPUs: 6.6 us + 6 hops x 1.0 us + the ring's bytes
    assert allreduce_call_s(4, 8192, "pcie", bw, 8e-6) == pytest.approx(12.6e-6 + 1.5 * 8192 / bw)
    assert allreduce_call_s(1, 8192, "pcie", bw, 8e-6) == 0.0


def test_which_releases_run_decode_piecewise():
    assert decode_is_piecewise((0, 9, 2), "v1") and decode_is_piecewise((0, 10, 2), "v1")
    assert not decode_is_piecewise((0, 11, 0), "v1")  # FULL_AND_PIECEWISE became the default
    assert not decode_is_piecewise((0, 9, 2), "v0")  # V0 captures full decode graphs


def test_layer_dispatch_by_hand():
    ds, q3 = load_card("deepseek-v3"), load_card("tests/data/hf/qwen3-4b.json")
    op = 19.308e-3 / (32 * 42)
    # views free: (7 MLA calls + 1 graph replay) x 14.37 us
    assert layer_dispatch_s(ds, op, 0.0) == pytest.approx(8 * op)
    # views at 5 us: a call is (42 op - 12 x 5 us) / 42; 8 calls and 19 views
    assert layer_dispatch_s(ds, op, 5e-6) == pytest.approx(8 * (42 * op - 60e-6) / 42 + 19 * 5e-6)
    assert layer_dispatch_s(q3, op, 0.0) == pytest.approx(3 * op)  # FlashAttention: 2 calls + a replay


def test_piecewise_step_is_overhead_plus_max_of_gpu_and_cpu():
    inner = LinearCost(fixed_s=2e-3, per_token_s=1e-3)  # 2 ms of overhead + 1 ms per token
    w = PiecewiseGraphCost(inner, cpu_s=5e-3, overhead_s=2e-3, decode_piecewise=True)
    one = StepPlan(decode_contexts=(100,))
    assert w.step_s(one) == pytest.approx(2e-3 + 5e-3)  # CPU-bound
    assert w.breakdown(one)["eager dispatch"] == pytest.approx(5e-3 - 1e-3)
    big = StepPlan(decode_contexts=(100,) * 8)
    assert w.step_s(big) == pytest.approx(inner.step_s(big))  # 8 ms of GPU: GPU-bound
    assert list(decode_run_s(w, [100], 3)) == pytest.approx([7e-3] * 3)
    assert w.decode_line is None
    full = PiecewiseGraphCost(inner, cpu_s=5e-3, overhead_s=2e-3, decode_piecewise=False)
    assert full.step_s(one) == pytest.approx(inner.step_s(one))  # a full decode graph
    pre = StepPlan(prefills=(PrefillChunk(2),))
    assert full.step_s(pre) == pytest.approx(7e-3)  # a mixed step still runs piecewise


def test_piecewise_wrap_only_where_vllm_runs_it():
    ds = load_card("deepseek-v3")
    inner = LinearCost(fixed_s=2e-3)
    cfg = EngineConfig()
    w = piecewise_wrap(inner, Vllm.from_spec("vllm@0.9"), cfg, ds, 2e-3, None)
    assert isinstance(w, PiecewiseGraphCost) and w.decode_piecewise
    assert w.cpu_s == pytest.approx(61 * layer_dispatch_s(ds))
    new = piecewise_wrap(inner, Vllm.from_spec("vllm@0.11"), cfg, ds, 2e-3, None)
    assert isinstance(new, PiecewiseGraphCost) and not new.decode_piecewise
    assert piecewise_wrap(inner, Vllm.from_spec("vllm@0.9"), cfg, ds, 2e-3, "some-profile") is inner
    assert piecewise_wrap(inner, Vllm.from_spec("vllm@0.7.3:v0"), cfg, ds, 2e-3, None) is inner
    eager = EngineConfig(enforce_eager=True)  # every step eager, V1 and V0 (tests/test_eager_step.py)
    for spec in ("vllm@0.9", "vllm@0.7.3:v0"):
        e = piecewise_wrap(inner, Vllm.from_spec(spec), eager, ds, 2e-3, None)
        assert isinstance(e, PiecewiseGraphCost) and e.prefill_eager and e.decode_graph_sizes == frozenset()
        assert e.eager_s == pytest.approx(61 * layer_eager_s(ds, 1)) and e.cpu_s == 0.0


def test_the_switch_turns_the_wrapper_off(monkeypatch):
    import capacity.cost.piecewise as pw

    inner = LinearCost(fixed_s=2e-3)
    monkeypatch.setattr(pw, "PIECEWISE_GRAPHS", False)
    assert piecewise_wrap(inner, Vllm.from_spec("vllm@0.9"), EngineConfig(), load_card("deepseek-v3"), 2e-3,
                          None) is inner
