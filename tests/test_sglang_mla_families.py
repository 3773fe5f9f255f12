"""GLM-4.7-Flash (glm4_moe_lite), GLM-5.1 (glm_moe_dsa) and Kimi-K2.5 (kimi_k25) in SGLang: their attention is
deepseek_v2.py's DeepseekV2AttentionMLA (glm4_moe_lite.py; GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM) in
glm4_moe.py; kimi_k25.py's language_model = DeepseekV3ForCausalLM; wheels 0.5.8-0.5.23), so post_load_weights keeps
the w_kc / w_vc copies of kv_b_proj beside it (sglang/mla.py) and DP attention shards it over the attention-TP group
(sglang/dpattn.py). Copy sizes computed by hand from the configs: layers x heads per rank x (qk_nope + v) x
kv_lora_rank x 2 bytes (bf16 attention weights)."""
from __future__ import annotations

from pathlib import Path

import pytest

from capacity.engine.sglang.dpattn import check_dp_attention
from capacity.engine.sglang.mla import absorbed_copy_bytes
from capacity.errors import ConfigError
from capacity.model.card import load_model_card

HF = Path(__file__).parent / "data" / "startup_v4" / "hf"
LINE = (0, 5, 20, 0)


@pytest.mark.parametrize("name, tp, expected", [
    ("glm-4.7-flash.json", 4, 47 * (20 // 4) * (192 + 256) * 512 * 2),  # 107,806,720 B
    ("glm-5.1.json", 8, 78 * (64 // 8) * (192 + 256) * 512 * 2),  # 286,261,248 B
    ("kimi-k2.5.json", 8, 61 * (64 // 8) * (128 + 128) * 512 * 2),  # 127,926,272 B
])
def test_absorbed_copies(name, tp, expected):
    card = load_model_card(HF / name)
    assert card.format_of("attention") not in ("fp8",)  # 16-bit attention weights: 2 bytes a copied element
    assert absorbed_copy_bytes(card, tp, LINE) == expected
    # DP attention 8 at TP 8: attention TP 1, every head's copy on each rank
    if tp == 8:
        assert absorbed_copy_bytes(card, 1, LINE) == expected * 8


@pytest.mark.parametrize("name", ["glm-4.7-flash.json", "glm-5.1.json", "kimi-k2.5.json"])
def test_dp_attention_accepted(name):
    card = load_model_card(HF / name)
    assert check_dp_attention(card, 8, 4, LINE) == 2


def test_dp_attention_still_refused_for_gemma4():
    card = load_model_card(HF / "gemma-4-31b-it.json")
    with pytest.raises(ConfigError, match="enable_dp_attention: SGLang's gemma4 model"):
        check_dp_attention(card, 8, 4, LINE)
