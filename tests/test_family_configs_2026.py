"""The 2026 families of the "模型信息报告" config copies (tests/data/startup_v4/hf, sources in its SOURCES.md): each
parameter count is derived by hand below from the config's fields and vLLM's model code, and meets the checkpoint's
own tensor total as the report prints it ("参数总量"), never a number read from the code under test. Models the
loader cannot size are refused in one line naming the model type."""
from __future__ import annotations

from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.weights import count_params, weight_bytes_per_rank

HF = Path(__file__).parent / "data" / "startup_v4" / "hf"
BF16 = 2


def test_gemma_4_31b_it():
    """gemma-4-31B-it (vLLM gemma4.py): 50 sliding layers (16 KV heads of 256) and 10 full layers (4 KV heads of
    512, k_eq_v: no v_proj in the checkpoint, but vLLM's QKVParallelLinear keeps a V slot it fills with K)."""
    card = load_model_card(HF / "gemma-4-31b-it.json")
    h, vocab, nq, inter = 5376, 262144, 32, 21504
    sliding = nq * 256 * h + 2 * 16 * 256 * h + h * nq * 256 + 2 * 256  # q, k/v, o, q/k norms
    full_ckpt = nq * 512 * h + 4 * 512 * h + h * nq * 512 + 2 * 512  # q, k (no v), o, q/k norms
    per_layer = 3 * h * inter + 4 * h + 1  # gated MLP, four norms, layer_scalar
    text = vocab * h + 50 * sliding + 10 * full_ckpt + 60 * per_layer + h  # tied embeddings, final norm
    v, vi = 1152, 4304
    vision = 27 * (4 * v * v + 3 * v * vi + 4 * v + 2 * 72) + 3 * 16 * 16 * v + 2 * 10240 * v + 2 * v
    embed_vision = h * v
    assert text + vision + embed_vision == 31_273_088_876  # the report's "参数总量" of the 2 safetensors files
    v_slot = 10 * 4 * 512 * h  # vLLM loads the full layers' K weights into their V slot too
    assert count_params(card) == text + vision + embed_vision + v_slot == 31_383_189_356
    assert (card.num_sliding_layers, card.sliding_window, card.num_kv_heads, card.head_dim) == (50, 1024, 16, 256)
    # KV: every layer counted at the sliding width, 2 x 16 x 256: the full layers' 2 x 4 x 512 is half of it at tp 1
    assert kv_bytes_per_token(card, "bf16", 1) == 60 * 2 * 16 * 256 * BF16 == 983_040
    # at tp 8 a rank keeps one of the 4 global KV heads (vLLM replicates them): 2 x 512, the card's 2 x (16/8) x 256
    assert kv_bytes_per_token(card, "bf16", 8) == 60 * 2 * 2 * 256 * BF16
    # one bf16 rank holds every weight (tied embedding once) plus two rotary caches of max_position x 256 and x 512
    rope = 262144 * (256 + 512) * BF16
    assert sum(weight_bytes_per_rank(card, 1).values()) == count_params(card) * BF16 + rope


def test_gemma_4_refusals():
    import json
    cfg = json.loads((HF / "gemma-4-31b-it.json").read_text())
    for key, value in (("hidden_size_per_layer_input", 256), ("num_kv_shared_layers", 20), ("enable_moe_block", True),
                       ("attention_k_eq_v", False), ("global_head_dim", 256)):
        bad = json.loads(json.dumps(cfg))
        bad["text_config"][key] = value
        with pytest.raises(ConfigError, match=key):
            from_hf_config(bad, "x", "cfg.json")
    text_only = from_hf_config(dict(cfg["text_config"]), "t")  # a bare gemma4_text config: no tower, no embed_vision
    assert count_params(text_only) == 31_383_189_356 - 569_550_384 - 5376 * 1152
    bad = json.loads(json.dumps(cfg))
    bad["audio_config"] = {"model_type": "gemma4_audio"}
    with pytest.raises(ConfigError, match="audio_config is not supported"):
        from_hf_config(bad, "x", "cfg.json")
    bad = json.loads(json.dumps(cfg))
    bad["vision_config"]["num_hidden_layers"] = 16
    with pytest.raises(ConfigError, match="vision_config.num_hidden_layers 16"):
        from_hf_config(bad, "x", "cfg.json")


