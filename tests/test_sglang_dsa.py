"""Start-up memory terms SGLang's and TensorRT-LLM's budgets were missing (issue 46): DeepSeek-V3.2's indexer cache
(capacity/engine/sglang/dsa.py, capacity/engine/trtllm/kv_estimate.py), the experts-only high end of an overridden
MoE checkpoint, and vLLM's int8 KV refusal. Byte counts are worked out by hand from the engines' formulas (quoted in
each test), never taken from the functions under test."""
from __future__ import annotations

from pathlib import Path

import pytest

from capacity.engine import get_engine
from capacity.engine.sglang.config import SglangConfig
from capacity.engine.sglang.memory import LOAD_EXTRA_HIGH_GIB, pool_tokens, sglang_budget
from capacity.engine.trtllm.config import TrtllmConfig
from capacity.engine.vllm.config import VllmConfig
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.model.weights import experts_only_alternative, weight_bytes_per_rank

ROOT = Path(__file__).resolve().parents[1]
V32 = ROOT / "tests/data/families/deepseek-v3.2-exp.json"
GiB = 1024**3
LAYERS = 61  # DeepSeek-V3.2: num_hidden_layers
INDEXER = 128 + 128 // 128 * 4  # index_head_dim fp8 bytes + one fp32 scale per 128: 132
MLA_BF16 = (512 + 64) * 2  # kv_lora_rank + qk_rope_head_dim, bf16: 1152
MLA_FP8_SIZED = (512 + 64) * 1  # what profile_max_num_token counts for fp8 before 0.5.17: 576
MLA_FP8_POOL = 512 + 512 // 128 * 4 + 64 * 2  # fp8 latent + fp32 scale per 128 + bf16 rope: 656


@pytest.fixture(scope="module")
def v32():
    return load_model_card(V32)


@pytest.mark.parametrize("gpu, release, per_layer, dtype", [
    ("h200", "sglang@0.5.5", MLA_BF16 + INDEXER, ""),  # Hopper: auto stays bf16: 1284 B a layer
    ("b200", "sglang@0.5.5", MLA_FP8_SIZED + INDEXER, "fp8"),  # SM100: auto becomes fp8; cell 576 + 132 = 708
    ("b200", "sglang@0.5.20", MLA_FP8_POOL + INDEXER, "fp8"),  # 0.5.17+: calculate_mla_kv_cache_dim, 656 + 132 = 788
])
def test_sglang_sizes_the_pool_with_the_indexer_in_every_token(v32, gpu, release, per_layer, dtype):
    sb = sglang_budget(v32, get_gpu(gpu), 8, release=get_engine(release).release, dp_attention=8)
    assert sb.kv_bytes_per_token == per_layer * LAYERS  # e.g. 1284 x 61 = 78,324 B
    assert sb.page_size == 64 and sb.kv_tokens % 64 == 0  # server_args: page 64 for DSA on CUDA
    assert sb.kv_dtype == dtype
    assert any("indexer" in n for n in sb.notes)


def test_the_b300_log_allocates_656_plus_132_bytes_a_token_and_layer(v32):
    """sglang#14700 (tests/data/startup_v3/sglang_dev.yaml, dev group; B300, fp8 KV): 'KV Cache is allocated.
    #tokens: 3627136, KV size: 162.38 GB' (SGLang's GB is 2^30 bytes). 3,627,136 x 61 x (656 + 132) B = 162.375 GiB:
    the pool holds the 656-byte fp8 MLA layout and the 132-byte indexer key of every token and layer. (With 576 + 132
    it would be 145.9 GiB.) Its sizing cell is 576 + 132 in the releases before 0.5.17: with the log's A = 172.51
    GiB and T0 = A + 93.06 GiB of weights, a 708-byte cell gives its token count at F = 0.90, a 788-byte one would need
    F = 0.96 (F is not printed; 0.9 is a common setting)."""
    tokens = 3_627_136
    assert tokens * LAYERS * (MLA_FP8_POOL + INDEXER) / GiB == pytest.approx(162.38, abs=0.005)
    assert tokens * LAYERS * (MLA_FP8_SIZED + INDEXER) / GiB == pytest.approx(145.89, abs=0.01)
    t0, a = 172.51 + 93.06, 172.51
    got = pool_tokens(t0, a, 0.90, LAYERS * (MLA_FP8_SIZED + INDEXER), 64)
    assert got == pytest.approx(tokens, rel=0.001)
    sb = sglang_budget(v32, get_gpu("b200"), 8, release="0.5.5", dp_attention=8, mem_fraction_static=0.9)
    assert sb.kv_pool_bytes == sb.kv_tokens * LAYERS * (MLA_FP8_POOL + INDEXER)  # what the pool allocates
    assert any("more than it sized" in n for n in sb.notes)  # 80 B a token and layer out of the reserve


