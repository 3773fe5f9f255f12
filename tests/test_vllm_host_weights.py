"""vLLM's --cpu-offload-gb and --kv-cache-memory-bytes (capacity/engine/vllm/host_weights.py), pinned on
hand-computed bytes of Llama-3.1-8B and DeepSeek-V2-Lite and on the figures of real logs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError, DoesNotFit
from capacity.files import validate
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu

GiB = 1024**3
HF = Path(__file__).parent / "data" / "hf"
# Llama-3.1-8B, one decoder layer in bf16 (hand-counted from config.json: hidden 4096, 32 heads, 8 KV heads of
# 128, intermediate 14336): q 4096x4096 + k,v 2x1024x4096 + o 4096x4096 + gate/up 2x14336x4096 + down 4096x14336
# + two norms of 4096 = 218,112,000 parameters
LLAMA_LAYER = 218_112_000 * 2
LLAMA_GATE_UP = 2 * 14336 * 4096 * 2  # the largest single parameter of a layer (MergedColumnParallelLinear)


def _budget(card_file: str, gpu: str = "h100-sxm", engine: str = "vllm@0.11", **flags):
    card = load_model_card(HF / card_file)
    cfg = validate(EngineConfig, {"engine": engine, **flags}, "test")
    return get_engine(engine).budget(card, get_gpu(gpu), cfg, check_fit=False)


def test_offload_moves_the_budget_off_the_gpu_weights():
    # 8 sequences: the sampler run's logits stay small beside an 8192-token forward
    base = _budget("llama-3.1-8b.json", max_model_len=8192, max_num_seqs=8)
    off = _budget("llama-3.1-8b.json", max_model_len=8192, max_num_seqs=8, cpu_offload_gb=4)
    assert base.weights_bytes - off.weights_bytes == pytest.approx(4 * GiB)  # at least the budget (the middle)
    lo, hi = off.ranges["weights"][0], base.ranges["weights"][0]
    assert lo == pytest.approx(hi - 4 * GiB)
    # the most offloaded: one parameter beyond the budget (gate/up is the largest a layer has)
    kv_hi_gain = off.ranges["kv_budget"][1] - base.ranges["kv_budget"][1]
    assert kv_hi_gain == pytest.approx(4 * GiB + LLAMA_GATE_UP)
    # the copy path: one whole offloaded layer is copied back for its forward, on top of the forward's activations
    # (not the sampler run's, which follows when the copies are freed): the peak is max(forward + layer, sampler)
    fwd = max(v for k, v in base.activation_phases.items() if k.startswith("forward"))
    assert fwd + LLAMA_LAYER > base.activation_bytes  # here the copied layer makes the forward the peak
    assert off.activation_bytes == pytest.approx(fwd + LLAMA_LAYER)
    gain = 4 * GiB - (fwd + LLAMA_LAYER - base.activation_bytes)
    assert off.kv_budget_bytes - base.kv_budget_bytes == pytest.approx(gain)
    assert off.ranges["activation"][0] == base.ranges["activation"][0]  # UVA (read in place): nothing copied


def test_offload_beyond_the_layers_keeps_embedding_and_head():
    base = _budget("llama-3.1-8b.json", max_model_len=8192)
    off = _budget("llama-3.1-8b.json", max_model_len=8192, cpu_offload_gb=100)
    # left on the GPU: the embedding and the LM head (128256 x 4096 each, bf16), the final norm, the rotary cache
    # (131072 positions x 128 x bf16: capacity.model.weights)
    left = 2 * 128256 * 4096 * 2 + 4096 * 2 + 131072 * 128 * 2
    assert off.weights_bytes == pytest.approx(left)
    assert base.weights_bytes - off.weights_bytes == pytest.approx(32 * LLAMA_LAYER)


def test_offload_real_log_kv_requirement_deepseek_v2_lite():
    """vllm-project/vllm#15871 (0.8.3.dev172 V1, DeepSeek-V2-Lite-Chat, offline LLM class, cpu_offload_gb 13, TP 1,
    eager, max_model_len 32768, max_num_batched_tokens 8192 as printed; the collect_env's bf16-capable GPU is an
    RTX 3090): the engine printed that one request needs 0.95 GiB of KV (MLA: (512 + 64) x 2 bytes x 27 layers a
    token) and that 0.93 GiB was available, and did not start."""
    flags = dict(max_model_len=32768, enforce_eager=True, max_num_batched_tokens=8192, usage_context="llm")
    b = _budget("deepseek-v2-lite.json", "rtx-3090", "vllm@0.8.3", cpu_offload_gb=13, **flags)
    assert b.kv_bytes_per_token == (512 + 64) * 2 * 27
    assert round(32768 * b.kv_bytes_per_token / GiB, 2) == 0.95
    assert not b.fits and "max_model_len 32,768" in b.reason  # as logged: 0.95 GiB needed
    assert abs(b.kv_budget_bytes / GiB - 0.93) <= max(0.05 * 0.93, 0.5)
    base = _budget("deepseek-v2-lite.json", "rtx-3090", "vllm@0.8.3", **flags)
    assert base.weights_bytes - b.weights_bytes == pytest.approx(13 * GiB)
    assert not base.fits and "weights need" in base.reason  # 29 GiB of weights: without offload it cannot load
    # with a large sampler run (1024 sequences x 102,400 logits) the copied layer's forward is not the peak
    big = _budget("deepseek-v2-lite.json", "a10", "vllm@0.8.3", max_model_len=32768, enforce_eager=True,
                  cpu_offload_gb=13, max_num_seqs=1024, max_num_batched_tokens=8192)
    plain = _budget("deepseek-v2-lite.json", "a10", "vllm@0.8.3", max_model_len=32768, enforce_eager=True,
                    cpu_offload_gb=0.001, max_num_seqs=1024, max_num_batched_tokens=8192)
    fwd = max(v for k, v in big.activation_phases.items() if k.startswith("forward"))
    assert big.activation_phases["sampler"] > fwd + 1.1 * GiB  # one MoE layer: 64 experts x 3 x 2048 x 1408 x 2 B
    assert big.activation_bytes == pytest.approx(plain.activation_bytes)


def test_kv_cache_memory_bytes_is_the_pool():
    b = _budget("llama-3.1-8b.json", max_model_len=8192, kv_cache_memory_bytes=4 * GiB)
    # a block: 16 tokens x 32 layers x (K and V) x 8 heads x 128 x 2 bytes = 2 MiB
    assert b.block_bytes == 16 * 32 * 2 * 8 * 128 * 2
    assert b.num_blocks == 4 * GiB // (2 * 1024**2) == 2048
    assert b.kv_tokens == 2048 * 16
    assert b.ranges["kv_budget"] == [4 * GiB, 4 * GiB] and b.planning_blocks == 2048
    assert b.fits and any("kv_cache_memory_bytes" in w for w in b.warnings)
    # gpu_memory_utilization does not size it (vLLM returns the bytes before profiling)
    low = _budget("llama-3.1-8b.json", max_model_len=8192, kv_cache_memory_bytes=4 * GiB, gpu_memory_utilization=0.3)
    assert low.num_blocks == 2048 and low.fits


def test_kv_cache_memory_bytes_more_than_the_gpu_does_not_fit():
    b = _budget("llama-3.1-8b.json", max_model_len=8192, kv_cache_memory_bytes=80 * GiB)
    assert not b.fits and "more than the" in b.reason
    with pytest.raises(DoesNotFit, match="kv_cache_memory_bytes"):
        get_engine("vllm@0.11").budget(load_model_card(HF / "llama-3.1-8b.json"), get_gpu("h100-sxm"),
                                       validate(EngineConfig, {"engine": "vllm@0.11", "max_model_len": 8192,
                                                               "kv_cache_memory_bytes": 80 * GiB}, "t"))
    short = _budget("llama-3.1-8b.json", max_model_len=131072, kv_cache_memory_bytes=4 * GiB)
    assert not short.fits and "max_model_len 131,072" in short.reason  # 16 GiB of KV for one request


@pytest.mark.parametrize("engine,flags,field", [
    ("vllm@0.10", {"kv_cache_memory_bytes": GiB}, "kv_cache_memory_bytes"),
    ("vllm@0.9:v0", {"kv_cache_memory_bytes": GiB}, "kv_cache_memory_bytes"),
    ("vllm@0.4", {"cpu_offload_gb": 2}, "cpu_offload_gb"),
])
def test_release_without_the_setting_is_refused(engine, flags, field):
    with pytest.raises(ConfigError, match=field):
        _budget("llama-3.1-8b.json", engine=engine, max_model_len=8192, **flags)


def test_cli_bad_value_one_line():
    for flag, value in (("--kv-cache-memory-bytes", "-5"), ("--cpu-offload-gb", "-1")):
        r = subprocess.run([sys.executable, "-m", "capacity.cli", "memory", "--model", str(HF / "llama-3.1-8b.json"),
                            "--gpu", "h100-sxm", flag, value], capture_output=True, text=True)
        assert r.returncode == 1, r.stderr
        out = (r.stderr + r.stdout).strip()
        assert len(out.splitlines()) == 1 and value in out and flag.lstrip("-").replace("-", "_") in out, out


def test_other_engine_refuses_the_setting():
    with pytest.raises(Exception, match="cpu_offload_gb"):
        validate(EngineConfig, {"engine": "sglang", "cpu_offload_gb": 2}, "test")


def test_blackwell_ultra_catalogue_entries():
    """B300 and GB300 (capacity/data/gpus.yaml from scripts/gpu_specs_more.yaml): NVIDIA's system totals divided
    per GPU by hand (HGX B300: 108 PFLOPS dense FP4, 72 sparse FP8, 36 sparse BF16 per 8 GPUs, 8 TB/s, 288 GB;
    GB300 NVL72: 1,100 PFLOPS dense FP4, 720 sparse FP8 per 72 GPUs)."""
    from capacity.model.gpus import match_gpu

    b = get_gpu("b300")
    assert (b.memory_bytes, b.mem_bw_bytes_per_s) == (288e9, 8e12)
    assert (b.fp4_flops, b.fp8_flops, b.bf16_flops) == (108e15 / 8, 72e15 / 8 / 2, 36e15 / 8 / 2)
    assert b.usable_memory_bytes == 268.0 * GiB  # the safe side of the public reports (no torch total seen)
    g = get_gpu("gb300-nvl72")
    assert g.fp8_flops == 720e15 / 72 / 2 and g.memory_bytes == 279e9
    assert match_gpu("NVIDIA B300 SXM6 AC") == "b300" and match_gpu("NVIDIA GB300") == "gb300"


def test_pipeline_parallel_real_log_dsv2_lite_4xl4():
    """vllm-project/vllm#20665: DeepSeek-V2-Lite with --tensor-parallel-size=2 --pipeline-parallel-size=2
    --max-model-len=1024 --enforce-eager on four L4s, a main build just after 0.9.2. Ranks 0-1 (stage 0) print
    12.13 GiB of KV memory, ranks 2-3 11.33 GiB; the engine keeps the tighter stage: 807,792 tokens. Stage 0 holds
    14 of the 27 layers (get_pp_indices: 13 each, the remainder to the first): 12.13 GiB / (14 x 1152 bytes, MLA's
    512 + 64 bf16 values a layer) = 807,5xx tokens, the printed figure to the rounding of 12.13."""
    b = _budget("deepseek-v2-lite.json", "l4", "vllm@0.9", tensor_parallel_size=2, pipeline_parallel_size=2,
                max_model_len=1024, enforce_eager=True)
    assert int(12.13 * GiB / (14 * 1152)) // 1000 == 807_792 // 1000
    assert b.kv_bytes_per_token == 14 * 1152 and b.fits
    assert abs(b.kv_budget_bytes / GiB - 12.13) <= max(0.05 * 12.13, 0.5)
    assert abs(b.kv_tokens - 807_792) <= 0.05 * 807_792


def test_model_runner_v2_ignores_the_offload():
    """Model Runner V2 (the default for dense models from vLLM 0.26 in capacity.engine.vllm.release) never installs
    the offloader (vllm-project/vllm#51396, #56283): a dense model keeps every weight on the GPU; for a MoE model
    (the V2 list varies) the conservative end counts on no offload."""
    base = _budget("llama-3.1-8b.json", engine="vllm@0.26", max_model_len=8192)
    off = _budget("llama-3.1-8b.json", engine="vllm@0.26", max_model_len=8192, cpu_offload_gb=4)
    assert off.weights_bytes == base.weights_bytes and off.num_blocks == base.num_blocks
    assert any("Model Runner V2" in w for w in off.warnings)
    moe0 = _budget("qwen3-30b-a3b.json", engine="vllm@0.26", max_model_len=8192)
    moe = _budget("qwen3-30b-a3b.json", engine="vllm@0.26", max_model_len=8192, cpu_offload_gb=4)
    assert moe0.weights_bytes - moe.weights_bytes == pytest.approx(4 * GiB)  # the middle: offloaded as V1 does
    assert moe.ranges["kv_budget"][0] <= moe0.ranges["kv_budget"][0]  # the conservative end: not offloaded
    assert moe.planning_blocks <= moe0.planning_blocks


def test_offload_says_the_step_cost_omits_host_reads():
    off = _budget("llama-3.1-8b.json", max_model_len=8192, cpu_offload_gb=4)
    assert any("4.00-4.22 GiB of weights per GPU in host memory" in w and "optimistic" in w for w in off.warnings)
