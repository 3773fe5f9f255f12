"""Jamba (`jamba`, capacity/model/families/jamba.py), derived by hand from vLLM's jamba.py (`JambaMambaDecoderLayer`,
`JambaAttentionDecoderLayer`, `JambaMoE`) and layers/mamba/mamba_mixer.py (`MambaMixer` with use_rms_norm), with
transformers' JambaConfig layer rules. The config and its source: tests/data/families/SOURCES.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.engine.vllm.layout import hybrid_block_size, mamba_page_bytes
from capacity.engine.vllm.release import release
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.weights import count_params, weight_bytes_per_rank

CONFIG = Path(__file__).parent / "data" / "families" / "jamba-1.5-mini.json"
H, L, VOCAB, INTER, E = 4096, 32, 65536, 14336, 16
ATTN, MOE = 4, 16  # attention at i % 8 == 4 (4, 12, 20, 28); experts at i % 2 == 1
D_IN, N, R, K = 2 * H, 16, 256, 4  # mamba_expand x hidden, d_state, dt_rank, d_conv


def test_jamba_params():
    card = load_model_card(CONFIG)
    attn = H * H + 2 * H * 8 * 128 + H * H  # q, k/v (8 KV heads of 128), o; no biases
    mamba = (2 * D_IN * H + D_IN * (K + 1) + (R + 2 * N) * D_IN  # in_proj, conv1d + bias, x_proj
             + D_IN * (R + 1) + D_IN * (N + 1) + H * D_IN + R + 2 * N)  # dt_proj + bias, A and D, out_proj, norms
    mlp = 3 * H * INTER
    params = (2 * VOCAB * H + ATTN * attn + (L - ATTN) * mamba + (L - MOE) * mlp + MOE * (E * H + E * mlp)
              + L * 2 * H + H)
    assert params == 51_570_323_328 == count_params(card)  # "52B total" for Jamba 1.5 Mini
    w = weight_bytes_per_rank(card, 1)
    assert w["rope_cache"] == 0  # no positional embedding: vLLM builds no rotary cache
    assert sum(w.values()) == params * 2


def test_jamba_kv_and_state():
    card = load_model_card(CONFIG)
    assert (card.num_kv_layers, card.num_moe_layers, card.num_dense_layers) == (ATTN, MOE, L - MOE)
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * 8 * 128 * ATTN * 2 == 16_384
    rel = release("0.13.0")  # mamba1_state_shape: (d_conv - 1) x D_IN / tp and D_IN / tp x d_state, bf16
    assert mamba_page_bytes(card, rel, 2) == ((K - 1) * D_IN // 2 + D_IN // 2 * N) * 2 == 155_648
    # the attention block holds one state page: 16 x cdiv(155,648, 16 x 2,048 B of one layer's token at tp 2)
    assert hybrid_block_size(card, rel, 2, "bf16", 16) == 80


def _cfg(**over) -> dict:
    cfg = json.loads(CONFIG.read_text())
    cfg.update(over)
    return cfg


def test_jamba_layer_rules():
    card = from_hf_config(_cfg(attn_layer_period=4, attn_layer_offset=1, num_experts=1, mamba_dt_rank="auto"), "x")
    assert card.num_kv_layers == 8 and card.moe is None and card.num_dense_layers == L
    assert card.state is not None and card.state.dt_rank == H // 16


@pytest.mark.parametrize("over, message", [({"attn_layer_period": 0}, "attn_layer_period 0"),
                                           ({"mamba_proj_bias": True}, "mamba_proj_bias true")])
def test_jamba_refuses_what_it_cannot_size(over, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config(_cfg(**over), "x")
