"""TensorRT-LLM per release line (0.17-1.2): how the PyTorch backend's KV estimate is run (capacity.engine.trtllm.
release `kv_profile`, `cuda_graphs_default`), the estimator's bytes per token at tp > KV heads (kv_estimate.py),
expert parallelism's weights and refusals (parallel.py), and the scheduler limits each release's defaults give.
Numbers are hand-computed from the code's formulas (docs/trtllm.md, "The PyTorch backend's KV estimate by
release", "Expert parallelism") and from the logged figures of NVIDIA/TensorRT-LLM issue 5872."""

import numpy as np
import pytest

from capacity.engine import get_engine
from capacity.engine.budget import SchedLimits, kv_bytes_per_token
from capacity.engine.config import EngineConfig
from capacity.engine.trtllm import kv_estimate
from capacity.engine.trtllm.parallel import moe_layout, weights_per_rank
from capacity.engine.trtllm.release import parse_trtllm
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu, with_memory
from capacity.model.weights import weight_bytes_per_rank
from tests.conftest import ROOT, run_cli

GiB = 1024**3
QWEN3_235B = ROOT / "tests/data/hf/qwen3-235b-a22b-fp8.json"
LLAMA_8B = ROOT / "models/llama-3.1-8b.yaml"


def trt(spec: str, **kw) -> EngineConfig:
    return EngineConfig.model_validate({"engine": spec, **kw})


@pytest.mark.parametrize("spec, backend, profile, graphs", [
    # 0.17: estimate_max_kv_cache_tokens(model_engine, executor_config, mapping): one model_engine.forward, no KV
    # manager; PyTorchConfig.use_cuda_graph = False
    ("trtllm@0.17:pytorch", "pytorch", "forward", (False, False)),
    # 0.18-0.21: dummy requests through the PyExecutor, the temporary pool added back (cal_max_tokens)
    ("trtllm@0.18:pytorch", "pytorch", "executor", (False, False)),
    ("trtllm@0.19:pytorch", "pytorch", "executor", (False, False)),
    ("trtllm@0.20:pytorch", "pytorch", "executor", (False, False)),
    ("trtllm@0.21:pytorch", "pytorch", "executor", (False, False)),  # PR 5480 (graphs on) after the 0.21 branch
    # 1.x: KvCacheCreator after the warm-up; TorchLlmArgs.cuda_graph_config default_factory=CudaGraphConfig
    ("trtllm@1.0", "pytorch", "creator", (True, True)),
    ("trtllm@1.1", "pytorch", "creator", (True, True)),
    ("trtllm@1.2.0rc2", "pytorch", "creator", (True, True)),
])
def test_each_release_line_reads_its_own_estimate_flow(spec, backend, profile, graphs):
    rel = parse_trtllm(spec)
    assert (rel.backend, rel.kv_profile, rel.cuda_graphs_default) == (backend, profile, graphs)
    # trtllm-serve's --max_batch_size / --max_num_tokens: BuildConfig's 2048 / 8192 in every line read
    assert (rel.max_batch_size, rel.max_num_tokens) == (2048, 8192)


def test_the_default_backend_by_release():
    assert [parse_trtllm(f"trtllm@{v}").backend for v in ("0.17", "0.18", "0.19", "0.20", "0.21", "1.0", "1.1", "1.2")] \
        == ["tensorrt"] * 5 + ["pytorch"] * 3


@pytest.mark.parametrize("spec, seqs, tokens", [("trtllm@0.13", 256, 8192), ("trtllm@0.19", 2048, 8192),
                                                ("trtllm@1.2", 2048, 8192)])
def test_the_simulators_limits_follow_the_release(spec, seqs, tokens):
    card = load_model_card(LLAMA_8B)
    b = get_engine(spec).budget(card, get_gpu("h100-sxm"), trt(spec))
    lim = SchedLimits.of(b)
    assert (lim.max_num_seqs, lim.max_num_batched_tokens) == (seqs, tokens)