def test_glm_5_1():
    """GLM-5.1 (`glm_moe_dsa`, vLLM deepseek_v2.py GlmMoeDsaForCausalLM): DeepSeek-V3.2's MLA + DSA indexer with
    index_n_heads 32; the MTP layer is a speculative draft vLLM does not load for plain serving."""
    card = load_model_card(HF / "glm-5.1.json")
    h, L, vocab, q, kv, nq, nope, rope, vd, experts, mi, inter = 6144, 78, 154880, 2048, 512, 64, 192, 64, 256, 256, \
        2048, 12288
    attn = q * h + q + nq * (nope + rope) * q + (kv + rope) * h + kv + nq * (nope + vd) * kv + h * nq * vd
    indexer = 32 * 128 * q + 128 * h + 2 * 128 + 32 * h  # wq_b, wk, k_norm (weight + bias), weights_proj
    moe = experts * 3 * h * mi + 3 * h * mi + experts * h + experts  # routed, shared, router, score bias
    common = attn + indexer + 2 * h
    main = 2 * vocab * h + h + L * common + 3 * 3 * h * inter + 75 * moe
    mtp = common + moe + h * 2 * h + 3 * h  # layer 78: a MoE layer, eh_proj, enorm / hnorm / shared_head.norm
    assert main + mtp == 753_864_139_008  # the report's "参数总量" of the 282 safetensors files
    assert count_params(card) == main == 743_911_218_432
    # KV: the 576-wide latent + rope key, and the indexer's 132-byte fp8 key cache, per layer
    assert kv_bytes_per_token(card, "bf16", 1) == L * ((kv + rope) * BF16 + 128 + 4) == 100_152


def test_minimax_m2_7():
    """MiniMax-M2.7: the minimax_m2 family unchanged (block-fp8 128 x 128); the report counts the fp32 scales too."""
    card = load_model_card(HF / "minimax-m2.7.json")
    h, L, vocab, experts, mi, nq, nkv, hd = 3072, 62, 200064, 256, 1536, 48, 8, 128
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + nq * hd + nkv * hd  # q, k/v, o, per-layer q/k norms
    layer = attn + 2 * h + experts * h + experts + experts * 3 * mi * h  # norms, router, score bias, experts
    params = 2 * vocab * h + h + L * layer
    scales = L * (experts * 3 * (12 * 24) + 48 * 24 + 2 * 8 * 24 + 24 * 48)  # weight_scale_inv per 128 x 128 block
    assert params + scales == 228_703_644_928  # the report's "参数总量" of the 125 safetensors files
    assert count_params(card) == params
    assert card.weight_dtype == "fp8" and card.quant_group_size == 128
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 253_952


def test_deepseek_v4_is_refused():
    with pytest.raises(ConfigError, match="model_type 'deepseek_v4' is not a modelled family"):
        load_model_card(HF / "deepseek-v4-flash.json")


