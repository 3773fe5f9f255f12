"""Quantisation configs of Hugging Face checkpoints -> the card's storage formats: fp8 (per channel or 128 x 128
blocks), compressed-tensors (FP8, W8A8, W4A16, NVFP4), AWQ/GPTQ (4 and 8 bit), MXFP4, ModelOpt NVFP4/FP8 and
bitsandbytes; modules a checkpoint leaves unquantised (`ignore`, `modules_to_not_convert`) keep the compute dtype.
Used by `capacity.model.hf` for every family (quantisation is not family-specific)."""
from __future__ import annotations

import re
from typing import Any

from capacity.errors import ConfigError

# ---- quantisation ---------------------------------------------------------------------------------
# "experts" must not match "shared_experts" (Kimi-K2.5 ignores `re:.*shared_experts.*` and quantises its routed
# experts); a dense MLP's projections (`mlp.gate_proj`, or a `re:.*mlp\.(gate|up|...)_proj.*` pattern) are the
# dense_mlp family, the router (`mlp.gate`) is not
_FAMILY_PATTERNS = (("attention", re.compile(r"self_attn|attention|attn")),
                    ("experts", re.compile(r"(?<!shared_)experts")),
                    ("shared_experts", re.compile(r"shared_expert")), ("lm_head", re.compile(r"lm_head")),
                    ("dense_mlp", re.compile(r"mlp\\?\.\(?(gate_up|gate|up|down)(_proj|\|)")),
                    ("vision", re.compile(r"vision|visual|multi_modal")))


def _unquantised_families(names: list[Any]) -> set[str]:
    fams = set()
    for n in names:
        s = str(n)
        for fam, pat in _FAMILY_PATTERNS:
            if pat.search(s) and not re.search(r"\.(gate|router)$|layernorm|norm$", s):
                fams.add(fam)
    return fams


def apply_quant(quant: Any, card: dict, dtype: str, source: str) -> None:
    if not isinstance(quant, dict):
        raise ConfigError(f"{source}: quantization_config must be a mapping, got {type(quant).__name__}")
    method = str(quant.get("quant_method", "")).lower()
    skip = (quant.get("modules_to_not_convert") or quant.get("ignore") or quant.get("ignored_layers")
            or quant.get("llm_int8_skip_modules") or [])
    if not isinstance(skip, list):
        raise ConfigError(f"{source}: quantization_config.ignore must be a list")
    if method == "fp8":
        card["weight_dtype"] = "fp8"
        block = quant.get("weight_block_size")
        if block:
            if not isinstance(block, list) or not block or not isinstance(block[0], int) or isinstance(block[0], bool):
                raise ConfigError(f"{source}: quantization_config.weight_block_size {block!r} must be [N, N]")
            card["quant_group_size"] = block[0]
    elif method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = quant.get("bits", quant.get("w_bit"))
        if bits == 4:
            card["weight_dtype"] = "int4"
            g = quant.get("group_size", quant.get("q_group_size", 128))
            if isinstance(g, bool) or not isinstance(g, int) or g == 0 or g < -1:
                raise ConfigError(f"{source}: quantization_config.group_size {g!r} must be a positive integer or -1")
            card["quant_group_size"] = g if g > 0 else 128  # -1 (one group per row): counted as 128, more scales
        elif bits == 8 and method.startswith("gptq"):
            card["weight_dtype"] = "int8"
            card["gemm_dtype"] = dtype  # GPTQ is weight-only: Marlin W8A16
        else:
            raise ConfigError(f"{source}: quantization_config.bits {bits!r} is not supported for {method} (4, or 8 for GPTQ)")
    elif method == "compressed-tensors":
        _compressed_tensors(quant, card, source)
    elif method == "mxfp4":
        card["weight_dtype"] = "mxfp4"
    elif method == "bitsandbytes":
        _bitsandbytes(quant, card, dtype, source)
        skip = [n for n in skip if not re.search(r"layers\.\d+\.", str(n))]  # single layers: not a family
    elif method == "modelopt":
        algo = str(quant.get("quant_algo") or (quant.get("quantization") or {}).get("quant_algo") or "").upper()
        if algo not in ("FP8", "NVFP4"):
            raise ConfigError(f"{source}: quantization_config.quant_algo {algo!r} is not supported (FP8, NVFP4)")
        card["weight_dtype"] = algo.lower()
    else:
        raise ConfigError(f"{source}: quantization_config.quant_method {method!r} is not supported "
                          "(fp8, compressed-tensors, awq, gptq, mxfp4, modelopt, bitsandbytes)")
    fams = _unquantised_families(skip)
    if fams:
        card["weight_formats"] = {f: dtype for f in fams if f not in ("lm_head", "vision")}
    if method == "mxfp4" and "attention" in fams:  # gpt-oss: only the experts are MXFP4
        card["weight_dtype"] = None
        card["weight_formats"] = {"experts": "mxfp4"}


