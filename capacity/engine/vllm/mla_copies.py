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
quant_group_size x quant_group_size, or one per tensor). W_UK and W_UV themselves are views of kv_b_proj's weight.
MLA runs only for unquantised, fp8 and compressed-tensors checkpoints (`ModelConfig.use_mla`); other formats fall
back to plain attention and keep nothing extra. From 0.8.0 (`attention/backends/mla/common.py`, read) the copies
are gone: W_UV and W_UK_T are views of kv_b_proj for an unquantised checkpoint (a quantised one keeps a dequantised
kv_b_proj, not counted here: releases after 0.8.0 not read for it).
"""
from __future__ import annotations

import math

from capacity.engine.vllm.release import Release
from capacity.model.card import ModelCard
from capacity.units import DTYPE_BYTES

ABSORB_FROM, ABSORB_UNTIL = (0, 7, 1), (0, 8, 0)  # releases that build the absorbed copies (read: 0.7.1-0.7.3, 0.8.0)
MLA_FORMATS = ("bf16", "fp16", "fp32", "fp8")  # formats whose checkpoints keep MLA on in 0.7.x (use_mla)


def absorbed_mla_bytes(card: ModelCard, tp: int, rel: Release) -> float:
    """Bytes of W_QR, W_Q_UK and W_UV_O on one rank over every MLA layer (see the module docstring); 0 where the
    release or the checkpoint does not build them."""
    m = card.mla
    if m is None or not ABSORB_FROM <= rel.version < ABSORB_UNTIL:
        return 0.0
    fmt = card.format_of("attention")
    if fmt not in MLA_FORMATS and fmt != card.dtype:
        return 0.0
    act = DTYPE_BYTES[card.dtype]
    heads = card.num_attention_heads // tp
    q_in = m.q_lora_rank or card.hidden_size
    w_qr = q_in * heads * m.qk_rope_head_dim * act
    shapes = ((q_in, heads * m.kv_lora_rank), (heads * m.kv_lora_rank, card.hidden_size))  # W_Q_UK, W_UV_O
    if fmt == "fp8":
        g = card.quant_group_size
        absorbed = sum(r * c + (math.ceil(r / g) * math.ceil(c / g) * 4 if g else 4) for r, c in shapes)
    else:
        absorbed = sum(r * c * act for r, c in shapes)
    return float(card.num_kv_layers * (w_qr + absorbed))


__all__ = ["ABSORB_FROM", "ABSORB_UNTIL", "absorbed_mla_bytes"]
