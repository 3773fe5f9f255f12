"""The families and config copies added for issue 46 item 5 / issue 47 (Llama-4, OLMo-3, Llama-3.2-90B-Vision) and
the one-row bias split at TP > 1: every total derived here by hand from the vLLM model file the family module names,
and checked against the parameter count the model card publishes (or the weights a real start-up log reports)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.weights import count_params, weight_bytes_per_rank

DATA = Path(__file__).parent / "data"
BF16 = 2
GIB = 2**30


def _cfg(path: Path) -> dict:
    return json.loads(path.read_text())


def _llama4_vision(text_hidden: int) -> int:
    """vLLM mllama4.py Llama4VisionModel, by hand: hidden 1408, MLP 5632, 34 layers, patch 14 of a 336 tile."""
    h, i, p, n = 1408, 5632, 14, (336 // 14) ** 2
    layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h  # q/k/v/o with biases, fc1/fc2 with biases, 2 LayerNorms
    embed = 3 * p * p * h + h + (n + 1) * h + 2 * h + 2 * h  # unfold linear (no bias), class, positions, pre/post LN
    adapter = 5632 * 4096 + 4096 * 4096  # pixel-shuffle MLP: intermediate_size -> 4096 -> 4096, no biases
    return 34 * layer + embed + adapter + 4096 * text_hidden  # + the projector to the text width, no bias


def test_llama4_scout():
    """Llama-4-Scout-17B-16E: 48 layers, every one a MoE (interleave_moe_layer_step 1) of 16 experts of 8192 plus a
    shared expert of 8192; untied embeddings of 202,048; the q/k norm has no weight (RMSNorm has_weight=False)."""
    card = load_model_card(DATA / "startup_v3" / "hf" / "llama-4-scout-17b-16e-instruct.json")
    h, L, vocab, nq, nkv, hd, e, mi = 5120, 48, 202048, 40, 8, 128, 16, 8192
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd
    moe = e * 3 * h * mi + e * h + 3 * h * mi  # experts, router, shared expert
    text = 2 * vocab * h + L * (attn + moe + 2 * h) + h
    assert text == 107_769_861_120
    assert card.vision is not None and card.vision.params() == _llama4_vision(h) == 871_932_416
    assert count_params(card) == text + 871_932_416 == 108_641_793_536  # model card: 109B total
    assert (card.num_moe_layers, card.num_dense_layers, card.num_sliding_layers) == (48, 0, 0)
    # one rank at TP 4 in bf16, tensor by tensor, against the vLLM 0.19 log's "Model loading took 53.12 GiB"
    # (tests/data/startup_v3/vllm_b_dev.yaml, llmd-llama4-scout-16e-h100-tp4-v0190)
    w = weight_bytes_per_rank(card, 4)
    rope = 10_485_760 * hd * BF16  # one llama3-scaled cos/sin cache of max_position_embeddings rows: 2.5 GiB
    assert w["rope_cache"] == rope == 2.5 * GIB
    rank = (2 * vocab // 4 * h + h + L * 2 * h + L * (nq // 4 * hd * h + 2 * 2 * hd * h + h * nq // 4 * hd)
            + L * (e * h + e * 3 * mi // 4 * h + 3 * mi // 4 * h)) * BF16 + 871_932_416 // 4 * BF16 + rope
    assert sum(w.values()) == rank
    assert abs(rank / GIB - 53.12) < 0.05  # 53.10 GiB
    # KV: all 48 layers (the chunked layers counted as full-attention layers), 2 KV heads a rank at TP 4
    assert kv_bytes_per_token(card, "bf16", 4) == L * 2 * 2 * hd * BF16 == 49_152
    assert 16.75 * GIB / 49_152 == pytest.approx(365_968, rel=1e-3)  # the log's 16.75 GiB -> 365,968 tokens


def test_llama4_maverick():
    """Llama-4-Maverick-17B-128E: interleave_moe_layer_step 2, so layers 1, 3, ..., 47 are MoE (128 experts of 8192
    and a shared expert) and the other 24 a dense MLP of intermediate_size_mlp 16384."""
    card = load_model_card(DATA / "hf" / "llama-4-maverick-17b-128e-instruct.json")
    h, L, vocab, nq, nkv, hd, e, mi, dense = 5120, 48, 202048, 40, 8, 128, 128, 8192, 16384
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd
    moe = e * 3 * h * mi + e * h + 3 * h * mi
    text = 2 * vocab * h + L * (attn + 2 * h) + 24 * moe + 24 * 3 * h * dense + h
    assert text == 400_711_848_960
    assert count_params(card) == text + _llama4_vision(h) == 401_583_781_376  # model card: 400B total
    assert (card.num_moe_layers, card.num_dense_layers, card.intermediate_size) == (24, 24, dense)
    assert card.moe is not None and (card.moe.num_experts, card.moe.shared_intermediate) == (e, mi)
    assert weight_bytes_per_rank(card, 8)["rope_cache"] == 1_048_576 * hd * BF16  # rope_scaling null: 1M positions


def test_llama4_refuses_what_it_cannot_size():
    cfg = _cfg(DATA / "hf" / "llama-4-maverick-17b-128e-instruct.json")
    bad = copy.deepcopy(cfg)
    bad["text_config"]["attention_bias"] = True
    with pytest.raises(ConfigError, match="attention_bias true"):
        from_hf_config(bad, "x")
    bad = copy.deepcopy(cfg)
    bad["text_config"]["interleave_moe_layer_step"] = -1
    with pytest.raises(ConfigError, match="interleave_moe_layer_step -1"):
        from_hf_config(bad, "x")
    bad = copy.deepcopy(cfg)
    bad["vision_config"]["model_type"] = "siglip_vision_model"
    with pytest.raises(ConfigError, match="vision_config.model_type 'siglip_vision_model'"):
        from_hf_config(bad, "x")


def test_llama_3_2_90b_vision():
    """Llama-3.2-90B-Vision-Instruct (mllama): 100 layers (80 self-attention, 20 cross-attention at 3, 8, ..., 98),
    hidden 8192, MLP 28672; the tiled ViT of 32 local + 8 gated global layers (hidden 1280, MLP 5120, 560-pixel
    tiles of 14-pixel patches, 4 tiles, 8 aspect ratios), projector 7680 -> 8192 with bias."""
    card = load_model_card(DATA / "hf" / "llama-3.2-90b-vision-instruct.json")
    h, L, nq, nkv, hd, inter, vocab = 8192, 100, 64, 8, 128, 28672, 128256
    layer = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 3 * h * inter + 2 * h
    text = (vocab + 8) * h + vocab * h + L * layer + 20 * (2 * hd + 2) + h  # +8 image rows; q/k norms, 2 gates
    vh, vi, p, n, tiles, ratios = 1280, 5120, 14, 1600, 4, 9
    vlayer = 4 * vh * vh + 2 * vh * vi + vi + vh + 4 * vh  # attention without biases, GELU MLP with biases, 2 LNs
    embed = (3 * p * p * vh + vh + (n + 1) * vh + 1 + ratios * tiles * (n + 1) * vh
             + 2 * (ratios * tiles * vh + 1) + 4 * vh)  # patches, class, gated positions, tile embeddings, pre/post LN
    vision = 32 * vlayer + 8 * (vlayer + 2) + embed + 7680 * h + h
    assert vision == 926_490_131
    assert count_params(card) == text + vision == 88_593_355_323  # model card: 88.6B
    assert card.cross_attention_layers == 20 and card.vision is not None and card.vision.kind == "mllama"
    assert kv_bytes_per_token(card, "bf16", 4) == L * 2 * 2 * hd * BF16  # every layer keeps K/V (the cross ones too)


def test_olmo3():
    """Olmo-3.1-32B-Instruct (olmo3, vLLM olmo2.py): 64 layers, 48 of them sliding (4,096 tokens), q_norm over all
    40 x 128 query channels and k_norm over 8 x 128 (whole on every rank), YaRN on the 16 full layers only."""
    card = load_model_card(DATA / "hf" / "olmo-3.1-32b-instruct.json")
    h, L, nq, nkv, hd, inter, vocab = 5120, 64, 40, 8, 128, 27648, 100278
    layer = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 3 * h * inter + 2 * h + (nq + nkv) * hd
    assert count_params(card) == 2 * vocab * h + L * layer + h == 32_233_522_176  # model card: 32B
    assert (card.sliding_window, card.num_sliding_layers, card.head_dim) == (4096, 48, 128)
    # two cos/sin caches: the sliding layers' plain rope (65,536) and the full layers' YaRN (8,192 x 8)
    assert card.rope_caches == [65536, 65536]
    assert weight_bytes_per_rank(card, 1)["rope_cache"] == 2 * 65536 * hd * BF16


def test_olmo3_without_yarn_keeps_one_cache():
    cfg = _cfg(DATA / "hf" / "olmo-3.1-32b-instruct.json")
    cfg["rope_scaling"] = None
    assert from_hf_config(cfg, "x").rope_caches == []
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 8.0}
    with pytest.raises(ConfigError, match="original_max_position_embeddings None"):
        from_hf_config(cfg, "x")


@pytest.mark.parametrize("tp, q, kv", [(1, 3584, 1024), (2, 1792, 512), (4, 896, 256), (8, 448, 256)])
def test_attention_biases_split_with_the_output_dim(tp, q, kv):
    """Qwen2.5-7B (28 layers, 28 heads, 4 KV heads of 128): vLLM's QKVParallelLinear creates its bias with the
    output size per partition, (heads / tp + 2 x max(1, kv_heads / tp)) x head_dim elements; at TP 8 each rank keeps
    one whole KV head (replicated), so 2 x 128."""
    card = load_model_card(DATA / "hf" / "qwen2.5-7b.json")
    w = weight_bytes_per_rank(card, tp)
    assert (w["q_bias"], w["kv_bias"]) == (28 * q * BF16, 28 * kv * BF16)
    assert {2: 129_024, 4: 64_512}.get(tp, w["q_bias"] + w["kv_bias"]) == w["q_bias"] + w["kv_bias"]


def test_multi_head_kv_bias_and_sinks_split_too():
    """Phi-2 (32 heads = 32 KV heads of 80): at TP 2 the K/V bias is 2 x 16 x 80 a rank, not 0; gpt-oss-20b's
    sinks (64 heads, one value each) split with the heads."""
    phi = weight_bytes_per_rank(load_model_card(DATA / "startup_v3" / "hf" / "phi-2.json"), 2)
    assert (phi["q_bias"], phi["kv_bias"]) == (32 * 1280 * BF16, 32 * 2560 * BF16)
    oss = weight_bytes_per_rank(load_model_card(DATA / "hf" / "gpt-oss-20b.json"), 4)
    assert oss["sinks"] == 24 * 16 * BF16
