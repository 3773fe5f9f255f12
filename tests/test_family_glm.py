"""GLM-4.5V (`glm4v_moe`) and the GLM-4.5 router (capacity/model/families/glm.py), derived by hand from vLLM's code:
glm4_1v.py (`Glm4vMoeForConditionalGeneration` builds `Glm4MoeForCausalLM` from text_config, and a
`Glm4vVisionTransformer`) and glm4_moe.py (`Glm4MoE`: a float32 gate and a float32 e_score_correction_bias).
The config and the checkpoint's own tensor total: tests/data/families/SOURCES.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.vision_tokens import glm4v, image_tokens
from capacity.model.weights import count_params, weight_bytes_per_rank

DATA = Path(__file__).parent / "data" / "families"
BF16, FP32 = 2, 4


def _vision() -> int:
    h, out, ctx, p, depth, merge, positions = 1536, 4096, 10944, 14, 24, 2, (336 // 14) ** 2
    patch = 3 * 2 * p * p * h + h  # the Conv3d as a linear, with bias
    block = 2 * h + 3 * h * h + h * h + 3 * h * out  # norm1/norm2, qkv, proj (no biases), gated MLP of out_hidden_size
    downsample = h * out * merge * merge + out  # Conv2d(1536, 4096, 2, 2) with bias
    merger = out * out + 2 * out + 3 * out * ctx  # proj, post_projection_norm (LayerNorm), gate/up/down
    return patch + h + positions * h + depth * block + h + downsample + merger  # + post_conv and post RMSNorms


def _text() -> tuple[int, int]:
    """(compute-dtype parameters, float32 parameters) of the language model."""
    h, L, nq, nkv, hd, vocab, inter = 4096, 46, 96, 8, 128, 151552, 10944
    e, mi, moe_layers = 128, 1408, 45  # first_k_dense_replace 1
    attn = nq * hd * h + nq * hd + 2 * (nkv * hd * h + nkv * hd) + h * nq * hd  # q/k/v with biases, o without
    bf16 = (2 * vocab * h + L * (attn + 2 * h) + h + 3 * h * inter
            + moe_layers * (e * 3 * h * mi + 3 * h * mi))  # routed experts, one shared expert
    fp32 = moe_layers * (e * h + e)  # gate (float32 nn.Linear), e_score_correction_bias
    return bf16, fp32


def test_glm45v_params_are_the_checkpoints():
    card = load_model_card(DATA / "glm-4.5v.json")
    bf16, fp32 = _text()
    assert card.vision is not None and card.vision.params() == _vision() == 858_681_856
    # the checkpoint's tensor list (SOURCES.md) totals 107,710,933,120 parameters: "106B" is the text model's rounding
    assert bf16 + fp32 + _vision() == 107_710_933_120 == count_params(card)
    groups = weight_bytes_per_rank(card, 1)
    assert groups["router"] == 45 * 128 * 4096 * FP32 and groups["router_score_bias"] == 45 * 128 * FP32
    assert sum(v for k, v in groups.items() if k != "rope_cache") == (bf16 + _vision()) * BF16 + fp32 * FP32
    # vLLM get_rope(head_size 128, rotary_dim 128 x partial_rotary_factor 0.5, max_position 65536): the cos/sin
    # cache is 65536 x 64 bf16 values, 8 MiB (docs/memory.md listed it as 8 MiB high when counted at head_dim)
    assert groups["rope_cache"] == 65536 * 64 * BF16 == 8 * 2**20


def test_glm45v_kv_and_moe():
    card = load_model_card(DATA / "glm-4.5v.json")
    assert card.architecture == "glm4v_moe" and card.attention_bias and not card.qk_norm
    assert card.moe is not None and (card.num_dense_layers, card.num_moe_layers) == (1, 45)
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * 8 * 128 * 46 * BF16 == 188_416
    assert kv_bytes_per_token(card, "bf16", 16) == 2 * 1 * 128 * 46 * BF16  # 8 KV heads replicated past 8 ranks


def test_glm45v_images():
    card = load_model_card(DATA / "glm-4.5v.json")
    v = card.vision
    assert v is not None
    # a prompt's image follows Glm4vImageProcessor (the same rule as vision_tokens.glm4v): 3000 x 2000 is scaled to
    # 2 x h x w <= 28 x 28 x 2 x 6144 (the shipped longest_edge): 1792 x 2688, 6,144 tokens (docs/vision.md)
    assert image_tokens(v, 3000, 2000) == glm4v(3000, 2000) and image_tokens(v, 3000, 2000).tokens == 6144
    # vLLM's profiling image: 1,708 pixels a side at 14-pixel patches, 122 x 122 patches through the encoder;
    # its budget item, get_max_image_tokens, 8 x 54 x 54 patches / 4 = 5,832 tokens
    assert (v.encoder_tokens_per_image, v.tokens_per_image) == (122 * 122, 8 * 54 * 54 // 4)


def test_glm45_text_router_is_fp32():
    card = load_model_card(Path(__file__).parent / "data" / "startup_v3" / "hf" / "glm-4.7-fp8-trimmed.json")
    moe_layers = 92 - 3  # first_k_dense_replace 3
    groups = weight_bytes_per_rank(card, 2)  # replicated: the same on every rank
    assert groups["router"] == moe_layers * 160 * 5120 * FP32 and groups["router_score_bias"] == moe_layers * 160 * FP32


def test_glm45v_refuses_what_it_cannot_size():
    cfg = json.loads((DATA / "glm-4.5v.json").read_text())
    with pytest.raises(ConfigError, match="text_config is missing"):
        from_hf_config({k: v for k, v in cfg.items() if k != "text_config"}, "x")
    with pytest.raises(ConfigError, match="vision_config.out_hidden_size"):
        from_hf_config({**cfg, "vision_config": {**cfg["vision_config"], "out_hidden_size": None}}, "x")


def test_glm41v_9b_thinking():
    """GLM-4.1V-9B-Thinking (`glm4v`): a GLM-4-9B-0414 language model (vLLM glm4.py) and GLM-4.5V's ViT."""
    card = load_model_card(DATA / "glm-4.1v-9b-thinking.json")
    assert card.architecture == "glm4v" and card.notes == []
    h, L, nq, nkv, hd, inter, vocab = 4096, 40, 32, 2, 128, 13696, 151552
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + nq * hd + 2 * nkv * hd  # q/k/v biases, o without
    layer = attn + 3 * h * inter + 4 * h  # merged gate_up and down; four RMSNorms
    text = 2 * vocab * h + L * layer + h
    assert text == 9_400_279_040
    vh, out, ctx, p, depth, merge = 1536, 4096, 13696, 14, 24, 2
    block = 2 * vh + 4 * vh * vh + 3 * vh * out
    embed = 3 * 2 * p * p * vh + vh + (336 // p) ** 2 * vh + 2 * vh
    projector = vh * out * merge * merge + out + out * out + 2 * out + 3 * out * ctx
    vision = depth * block + embed + projector
    assert vision == 892_498_432
    assert count_params(card) == text + vision == 10_292_777_472  # the model card: "10B" (10.3B)
    groups = weight_bytes_per_rank(card, 1)
    assert groups["rope_cache"] == 65536 * (hd // 2) * BF16  # half-width rotary, max_position_embeddings 65536
    assert sum(groups.values()) == (text + vision) * BF16 + 65536 * (hd // 2) * BF16
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 40_960
    assert kv_bytes_per_token(card, "bf16", 4) == 2 * 1 * hd * L * BF16  # 2 KV heads replicated past tp 2


def test_glm4_dense_text_only():
    """GLM-4-9B-0414 (`glm4`): the same language model as a text-only config (GLM-4.1V's text fields)."""
    cfg = json.loads((DATA / "glm-4.1v-9b-thinking.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("vision_config", "rope_scaling") and "token_id" not in k}
    cfg.update(model_type="glm4", architectures=["Glm4ForCausalLM"])
    card = from_hf_config(cfg, "glm4")
    assert (card.norms_per_layer, card.attention_bias, card.vision) == (4, True, None)
    assert count_params(card) == 9_400_279_040


@pytest.mark.parametrize("mt", ["glm4", "glm4v", "glm4v_moe"])
def test_glm_refuses_another_partial_rotary(mt):
    name = "glm-4.5v.json" if mt == "glm4v_moe" else "glm-4.1v-9b-thinking.json"
    cfg = json.loads((DATA / name).read_text())
    cfg["model_type"] = mt
    if "text_config" in cfg:
        cfg["text_config"] = {**cfg["text_config"], "partial_rotary_factor": 1.0}
    else:
        cfg["partial_rotary_factor"] = 1.0
    with pytest.raises(ConfigError, match="partial_rotary_factor 1.0"):
        from_hf_config(cfg, "x")
