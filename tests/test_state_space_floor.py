"""The measured floor under a hybrid's state-layer kernels (capacity/cost/state_space_floor.py,
capacity/data/state_space_latency.json): numbers read by hand from NVIDIA aiconfigurator's parquet tables
(github.com/ai-dynamo/aiconfigurator@095f58a5, aic-core/src/aiconfigurator_core/systems/data/h200_sxm/
linear_attention/...; latency column in ms), the lookup rules, the hook in state_space.py, and the state layers'
kernels in the kernel-count floor."""
from __future__ import annotations

import json
from statistics import median

import pytest

from capacity.cost.kernels import kernel_floor_extra_s
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.state_space_floor import (
    _interp,
    pick_shape,
    rank_key,
    state_floor,
    state_latency_data,
    state_layer_kernels,
)
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from tests.conftest import ROOT

HF3 = ROOT / "tests" / "data" / "startup_v3" / "hf"
NEMOTRON = HF3 / "nemotron-3-nano-30b-a3b-bf16.json"
QWEN3_NEXT = HF3 / "qwen3-next-80b-a3b-thinking.json"

# h200_sxm/linear_attention/sglang/0.5.14/gdn_perf.parquet, num_k_heads 2, head_k_dim 128, num_v_heads 4,
# head_v_dim 128, d_conv 4 (Qwen3-Next at TP 8), rows at d_model 2048 / 2560 / 4096, latency in ms
CONV_UPDATE_B8 = (0.00162016, 0.00162240, 0.00161504)
PACKED_DECODE_B8 = (0.00465792, 0.00459424, 0.00462432)
CONV_UPDATE_B16 = (0.00167424, 0.00164864, 0.00165056)
PACKED_DECODE_B16 = (0.00523840, 0.00521984, 0.00527264)
CONV_UPDATE_B1024 = (0.00773088, 0.00771968, 0.00779040)
PACKED_DECODE_B1024 = (0.136848316, 0.136647043, 0.136759357)
CONV_FN_1x1024 = (0.004244, 0.004240, 0.004251)  # context, batch 1, seq_len 1024
CHUNK_SCAN_1x1024 = (0.061057, 0.061305, 0.061327)


def us(*rows: tuple[float, ...]) -> float:
    """The sum over kernels of each kernel's median over d_model, ms -> us."""
    return 1000.0 * sum(median(r) for r in rows)


def qwen3_next_floor(tp: int, engine: str = "sglang", gpu: str = "h200"):
    return state_floor(load_model_card(QWEN3_NEXT), gpu, tp, engine)


def test_data_file_names_its_source():
    d = state_latency_data()
    assert "095f58a51c4ca8e61b66ec108d86f223f8d559ce" in d["source"] and d["unit"] == "us"
    assert d["written_by"] == "python bench/state_space_latency.py --aic PATH"
    assert set(d["gpus"]) == {"h100-sxm", "h200", "b200", "l40s"}
    assert d["gpus"]["h200"]["sglang"]["version"] == "0.5.14"


def test_qwen3_next_tp8_decode_read_from_the_table():
    f = qwen3_next_floor(8)
    assert f is not None and f.label == "h200 sglang 0.5.14 gated_deltanet 2/128/4/128/4"
    assert rank_key(load_model_card(QWEN3_NEXT), 8) == ("gated_deltanet", (2, 128, 4, 128, 4))
    b8 = us(CONV_UPDATE_B8, PACKED_DECODE_B8)  # 1.62016 + 4.62432 = 6.24448 us
    b16 = us(CONV_UPDATE_B16, PACKED_DECODE_B16)  # 1.65056 + 5.23840 = 6.88896 us
    assert f.decode_s(8) == pytest.approx(b8 * 1e-6, rel=1e-3)
    assert f.decode_s(16) == pytest.approx(b16 * 1e-6, rel=1e-3)
    assert f.decode_s(12) == pytest.approx((b8 + b16) / 2 * 1e-6, rel=1e-3)  # linear between grid points
    # above the grid: the last point scaled by the batch (conservative: no fixed cost shared)
    b1024 = us(CONV_UPDATE_B1024, PACKED_DECODE_B1024)  # 7.73088 + 136.759357 us
    assert f.decode_s(2048) == pytest.approx(2 * b1024 * 1e-6, rel=1e-3)
    assert f.decode_s(0) == 0.0


