"""SGLang's memory terms release line by release line (capacity/engine/sglang/releases.py, ep.py). Every number
pinned here is computed by hand from the rule read in that release's wheel (file and function in the comments and in
docs/sglang.md, "Terms per release line"), or printed in a start-up log; none is copied from capacity."""
from __future__ import annotations

import pytest

from capacity.engine.sglang.ep import check_ep, ep_weights
from capacity.engine.sglang.memory import sglang_budget
from capacity.engine.sglang.releases import (
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_mem_fraction_static,
    mm_reservation_bytes,
    parse_release,
    rope_cache_factor,
    spec_reserve_mib,
    version_key,
)
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.model.weights import weight_bytes_per_rank
from tests.conftest import ROOT, run_cli

H100, H200, B200, RTX4090, RTX5090 = 81559, 143771, 183359, 24564, 32607  # nvidia-smi totals, MiB
HF = ROOT / "tests/data/hf"
MiB = 1 << 20


def card(path: str):
    return load_model_card(ROOT / path if path.startswith("models/") else HF / path)


def test_tp8_fraction_of_the_0_3_lines():
    """server_args.py `__post_init__`: 0.83 at TP 8 in 0.3.0-0.3.5 (read in 0.3.0, 0.3.1, 0.3.2, 0.3.4, 0.3.5), 0.82
    in 0.3.6 and 0.3.6.post3, 0.81 from 0.4.0; the rest of the table (0.88, 0.87, 0.85, 0.79) is unchanged."""
    assert [parse_release(f"sglang@{v}") for v in ("0.3.0", "0.3.1", "0.3.5", "0.3.6.post3", "0.4.1")] == \
        ["0.3.0", "0.3.1", "0.3.2", "0.3.6", "0.4.0"]
    assert default_mem_fraction_static(H100, 8, "0.3.0") == 0.83
    assert default_mem_fraction_static(H100, 8, "0.3.6") == 0.82
    assert default_mem_fraction_static(H100, 8, "0.4.0") == 0.81
    assert [default_mem_fraction_static(H100, tp, "0.3.0") for tp in (1, 2, 4, 16)] == [0.88, 0.87, 0.85, 0.79]


def test_chunk_and_graph_defaults_per_line():
    """chunked_prefill_size: a fixed 8,192 to 0.3.5; `gpu_mem < 25_000` -> 2,048 from 0.3.6; 0.4.7: 16,384 over
    180,000 MiB; 0.4.7.post1-0.5.2: < 35 GiB 2,048, < 160 GiB 8,192, else 16,384 (so a 32 GiB RTX 5090 moves from
    8,192 to 2,048). cuda_graph_max_bs: 4 under 25,000 MiB in 0.3.6; 8 (80 at TP >= 4) under 25,000 MiB from
    0.4.0, under 35 GiB from 0.4.7.post1; `_handle_gpu_memory_settings` 16 at 20-35 GiB and TP < 4 in 0.5.3-0.5.4,
    24 from 0.5.5."""
    assert default_chunked_prefill_size(RTX4090, "0.3.0") == 8192
    assert default_chunked_prefill_size(RTX4090, "0.3.6") == 2048
    assert default_chunked_prefill_size(B200, "0.4.6.post2") == 8192
    assert default_chunked_prefill_size(B200, "0.4.7") == 16384
    assert default_chunked_prefill_size(RTX5090, "0.4.6") == 8192
    assert default_chunked_prefill_size(RTX5090, "0.4.7.post1") == 2048
    assert default_chunked_prefill_size(B200, "0.4.9") == 16384
    assert default_cuda_graph_max_bs(H100, 1, "0.3.0") == 160
    assert default_cuda_graph_max_bs(RTX4090, 1, "0.3.6") == 4
    assert default_cuda_graph_max_bs(RTX4090, 4, "0.4.0") == 80
    assert default_cuda_graph_max_bs(RTX5090, 1, "0.4.6") == 160 and default_cuda_graph_max_bs(RTX5090, 1, "0.4.9") == 8
    assert default_cuda_graph_max_bs(RTX4090, 1, "0.5.3") == 16 and default_cuda_graph_max_bs(RTX4090, 1, "0.5.5") == 24
    # 0.5.3's F on a 4090 at TP 1: reserve 512 + 2048 x 1.5 + 16 x 2 + 1024 / 8 = 3,744 MiB
    assert default_mem_fraction_static(RTX4090, 1, "0.5.3") == round((RTX4090 - 3744) / RTX4090, 3) == 0.848


