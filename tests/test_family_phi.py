"""Families with LayerNorms, biases and non-gated MLPs: Phi-2 and Phi-3.5-MoE (capacity/model/families/phi.py),
StarCoder2 and GPT-BigCode (starcoder.py), OPT (opt.py), each derived by hand from its config and the vLLM model
file its module names (phi.py: a parallel block with one LayerNorm, biases on q/k/v, dense, fc1, fc2, the final
LayerNorm and the LM head, a non-gated GELU MLP, a rotary over 0.4 of each head). Config sources:
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
FP16 = 2


def test_phi_2():
    card = load_model_card(DATA / "phi-2.json")
    assert card.notes == [] and card.dtype == "fp16" and not card.gated_mlp
    h, L, nq, hd, inter, vocab = 2560, 32, 32, 80, 10240, 51200
    attn = 4 * h * h + 3 * h + h  # q/k/v and dense, with biases
    mlp = 2 * h * inter + inter + h  # fc1 and fc2, with biases
    layer = attn + mlp + 2 * h  # one LayerNorm (weight and bias)
    params = 2 * vocab * h + L * layer + 2 * h + vocab  # untied; final LayerNorm and LM-head bias
    assert params == 2_779_683_840 == count_params(card)  # Phi-2: "2.7B" (2.78B)
    rope = 2048 * int(0.4 * hd) * FP16  # rotary_dim 32 of head_dim 80, max_position_embeddings 2048
    groups = weight_bytes_per_rank(card, 1)
    assert groups["rope_cache"] == rope == 131_072
    assert sum(groups.values()) == params * FP16 + rope
    assert kv_bytes_per_token(card, "fp16", 1) == 2 * nq * hd * L * FP16 == 327_680


@pytest.mark.parametrize("over, field", [({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
                                         ({"partial_rotary_factor": None}, "partial_rotary_factor 0.5"),
                                         ({"qk_layernorm": True}, "qk_layernorm true"),
                                         ({"hidden_act": "silu"}, "hidden_act 'silu'")])
def test_phi_refuses_what_it_cannot_size(over, field):
    cfg = json.loads((DATA / "phi-2.json").read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")


def test_phi_3_5_moe():
    """Phi-3.5-MoE (`phimoe`): vLLM phimoe.py, derived by hand (biases on q/k/v/o, two LayerNorms with bias a
    layer, 16 experts of 6400, top 2, a final LayerNorm with bias and an LM-head bias)."""
    card = load_model_card(DATA / "phi-3.5-moe.json")
    h, L, nq, nkv, hd, e, k, inter, vocab = 4096, 32, 32, 8, 128, 16, 2, 6400, 32064
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + nq * hd + 2 * nkv * hd + h  # with q/k/v and o biases
    moe = e * 3 * h * inter + e * h
    params = 2 * vocab * h + L * (attn + moe + 4 * h) + 2 * h + vocab
    assert params == 41_873_153_344 == count_params(card)  # Phi-3.5-MoE: "41.9B total"
    active = 2 * vocab * h + L * (attn + k * 3 * h * inter + e * h + 4 * h) + 2 * h + vocab
    assert 6.5e9 < active < 6.7e9  # "6.6B active"
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * FP16 == 131_072


def test_longrope_keeps_short_long_and_joined_caches():
    """vLLM Phi3LongRoPEScaledRotaryEmbedding registers short_cos_sin_cache (original_max_position_embeddings),
    long_cos_sin_cache (max_position_embeddings) and their concatenation, long_short_cos_sin_cache."""
    cfg = json.loads((DATA / "phi-3.5-moe.json").read_text())
    cfg["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 64, "long_factor": [1.0] * 64}
    card = from_hf_config(cfg, "x")
    assert weight_bytes_per_rank(card, 1)["rope_cache"] == (4096 + 131072 + 135168) * 128 * FP16
    phi3 = {**cfg, "model_type": "phi3", "num_local_experts": None}  # Phi-3's family reads the same caches
    assert from_hf_config(phi3, "y").rope_caches == [4096, 131072, 135168]
    del cfg["original_max_position_embeddings"]
    with pytest.raises(ConfigError, match="original_max_position_embeddings None"):
        from_hf_config(cfg, "x")


@pytest.mark.parametrize("over, field", [({"lm_head_bias": False}, "lm_head_bias False"),
                                         ({"attention_bias": None}, "attention_bias None")])
def test_phimoe_refuses_what_it_cannot_size(over, field):
    cfg = json.loads((DATA / "phi-3.5-moe.json").read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")


def test_starcoder2_3b():
    """StarCoder2-3B (`starcoder2`, families/starcoder.py): vLLM starcoder2.py, derived by hand (biases on q/k/v/o
    and the GELU MLP's c_fc/c_proj, two LayerNorms with bias a layer, tied embeddings, every layer sliding)."""
    card = load_model_card(DATA / "starcoder2-3b.json")
    h, L, nq, nkv, hd, inter, vocab = 3072, 30, 24, 2, 128, 12288, 49152
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + nq * hd + 2 * nkv * hd + h
    mlp = 2 * h * inter + inter + h
    params = vocab * h + L * (attn + mlp + 4 * h) + 2 * h  # tied; final LayerNorm with bias
    assert params == 3_030_371_328 == count_params(card)  # StarCoder2-3B: "3B" (3.03B)
    assert (card.num_sliding_layers, card.sliding_window) == (30, 4096)  # window 4,096 < 16,384 positions
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * FP16 == 30_720


def test_starcoder2_refuses_unbiased_layers():
    cfg = json.loads((DATA / "starcoder2-3b.json").read_text())
    cfg["use_bias"] = False
    with pytest.raises(ConfigError, match="use_bias false"):
        from_hf_config(cfg, "x")


def test_gpt_bigcode_santacoder():
    """SantaCoder (`gpt_bigcode`, families/starcoder.py): vLLM gpt_bigcode.py, derived by hand from the GPT-2 style
    fields (multi-query attention: one K/V head of 128; learned positions; LayerNorms, attention and MLP with
    biases; the LM head tied to wte; no rotary cache)."""
    card = load_model_card(DATA / "gpt_bigcode-santacoder.json")
    h, L, nq, hd, inter, vocab, positions = 2048, 24, 16, 128, 8192, 49280, 2048
    c_attn = h * (nq * hd + 2 * hd) + nq * hd + 2 * hd  # q of 16 heads, one shared k and v, with bias
    layer = 2 * h + c_attn + (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h)
    params = vocab * h + positions * h + L * layer + 2 * h
    assert params == 1_124_886_528 == count_params(card)  # SantaCoder: "1.1B"
    groups = weight_bytes_per_rank(card, 1)
    assert groups["rope_cache"] == 0 and groups["position_embeddings"] == positions * h * FP16
    assert card.num_kv_heads == 1
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * 1 * hd * L * FP16 == 12_288
    assert kv_bytes_per_token(card, "bf16", 4) == 12_288  # the one K/V head is replicated on every rank


def test_gpt_bigcode_refuses_another_activation():
    cfg = json.loads((DATA / "gpt_bigcode-santacoder.json").read_text())
    cfg["activation_function"] = "relu"
    with pytest.raises(ConfigError, match="activation_function 'relu'"):
        from_hf_config(cfg, "x")
    cfg = json.loads((DATA / "gpt_bigcode-santacoder.json").read_text())
    del cfg["n_layer"]
    with pytest.raises(ConfigError, match="field 'n_layer' is missing"):
        from_hf_config(cfg, "x")


def test_opt_125m():
    """OPT-125m (`opt`, families/opt.py): vLLM opt.py, derived by hand (biases everywhere, two LayerNorms with bias
    a layer, a ReLU MLP of ffn_dim, 2,048 + 2 learned positions, the LM head tied to the embedding)."""
    card = load_model_card(DATA / "opt-125m.json")
    h, L, ffn, vocab, positions = 768, 12, 3072, 50272, 2048 + 2
    layer = (4 * h * h + 4 * h) + 4 * h + (h * ffn + ffn) + (ffn * h + h)
    params = vocab * h + positions * h + L * layer + 2 * h
    assert params == 125_239_296 == count_params(card)  # OPT-125m: "125M"
    groups = weight_bytes_per_rank(card, 1)
    assert groups["rope_cache"] == 0 and groups["position_embeddings"] == positions * h * FP16
    assert kv_bytes_per_token(card, "fp16", 1) == 2 * 12 * 64 * L * FP16 == 36_864


@pytest.mark.parametrize("over, field", [({"word_embed_proj_dim": 512}, "word_embed_proj_dim 512"),
                                         ({"do_layer_norm_before": False}, "do_layer_norm_before False"),
                                         ({"activation_function": "gelu"}, "activation_function 'gelu'"),
                                         ({"ffn_dim": None}, "field 'ffn_dim' is missing")])
def test_opt_refuses_what_it_cannot_size(over, field):
    cfg = json.loads((DATA / "opt-125m.json").read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")
