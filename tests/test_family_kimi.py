"""Kimi-Linear (`kimi_linear`, capacity/model/families/kimi.py): KDA state layers beside MLA layers, derived by hand
from vLLM's code: models/kimi_linear.py (`KimiDecoderLayer`, `KimiMLAAttention`, `KimiMoE`), layers/kda.py
(`KimiDeltaAttention`'s tensors), mamba/mamba_utils.py (`MambaStateShapeCalculator.kda_state_shape`,
`MambaStateDtypeCalculator.kda_state_dtype`). The config and its sources: tests/data/families/SOURCES.md."""
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

CONFIG = Path(__file__).parent / "data" / "families" / "kimi-linear-48b-a3b-instruct.json"
BF16, FP32 = 2, 4
H, L, VOCAB, KDA, MLA = 2304, 27, 163840, 20, 7  # full_attn_layers 4, 8, ..., 24, 27 (1-based): 7 MLA layers
HEADS, D, K = 32, 128, 4  # linear_attn_config: num_heads, head_dim, short_conv_kernel_size
P = HEADS * D


def _params() -> tuple[int, int]:
    """(compute-dtype parameters, float32 parameters)."""
    kda = (3 * P * H + HEADS * H  # q/k/v_proj, b_proj
           + 2 * (D * H + P * D)  # f_a/f_b and g_a/g_b
           + D + H * P)  # o_norm, o_proj
    kda_fp32 = 3 * P * K + P + HEADS  # q/k/v_conv1d (params_dtype float32), dt_bias, A_log
    mla = 32 * (128 + 64) * H + (512 + 64) * H + 512 + 32 * (128 + 128) * 512 + H * 32 * 128
    e, mi = 256, 1024
    moe = e * H + e + e * 3 * H * mi + 3 * H * mi  # gate, e_score_correction_bias (model dtype), experts, 1 shared
    bf16 = 2 * VOCAB * H + L * 2 * H + H + KDA * kda + MLA * mla + 3 * H * 9216 + (L - 1) * moe
    return bf16, KDA * kda_fp32


def test_kimi_linear_params_and_weights():
    card = load_model_card(CONFIG)
    bf16, fp32 = _params()
    assert bf16 + fp32 == 49_122_681_728 == count_params(card)  # "48B total" in the Kimi-Linear README
    w = weight_bytes_per_rank(card, 1)
    assert w["rope_cache"] == 0  # MLA with mla_use_nope: vLLM passes rotary_emb=None, no cos/sin cache
    assert sum(w.values()) == bf16 * BF16 + fp32 * FP32


def test_kimi_linear_kv_and_state():
    card = load_model_card(CONFIG)
    assert card.state is not None and (card.state.kind, card.state.num_layers, card.num_kv_layers) == ("kda", KDA, MLA)
    assert (card.num_dense_layers, card.num_moe_layers) == (1, 26)
    # MLA: one latent of 512 and a 64-wide rope key per token and layer, on every rank
    assert kv_bytes_per_token(card, "bf16", 1) == kv_bytes_per_token(card, "bf16", 8) == (512 + 64) * MLA * BF16 == 8064
    # a KDA layer's state per sequence: q/k/v convs (K - 1) x P / tp in bf16, the recurrent H / tp x D x D in fp32
    rel = release("0.13.0")
    assert mamba_page_bytes(card, rel, 1) == 3 * (K - 1) * P * BF16 + HEADS * D * D * FP32 == 2_170_880
    assert mamba_page_bytes(card, rel, 2) == 3 * (K - 1) * P // 2 * BF16 + HEADS // 2 * D * D * FP32 == 1_085_440
    # vLLM's hybrid block size at tp 2: 16 x cdiv(1,085,440, 16 x 1,152 B of one MLA layer's token) = 16 x 59
    assert hybrid_block_size(card, rel, 2, "bf16", 16) == 944


def _cfg(**over) -> dict:
    cfg = json.loads(CONFIG.read_text())
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("over, message", [
    ({"mla_use_nope": False}, "mla_use_nope False"),
    ({"q_lora_rank": 1536}, "q_lora_rank 1536"),
    ({"moe_layer_freq": 2}, "moe_layer_freq 2"),
    ({"linear_attn_config": {"kda_layers": [0, 1]}}, "kda_layers must list"),
    ({"linear_attn_config": None}, "linear_attn_config is missing"),
])
def test_kimi_linear_refuses_what_vllm_does_not_build(over, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config(_cfg(**over), "x")


def test_kimi_linear_without_kda_layers_is_plain_mla():
    lin = {**_cfg()["linear_attn_config"], "kda_layers": []}
    card = from_hf_config(_cfg(linear_attn_config=lin), "x")
    assert card.state is None and card.num_kv_layers == L