def test_qwen3_next_tp8_prefill_read_from_the_table():
    f = qwen3_next_floor(8)
    assert f is not None
    one = us(CONV_FN_1x1024, CHUNK_SCAN_1x1024)  # 4.244 + 61.305 = 65.549 us
    assert f.prefill_s([(1024, 0)]) == pytest.approx(one * 1e-6, rel=1e-3)
    # chunks of a step: batch = their count, seq_len = their mean (4 x 1024: the [4][1024] grid point)
    d = state_latency_data()["gpus"]["h200"]["sglang"]["gated_deltanet"]["2/128/4/128/4"]
    assert f.prefill_s([(512, 0), (1536, 100), (1024, 0), (1024, 7)]) == pytest.approx(d["prefill"][2][10] * 1e-6)
    assert f.prefill_s([]) == 0.0


def test_mamba2_conv_under_tensorrt_llm_only():
    # h200_sxm/linear_attention/trtllm/1.3.0rc20/mamba2_perf.parquet, conv width 6144 (64 heads x 64 + 2 x 8 groups
    # x d_state 128): NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 and MAMBA2_GENERIC_4K (d_model 8192, chunk 256) rows, whose
    # median (here their mean) is kept: causal_conv1d_update at batch 8 0.003914 and 0.003872 ms, causal_conv1d_fn at
    # batch 1, seq_len 1024 0.014208 and 0.014410 ms
    card = load_model_card(NEMOTRON)
    assert rank_key(card, 1) == ("mamba2", (6144, 4))
    f = state_floor(card, "h200", 1, "trtllm")
    assert f is not None
    assert f.decode_s(8) == pytest.approx((3.914 + 3.872) / 2 * 1e-6, rel=1e-3)
    assert f.prefill_s([(1024, 0)]) == pytest.approx((14.208 + 14.410) / 2 * 1e-6, rel=1e-3)
    assert state_floor(card, "h200", 1, "trtllm-engine") is not None  # the engine backend reads the same table
    assert state_floor(card, "h200", 1, "vllm") is None and state_floor(card, "h200", 1, "sglang") is None


def test_no_table_no_floor():
    assert qwen3_next_floor(4, gpu="h20") is None  # H20: no aiconfigurator table
    assert qwen3_next_floor(4, gpu="a100-80gb") is None
    card = load_model_card(QWEN3_NEXT)
    on = RooflineCost(card, get_gpu("h20"), 4)._state
    off = RooflineCost(card, get_gpu("h20"), 4, params=RooflineParams(measured_state_floor=False))._state
    assert on is not None and off is not None and on.floor is None
    for chunks, seqs in (([(1000, 0)], 0), ([], 32), ([(8192, 0), (300, 50)], 7)):
        assert on.scan_step_s(chunks, seqs) == off.scan_step_s(chunks, seqs)


def test_shape_contained_or_none():
    shapes = {"2/128/4/128/4": {}, "4/128/8/128/4": {}, "4/128/16/128/4": {}, "16/128/64/128/4": {}}
    assert pick_shape(shapes, (4, 128, 8, 128, 4), "gated_deltanet") == "4/128/8/128/4"  # exact
    assert pick_shape(shapes, (4, 128, 12, 128, 4), "gated_deltanet") == "4/128/8/128/4"  # largest inside
    assert pick_shape(shapes, (8, 128, 32, 128, 4), "gated_deltanet") == "4/128/16/128/4"
    assert pick_shape(shapes, (1, 128, 2, 128, 4), "gated_deltanet") is None  # smaller than anything measured
    assert pick_shape(shapes, (4, 128, 8, 256, 4), "gated_deltanet") is None  # other head dim
    assert pick_shape({"6144/4": {}, "10240/4": {}}, (8000, 4), "mamba2") == "6144/4"
    assert pick_shape({"6144/4": {}}, (3072, 4), "mamba2") is None


def test_interp_rules():
    xs, ys = [1, 2, 4], [10.0, None, 30.0]
    assert _interp(xs, ys, 1) == 10.0 and _interp(xs, ys, 0.5) == 10.0  # clamped below
    assert _interp(xs, ys, 2.5) == pytest.approx(10.0 + 20.0 * 1.5 / 3)  # holes skipped
    assert _interp(xs, ys, 8) == 60.0  # proportional above
    assert _interp(xs, [None, None, None], 2) is None