def test_the_015_line_takes_the_larger_cell_at_its_conservative_end(v32):
    """0.5.15-0.5.17 share a rules line: 0.5.15 sizes fp8 at 576 + 132, 0.5.17 at 656 + 132 (the conservative end)."""
    gpu = get_gpu("b200")
    mid = sglang_budget(v32, gpu, 8, release="0.5.15", dp_attention=8, mem_fraction_static=0.85)
    new = sglang_budget(v32, gpu, 8, release="0.5.18", dp_attention=8, mem_fraction_static=0.85)
    assert mid.kv_tokens > mid.kv_tokens_low == new.kv_tokens_low


def test_sglang_refuses_v32_before_its_nsa_pool_in_one_line(v32):
    with pytest.raises(ConfigError, match=r"0\.5\.3") as err:
        sglang_budget(v32, get_gpu("h200"), 8, release="0.5.2", dp_attention=8)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="ROCm"):
        sglang_budget(v32, get_gpu("mi300x"), 8, release="0.5.5")


@pytest.mark.parametrize("kv, per_layer", [("auto", (576 + 132) * 2), ("fp8", (576 + 132) * 1)])
def test_trtllm_counts_the_indexer_in_the_kv_dtype(v32, kv, per_layer):
    """DSACacheManager.get_cache_size_per_token: mem_per_token = dtype bytes x layers x (kv_lora_rank + rope) x
    (1 + (index_head_dim + index_head_dim // 128 x 4) / (kv_lora_rank + rope)) = dtype bytes x 61 x (576 + 132)."""
    b = get_engine("trtllm@1.2").budget(v32, get_gpu("b200"), TrtllmConfig(engine="trtllm@1.2", tensor_parallel_size=8,
                                                                           kv_cache_dtype=kv), check_fit=False)
    assert b.kv_bytes_per_token == per_layer * LAYERS  # bf16: 86,376 B; fp8: 43,188 B


@pytest.mark.parametrize("spec, said", [("trtllm@1.1", "arrived in TensorRT-LLM 1.2"),
                                        ("trtllm@1.2:tensorrt", "PyTorch backend only")])
def test_trtllm_refuses_v32_where_it_has_no_dsa_model(v32, spec, said):
    with pytest.raises(ConfigError, match=said) as err:
        get_engine(spec).budget(v32, get_gpu("b200"), TrtllmConfig(engine=spec, tensor_parallel_size=8))
    assert "\n" not in str(err.value)


# ---- the experts-only high end (capacity.model.weights.experts_only_alternative) --------------------------------
def _moe_override():
    base = load_model_card(ROOT / "capacity/data/models/mixtral-8x7b.yaml")
    card = base.with_overrides(weight_dtype="int4", quant_group_size=128)
    alt = experts_only_alternative(card)
    assert alt is not None
    return card, alt