def _bitsandbytes(quant: dict, card: dict, dtype: str, source: str) -> None:
    """bitsandbytes checkpoints (vLLM's BitsAndBytesLinearMethod, read in 0.11): 4-bit weights stored as packed
    uint8 pairs with an absmax per block of 64 that vLLM keeps in fp32 (a double-quantised absmax is dequantised
    at load, `_dequantize_dq`); 8-bit (LLM.int8) as int8 with an fp32 scale per row. The GEMMs run in the
    activation dtype. Modules in llm_int8_skip_modules stay in the compute dtype (module families only: a skip
    list naming single layers, as Unsloth's dynamic checkpoints have, is not resolved per layer)."""
    four, eight = quant.get("load_in_4bit"), quant.get("load_in_8bit")
    if four is True:
        qtype = str(quant.get("bnb_4bit_quant_type", "nf4")).lower()
        if qtype not in ("nf4", "fp4"):
            raise ConfigError(f"{source}: quantization_config.bnb_4bit_quant_type {qtype!r} is not supported (nf4, fp4)")
        card["weight_dtype"] = "nf4"
        card["bnb_double_quant"] = quant.get("bnb_4bit_use_double_quant") is True
    elif eight is True:
        card["weight_dtype"] = "int8"
    else:
        raise ConfigError(f"{source}: quantization_config (bitsandbytes) needs load_in_4bit or load_in_8bit true")
    card["gemm_dtype"] = dtype


def _compressed_tensors(quant: dict, card: dict, source: str) -> None:
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{source}: quantization_config.config_groups is missing (compressed-tensors)")
    w = next(iter(groups.values())).get("weights") if isinstance(next(iter(groups.values())), dict) else None
    if not isinstance(w, dict):
        raise ConfigError(f"{source}: quantization_config.config_groups has no weights scheme")
    bits, kind, strategy = w.get("num_bits"), w.get("type", "int"), w.get("strategy")
    acts = next(iter(groups.values())).get("input_activations")
    if not acts:  # weights only (W8A16, W4A16, NVFP4A16): the GEMMs multiply in the activation dtype
        card["gemm_dtype"] = card.get("dtype", "bf16")
    if bits == 8 and kind == "float":
        card["weight_dtype"] = "fp8"
        block = w.get("block_structure")
        if strategy == "block" and block:
            card["quant_group_size"] = block[0]
    elif bits == 8 and kind == "int":
        card["weight_dtype"] = "int8"
    elif bits == 4 and kind == "int":
        card["weight_dtype"] = "int4"
        g = w.get("group_size")
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g <= 0):
            raise ConfigError(f"{source}: compressed-tensors weights.group_size {g!r} must be a positive integer")
        card["quant_group_size"] = g or 128
    elif bits == 4 and kind == "float":
        card["weight_dtype"] = "nvfp4"
    else:
        raise ConfigError(f"{source}: compressed-tensors weights num_bits {bits!r} type {kind!r} is not supported")
