"""OLMo-2 and OLMoE (capacity/model/families/olmo.py), derived by hand from the configs and vLLM's olmo2.py /
olmoe.py (full-width q/k RMSNorms held whole on every rank; OLMoE's MoE without shared experts). Config sources:
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


def test_olmo2_7b():
    card = load_model_card(DATA / "olmo-2-1124-7b.json")
    assert card.notes == []
    h, L, nq, hd, inter, vocab = 4096, 32, 32, 128, 11008, 100352
    attn = 4 * h * h  # q, k, v, o: 32 heads, 32 KV heads of 128
    qk_norm = nq * hd + nq * hd  # q_norm over hidden_size, k_norm over kv_heads x head_dim
    layer = attn + qk_norm + 3 * h * inter + 2 * h
    params = 2 * vocab * h + L * layer + h
    assert params == 7_298_617_344 == count_params(card)  # OLMo-2-1124-7B: "7.3B"
    rope = 4096 * hd * BF16
    assert sum(weight_bytes_per_rank(card, 1).values()) == params * BF16 + rope
    tp2 = (vocab * h + L * ((attn + 3 * h * inter) // 2 + qk_norm + 2 * h) + h) * BF16  # the norms whole
    assert sum(weight_bytes_per_rank(card, 2).values()) == tp2 + rope
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nq * hd * L * BF16 == 524_288


def test_olmoe_1b_7b():
    card = load_model_card(DATA / "olmoe-1b-7b-0924.json")
    h, L, nq, hd, vocab, e, k, mi = 2048, 16, 16, 128, 50304, 64, 8, 1024
    attn = 4 * h * h + 2 * nq * hd  # q, k, v, o and the full-width q/k norms
    moe = e * 3 * h * mi + e * h
    params = 2 * vocab * h + L * (attn + moe + 2 * h) + h
    assert params == 6_919_161_856 == count_params(card)  # OLMoE-1B-7B: "6.9B total"
    active = 2 * vocab * h + L * (attn + k * 3 * h * mi + e * h + 2 * h) + h
    assert 1.2e9 < active < 1.4e9  # "1.3B active"
    assert card.max_position_embeddings == 4096  # OlmoeConfig's default (the config leaves it out)
    ep4 = weight_bytes_per_rank(card, 4, ep=4)  # 64 experts, 16 whole ones a rank
    assert ep4["experts_gate_up"] + ep4["experts_down"] == L * 16 * 3 * h * mi * BF16
    tp4 = weight_bytes_per_rank(card, 4)  # without EP: every expert split along its intermediate size
    assert tp4["experts_gate_up"] + tp4["experts_down"] == L * e * 3 * h * (mi // 4) * BF16
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nq * hd * L * BF16 == 131_072


@pytest.mark.parametrize("name, over, field", [("olmo-2-1124-7b.json", {"attention_bias": True}, "attention_bias True"),
                                               ("olmoe-1b-7b-0924.json", {"clip_qkv": 8.0}, "clip_qkv 8.0"),
                                               ("olmoe-1b-7b-0924.json", {"num_experts": None},
                                                "'num_experts' is missing")])
def test_olmo_refuses_what_it_cannot_size(name, over, field):
    cfg = json.loads((DATA / name).read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")
