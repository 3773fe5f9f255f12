"""DeepSeek-V2/V3 (capacity/model/families/deepseek.py): the router's score-correction bias.

vLLM deepseek_v2.py `DeepseekV2MoE.__init__`: where topk_method is "noaux_tc" (transformers' DeepseekV3Config
default) `self.gate.e_score_correction_bias = nn.Parameter(torch.empty(config.n_routed_experts,
dtype=torch.float32))`, a plain parameter, so every TP rank holds the whole vector. Numbers derived by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

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