def test_sglang_plans_on_the_experts_alone_quantised():
    card, alt = _moe_override()
    gpu = get_gpu("h100-sxm")
    w_all, w_alt = (sum(weight_bytes_per_rank(c, 1).values()) for c in (card, alt))
    assert w_alt > w_all + GiB  # attention and dense layers at bf16 instead of int4
    b = get_engine("sglang@0.5.5").budget(card, gpu, SglangConfig(engine="sglang@0.5.5", max_model_len=8192))
    sb = sglang_budget(card, gpu, 1, release="0.5.5", context_len=8192)
    assert 0 <= sb.weights_bytes - w_all < 0.05 * GiB  # the middle: every layer int4 (+ the rope cache)
    assert b.ranges["weights"][1] == pytest.approx(w_alt + (sb.weights_bytes - w_all) + LOAD_EXTRA_HIGH_GIB * GiB)
    # the conservative pool: SGLang's formula with the high weights (rest = A - T0 (1 - F), tokens = rest // cell)
    t0_low = sb.total_bytes - sb.context_high_bytes
    w_hi = w_alt + (sb.weights_bytes - w_all)  # the rope cache on top, as in the middle
    rest = (t0_low - w_hi - LOAD_EXTRA_HIGH_GIB * GiB) - t0_low * (1 - sb.mem_fraction_static)
    assert sb.kv_tokens_low == int(rest // sb.kv_bytes_per_token)
    assert b.planning_blocks < b.num_blocks
    assert any("experts alone" in e for e in b.estimates)


@pytest.mark.parametrize("spec", ["trtllm@1.2", "trtllm@1.0"])
def test_trtllm_plans_on_the_experts_alone_quantised(spec):
    card, alt = _moe_override()
    w_alt = sum(weight_bytes_per_rank(alt, 1).values())
    b = get_engine(spec).budget(card, get_gpu("h100-sxm"), TrtllmConfig(engine=spec, max_model_len=8192),
                                check_fit=False)
    assert b.ranges["weights"][1] == pytest.approx(w_alt)  # the PyTorch backend (the engine backend refuses MoE)
    assert b.num_blocks_range[0] < b.num_blocks


# ---- vLLM: int8 KV is no choice of any release ---------------------------------------------------------------
@pytest.mark.parametrize("spec", ["vllm", "vllm@0.11", "vllm@0.4.2"])
def test_vllm_refuses_int8_kv_on_every_release(spec):
    with pytest.raises(ConfigError, match="kv_cache_dtype int8") as err:
        get_engine(spec).resolve(VllmConfig(engine=spec, kv_cache_dtype="int8"), load_model_card(
            ROOT / "capacity/data/models/llama-3.1-8b.yaml"), get_gpu("h100-sxm"))
    assert "\n" not in str(err.value)


# ---- SGLang LoRA: LoRAMemoryPool's buffers, allocated before the pool is sized (capacity/engine/sglang/lora.py) ----
def _lora_cfg(release: str = "sglang@0.5.5", **kw):
    return SglangConfig(engine=release, max_model_len=8192, enable_lora=True, **kw)


def test_sglang_lora_buffers_of_llama_8b_by_hand():
    """Llama-3.1-8B (hidden 4096, 32 heads of 128, 8 KV heads, intermediate 14336, 32 layers, bf16), 8 slots of rank
    64 on all four linear modules, tp 1. Per slot and layer, A (N, R x c, in) + B (N, out, R):
    qkv_proj 3 x 64 x 4096 + 128 x (32 + 16) x 64 = 1,179,648; o_proj 64 x 4096 + 4096 x 64 = 524,288;
    gate_up_proj 2 x 64 x 4096 + 2 x 14336 x 64 = 2,359,296; down_proj 64 x 14336 + 4096 x 64 = 1,179,648:
    5,242,880 elements, x 32 layers x 8 slots x 2 B = 2,684,354,560 B = 2.5 GiB. At tp 2 the split dims halve:
    qkv 786,432 + 196,608, o 131,072 + 262,144, gate_up 524,288 + 917,504, down 458,752 + 262,144 = 3,538,944."""
    card = load_model_card(ROOT / "capacity/data/models/llama-3.1-8b.yaml")
    gpu, e = get_gpu("h100-sxm"), get_engine("sglang@0.5.5")
    base = e.budget(card, gpu, SglangConfig(engine="sglang@0.5.5", max_model_len=8192))
    lora = e.budget(card, gpu, _lora_cfg(lora_rank=64))
    assert lora.weights_bytes - base.weights_bytes == 2_684_354_560
    cell = 8 * 128 * 32 * 2 * 2  # the KV cell: 131,072 B a token
    assert base.kv_tokens - lora.kv_tokens == pytest.approx(2_684_354_560 / cell, abs=1)  # 20,480 tokens fewer
    assert any("LoRA: 8 adapter slots of rank 64" in w for w in lora.warnings)
    lora2 = e.budget(card, gpu, _lora_cfg(lora_rank=64, tensor_parallel_size=2))
    base2 = e.budget(card, gpu, SglangConfig(engine="sglang@0.5.5", max_model_len=8192, tensor_parallel_size=2))
    assert lora2.weights_bytes - base2.weights_bytes == 3_538_944 * 32 * 8 * 2
    # target modules name q/k/v_proj as qkv_proj; 4 slots of rank 16 on q_proj and v_proj only:
    # (3 x 16 x 4096 + 6144 x 16) x 32 x 4 x 2 = 75,497,472 B
    qv = e.budget(card, gpu, _lora_cfg(lora_rank=16, max_loras_per_batch=4, lora_target_modules=["q_proj", "v_proj"]))
    assert qv.weights_bytes - base.weights_bytes == 75_497_472
    # from 0.5.9 (the 0.5.8 rules line) `all` adds embed_tokens (A: R x vocab, B: hidden x R) and lm_head (A: R x
    # hidden, B: vocab x R), once each: 2 x (16 x 128,256 + 4096 x 16) x 4 slots x 2 B = 33,882,112 B more
    e9 = get_engine("sglang@0.5.9")
    new = e9.budget(card, gpu, _lora_cfg("sglang@0.5.9", lora_rank=16, max_loras_per_batch=4))
    base9 = e9.budget(card, gpu, SglangConfig(engine="sglang@0.5.9", max_model_len=8192))
    linear = 5_242_880 // 4 * 32 * 4 * 2  # rank 16 is a quarter of rank 64's elements
    assert new.weights_bytes - base9.weights_bytes == linear + 33_882_112


@pytest.mark.parametrize("kw, release, said", [
    ({}, "sglang@0.5.5", "lora_rank: needed with enable_lora"),
    ({"lora_rank": 8}, "sglang@0.4.6", "enable_lora: SGLang's LoRA buffers are modelled from the 0.5.2"),
    ({"lora_rank": 8, "lora_target_modules": ["mlp.fc1"]}, "sglang@0.5.5", "lora_target_modules: 'mlp.fc1'"),
    ({"lora_rank": 8, "lora_target_modules": ["lm_head"]}, "sglang@0.5.5", "lora_target_modules: 'lm_head'"),
])
def test_sglang_lora_bad_settings_are_one_line(kw, release, said):
    card = load_model_card(ROOT / "capacity/data/models/llama-3.1-8b.yaml")
    with pytest.raises(ConfigError, match=said) as err:
        get_engine(release).budget(card, get_gpu("h100-sxm"), _lora_cfg(release, **kw))
    assert "\n" not in str(err.value)


def test_sglang_lora_on_a_moe_model_is_refused():
    card = load_model_card(ROOT / "capacity/data/models/mixtral-8x7b.yaml")
    with pytest.raises(ConfigError, match="MoE, MLA or state layers"):
        get_engine("sglang@0.5.5").budget(card, get_gpu("h200"), _lora_cfg(lora_rank=8, tensor_parallel_size=2))


def test_sglang_lora_flags_reach_the_launch_command():
    card = load_model_card(ROOT / "capacity/data/models/llama-3.1-8b.yaml")
    cfg = _lora_cfg(lora_rank=64, max_loras_per_batch=4)
    e = get_engine("sglang@0.5.5")
    cmd = e.launch_command(card, cfg, e.budget(card, get_gpu("h100-sxm"), cfg))
    assert "--enable-lora" in cmd and "--max-loras-per-batch 4" in cmd and "--max-lora-rank 64" in cmd


# ---- SGLang DeepEP buffers (capacity/engine/sglang/deepep.py) ----------------------------------------------------
# DeepSeek-V3 over 8 ranks (hidden 7168, 256 experts), 128 dispatch tokens a rank, DeepEP's Buffer.num_sms 20:
# low latency: scales 56; dispatch message 16 + max(14,336, 7,168 + 224) = 14,352; combine message 224 + 14,336 =
# 14,560; send max(128 x 14,352, 256 x 128 x 14,560 = 477,102,080); receive max(256 x 128 x 14,352 = 470,286,336,
# 477,102,080); signalling align(256 x 8 + 32 x 4, 128) = 2,176; 2 x (477,102,080 x 2 + 2,176) = 1,908,412,672,
# then ((n + 128) // 128) x 128 = 1,908,412,800.
# normal: 10 channels x 8 ranks x [(2 + 3) x 4 + 256 x (14,336 + 8 + 128 x 8 + 128 x 4 + 128 x 4)] = 80 x 4,196,372
# = 335,709,760, rounded up to 128: 335,709,824.
# The RDMA (low-latency) buffer sits in NVSHMEM's heap, mapped in granules of 2^29 = 536,870,912 bytes (DeepEP sets
# NVSHMEM_CUMEM_GRANULARITY): 1,908,412,800 / 536,870,912 = 3.55 -> 4 granules = 2,147,483,648 bytes.
LL_V3, NVL_V3 = 1_908_412_800, 335_709_824
LL_HEAP_V3 = 4 * 536_870_912


@pytest.mark.parametrize("mode, want", [("low_latency", LL_HEAP_V3), ("normal", NVL_V3), ("auto", LL_HEAP_V3 + NVL_V3)])
def test_deepep_buffers_of_deepseek_v3_by_hand(mode, want):
    card = load_model_card(ROOT / "capacity/data/models/deepseek-v3.yaml")
    cfg = SglangConfig(engine="sglang@0.5.5", tensor_parallel_size=8, max_model_len=8192, moe_a2a_backend="deepep",
                       deepep_mode=mode)
    e = get_engine("sglang@0.5.5")
    sb = e._resolve(cfg, card, get_gpu("h200"))[1]
    assert sb.deepep_bytes == want
    plain = e.budget(card, get_gpu("h200"), SglangConfig(engine="sglang@0.5.5", tensor_parallel_size=8,
                                                         max_model_len=8192))
    assert sb.kv_tokens == plain.kv_tokens  # made after the pool is sized: out of the reserve, not the pool
    assert any(f"DeepEP ({mode})" in n for n in sb.notes)


def test_deepep_larger_than_the_reserve_does_not_fit_and_bad_settings_are_one_line():
    card = load_model_card(ROOT / "capacity/data/models/deepseek-v3.yaml")
    e, gpu = get_engine("sglang@0.5.5"), get_gpu("h200")
    cfg = SglangConfig(engine="sglang@0.5.5", tensor_parallel_size=8, max_model_len=8192, moe_a2a_backend="deepep",
                       mem_fraction_static=0.99)  # reserve 0.01 x T0 = about 1.4 GiB < 2.31 GiB
    b = e.budget(card, gpu, cfg, check_fit=False)
    # auto: 335,709,824 + 2,147,483,648 = 2,483,193,472 bytes = 2.31 GiB
    assert not b.fits and "DeepEP's buffers (2.31 GiB a rank)" in b.reason
    small = load_model_card(ROOT / "capacity/data/models/llama-3.1-8b.yaml")
    with pytest.raises(ConfigError, match="has no MoE layers") as err:
        e.budget(small, gpu, SglangConfig(engine="sglang@0.5.5", moe_a2a_backend="deepep"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="deepep_max_dispatch_tokens_per_rank"):
        SglangConfig(engine="sglang@0.5.5", moe_a2a_backend="deepep", deepep_max_dispatch_tokens_per_rank=2048)


# ---- SGLang 0.5.15+: the default F keeps 2 GiB for DeepEP (releases.py deepep_reserve_mib) ------------------------
# ServerArgs._handle_gpu_memory_settings (0.5.15 wheel): reserved = 512 + max(chunk, 2048) x 1.5 + graph_bs x 2
# + TP x PP / 8 x 1024 (+ 1.5 GiB for the MLA prefill graph), at least 10 GiB over 60 GiB, then + 2048 MiB with
# --moe-a2a-backend deepep; F = round((G - reserved) / G, 3). G = 81,559 MiB:
# chunk 8,192, graph 256, TP 8, MLA: 512 + 12,288 + 512 + 1,024 + 1,536 = 15,872 (above the floor) -> 0.805;
#   + 2,048 = 17,920 -> round(63,639 / 81,559, 3) = 0.780.
# chunk 2,048, graph 8, TP 1, MLA: 512 + 3,072 + 16 + 128 + 1,536 = 5,264 -> the floor 10,240 -> 0.874;
#   + 2,048 on top of the floor = 12,288 -> round(69,271 / 81,559, 3) = 0.849. 0.5.14 has no such reserve.
@pytest.mark.parametrize("release, chunk, graph, tp, plain, with_deepep", [
    ("0.5.15", 8192, 256, 8, 0.805, 0.780), ("0.5.15", 2048, 8, 1, 0.874, 0.849),
    ("0.5.23", 2048, 8, 1, 0.874, 0.849), ("0.5.14", 2048, 8, 1, 0.874, 0.874)])
def test_default_f_keeps_2_gib_for_deepep_from_0_5_15(release, chunk, graph, tp, plain, with_deepep):
    from capacity.engine.sglang.releases import default_mem_fraction_static

    kw = dict(chunked_prefill_size=chunk, cuda_graph_max_bs=graph, mla=True)
    assert default_mem_fraction_static(81_559, tp, release, **kw) == pytest.approx(plain, abs=1e-12)
    assert default_mem_fraction_static(81_559, tp, release, deepep=True, **kw) == pytest.approx(with_deepep, abs=1e-12)


def test_deepep_pool_is_smaller_from_0_5_15_and_unchanged_before():
    """With the default F the pool loses T0 x (the 2 GiB / G drop in F) from 0.5.15; 0.5.14's pool is the same with
    and without DeepEP (the buffers come out of the reserve only)."""
    card = load_model_card(ROOT / "capacity/data/models/deepseek-v3.yaml")
    gpu = get_gpu("h200")
    for rel, smaller in (("sglang@0.5.15", True), ("sglang@0.5.14", False)):
        e = get_engine(rel)
        plain = e.budget(card, gpu, SglangConfig(engine=rel, tensor_parallel_size=8, max_model_len=8192))
        ep = e._resolve(SglangConfig(engine=rel, tensor_parallel_size=8, max_model_len=8192,
                                     moe_a2a_backend="deepep"), card, gpu)[1]
        assert (ep.kv_tokens < plain.kv_tokens) is smaller, rel
        assert any("reserves 2 GiB more" in n for n in ep.notes) is smaller, rel
        if smaller:  # about 2 GiB of KV a rank: F drops by at least 2048 / G - 0.0005 (the rounding)
            mib = gpu.usable_memory_bytes / 2**20
            cell = (plain.kv_budget_bytes / plain.kv_tokens)
            lost = (plain.kv_tokens - ep.kv_tokens) * cell / GiB
            assert (2048 / mib - 0.001) * mib / 1024 * 0.9 < lost < 2.2, lost


def test_deepep_low_latency_hint_itself_and_its_heap_granules():
    """The hint (Buffer.get_low_latency_rdma_size_hint) is unchanged; the heap rounds it to 2^29-byte granules: 1 byte
    takes one granule, exactly one granule takes one, one byte more takes two, 0 takes none."""
    from capacity.engine.sglang.deepep import low_latency_bytes, nvshmem_heap_bytes

    assert low_latency_bytes(128, 7168, 8, 256) == LL_V3
    assert [nvshmem_heap_bytes(n) for n in (0, 1, 2**29, 2**29 + 1, LL_V3)] == [0, 2**29, 2**29, 2**30, LL_HEAP_V3]
