"""Cohere Command-R (`cohere`) and Command-R7B (`cohere2`), capacity/model/families/cohere.py, derived by hand
from the configs' fields and vLLM's commandr.py (a parallel block with one weight-only LayerNorm, tied embeddings,
3 sliding layers to 1 full in cohere2). Config sources: tests/data/families/SOURCES.md."""
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


def test_command_r7b():
    card = load_model_card(DATA / "command-r7b-12-2024.json")
    assert card.notes == [] and card.tie_word_embeddings and card.norms_per_layer == 1
    h, L, nq, nkv, hd, inter, vocab = 4096, 32, 32, 8, 128, 14336, 256000
    layer = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 3 * h * inter + h  # one LayerNorm (weight only)
    params = vocab * h + L * layer + h
    assert params == 8_028_033_024 == count_params(card)  # Command-R7B: "7B" (8.03B with the 256k vocabulary)
    assert sum(weight_bytes_per_rank(card, 1).values()) == params * BF16 + 132096 * hd * BF16
    # sliding_window_pattern 4: layers 0-2 of every 4 slide over 4,096 tokens, every 4th layer is full
    assert (card.num_sliding_layers, card.num_full_layers, card.sliding_window) == (24, 8, 4096)
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 131_072  # all layers, before windows


def test_command_r_v01():
    card = load_model_card(DATA / "c4ai-command-r-v01.json")
    h, L, inter, vocab = 8192, 40, 22528, 256000
    params = vocab * h + L * (4 * h * h + 3 * h * inter + h) + h  # MHA: 64 heads, 64 KV heads of 128
    assert params == 34_980_831_232 == count_params(card)  # Command-R: "35B"
    assert card.num_sliding_layers == 0
    assert kv_bytes_per_token(card, "bf16", 8) == 2 * 8 * 128 * L * BF16  # 64 KV heads, 8 a rank


def test_command_r_plus_qk_norm_adds_per_head_layernorms():
    cfg = json.loads((DATA / "c4ai-command-r-v01.json").read_text())
    cfg.update(use_qk_norm=True, num_key_value_heads=8)
    card = from_hf_config(cfg, "x")
    h, L, hd = 8192, 40, 128
    plain = 256000 * h + L * (h * h + 2 * 8 * hd * h + h * h + 3 * h * 22528 + h) + h
    assert count_params(card) == plain + L * (64 * hd + 8 * hd)  # q_norm (64, 128), k_norm (8, 128)
    assert weight_bytes_per_rank(card, 8)["k_norm"] == L * hd * BF16  # one KV head a rank


@pytest.mark.parametrize("over, field", [({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
                                         ({"layer_norm_bias": True}, "layer_norm_bias true"),
                                         ({"sliding_window": None}, "sliding_window None")])
def test_cohere2_refuses_what_it_cannot_size(over, field):
    cfg = json.loads((DATA / "command-r7b-12-2024.json").read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")
