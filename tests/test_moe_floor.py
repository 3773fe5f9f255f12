"""The measured floor under a MoE layer's routed experts (capacity/cost/moe_floor.py; capacity/data/moe_latency.json:
NVIDIA aiconfigurator's moe_perf tables, github.com/ai-dynamo/aiconfigurator@095f58a, Apache-2.0).

The figures pinned here were read by hand from aiconfigurator's parquet files, not from the data file or the code:
h100_sxm/moe/vllm/{0.14.0,0.19.0,0.24.0}/moe_perf.parquet, moe_dtype bfloat16, hidden 4096, inter 14336, 8 experts,
top-2 (Mixtral-8x7B), moe_ep_size 1, distribution balanced, latency in ms; the floor is the fastest release."""
import pytest

from capacity.cli.common import load_card
from capacity.cost.moe_floor import moe_floor
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.model.gpus import get_gpu

# (moe_tp_size, num_tokens) -> latency (us) in vLLM 0.14.0, 0.19.0, 0.24.0
MIXTRAL_H100_VLLM = {(1, 1): (316.139, 254.661, 258.741), (1, 2): (507.803, 481.680, 572.533),
                     (1, 4): (961.067, 955.216, 1120.037), (1, 96): (1332.405, 1024.965, 1022.581),
                     (1, 128): (1355.755, 1011.440, 1015.099), (1, 12288): (40779.050, 17551.530, 16956.608),
                     (1, 16384): (57648.249, 28059.514, 22560.822), (4, 16384): (5335.622, 5352.075, 4881.403)}


def fastest(tp, tokens):
    return min(MIXTRAL_H100_VLLM[tp, tokens]) * 1e-6


def floor(model="mixtral-8x7b", weight=None, gpu="h100-sxm", tp=1, engine="vllm"):
    return moe_floor(load_card(model, weight), get_gpu(gpu), tp, engine)


def test_at_a_measured_point_it_is_the_fastest_release():
    f = floor()
    assert f.exact
    for tokens in (1, 2, 4, 16384):
        assert f.floor_s(tokens) == pytest.approx(fastest(1, tokens), rel=1e-3)
    assert fastest(1, 1) == 254.661e-6  # 0.19.0's; 0.24.0 has the fastest at 16,384 tokens (22.56 ms)


def test_between_points_linear_and_never_above_a_larger_batch():
    f = floor()
    # 3 tokens: halfway between 2 and 4 (aiconfigurator's lerp in tokens)
    assert f.floor_s(3) == pytest.approx((fastest(1, 2) + fastest(1, 4)) / 2, rel=1e-3)  # 718.4 us
    # 14,336 tokens: halfway between 12,288 and 16,384
    assert f.floor_s(14336) == pytest.approx((fastest(1, 12288) + fastest(1, 16384)) / 2, rel=1e-3)
    # 96 tokens measured 1,022.6 us at best, 128 tokens 1,011.4 us: the floor at 96 is the larger batch's
    assert fastest(1, 96) > fastest(1, 128)
    assert f.floor_s(96) == pytest.approx(fastest(1, 128), rel=1e-3)


def test_past_the_grid_the_last_utilisation_is_held():
    """32,768 tokens x top-2 on 4096 x 14336 experts: compute-bound (2 x 65,536 rows x 3 x 4096 x 14336 FLOPs at
    989 TFLOP/s = 23 ms against 0.7 GB of weights + 2.4 GB of activations at 3.35 TB/s = 0.9 ms), so twice 16,384's."""
    assert floor().floor_s(32768) == pytest.approx(2 * fastest(1, 16384), rel=1e-3)


def test_an_unmeasured_width_carries_the_nearest_shapes_utilisation():
    """At TP 3 an expert's intermediate is 14336 // 3 = 4778 per rank, not measured; the nearest measured Mixtral
    width (log scale) is TP 4's 3584. At 16,384 tokens both are compute-bound (rows x 3 x 4096 x width FLOPs at
    989 TFLOP/s: 3.9 and 2.9 ms, against 0.7-0.9 ms of bytes), so the floor is the measured 3584's x 4778 / 3584."""
    f = floor(tp=3)
    assert not f.exact and f.ref[:4] == (2, 8, 4096, 3584)
    assert f.floor_s(16384) == pytest.approx(fastest(4, 16384) * 4778 / 3584, rel=1e-3)


