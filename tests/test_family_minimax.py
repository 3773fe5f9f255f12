"""MiniMax-M2 (capacity/model/families/minimax.py), derived by hand from the config and vLLM's minimax_m2.py
(`MiniMaxM2Attention`: per-layer q/k RMSNorms over all heads, a rotary embedding of rotary_dim; `MiniMaxM2MoE`: a
float32 gate and e_score_correction_bias, no shared expert). Config source: tests/data/families/SOURCES.md."""
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
BF16, FP32 = 2, 4


def test_minimax_m2():
    card = load_model_card(DATA / "minimax-m2.json")
    assert card.notes == [] and card.architecture == "minimax_m2"
    h, L, nq, nkv, hd, vocab, e, k, mi = 3072, 62, 48, 8, 128, 200064, 256, 8, 1536
    attn = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + nq * hd + nkv * hd  # q, k/v, o, q_norm, k_norm
    experts = e * 3 * h * mi
    router = e * h + e  # gate and e_score_correction_bias, float32
    bf16 = 2 * vocab * h + L * (attn + experts + 2 * h) + h
    params = bf16 + L * router
    assert params == 228_689_764_864  # MiniMax-M2: "230B total"
    active = 2 * vocab * h + L * (attn + k * 3 * h * mi + router + 2 * h) + h
    assert 10e9 < active < 11.1e9  # "10B active" (the model card counts without the embeddings)
    assert count_params(card) == params
    rope = 196608 * 64 * BF16  # max_position_embeddings x rotary_dim 64 (of head_dim 128)
    by = weight_bytes_per_rank(card, 1)
    assert by["rope_cache"] == rope
    assert sum(by.values()) == bf16 * BF16 + L * router * FP32 + rope
    # tp=8: q/k/v/o, the experts and the q/k norms split by head, one KV head a rank; router, norms replicated
    tp8 = weight_bytes_per_rank(card, 8)
    assert tp8["q_norm"] + tp8["k_norm"] == L * (nq * hd // 8 + hd) * BF16
    assert tp8["router"] + tp8["router_score_bias"] == L * router * FP32
    # ep=8 (tp 8): whole experts, 256 / 8 = 32 on each rank, gate/up and down unsplit
    ep8 = weight_bytes_per_rank(card, 8, ep=8)
    assert ep8["experts_gate_up"] + ep8["experts_down"] == L * 32 * 3 * h * mi * BF16
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 253_952
    assert kv_bytes_per_token(card, "fp8", 8) == 2 * 1 * hd * L


@pytest.mark.parametrize("over, field", [({"rotary_dim": 128}, "rotary_dim 128"),
                                         ({"rotary_dim": None}, "'rotary_dim' is missing"),
                                         ({"qk_norm_type": "per_head"}, "qk_norm_type 'per_head'"),
                                         ({"shared_intermediate_size": 1536}, "shared_intermediate_size 1536"),
                                         ({"num_local_experts": None}, "'num_local_experts' is missing"),
                                         ({"attn_type_list": [0, 1]}, "attn_type_list with linear-attention")])
def test_minimax_m2_refuses_what_it_cannot_size(over, field):
    cfg = json.loads((DATA / "minimax-m2.json").read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")
