"""IBM Granite 3.x dense and MoE (capacity/model/families/granite.py), derived by hand from the configs and vLLM's
granite.py / granitemoe.py (Llama's layout; multipliers hold no weights; a MoE of num_local_experts experts of
intermediate_size with a replicated router). Config sources: tests/data/families/SOURCES.md."""
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


def test_granite_3_3_8b():
    card = load_model_card(DATA / "granite-3.3-8b.json")
    assert card.notes == [] and card.tie_word_embeddings and not card.attention_bias
    h, L, nq, nkv, hd, inter, vocab = 4096, 40, 32, 8, 128, 12800, 49159
    layer = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 3 * h * inter + 2 * h
    params = vocab * h + L * layer + h  # tied: one embedding matrix
    assert params == 8_170_864_640 == count_params(card)  # Granite-3.3-8B: "8B" (8.17B)
    rope = 131072 * hd * BF16
    padded = -(-vocab // 64) * 64  # vLLM pads the vocabulary to a multiple of 64 (49,216 rows)
    assert sum(weight_bytes_per_rank(card, 1).values()) == (params + (padded - vocab) * h) * BF16 + rope
    tp4 = (padded * h // 4 + L * ((layer - 2 * h) // 4 + 2 * h) + h) * BF16
    assert sum(weight_bytes_per_rank(card, 4).values()) == tp4 + rope
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 163_840


def test_granite_3_1_3b_a800m():
    card = load_model_card(DATA / "granite-3.1-3b-a800m.json")
    h, L, nq, nkv, vocab, e, k, mi = 1536, 32, 24, 8, 49155, 40, 8, 512
    hd = h // nq  # 64
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd
    moe = e * 3 * h * mi + e * h  # experts and router
    params = vocab * h + L * (attn + moe + 2 * h) + h
    assert params == 3_298_793_472 == count_params(card)  # Granite-3.1-3B-A800M: "3.3B total"
    active = vocab * h + L * (attn + k * 3 * h * mi + e * h + 2 * h) + h
    assert 0.75e9 < active - vocab * h < 0.85e9  # "800M active" (without the embedding)
    assert card.moe is not None and card.moe.num_shared_experts == 0
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 65_536


def test_granitemoeshared_adds_one_shared_mlp():
    cfg = json.loads((DATA / "granite-3.1-3b-a800m.json").read_text())
    cfg.update(model_type="granitemoeshared", shared_intermediate_size=1024)
    card = from_hf_config(cfg, "x")
    assert card.moe is not None and card.moe.shared_intermediate == 1024
    assert count_params(card) == 3_298_793_472 + 32 * 3 * 1536 * 1024


@pytest.mark.parametrize("name, over, field", [
    ("granite-3.3-8b.json", {"mlp_bias": True}, "mlp_bias true"),
    ("granite-3.1-3b-a800m.json", {"shared_intermediate_size": 1024}, "needs model_type granitemoeshared"),
    ("granite-3.1-3b-a800m.json", {"num_local_experts": None}, "'num_local_experts' is missing")])
def test_granite_refuses_what_it_cannot_size(name, over, field):
    cfg = json.loads((DATA / name).read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")