def test_speculative_reserve_per_line():
    """0.4.7: x 0.95 up to 96 GiB, 20 GiB instead of 18 above; 0.4.7.post1-0.5.1: + 2 GiB for any algorithm;
    0.5.2-0.5.9: STANDALONE + 6 GiB, NGRAM none, EAGLE + 2 GiB (after the 10 GiB floor from 0.5.3); 0.5.10-0.5.12:
    EAGLE + 4 GiB; from 0.5.15 (memory_hook.py in 0.5.19+) nothing."""
    assert default_mem_fraction_static(H100, 1, "0.4.7", speculative="EAGLE") == pytest.approx(0.88 * 0.95)
    f = min(0.88 + 48 * 1024 * 0.12 / H200, (H200 - 20 * 1024) / H200)
    assert default_mem_fraction_static(H200, 1, "0.4.7", speculative="EAGLE") == pytest.approx(f)
    assert default_mem_fraction_static(H100, 1, "0.4.9", speculative="EAGLE") == round((H100 - 10240 - 2048) / H100, 3)
    base = 512 + 8192 * 1.5 + 256 * 2 + 1024 / 8  # 0.5.5 on an H100 at TP 1: 13,440 MiB
    assert default_mem_fraction_static(H100, 1, "0.5.5", speculative="EAGLE") == round((H100 - base - 2048) / H100, 3)
    assert default_mem_fraction_static(H100, 1, "0.5.5", speculative="STANDALONE") == round((H100 - base - 6144) / H100, 3)
    assert default_mem_fraction_static(H100, 1, "0.5.5", speculative="NGRAM") == default_mem_fraction_static(H100, 1, "0.5.5")
    piecewise = 58 * 8  # the prefill graph's 58 capture sizes up to 8,192 (0.5.10)
    assert default_mem_fraction_static(H100, 1, "0.5.10", speculative="EAGLE") == \
        round((H100 - base - piecewise - 4096) / H100, 3) == 0.779
    assert default_mem_fraction_static(H100, 1, "0.5.20", speculative="EAGLE") == default_mem_fraction_static(H100, 1)
    assert [spec_reserve_mib("EAGLE", version_key(v)) for v in ("0.4.7", "0.5.1", "0.5.9", "0.5.12", "0.5.15")] == \
        [0, 2048, 2048, 4096, 0]


