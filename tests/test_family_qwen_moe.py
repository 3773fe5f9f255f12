"""Qwen2-MoE, Qwen3-VL(-MoE) and Qwen3.5-MoE (capacity/model/families/qwen_moe.py).

Every number is derived by hand below from the config's fields and vLLM's model code (qwen2_moe.py
`Qwen2MoeSparseMoeBlock`, `Qwen2MoeAttention`; qwen3_vl.py / qwen3_vl_moe.py; qwen3_5.py, qwen3_next.py), and
checked against the published totals, not read from the code under test. Configs and their sources:
tests/data/families/SOURCES.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.weights import count_params, weight_bytes_per_rank

DATA = Path(__file__).parent / "data" / "families"
BF16 = 2


def test_qwen2_57b_a14b():
    card = load_model_card(DATA / "qwen2-57b-a14b.json")
    assert card.notes == []
    h, L, hd, nq, nkv, vocab = 3584, 28, 128, 28, 4, 151936  # head_dim: 3584 / 28
    e, k, mi, shared = 64, 8, 2560, 20480
    embed = 2 * vocab * h  # untied: embedding and LM head
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + nq * hd + 2 * nkv * hd  # q, k/v, o; q/k/v biases
    experts = e * 3 * h * mi
    shared_mlp = 3 * h * shared
    router, shared_gate = e * h, h  # gate (hidden -> experts) and shared_expert_gate (hidden -> 1)
    norms = 2 * h
    layer = attn + experts + shared_mlp + router + shared_gate + norms
    params = embed + L * layer + h
    assert params == 57_408_658_944  # Qwen2-57B-A14B: "57B total"
    active = embed + L * (attn + k * 3 * h * mi + shared_mlp + router + shared_gate + norms) + h
    assert 14.0e9 < active < 14.5e9  # "14B activated"
    assert count_params(card) == params
    rope = 131072 * hd * BF16
    assert sum(weight_bytes_per_rank(card, 1).values()) == params * BF16 + rope
    # tp=4: attention, experts (along their intermediate size), shared expert and vocab split in four; routers,
    # the shared-expert gate and norms replicated; 4 KV heads, one a rank
    # (the q/k/v biases are left out: capacity/model/weights.py keeps a 1-row bias whole on a column split and
    # rounds a kv split of it to 0 rows, a few KiB off vLLM's split of them; reported, not this family's code)
    bias = nq * hd + 2 * nkv * hd
    tp4 = (embed // 4 + L * ((attn - bias) // 4 + experts // 4 + shared_mlp // 4 + router + shared_gate + norms)
           + h) * BF16
    by = weight_bytes_per_rank(card, 4)
    assert sum(v for n, v in by.items() if n not in ("q_bias", "kv_bias")) == tp4 + rope
    # ep=8: whole experts, 8 of the 64 on each rank
    ep8 = weight_bytes_per_rank(card, 1, ep=8)
    assert ep8["experts_gate_up"] + ep8["experts_down"] == L * 8 * 3 * h * mi * BF16
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 57_344
    assert kv_bytes_per_token(card, "bf16", 8) == 2 * 1 * hd * L * BF16  # 4 KV heads replicated past tp 4


def _cfg(name: str, **over) -> dict:
    cfg = json.loads((DATA / name).read_text())
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("over, field", [({"decoder_sparse_step": 2}, "decoder_sparse_step 2"),
                                         ({"mlp_only_layers": [0]}, "mlp_only_layers"),
                                         ({"num_experts": None}, "'num_experts' is missing")])
def test_qwen2_moe_refuses_what_it_cannot_size(over, field):
    with pytest.raises(ConfigError, match=field):
        from_hf_config(_cfg("qwen2-57b-a14b.json", **over), "x")


def test_qwen3_vl_30b_a3b():
    card = load_model_card(DATA / "qwen3-vl-30b-a3b-instruct.json")
    h, L, hd, nq, nkv, vocab, e, mi = 2048, 48, 128, 32, 4, 151936, 128, 768
    embed = 2 * vocab * h
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 2 * hd  # q, k/v, o, q/k RMSNorm (head_dim each)
    moe = e * 3 * h * mi + e * h  # experts and router; no shared expert
    text = embed + L * (attn + moe + 2 * h) + h
    assert text == 30_532_122_624  # the text model is Qwen3-30B-A3B's shape
    # The ViT (vLLM qwen3_vl.py Qwen3_VisionTransformer): vh 1152, mlp 4304, 27 blocks of two LayerNorms, qkv and
    # proj with biases, a GELU MLP with biases; a 3D patch linear (3 x 2 x 16 x 16 inputs, bias), 2304 learned
    # positions; the merger and 3 deepstack mergers, each a LayerNorm, a 4vh x 4vh linear and a 4vh -> 2048 linear.
    # The final merger's LayerNorm is over one patch (vh); the deepstack mergers' over the 2x2 shuffle (4vh:
    # Qwen3_VisionPatchMerger use_postshuffle_norm=True), 6 vh = 6,912 more each, 20,736 for the three.
    vh, vi, p, out = 1152, 4304, 16, 2048
    block = 4 * vh + (3 * vh * vh + 3 * vh) + (vh * vh + vh) + (2 * vh * vi + vi + vh)
    patch = 3 * 2 * p * p * vh + vh
    merger = 2 * vh + (4 * vh) ** 2 + 4 * vh + 4 * vh * out + out
    deep = 2 * 4 * vh + (4 * vh) ** 2 + 4 * vh + 4 * vh * out + out
    vision = 27 * block + patch + 2304 * vh + merger + 3 * deep
    assert card.vision is not None and card.vision.params() == vision
    assert count_params(card) == text + vision == 31_070_754_032  # Qwen3-VL-30B-A3B: "31.1B" (30.5B text + ViT)
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 98_304
    assert card.moe is not None and (card.moe.experts_per_token, card.moe.num_shared_experts) == (8, 0)


def test_qwen3_vl_wrong_vision_type_names_the_field():
    cfg = _cfg("qwen3-vl-30b-a3b-instruct.json")
    cfg["vision_config"] = {**cfg["vision_config"], "model_type": "siglip_vision_model"}
    with pytest.raises(ConfigError, match="vision_config.model_type 'siglip_vision_model'"):
        from_hf_config(cfg, "x")


def test_qwen3_5_35b_a3b():
    """Qwen3.5-35B-A3B: 30 gated DeltaNet + 10 gated full-attention layers, every layer a MoE with a shared expert."""
    card = load_model_card(DATA / "qwen3.5-35b-a3b.json")
    h, L, vocab, nq, nkv, hd = 2048, 40, 248320, 16, 2, 256
    full, linear = 10, 30  # layer_types: every 4th layer full_attention
    kh, kd, vh, vd, conv = 16, 128, 32, 128, 4  # linear_num_key_heads x key dim, value heads x dim, conv kernel
    e, mi, shared = 256, 512, 512
    attn = 2 * nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 2 * hd  # q + its output gate, k/v, o, q/k norms
    key, value = kh * kd, vh * vd
    deltanet = ((2 * key + 2 * value) * h + 2 * vh * h  # in_proj_qkvz, in_proj_ba
                + (2 * key + value) * conv + 2 * vh + vd + h * value)  # conv1d, dt_bias + A_log, gated norm, out_proj
    moe = e * 3 * h * mi + e * h + 3 * h * shared + h  # experts, router, shared expert, shared_expert_gate
    text = 2 * vocab * h + full * attn + linear * deltanet + L * (moe + 2 * h) + h
    assert text == 34_660_610_688
    vh_, vi, p, out = 1152, 4304, 16, 2048  # the ViT: no deepstack mergers (deepstack_visual_indexes [])
    block = 4 * vh_ + (3 * vh_ * vh_ + 3 * vh_) + (vh_ * vh_ + vh_) + (2 * vh_ * vi + vi + vh_)
    vision = 27 * block + 3 * 2 * p * p * vh_ + vh_ + 2304 * vh_ + (2 * vh_ + (4 * vh_) ** 2 + 4 * vh_ + 4 * vh_ * out
                                                                       + out)
    assert count_params(card) == text + vision == 35_107_181_936  # Qwen3.5-35B-A3B: "35B total"
    assert card.moe is not None and card.moe.shared_intermediate == shared
    groups = weight_bytes_per_rank(card, 1)
    assert groups["rope_cache"] == 262144 * (hd // 4) * BF16  # partial_rotary_factor 0.25: 64 of 256 rotated
    assert groups["shared_expert_gate"] == L * h * BF16
    # KV: only the 10 full-attention layers; the DeltaNet layers keep a per-sequence state instead
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * full * BF16 == 20_480
    assert card.state is not None and card.state.num_layers == linear
    assert card.state.state_elements(1) == ((conv - 1) * (2 * key + value), vh * kd * vd)  # (24,576, 524,288)
    assert card.state.ssm_dtype == "fp32"  # mamba_ssm_dtype float32: 2 MiB of recurrent state per layer


def test_qwen3_5_moe_refuses_another_partial_rotary():
    cfg = _cfg("qwen3.5-35b-a3b.json")
    cfg["text_config"] = {**cfg["text_config"], "partial_rotary_factor": 0.5}
    with pytest.raises(ConfigError, match="partial_rotary_factor 0.5"):
        from_hf_config(cfg, "x")


def test_qwen3_vl_8b():
    """Qwen3-VL-8B-Instruct (`qwen3_vl`, dense): the config tests/data/startup_v3/hf/SOURCES.md records."""
    card = load_model_card(Path(__file__).parent / "data" / "startup_v3" / "hf" / "qwen3-vl-8b-instruct.json")
    h, L, hd, nq, nkv, inter, vocab = 4096, 36, 128, 32, 8, 12288, 151936
    text = 2 * vocab * h + L * (nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 2 * hd + 3 * h * inter + 2 * h) + h
    vh, vi, p, out = 1152, 4304, 16, 4096
    block = 4 * vh + (3 * vh * vh + 3 * vh) + (vh * vh + vh) + (2 * vh * vi + vi + vh)
    merger = 2 * vh + (4 * vh) ** 2 + 4 * vh + 4 * vh * out + out
    deep = merger + 6 * vh  # a deepstack merger's LayerNorm is over 4 vh (use_postshuffle_norm), not vh
    vision = 27 * block + 3 * 2 * p * p * vh + vh + 2304 * vh + merger + 3 * deep  # the merger and 3 deepstack ones
    assert count_params(card) == text + vision == 8_767_123_696  # Qwen3-VL-8B-Instruct: "8.77B" (the model card)
    assert card.qk_norm and card.moe is None and card.vision is not None and card.vision.extra_mergers == 3
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 147_456


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b-thinking.json", "qwen3.5-9b.json"])
def test_qwen3_next_and_qwen3_5_cache_a_quarter_of_each_head(name):
    """vLLM qwen3_next.py / qwen3_5.py: get_rope(head_dim 256, rotary_dim 256 x 0.25, max_position 262,144)."""
    card = load_model_card(Path(__file__).parent / "data" / "startup_v3" / "hf" / name)
    assert card.head_dim == 256 and card.max_position_embeddings == 262144
    assert weight_bytes_per_rank(card, 1)["rope_cache"] == 262144 * 64 * BF16 == 32 * 2**20