def test_kimi_k2_5():
    """Kimi-K2.5 (`kimi_k25`, vLLM kimi_k25.py): DeepSeek-V3's text layers with int4 group-32 routed experts (bf16
    attention, shared experts, dense MLP: the checkpoint's ignore list), a MoonViT tower and its projector. The
    report's total counts the checkpoint's stored elements (eight int4 values per int32, a bf16 scale per 32, two
    int32 of weight_shape per expert tensor); the same shapes give the card's parameters."""
    card = load_model_card(HF / "kimi-k2.5.json")
    h, L, vocab, q, kv, nq, nope, rope, vd, experts, mi, inter = 7168, 61, 163840, 1536, 512, 64, 128, 64, 128, 384, \
        2048, 18432
    attn = q * h + q + nq * (nope + rope) * q + (kv + rope) * h + kv + nq * (nope + vd) * kv + h * nq * vd
    routed = 60 * experts * 3 * h * mi
    text = 2 * vocab * h + h + L * (attn + 2 * h) + 3 * h * inter + 60 * (3 * h * mi + experts * h + experts) + routed
    stored_routed = 60 * experts * (3 * h * mi // 8 + 3 * h * mi // 32 + 3 * 2)
    v, vi = 1152, 4304
    block = 3 * v * v + 3 * v + v * v + v + vi * v + vi + v * vi + v + 4 * v  # wqkv, wo, fc0, fc1, two LayerNorms
    vision = 27 * block + 2 * v + 64 * 64 * v + v * 3 * 14 * 14 + v  # final LayerNorm, position table, patch conv
    projector = 2 * v + 4608 * 4608 + 4608 + h * 4608 + h
    assert text - routed + stored_routed + vision + projector == 170_738_182_128  # the report's "参数总量"
    assert count_params(card) == text + vision + projector == 1_026_879_376_368
    assert card.weight_dtype == "int4" and card.quant_group_size == 32
    assert card.weight_formats == {"attention": "bf16", "shared_experts": "bf16", "dense_mlp": "bf16"}
    assert kv_bytes_per_token(card, "bf16", 1) == L * (kv + rope) * BF16 == 70_272


def test_deepseek_v3_2_raw_config_matches_the_assembled_one():
    """deepseek-ai/DeepSeek-V3.2's raw config.json gives the card of the copy tests/data/families assembled for
    V3.2-Exp (same shapes); the hand count of that card plus the MTP layer and the fp32 block scales meets the
    checkpoint's own tensor total."""
    raw = load_model_card(HF / "deepseek-v3.2.json")
    assembled = load_model_card(HF.parents[1] / "families" / "deepseek-v3.2-exp.json")
    assert raw.model_dump(exclude={"name"}) == assembled.model_dump(exclude={"name"})
    h, L, vocab, q, kv, nq, nope, rope, vd, experts, mi, inter = 7168, 61, 129280, 1536, 512, 128, 128, 64, 128, 256, \
        2048, 18432
    attn = q * h + q + nq * (nope + rope) * q + (kv + rope) * h + kv + nq * (nope + vd) * kv + h * nq * vd
    indexer = 64 * 128 * q + 128 * h + 2 * 128 + 64 * h
    moe = experts * 3 * h * mi + 3 * h * mi + experts * h + experts
    common = attn + indexer + 2 * h
    main = 2 * vocab * h + h + L * common + 3 * 3 * h * inter + 58 * moe
    mtp = common + moe + h * 2 * h + 3 * h + 2 * vocab * h  # layer 61 keeps its own embedding and head copies

    def blocks(rows: int, cols: int) -> int:  # one fp32 weight_scale_inv per 128 x 128 block
        return -(-rows // 128) * -(-cols // 128)

    attn_scales = (blocks(q, h) + blocks(nq * (nope + rope), q) + blocks(kv + rope, h) + blocks(nq * (nope + vd), kv)
                   + blocks(h, nq * vd) + blocks(64 * 128, q) + blocks(128, h))  # the indexer's wq_b and wk too
    scales = 62 * attn_scales + 3 * 3 * blocks(inter, h) + 59 * (experts + 1) * 3 * blocks(mi, h)
    assert main + mtp + scales == 685_396_921_376  # the report's "参数总量" of the 163 safetensors files
    assert count_params(raw) == main == 671_877_944_064


def test_glm_4_7_flash():
    """GLM-4.7-Flash (`glm4_moe_lite`, vLLM glm4_moe_lite.py): DeepSeek-V2's MLA attention and glm4_moe's MoE (float32
    router and score bias); the MTP layer (with its own embedding and head copies) is skipped by load_weights."""
    card = load_model_card(HF / "glm-4.7-flash.json")
    h, L, vocab, q, kv, nq, nope, rope, vd, experts, mi, inter = 2048, 47, 154880, 768, 512, 20, 192, 64, 256, 64, \
        1536, 10240
    attn = q * h + q + nq * (nope + rope) * q + (kv + rope) * h + kv + nq * (nope + vd) * kv + h * nq * vd
    moe = experts * 3 * h * mi + 3 * h * mi + experts * h + experts  # routed, shared, router, score bias
    main = 2 * vocab * h + h + L * (attn + 2 * h) + 3 * h * inter + 46 * moe
    mtp = attn + 2 * h + moe + h * 2 * h + 3 * h + 2 * vocab * h
    assert main + mtp == 31_221_488_576  # the report's "参数总量" of the 48 safetensors files
    assert count_params(card) == main == 29_943_393_920
    assert kv_bytes_per_token(card, "bf16", 1) == L * (kv + rope) * BF16 == 54_144
    # the router and its score bias are float32 (4 bytes) on every rank, the rest bf16, plus the rotary cache
    fp32 = 46 * (experts * h + experts)
    rope_cache = 202752 * rope * BF16
    assert sum(weight_bytes_per_rank(card, 1).values()) == (main - fp32) * BF16 + fp32 * 4 + rope_cache