def test_speculative_reserve_reaches_the_budget_through_the_engine_config():
    from capacity.engine import get_engine
    from capacity.engine.config import EngineConfig
    from capacity.files import validate

    c, gpu = card("models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")
    plain = get_engine("sglang@0.5.5").budget(c, gpu, validate(EngineConfig, {"engine": "sglang@0.5.5"}, "engine"))
    cfg = validate(EngineConfig, {"engine": "sglang@0.5.5", "speculative": {
        "method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7, "draft_path": "x/eagle"}}, "engine")
    spec = get_engine("sglang@0.5.5").budget(c, gpu, cfg)
    assert spec.kv_tokens < plain.kv_tokens
    assert any("speculative decoding (EAGLE)" in w for w in spec.warnings)


def test_multimodal_reservation_from_0_5_18():
    """`_profile_available_bytes` (kv_cache_configurator.py, 0.5.18-0.5.23): rest = A - T0 (1 - F) -
    SGLANG_VLM_CACHE_SIZE_MB (100) for a multimodal model; 0.5.17 has no such term. At a given F the pool is
    100 MiB / cell smaller: Llama-3.2-11B-Vision's cell is 8 x 128 x 40 x 2 x 2 B = 163,840 B, 640 tokens."""
    vlm, gpu = card("llama-3.2-11b-vision-instruct.json"), get_gpu("h100-sxm")
    assert mm_reservation_bytes(vlm, "0.5.15") == 0 and mm_reservation_bytes(vlm, "0.5.18") == 100 * MiB
    assert mm_reservation_bytes(card("models/llama-3.1-8b.yaml"), "0.5.18") == 0
    assert mm_reservation_bytes(card("gemma-3-27b-it.json"), "0.5.20") == 0  # text-only unless --enable-multimodal
    old = sglang_budget(vlm, gpu, 1, release=parse_release("sglang@0.5.17"), mem_fraction_static=0.8)
    new = sglang_budget(vlm, gpu, 1, release=parse_release("sglang@0.5.18"), mem_fraction_static=0.8)
    assert old.kv_bytes_per_token == new.kv_bytes_per_token == 163_840
    assert old.kv_tokens - new.kv_tokens in (640, 641)


def test_rope_cache_in_float32_from_0_4_2_and_none_for_gemma3_before_0_5_10():
    """layers/rotary_embedding.py (0.4.2.post4 on): `if not _is_cuda: cache = cache.to(dtype)`, so on CUDA the cos/sin
    cache stays float32; 0.4.1 imports vLLM's get_rope (the model dtype). Llama-3.1-8B: 131,072 positions x 128 x
    (4 - 2) B = 32 MiB more from 0.4.2 (maxuhl98's 0.4.9 log: 'mem usage=15.02 GB' = 14.96 GiB of bf16 weights +
    the 64 MiB float32 cache). Gemma-3 (gemma3_causal.py, 0.4.4.post2-0.5.9): transformers-style
    Gemma3RotaryEmbedding, no cache; from 0.5.10 its attention takes get_rope: (131,072 + 8 x 131,072) x 128 x 4 B."""
    llama, gpu = card("models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")
    w = {r: sglang_budget(llama, gpu, 1, release=r).weights_bytes for r in ("0.4.0", "0.4.2")}
    assert w["0.4.2"] - w["0.4.0"] == 131_072 * 128 * 2
    assert (8_030_261_248 * 2 + 131_072 * 128 * 4) / 2**30 == pytest.approx(15.02, abs=0.005)
    assert w["0.4.2"] == pytest.approx((8_030_261_248 * 2 + 131_072 * 128 * 4), rel=1e-9)
    assert rope_cache_factor(llama, "0.4.2", amd=True) == 1.0  # ROCm: the dtype's
    gemma = card("gemma-3-27b-it.json")
    assert rope_cache_factor(gemma, "0.4.4.post1") == rope_cache_factor(gemma, "0.5.8") == 0.0
    g8 = sglang_budget(gemma, gpu, 1, release="0.5.8").weights_bytes
    g10 = sglang_budget(gemma, gpu, 1, release="0.5.10").weights_bytes
    assert g10 - g8 == 9 * 131_072 * 128 * 4


def test_deepseek_v2_pool_is_mha_before_0_3_2():
    """0.3.0-0.3.1: `enable_mla: bool = False`, so profile_max_num_token takes the MHA cell with model_config's
    head_dim = 256 for DeepseekV2ForCausalLM: DeepSeek-V2-Lite 16 KV heads x 256 x 27 layers x 2 x 2 B; from 0.3.2
    (`disable_mla: bool = False`) the latent: (512 + 64) x 27 x 2 B."""
    lite, gpu = card("deepseek-v2-lite.json"), get_gpu("h100-sxm")
    assert sglang_budget(lite, gpu, 1, release="0.3.0").kv_bytes_per_token == 16 * 256 * 27 * 2 * 2 == 442_368
    assert sglang_budget(lite, gpu, 1, release="0.3.2").kv_bytes_per_token == (512 + 64) * 27 * 2 == 31_104


def test_expert_parallelism_layout_and_refusals():
    """ep.py: whole experts over ep ranks, each split over tp / ep (fused_moe_triton/layer.py of 0.5.x:
    `num_local_experts = num_experts // moe_ep_size`, `intermediate_size // moe_tp_size`). Qwen3-30B-A3B: 128
    experts of 3 x 768 x 2,048 bf16 in 48 layers; at TP 4 with EP 4 a rank holds 32 whole ones, with EP 2 64 halves:
    the same 128 x 48 x 3 x 768 x 2048 x 2 / 4 B either way."""
    moe = card("qwen3-30b-a3b.json")
    per_rank = 128 * 48 * 3 * 768 * 2048 * 2 / 4
    for ep in (2, 4):
        w = ep_weights(moe, 4, ep, weight_bytes_per_rank(moe, 4))
        assert sum(v for k, v in w.items() if k.startswith("experts_")) == pytest.approx(per_rank)
    with pytest.raises(ConfigError, match="ep_size: 2: SGLang 0.4.1-0.5.2"):
        check_ep(moe, 4, 2, version_key("0.4.6"))
    with pytest.raises(ConfigError, match="before 0.4.1"):
        check_ep(moe, 4, 4, version_key("0.4.0"))
    with pytest.raises(ConfigError, match="no MoE experts"):
        check_ep(card("models/llama-3.1-8b.yaml"), 2, 2, version_key("0.5.5"))
    with pytest.raises(ConfigError, match="must divide the 8 experts"):
        check_ep(card("models/mixtral-8x7b.yaml"), 16, 16, version_key("0.5.5"))
    check_ep(moe, 4, 4, version_key("0.4.6"))  # --enable-ep-moe: ep_size = tp_size


def test_ep_size_on_the_command_line():
    args = ("memory", "--model", str(HF / "qwen3-30b-a3b.json"), "--gpu", "h100-sxm", "--tp", "4", "--engine",
            "sglang@0.5.5")
    ok = run_cli(*args, "--ep-size", "4")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli(*args, "--ep-size", "3")
    assert bad.returncode == 1 and "ep_size: 3 must divide tensor_parallel_size 4" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_mem_fraction_static_setting():
    """SglangConfig.mem_fraction_static is SGLang's --mem-fraction-static: rest = A - T0 (1 - F). Llama-3.1-8B on
    the catalogue H100 at 0.4.6: T0 = total - 0.5 GiB (the context's middle), A = T0 - (8,030,261,248 x 2 B + the
    float32 rope cache 131,072 x 128 x 4 B), cell 131,072 B; F 0.8 given, so no default rule. The launch command
    spells it once; out of (0, 1) it is refused naming the field."""
    from capacity.engine import get_engine
    from capacity.engine.config import EngineConfig
    from capacity.files import validate

    c, gpu = card("models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")
    cfg = validate(EngineConfig, {"engine": "sglang@0.4.6", "mem_fraction_static": 0.8}, "engine")
    em = get_engine("sglang@0.4.6")
    b = em.budget(c, gpu, cfg)
    t0 = gpu.usable_memory_bytes - 0.5 * 2**30
    a = t0 - (8_030_261_248 * 2 + 131_072 * 128 * 4)
    assert b.kv_tokens == int((a - t0 * 0.2) // 131_072)
    assert "mem_fraction_static" not in b.defaults_used
    assert em.launch_command(c, cfg, b).count("--mem-fraction-static") == 1
    with pytest.raises(ConfigError, match="mem_fraction_static"):
        validate(EngineConfig, {"engine": "sglang", "mem_fraction_static": 1.0}, "engine")


def test_request_table_cap_of_0_3_0():
    """model_runner.py init_memory_pool: max_num_reqs = min(max(int(tokens / context_len x 512), 2048), cap), cap
    5120 in 0.3.0 and 4096 from 0.3.1 (read in 0.3.1, 0.3.2, 0.3.4-0.3.6). The request table: ReqToTokenPool(
    max_num_reqs) in 0.3.0-0.3.1, max_num_reqs + 1 rows from 0.3.2; max_running_requests = min(tokens // 2,
    req_to_token_pool.size - 1) in 0.3.0 (tp_worker.py), min(.., size) in 0.3.1-0.4.8. MI300X log: 1,256,440 tokens
    at context 8,192: int(1,256,440 / 8,192 x 512) = 78,527, capped."""
    from capacity.engine.sglang.memory import max_running_requests

    assert max_running_requests(1_256_440, 8192, release="0.3.0") == 5120 - 1
    assert max_running_requests(1_256_440, 8192, release="0.3.1") == 4096
    assert max_running_requests(1_256_440, 8192, release="0.3.2") == 4096 + 1


def test_draft_is_outside_the_pool_before_0_5_15():
    """Up to 0.5.12 (read in 0.4.3-0.5.10) the EAGLE/STANDALONE draft worker is built after the target's pool is
    sized (its weights and its own pool come out of T0 x (1 - F), which the default F's speculative reserve makes
    room for); from 0.5.15 `_profile_available_bytes` counts 'Loaded weights (target + draft)'. So the draft leaves
    the 0.5.5 pool alone and takes from the 0.5.20 one."""
    from capacity.engine import get_engine, speculative
    from capacity.engine.config import EngineConfig
    from capacity.files import validate

    c, gpu = card("models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "acceptance_rate": 0.7,
            "draft_model": str(HF / "llama-3.2-1b.json")}
    for rel, moved in (("sglang@0.5.5", False), ("sglang@0.5.20", True)):
        cfg = validate(EngineConfig, {"engine": rel, "speculative": spec}, "engine")
        b = get_engine(rel).budget(c, gpu, cfg)
        out = speculative.with_draft(b, c, cfg.speculative, engine="sglang")
        assert (out.planning_blocks < b.planning_blocks) is moved, rel
        assert out.weights_bytes > b.weights_bytes if moved else any("reserve" in w for w in out.warnings)