def test_the_floor_binds_on_prefill_and_never_lowers_a_cost():
    card = load_model_card(QWEN3_NEXT)
    for tp in (2, 4, 8):
        p = RooflineParams(allreduce_engine="sglang")
        on = RooflineCost(card, get_gpu("h200"), tp, params=p)._state
        off = RooflineCost(card, get_gpu("h200"), tp, params=p.model_copy(update={"measured_state_floor": False}))._state
        assert on is not None and off is not None and on.floor is not None and off.floor is None
        for chunks in ([(1024, 0)], [(64, 0)] * 3, [(8192, 100)], [(30000, 0)]):
            assert on.prefill_s(chunks) == max(off.prefill_s(chunks), on.floor.prefill_s(chunks))
        for seqs in (1, 8, 100, 1024, 3000):
            assert on.decode_s(seqs) == max(off.decode_s(seqs), on.floor.decode_s(seqs)) >= off.decode_s(seqs)
        # a 1,024-token prefill: the measured conv + scan is above the assumed-efficiency model at every TP here
        assert on.prefill_s([(1024, 0)]) > off.prefill_s([(1024, 0)])
    tp8 = RooflineCost(card, get_gpu("h200"), 8, params=RooflineParams(allreduce_engine="sglang"))._state
    assert tp8 is not None
    assert tp8.prefill_s([(1024, 0)]) == pytest.approx(us(CONV_FN_1x1024, CHUNK_SCAN_1x1024) * 1e-6, rel=1e-3)


def test_engine_picks_its_own_table():
    vllm = qwen3_next_floor(8, engine="vllm")
    trt = qwen3_next_floor(8, engine="trtllm")
    assert vllm is not None and vllm.label.startswith("h200 vllm 0.24.0")
    assert trt is None  # TensorRT-LLM's table holds TP 1 shapes only (16 key heads): nothing inside 2 / 4 heads
    trt1 = qwen3_next_floor(1, engine="trtllm")
    assert trt1 is not None and trt1.label == "h200 trtllm 1.3.0rc20 gated_deltanet 16/128/32/128/4"


def test_state_layers_in_the_kernel_count():
    card = load_model_card(QWEN3_NEXT)
    assert card.state is not None and state_layer_kernels(card) == 8 and card.qk_norm
    assert state_layer_kernels(load_model_card(NEMOTRON)) == 6
    # with a 1 us floor and no launch charge: 12 attention layers x 8 (q/k norms) + 48 MoE layers x (8 + 4 shared
    # expert kernels) + 36 gated DeltaNet layers x 8
    assert (card.num_kv_layers, card.num_moe_layers, card.state.num_layers) == (12, 48, 36)
    assert kernel_floor_extra_s(card, 1e-6, 0.0, True) == pytest.approx((12 * 8 + 48 * 12 + 36 * 8) * 1e-6)
    # the roofline's own launches on those layers: 3 a state layer (projections, decode's two)
    ops = 2 * 12 + 2 * 48 + 48 * 3 + 3 * 36
    assert kernel_floor_extra_s(card, 0.0, 1e-6, True) == 0.0
    assert kernel_floor_extra_s(card, 2e-6, 1e-6, True) == pytest.approx((2 * 960 - ops) * 1e-6)


def test_bench_script_documents_the_tables():
    text = (ROOT / "bench" / "state_space_latency.py").read_text()
    assert "095f58a51c4ca8e61b66ec108d86f223f8d559ce" in text and "linear_attention" in text
    assert json.loads((ROOT / "capacity" / "data" / "state_space_latency.json").read_text())["seq"][-1] == 32768


def test_piecewise_steps_dispatch_the_state_layers_too():
    # vLLM's piecewise graphs split at the state layers' custom ops as at attention: Qwen3-Next's 12 attention layers
    # at layer_dispatch_s and its 36 gated DeltaNet layers at (2 calls + 1 graph replay) x eager_call_s + 3 views
    from capacity.cost.piecewise import VIEW_S, PiecewiseGraphCost, eager_call_s, layer_dispatch_s, piecewise_wrap
    from capacity.cost.step import LinearCost
    from capacity.engine.config import EngineConfig
    from capacity.engine.vllm.engine import Vllm

    card = load_model_card(QWEN3_NEXT)
    w = piecewise_wrap(LinearCost(fixed_s=2e-3), Vllm.from_spec("vllm@0.11"), EngineConfig(), card, 2e-3, None)
    assert isinstance(w, PiecewiseGraphCost) and not w.decode_piecewise  # 0.11: full decode graphs (UNIFORM_BATCH)
    assert w.cpu_s == pytest.approx(12 * layer_dispatch_s(card) + 36 * (3 * eager_call_s() + 3 * VIEW_S))