def test_cuda_graphs_enter_the_peak_from_1_0_only():
    """0.20's PyTorch backend captures no graphs by default, 1.0's does: with everything else equal, 0.20's pool
    is larger by 0.9 x 1.0's graph term (the fraction of free memory), to a block's rounding."""
    card, gpu = load_model_card(LLAMA_8B), get_gpu("h100-sxm")
    old = get_engine("trtllm@0.20:pytorch").budget(card, gpu, trt("trtllm@0.20:pytorch"))
    new = get_engine("trtllm@1.0").budget(card, gpu, trt("trtllm@1.0"))
    assert old.cuda_graph_bytes == 0.0 and new.cuda_graph_bytes > 0
    assert old.weights_bytes == new.weights_bytes and old.activation_bytes == new.activation_bytes
    np.testing.assert_allclose(old.kv_budget_bytes - new.kv_budget_bytes, 0.9 * new.cuda_graph_bytes, rtol=1e-9)


def test_a_release_with_graphs_off_counts_a_given_graph_term():
    """cuda_graph_bytes given (use_cuda_graph / cuda_graph_config set in the options file) enters 0.21's peak."""
    card, gpu = load_model_card(LLAMA_8B), get_gpu("h100-sxm")
    b = get_engine("trtllm@0.21:pytorch").budget(card, gpu, trt("trtllm@0.21:pytorch", cuda_graph_bytes=GiB))
    assert b.cuda_graph_bytes == GiB and b.ranges["cuda_graphs"] == [GiB, GiB]


def test_0_17s_high_end_counts_the_cached_activation_twice():
    card, gpu = load_model_card(LLAMA_8B), get_gpu("h100-sxm")
    a17 = get_engine("trtllm@0.17:pytorch").budget(card, gpu, trt("trtllm@0.17:pytorch")).ranges["activation"]
    a18 = get_engine("trtllm@0.18:pytorch").budget(card, gpu, trt("trtllm@0.18:pytorch")).ranges["activation"]
    assert a17[0] == a18[0] and a17[1] > a18[1]


def test_the_estimators_bytes_per_token_at_tp_above_the_kv_heads():
    """Qwen3-235B-A22B: 94 layers, 4 KV heads of 128, bf16 KV. get_cache_size_per_token: 2 x 94 x (128 x 4 // 8)
    x 2 = 24,064 B at tp 8; the pool keeps ceil(4 / 8) = 1 head: 2 x 94 x 128 x 2 = 48,128 B; twice. At tp 4
    both are 48,128."""
    card = load_model_card(QWEN3_235B)
    assert kv_estimate.estimator_bytes_per_token(card, "bf16", 8) == 24_064
    assert kv_bytes_per_token(card, "bf16", 8) == 48_128
    assert kv_estimate.inflation(card, "bf16", 8, 48_128) == 2.0
    assert kv_estimate.inflation(card, "bf16", 4, kv_bytes_per_token(card, "bf16", 4)) == 1.0


def _issue_5872(spec: str, tp: int, ep: int):
    card = load_model_card(QWEN3_235B)
    gpu = with_memory(get_gpu("h200-sxm"), 140.06)  # the log's "Total GPU memory (GiB): 140.06"
    return get_engine(spec).budget(card, gpu, trt(spec, tensor_parallel_size=tp, moe_expert_parallel_size=ep,
                                                  enable_prefix_caching=False), check_fit=False)


def test_issue_5872_tp8_ep8_on_1_0_cannot_create_its_pool():
    """The log: free before the model 139.55 GiB, after 110.70 (weights 28.85 a rank); the KV cache could not be
    created with 108.86 GiB free. The estimate's max_tokens is twice what its memory holds in the pool, so 1.0 asks
    for about twice the ~96 GiB estimated; at tp 4 / ep 4 (which the reporter says starts) the two agree."""
    b = _issue_5872("trtllm@1.0", 8, 8)
    assert not b.fits and "KV heads" in b.reason
    np.testing.assert_allclose(b.weights_bytes / GiB, 139.55 - 110.70, rtol=0.05)  # the card's count, -4%
    assert _issue_5872("trtllm@1.0", 4, 4).fits
    assert _issue_5872("trtllm@1.1", 8, 8).fits  # max_gpu_total_bytes bounds the pool (the 1.2-era copy)


