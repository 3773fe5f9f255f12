"""The absorbed-MLA copies SGLang's DeepSeek loader keeps beside `kv_b_proj` (`w_kc`, `w_vc`), per rank.

Read in the PyPI wheels (`python/sglang/srt/models/deepseek_v2.py`, `DeepseekV2ForCausalLM.post_load_weights`) of
0.4.2.post4, 0.4.3, 0.4.4.post2, 0.4.5, 0.4.5.post1, 0.4.5.post3, 0.4.6 to 0.4.6.post5, 0.4.8.post1, 0.4.9, 0.5.0rc0
and 0.5.5. Every release splits each layer's `kv_b_proj` weight (heads / attention-TP x (qk_nope_head_dim +
v_head_dim) x kv_lora_rank on one rank) into `w_kc` and `w_vc` with `.contiguous()` copies, and keeps
`kv_b_proj.weight` as well: one more copy of kv_b_proj's elements per rank, in the dtype of the `w` it split:

- a block-FP8 checkpoint (DeepSeek-V3/R1): up to 0.4.6.post2 `block_quant_to_tensor_quant` requantizes `w` to
  FP8 with one scale (1 byte an element; 0.4.6 to 0.4.6.post2 keep the block-FP8 weight itself when DeepGEMM's JIT
  is on, also 1 byte); from 0.4.6.post3 on CUDA `block_quant_dequant(..., torch.bfloat16)` (2 bytes) unless
  SGL_USE_DEEPGEMM_BMM is set (off by default, not modelled); on ROCm (`_is_cuda` false) FP8 in every release;
- a bf16 / fp16 checkpoint: copies of the 16-bit weight (2 bytes); AWQ and INT8 checkpoints dequantize `w` to
  16 bits first (`awq_dequantize`, `int8_block_dequant(...).to(torch.bfloat16)`): 2 bytes.

DeepSeek-V3 at TP 8 (16 heads a rank, 61 layers): 16 x 256 x 512 x 61 = 127.9 M elements, 0.119 GiB in FP8 (the
0.4.2 series of sglang#3416) and 0.238 GiB in bf16; with DP attention 8 (attention TP 1) eight times that.
"""
from __future__ import annotations

from capacity.model.card import ModelCard

# models whose attention is deepseek_v2.py's DeepseekV2AttentionMLA, with post_load_weights' w_kc / w_vc copies:
# DeepSeek V2/V3/V3.2; GLM-5 (GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM), glm4_moe.py, from 0.5.9); Kimi-K2.5
# (KimiK25ForConditionalGeneration.language_model = DeepseekV3ForCausalLM, kimi_k25.py, from 0.5.9); GLM-4.7-Flash
# (Glm4MoeLiteForCausalLM, glm4_moe_lite.py from 0.5.8: DeepseekV2AttentionMLA layers and
# DeepseekV2WeightLoaderMixin.post_load_weights, called at the end of its load_weights). Read in 0.5.8, 0.5.9,
# 0.5.20 and 0.5.23.
ABSORB_ARCHS = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "kimi_k25", "glm4_moe_lite"})
FIRST_BF16_COPIES = (0, 4, 6, 3)  # the first release whose CUDA path dequantizes a block-FP8 kv_b_proj to bf16
# sglang_budget knows the rules line (memory.RELEASES), not the patch: the 0.4.6.post2 line covers 0.4.6.post2 (FP8
# copies) and 0.4.6.post3-post5 (bf16); it takes bf16, the conservative end (0.119 GiB more at TP 8 for post2).
BF16_COPIES_LINE = (0, 4, 6, 2)


def copy_bytes_per_element(card: ModelCard, line: tuple[int, int, int, int], amd: bool = False) -> int:
    """Bytes of one element of the w_kc / w_vc copies under the rules line `line` (see the module docstring)."""
    fmt = card.format_of("attention")
    if fmt == "fp8" and (amd or line < BF16_COPIES_LINE):
        return 1
    return 2


def absorbed_copy_bytes(card: ModelCard, attn_tp: int, line: tuple[int, int, int, int], amd: bool = False) -> float:
    """Bytes of the w_kc / w_vc copies on one rank at attention TP `attn_tp` (0 for a model SGLang does not load
    through deepseek_v2.py)."""
    m = card.mla
    if m is None or card.architecture not in ABSORB_ARCHS:
        return 0.0
    heads = -(-card.num_attention_heads // attn_tp)
    elements = card.num_kv_layers * heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank
    return float(elements * copy_bytes_per_element(card, line, amd))


__all__ = ["ABSORB_ARCHS", "BF16_COPIES_LINE", "FIRST_BF16_COPIES", "absorbed_copy_bytes", "copy_bytes_per_element"]
