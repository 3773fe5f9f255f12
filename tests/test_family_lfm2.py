"""LFM2 (`lfm2`, capacity/model/families/lfm2.py): short-convolution state layers beside GQA attention, derived by
hand from vLLM's lfm2.py (`Lfm2AttentionDecoderLayer`, `Lfm2ShortConvDecoderLayer`, `Lfm2MLP`) and
layers/mamba/short_conv.py (`ShortConv`), with transformers' Lfm2Config reading the original keys (block_ff_dim,
full_attn_idxs). The config and its source: tests/data/families/SOURCES.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.engine.vllm.layout import mamba_page_bytes
from capacity.engine.vllm.release import release
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.weights import count_params, weight_bytes_per_rank

CONFIG = Path(__file__).parent / "data" / "families" / "lfm2-1.2b.json"
H, L, VOCAB, HEADS, KV, ATTN, CONV = 2048, 16, 65536, 32, 8, 6, 10  # full_attn_idxs 2, 5, 8, 10, 12, 14
HD = H // HEADS  # 64


def test_lfm2_params():
    card = load_model_card(CONFIG)
    ff = 256 * -(-int(2 * 12288 / 3) // 256)  # block_ff_dim 12288, auto-adjusted: 8192
    assert ff == 8192 == card.intermediate_size
    conv = 3 * H * H + H * 3 + H * H  # in_proj (B, C, x), the 3-tap depthwise conv, out_proj; no biases
    attn = H * HEADS * HD + 2 * H * KV * HD + HEADS * HD * H + 2 * HD  # q, k/v, out_proj, q/k layernorms
    params = VOCAB * H + CONV * conv + ATTN * attn + L * (3 * H * ff + 2 * H) + H  # tied embedding, final norm
    assert params == 1_170_340_608 == count_params(card)  # LFM2-1.2B ("1.2B" on its model card)
    assert sum(v for k, v in weight_bytes_per_rank(card, 1).items() if k != "rope_cache") == params * 2


def test_lfm2_kv_and_state():
    card = load_model_card(CONFIG)
    assert card.state is not None and (card.state.kind, card.state.num_layers, card.num_kv_layers) == (
        "short_conv", CONV, ATTN)
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * KV * HD * ATTN * 2 == 12_288
    rel = release("0.13.0")  # short_conv_state_shape: (conv_L_cache - 1) x conv_dim / tp, bf16
    assert mamba_page_bytes(card, rel, 1) == (3 - 1) * 2048 * 2 == 8192
    assert mamba_page_bytes(card, rel, 2) == (3 - 1) * 1024 * 2


def _cfg(**over) -> dict:
    cfg = json.loads(CONFIG.read_text())
    cfg.update(over)
    return cfg


def test_lfm2_layer_types_and_ff_width_rules():
    listed = {k: v for k, v in _cfg().items() if k != "full_attn_idxs"}
    listed["layer_types"] = ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(L)]
    assert from_hf_config(listed, "x").num_kv_layers == ATTN
    assert from_hf_config(_cfg(block_auto_adjust_ff_dim=False), "x").intermediate_size == 12288
    no_idx = {k: v for k, v in _cfg().items() if k != "full_attn_idxs"}  # Lfm2Config: every layer attends
    card = from_hf_config(no_idx, "x")
    assert card.state is None and card.num_kv_layers == L


@pytest.mark.parametrize("over, message", [({"block_dim": 1024}, "block_dim 1024"),
                                           ({"conv_bias": True}, "conv_bias true"),
                                           ({"conv_dim": None}, "'conv_dim' is missing")])
def test_lfm2_refuses_what_it_cannot_size(over, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config(_cfg(**over), "x")