def test_the_roofline_takes_the_floor_where_it_is_higher():
    """Two tokens of Mixtral on an H100: the roofline streams the 3.5 experts two tokens touch on average
    (8 x (1 - (6/8)^2)), 3.5 x 3 x 4096 x 14336 x 2 bytes = 1.233 GB, at 80% of 3.35 TB/s + 4 us = 464.2 us;
    vLLM's kernels were measured at 481.7 us: the experts cost that. One token: 2 experts, 267 us by the
    roofline against 254.7 us measured: the roofline stays."""
    card = load_card("mixtral-8x7b")
    on = RooflineCost(card, get_gpu("h100-sxm"), 1)
    off = RooflineCost(card, get_gpu("h100-sxm"), 1, params=RooflineParams(measured_moe_floor=False))
    roof2 = (3.5 * 3 * 4096 * 14336 * 2 + 2 * 2 * 2 * 4096 * 2) / (3.35e12 * 0.8) + 4e-6
    assert roof2 == pytest.approx(464.2e-6, rel=1e-3)
    # (the data file keeps 4 significant figures: 481.7 us)
    assert on._mlp_s(2, True) - off._mlp_s(2, True) == pytest.approx(fastest(1, 2) - roof2, abs=1e-7)
    assert on._mlp_s(1, True) == off._mlp_s(1, True)


@pytest.mark.parametrize("gpu,engine,weight", [("rtx-4090", "vllm", None),  # no Ada table
                                               ("a100-80gb", "vllm", None),  # no Ampere table
                                               ("h100-sxm", "trtllm", "int4")])  # TensorRT-LLM has no W4A16 MoE rows
def test_no_table_no_floor(gpu, engine, weight):
    assert floor(gpu=gpu, engine=engine, weight=weight) is None


def test_a_slower_part_of_the_architecture_takes_a_faster_ones_table():
    """An H20 (4.0 TB/s, 148 TFLOP/s bf16) is no faster than an H200 (4.8 TB/s, 989 TFLOP/s): the H200's
    measured latencies bound it from below. An H100 SXM is slower than an H200 in bandwidth: not the other way."""
    f = floor(gpu="h20")
    assert f is not None and "h200" in f.source
    assert "h100-sxm" in floor(gpu="h100-sxm").source


def test_sglang_runs_gpt_oss_mxfp4_on_vllms_triton_kernels_path():
    f = floor("gpt-oss-20b", gpu="h100-sxm", engine="sglang")
    assert f.exact and f.source.startswith("aiconfigurator vllm")


def test_switched_off_or_dense_no_floor():
    card = load_card("mixtral-8x7b")
    assert RooflineCost(card, get_gpu("h100-sxm"), 1, params=RooflineParams(measured_moe_floor=False))._moe_floor is None
    assert RooflineCost(load_card("llama-3.1-8b"), get_gpu("h100-sxm"), 1)._moe_floor is None


def test_expert_parallel_takes_the_floor_out_and_data_parallel_splits_it():
    """Under expert parallelism (aiconfigurator's EP rows are not in the data file) the layout's experts are the
    roofline's alone: the step is the same with the inner floor on or off. Data parallelism without EP splits each
    expert's intermediate over tp x dp ranks and works on dp x the rank's tokens: its floor is TP 2's at 2x tokens."""
    from capacity.cost.parallel import Layout, ParallelCost
    from capacity.cost.step import StepPlan

    card, gpu = load_card("mixtral-8x7b"), get_gpu("h100-sxm")
    on = RooflineCost(card, gpu, 1)
    off = RooflineCost(card, gpu, 1, params=RooflineParams(measured_moe_floor=False))
    plan = StepPlan(decode_contexts=(512,) * 2)
    ep_on, ep_off = ParallelCost(on, Layout(1, 2, True)), ParallelCost(off, Layout(1, 2, True))
    assert ep_on.step_s(plan) == pytest.approx(ep_off.step_s(plan), rel=1e-12)
    assert on.step_s(plan) > off.step_s(plan)  # 2 tokens: the floor (481.7 us) over the roofline (464.2 us)
    dp = ParallelCost(on, Layout(1, 2, False))
    assert dp.experts_s(2) >= floor(tp=2).floor_s(4) > 0
