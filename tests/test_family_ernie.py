"""ERNIE-4.5 (dense and MoE), the first family added as one module (capacity/model/families/ernie.py).

Every number is derived by hand below from the config's fields and vLLM's model code (ernie45.py: Llama's layout;
ernie45_moe.py: `Ernie4_5_MoeDecoderLayer`, `Ernie4_5_MoeMoE`, `Ernie4_5_MoeAttention`), not read from the code
under test. Configs and their sources: tests/data/families/SOURCES.md."""
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
ROPE = 131072 * 128 * BF16  # vLLM's cos/sin cache: max_position_embeddings x head_dim (full rotary) in bf16


def test_ernie_dense_03b():
    card = load_model_card(DATA / "ernie-4.5-0.3b-pt.json")
    assert card.notes == []  # a family of its own: no "read as a Llama-style decoder" note
    h, L, hd, q_heads, kv_heads, inter, vocab = 1024, 18, 128, 16, 2, 3072, 103424
    embed = vocab * h  # tied: the LM head is the embedding
    attn = q_heads * hd * h + 2 * kv_heads * hd * h + h * q_heads * hd  # q, k and v, o (no biases)
    mlp = 3 * h * inter  # gate, up, down
    norms = L * 2 * h + h  # two RMSNorms a layer, the final norm
    params = embed + L * (attn + mlp) + norms
    assert params == 360_748_032  # ERNIE-4.5-0.3B: "0.36B" on its model card
    assert count_params(card) == params
    assert sum(weight_bytes_per_rank(card, 1).values()) == params * BF16 + ROPE
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * kv_heads * hd * L * BF16 == 18_432


def test_ernie_moe_21b_a3b():
    card = load_model_card(DATA / "ernie-4.5-21b-a3b-pt.json")
    h, L, hd, q_heads, kv_heads, vocab = 2560, 28, 128, 20, 4, 103424  # head_dim: 2560 / 20
    inter, e, k, mi, shared = 12288, 64, 6, 1536, 2
    moe_layers = L - 1  # layers 1..27 (moe_layer_start_index 1, end 27, interval 1); layer 0 is dense
    embed = vocab * h  # tied
    attn = q_heads * hd * h + 2 * kv_heads * hd * h + h * q_heads * hd
    dense = 3 * h * inter
    experts = e * 3 * h * mi
    shared_mlp = 3 * h * (mi * shared)  # one MLP of moe_intermediate_size x moe_num_shared_experts
    router, score_bias = e * h, e  # float32 (gate params_dtype=torch.float32; e_score_correction_bias float32)
    norms = L * 2 * h + h
    bf16 = embed + L * attn + dense + moe_layers * (experts + shared_mlp) + norms
    fp32 = moe_layers * (router + score_bias)
    assert bf16 + fp32 == 21_825_437_888  # "21B total" (21.8B) on the model card
    assert count_params(card) == bf16 + fp32
    assert sum(weight_bytes_per_rank(card, 1).values()) == bf16 * BF16 + fp32 * FP32 + ROPE == 43_693_281_024
    assert card.moe is not None and (card.moe.experts_per_token, card.num_moe_layers) == (k, moe_layers)
    # KV: every layer full GQA attention; 4 KV heads split over tp, replicated past 4 ranks
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * kv_heads * hd * L * BF16 == 57_344
    assert kv_bytes_per_token(card, "bf16", 2) == 2 * (kv_heads // 2) * hd * L * BF16
    assert kv_bytes_per_token(card, "bf16", 8) == 2 * 1 * hd * L * BF16
    # tp=2: every linear split in two (experts along their intermediate size), routers and norms replicated
    tp2 = (embed // 2 + L * attn // 2 + dense // 2 + moe_layers * (experts + shared_mlp) // 2 + norms) * BF16
    assert sum(weight_bytes_per_rank(card, 2).values()) == tp2 + fp32 * FP32 + ROPE


def _cfg(**over) -> dict:
    cfg = json.loads((DATA / "ernie-4.5-21b-a3b-pt.json").read_text())
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("over, field", [({"moe_layer_interval": 2}, "moe_layer_interval 2"),
                                         ({"moe_layer_end_index": 20}, "moe_layer_end_index 20"),
                                         ({"use_bias": True}, "use_bias true"),
                                         ({"moe_k": None}, "'moe_k' is missing")])
def test_ernie_moe_refuses_what_it_cannot_size(over, field):
    with pytest.raises(ConfigError, match=field):
        from_hf_config(_cfg(**over), "x")


def test_ernie_moe_start_index_is_the_dense_prefix():
    card = from_hf_config(_cfg(moe_layer_start_index=3, moe_layer_end_index=None), "x")  # as ERNIE-4.5-300B-A47B
    assert (card.num_dense_layers, card.num_moe_layers) == (3, 25)