def test_expert_parallel_weights_are_whole_experts():
    """At tp 8 / ep 8 a rank holds 128 / 8 = 16 whole experts of each of 94 layers: gate_up 2 x 1,536 x 4,096 and
    down 4,096 x 1,536 FP8 (1 B) elements, 16 x 94 x 3 x 6,291,456 = 28,387,049,472 B, plus the block scales;
    ep 2 holds 64 experts split over moe_tp 4: the same bytes."""
    card = load_model_card(QWEN3_235B)
    assert moe_layout(card, trt("trtllm@1.0", moe_expert_parallel_size=8), 8, False) == (8, 1)
    assert moe_layout(card, trt("trtllm@1.0", moe_expert_parallel_size=2), 8, False) == (2, 4)
    per = weight_bytes_per_rank(card, 8, ep=8)
    experts = per["experts_gate_up"] + per["experts_down"]
    np.testing.assert_allclose(experts, 28_387_049_472, rtol=0.01)
    w8 = weights_per_rank(card, trt("trtllm@1.0", moe_expert_parallel_size=8), 8)
    w2 = weights_per_rank(card, trt("trtllm@1.0", moe_expert_parallel_size=2), 8)
    np.testing.assert_allclose(w8, w2, rtol=1e-9)


@pytest.mark.parametrize("model, tp, ep, words", [
    (QWEN3_235B, 8, 3, "does not divide tensor_parallel_size 8"),
    (LLAMA_8B, 2, 2, "no experts"),
])
def test_bad_expert_parallel_sizes_are_one_line(model, tp, ep, words):
    card = load_model_card(model)
    with pytest.raises(ConfigError) as e:
        get_engine("trtllm@1.0").budget(card, get_gpu("h200-sxm"),
                                        trt("trtllm@1.0", tensor_parallel_size=tp, moe_expert_parallel_size=ep))
    assert words in str(e.value) and f"moe_expert_parallel_size {ep}" in str(e.value)


def test_an_expert_count_ep_does_not_divide_is_one_line():
    """60 experts (Qwen1.5-MoE-A2.7B's count) over ep 8: MoE keeps num_experts // ep whole experts a rank."""
    card = load_model_card(QWEN3_235B)
    card = card.model_copy(update={"moe": card.moe.model_copy(update={"num_experts": 60})})
    with pytest.raises(ConfigError) as e:
        moe_layout(card, trt("trtllm@1.0", moe_expert_parallel_size=8), 8, False)
    assert str(e.value).startswith("moe_expert_parallel_size 8: does not divide") and "60 experts" in str(e.value)
    with pytest.raises(ConfigError) as e:  # the engine backend's MoE is not modelled
        moe_layout(load_model_card(QWEN3_235B), trt("trtllm@1.0", moe_expert_parallel_size=8), 8, True)
    assert "engine backend" in str(e.value)


def test_the_cli_refuses_a_bad_ep_in_one_line_and_launches_with_ep_size():
    r = run_cli("memory", "--model", str(QWEN3_235B), "--gpu", "h200-sxm", "--tp", "8", "--engine", "trtllm@1.0",
                "--trtllm-ep-size", "3")
    assert r.returncode == 1 and "moe_expert_parallel_size 3" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    card, cfg = load_model_card(QWEN3_235B), trt("trtllm@1.1", tensor_parallel_size=8, moe_expert_parallel_size=8)
    eng = get_engine("trtllm@1.1")
    assert "--ep_size 8" in eng.launch_command(card, cfg, eng.budget(card, get_gpu("h200-sxm"), cfg))
