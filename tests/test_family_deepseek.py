"""DeepSeek-V2/V3 (capacity/model/families/deepseek.py): the router's score-correction bias.

vLLM deepseek_v2.py `DeepseekV2MoE.__init__`: where topk_method is "noaux_tc" (transformers' DeepseekV3Config
default) `self.gate.e_score_correction_bias = nn.Parameter(torch.empty(config.n_routed_experts,
dtype=torch.float32))`, a plain parameter, so every TP rank holds the whole vector. Numbers derived by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.hf import from_hf_config
from capacity.model.weights import count_params, weight_bytes_per_rank

HF = Path(__file__).parent / "data" / "hf"
CARDS = Path(__file__).parents[1] / "capacity" / "data" / "models"


def _v3_params() -> int:
    h, L, vocab, nq = 7168, 61, 129280, 128
    ql, kvl, nope, rope, v = 1536, 512, 128, 64, 128
    dense_layers, moe_layers, e, mi, inter = 3, 58, 256, 2048, 18432
    attn = (ql * h + ql + nq * (nope + rope) * ql  # q_a_proj, q_a_layernorm, q_b_proj
            + (kvl + rope) * h + kvl + nq * (nope + v) * kvl  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
            + h * nq * v)  # o_proj
    moe = e * h + e + e * 3 * h * mi + 3 * h * mi  # gate, e_score_correction_bias, experts, one shared expert
    return 2 * vocab * h + L * (attn + 2 * h) + h + dense_layers * 3 * h * inter + moe_layers * moe


@pytest.mark.parametrize("path", [HF / "deepseek-v3.json", CARDS / "deepseek-v3.yaml"])
def test_v3_counts_the_score_correction_bias(path):
    card = load_model_card(path)
    assert _v3_params() == 671_026_419_200  # 671B on the model card (the 14B MTP module is not loaded)
    assert count_params(card) == _v3_params()
    for tp in (1, 8):  # replicated: 58 MoE layers x 256 experts x 4 B on every rank
        assert weight_bytes_per_rank(card, tp)["router_score_bias"] == 58 * 256 * 4 == 59_392


def test_v2_has_no_score_correction_bias():
    card = load_model_card(HF / "deepseek-v2-lite.json")  # topk_method greedy (DeepseekV2Config's default)
    assert "router_score_bias" not in weight_bytes_per_rank(card, 1)


@pytest.mark.parametrize("name, topk", [("deepseek-v3.json", "greedy"), ("deepseek-v2-lite.json", "noaux_tc")])
def test_a_topk_method_its_model_type_does_not_use_is_refused(name, topk):
    cfg = json.loads((HF / name).read_text())
    with pytest.raises(ConfigError, match=f"topk_method '{topk}'"):
        from_hf_config({**cfg, "topk_method": topk}, "x")


FAMILIES = Path(__file__).parent / "data" / "families"


def test_v32_indexer_weights_and_cache():
    """DeepSeek-V3.2 (`deepseek_v32`): V3's layout plus the lightning indexer on every layer (vLLM deepseek_v2.py
    `Indexer`, `DeepseekV32IndexerCache`), derived by hand from the config's index_* fields."""
    card = load_model_card(FAMILIES / "deepseek-v3.2-exp.json")
    h, L, ql, idx_heads, idx_dim = 7168, 61, 1536, 64, 128
    wq_b, wk, k_norm, weights_proj = idx_heads * idx_dim * ql, idx_dim * h, 2 * idx_dim, idx_heads * h
    indexer = L * (wq_b + wk + k_norm + weights_proj)
    assert indexer == 851_524_864
    assert count_params(card) == _v3_params() + indexer == 671_877_944_064  # V3's 671B + 0.85B of indexer
    groups = weight_bytes_per_rank(card, 8)  # replicated: every rank holds the whole indexer
    blocks = (idx_heads * idx_dim // 128) * (ql // 128) + 1 * (h // 128)  # fp32 scale per 128 x 128 block
    assert groups["indexer_wq_b"] + groups["indexer_wk"] == L * (wq_b + wk + blocks * 4)  # fp8 + block scales
    assert groups["indexer_weights_proj"] == L * weights_proj * 2  # quant_config=None: bf16
    assert groups["indexer_k_norm"] == L * k_norm * 2
    assert groups["router_score_bias"] == 58 * 256 * 4
    # KV per token and layer: the MLA latent + rope key (512 + 64) in the KV dtype, and the indexer's 128 fp8 key
    # bytes + one fp32 scale (132 B, uint8 whatever the KV dtype)
    assert kv_bytes_per_token(card, "bf16", 1) == L * ((512 + 64) * 2 + 132) == 78_324
    assert kv_bytes_per_token(card, "fp8", 8) == L * ((512 + 64) * 1 + 132) == 43_188  # the latent is not split


@pytest.mark.parametrize("over, field", [({"index_head_dim": 64}, "index_head_dim 64"),
                                         ({"index_n_heads": 32}, "index_n_heads 32"),
                                         ({"index_topk": None}, "'index_topk' is missing"),
                                         ({"topk_method": "greedy"}, "topk_method 'greedy'")])
def test_v32_refuses_an_indexer_it_cannot_size(over, field):
    cfg = json.loads((FAMILIES / "deepseek-v3.2-exp.json").read_text())
    cfg.update(over)
    with pytest.raises(ConfigError, match=field):
        from_hf_config(cfg, "x")


def test_v3_has_no_indexer_cache():
    card = load_model_card(HF / "deepseek-v3.json")
    assert kv_bytes_per_token(card, "bf16", 1) == 61 * (512 + 64) * 2
    assert not any(name.startswith("indexer") for name in weight_bytes_per_rank(card, 1))
