"""The matrices vLLM 0.7.1-0.7.3 build for DeepSeek's latent attention after loading the weights and keep beside
them (per rank), which "model weights take" reports.

Read in the PyPI wheels of 0.7.1, 0.7.2 and 0.7.3, `vllm/attention/backends/mla/utils.py`
`MLACommonImpl.process_weights_after_loading`, called by `model_loader/loader.py` `DefaultModelLoader.load_model`
for every `Attention` module that has it ("currently only used by MLA"), inside the load the worker measures.
With VLLM_MLA_PERFORM_MATRIX_ABSORPTION (`envs.py`: True by default) each MLA layer keeps, next to q_proj,
kv_b_proj and o_proj (kept for prefill: "absorbed weights for decode and another copy of raw weights for prefill"):

- W_QR = q_proj's rope columns, `.flatten(start_dim=1).contiguous()` then `.to(act_dtype)`:
  q_in x heads x qk_rope_head_dim in the compute dtype (q_in: q_lora_rank, or hidden_size where q is a plain
  projection, DeepSeek-V2-Lite);
- W_Q_UK = einsum("qnd,lnd -> qnl", W_Q, W_UK): q_in x heads x kv_lora_rank;
- W_UV_O = einsum("lnd,hnd -> nlh", W_UV, W_O): heads x kv_lora_rank x hidden_size;

heads being the rank's (num_attention_heads / tp). W_Q_UK and W_UV_O are in the compute dtype, or re-quantised to
FP8 with the checkpoint's group shape when the weights are FP8 (`scaled_quantize`: one fp32 scale per block of
quant_group_size x quant_group_size, or one per tensor). `self.W_UK, self.W_UV = kv_b_proj_weight.split(...)` keeps
kv_b_proj as `get_and_maybe_dequant_weights` returned it: a view of the parameter when unquantised, a new
dequantised tensor (kv_lora_rank x heads x (qk_nope + v), compute dtype) when quantised (`scaled_dequantize` for FP8;
from 0.7.3 any method, by applying it to an identity matrix).

Which checkpoints run MLA (`ModelConfig.use_mla`): in 0.7.1 and 0.7.2 only unquantised, fp8 and compressed-tensors
(FP8) ones ("MLA is not supported with %s quantization. Disabling MLA."): an AWQ/GPTQ DeepSeek falls back to
`DeepseekV2Attention`, whose cache holds K and V of every local head at qk_nope + qk_rope (192) a head, as 0.7.0's
(`mla_enabled`, read by `layout.kv_layout_card`); from 0.7.3 every checkpoint (`is_deepseek_mla and not
VLLM_MLA_DISABLE`). From 0.8.0 the absorbed copies are gone (`attention/backends/mla/common.py` 0.8.0,
`v1/attention/backends/mla/common.py` 0.10.1, `model_executor/layers/attention/mla_attention.py`
`MLAAttention.process_weights_after_loading` 0.19.0, read): W_UV and W_UK_T are views of what
`get_and_maybe_dequant_weights(kv_b_proj)` returns, the parameter itself when unquantised (0.19: `weight.to(act
dtype)`, the same tensor), a new dequantised kv_b_proj in the compute dtype when quantised (FP8 included), which
those views keep alive: kv_lora_rank x heads x (qk_nope + v) a layer (`dequantised_kv_b_bytes`; DeepSeek-V3 FP8 at
TP 8: 4 MiB a layer, 0.24 GiB a rank), counted from 2026-12-08 (the golden memory_deepseek_h200_tp8 re-recorded
for it, tests/golden/cases.py). ROCm's aiter FP8 / MXFP4
batched-matmul paths keep quantised W_K / W_V instead: not modelled.
"""
from __future__ import annotations

import math

from capacity.engine.vllm.release import Release
from capacity.model.card import ModelCard
from capacity.units import DTYPE_BYTES

ABSORB_FROM, ABSORB_UNTIL = (0, 7, 1), (0, 8, 0)  # releases that build the absorbed copies (read: 0.7.1-0.7.3, 0.8.0)
ANY_FORMAT_FROM = (0, 7, 3)  # use_mla for every checkpoint (0.7.1-0.7.2: unquantised and FP8 only)
UNQUANTISED = ("bf16", "fp16", "fp32")


def mla_enabled(card: ModelCard, rel: Release) -> bool:
    """Whether the release runs this DeepSeek checkpoint with MLA (`ModelConfig.use_mla`, see the module
    docstring); False for a card without latent attention."""
    if card.mla is None or rel.version < ABSORB_FROM:
        return False
    return rel.version >= ANY_FORMAT_FROM or card.format_of("attention") in (*UNQUANTISED, "fp8", card.dtype)


def absorbed_mla_bytes(card: ModelCard, tp: int, rel: Release) -> float:
    """Bytes vLLM 0.7.1-0.7.3 keep beside the checkpoint's MLA weights on one rank over every MLA layer: W_QR,
    W_Q_UK, W_UV_O and a quantised checkpoint's dequantised kv_b_proj (see the module docstring); 0 where the
    release or the checkpoint builds none (from 0.8.0 only the dequantised kv_b_proj of a quantised checkpoint)."""
    m = card.mla
    if m is None or rel.version < ABSORB_FROM or not mla_enabled(card, rel):
        return 0.0
    if rel.version >= ABSORB_UNTIL:  # 0.8+: only a quantised checkpoint's dequantised kv_b_proj stays
        return float(card.num_kv_layers * dequantised_kv_b_bytes(card, tp))
    fmt = card.format_of("attention")
    act = DTYPE_BYTES[card.dtype]
    heads = card.num_attention_heads // tp
    q_in = m.q_lora_rank or card.hidden_size
    w_qr = q_in * heads * m.qk_rope_head_dim * act
    shapes = ((q_in, heads * m.kv_lora_rank), (heads * m.kv_lora_rank, card.hidden_size))  # W_Q_UK, W_UV_O
    absorbed = 0.0
    for r, c in shapes:
        if fmt == "fp8":  # re-quantised: one byte an element, one fp32 scale a g x g block (or the tensor)
            g = card.quant_group_size
            absorbed += r * c + (math.ceil(r / g) * math.ceil(c / g) * 4 if g else 4)
        else:
            absorbed += r * c * act
    return float(card.num_kv_layers * (w_qr + absorbed + dequantised_kv_b_bytes(card, tp)))


def dequantised_kv_b_bytes(card: ModelCard, tp: int) -> float:
    """One layer's kv_b_proj dequantised to the compute dtype (kv_lora_rank x heads x (qk_nope + v)) where the
    checkpoint quantises attention, else 0 (kv_b_proj's own parameter is used as it is)."""
    m = card.mla
    if m is None or card.format_of("attention") in (*UNQUANTISED, card.dtype):
        return 0.0
    heads = card.num_attention_heads // tp
    return float(m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim) * DTYPE_BYTES[card.dtype])


__all__ = ["ABSORB_FROM", "ABSORB_UNTIL", "ANY_FORMAT_FROM", "absorbed_mla_bytes", "dequantised_kv_b_bytes",
           "mla_enabled"]
