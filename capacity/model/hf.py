"""Hugging Face `config.json` -> ModelCard, for the architectures people serve with vLLM.

Text models: Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, DeepSeek-V2/V3, Phi-3/Phi-4, Gemma-2, Gemma-3 and
gpt-oss (alternating sliding-window layers, attention sinks, MXFP4 experts). Vision-language models: LLaVA
(CLIP), Gemma-3 (SigLIP), Mistral-3 (Pixtral), Llama-3.2-Vision (Mllama) and Qwen2.5-VL; the vision tower's
weights are counted from its config. Quantised checkpoints: fp8 (per channel or 128 x 128 blocks),
compressed-tensors (FP8, W8A8, W4A16), AWQ/GPTQ (4 and 8 bit), MXFP4, ModelOpt NVFP4/FP8; modules a
checkpoint leaves unquantised (`ignore`, `modules_to_not_convert`) keep the compute dtype.

Where a config leaves a field to the `transformers` config class, the class's default is used (Gemma-3's
vocabulary, Gemma's tied embeddings ...). Anything the loader cannot size is an error naming the field and
value, never a guess.
"""
from __future__ import annotations

import re
from typing import Any

from capacity.errors import ConfigError
from capacity.files import validate
from capacity.model.card import ModelCard
from capacity.model.hf_vision import vision_tower

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", "float": "bf16"}
TEXT_TYPES = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v3", "deepseek_v2", "phi3",
              "gemma2", "gemma3_text", "gpt_oss", "mllama_text_model", "nemotron_h", "qwen3_next", "qwen3_5_text",
              "seed_oss", "glm4_moe", "granitemoehybrid"}
VISION_TYPES = {"llava", "llava_next", "mistral3", "gemma3", "mllama", "qwen2_5_vl", "qwen2_vl", "qwen3_5"}
SUPPORTED = sorted(TEXT_TYPES | VISION_TYPES)
# transformers' config-class defaults for fields real configs leave out
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "head_dim": 256, "sliding_window": 4096,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": True,
                    "sliding_window_pattern": 6},
    "gemma2": {"tie_word_embeddings": True},
    "mistral": {"max_position_embeddings": 32768},
    "mllama_text_model": {"vocab_size": 128256},
}


# Fields whose presence means layers a plain decoder does not have: a model type carrying one is refused rather
# than read as a standard decoder (the error names the field).
_EXOTIC = {
    "state-space or linear-attention layers": ("mamba_d_state", "ssm_state_size", "state_size", "d_state",
                                               "hybrid_override_pattern", "layers_block_type", "linear_num_value_heads",
                                               "linear_key_head_dim", "attn_layer_indices", "ssm_cfg", "conv_L_cache",
                                               "linear_attn_config", "mamba_expand"),
    "mixture-of-experts layers": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                                  "num_experts_per_tok", "moe_intermediate_size", "moe_k"),
    "latent attention (MLA)": ("kv_lora_rank", "q_lora_rank"),
    "cross-attention layers": ("cross_attention_layers",),
    "a vision or audio tower": ("vision_config", "audio_config", "visual"),
    "an encoder-decoder layout": ("encoder_layers", "decoder_layers", "is_encoder_decoder"),
}
_STANDARD = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def _generic_decoder(cfg: dict[str, Any], mt: Any, source: str) -> tuple[dict[str, Any], list[str]]:
    """A model type with no family here but the standard decoder fields: read as a Llama-style decoder, with
    notes saying so and which fields were read. Exotic layers are refused, naming the field."""
    label = f"model_type {mt!r}" if mt else "a config without model_type"
    for what, keys in _EXOTIC.items():
        hit = next((k for k in keys if cfg.get(k) not in (None, False, 0, [], {})), None)
        if hit is not None:
            raise ConfigError(f"{source}: {label} is not a modelled family and has field {hit!r} "
                              f"({what}): it cannot be sized as a standard decoder; supported: {', '.join(SUPPORTED)}")
    types = cfg.get("layer_types")
    if isinstance(types, list) and any(t not in ("full_attention", "sliding_attention") for t in types):
        odd = next(t for t in types if t not in ("full_attention", "sliding_attention"))
        raise ConfigError(f"{source}: {label} is not a modelled family and its layer_types has {str(odd)[:40]!r}: "
                          "only full and sliding attention layers can be sized as a standard decoder")
    act = cfg.get("hidden_act") or cfg.get("activation_function")
    if isinstance(act, str) and act.lower().startswith(("gelu", "relu")) and act.lower() != "relu2":
        raise ConfigError(f"{source}: {label} is not a modelled family and has hidden_act {act[:30]!r} (a GELU/ReLU "
                          "MLP, usually not gated as Llama's): it cannot be sized as a standard decoder")
    missing = [k for k in _STANDARD if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool)]
    if missing:
        raise ConfigError(f"{source}: {label} is not supported and lacks the standard decoder field "
                          f"{missing[0]!r}; supported: {', '.join(SUPPORTED)} (or write a capacity model card YAML)")
    read = [k for k in (*_STANDARD, "num_key_value_heads", "head_dim", "max_position_embeddings",
                        "tie_word_embeddings", "attention_bias", "sliding_window", "layer_types") if k in cfg]
    notes = [f"{label} has no family here: read as a Llama-style decoder (gated MLP, RMSNorm, rotary "
             f"attention) from the fields {', '.join(read)}"]
    return cfg, notes


def from_hf_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelCard:
    """Map a Hugging Face config.json onto a ModelCard. A model type without a family here is read as a standard
    decoder where its config has nothing else (with a note); anything exotic is an error, not a guess."""
    mt = cfg.get("model_type")
    notes: list[str] = []
    if mt not in TEXT_TYPES and mt not in VISION_TYPES:
        if mt is not None and not isinstance(mt, str):
            raise ConfigError(f"{source}: model_type {mt!r} must be a string")
        cfg, notes = _generic_decoder(cfg, mt, source)
    mt = mt or ""
    text: dict[str, Any] = cfg
    if mt in VISION_TYPES and mt not in ("qwen2_5_vl", "qwen2_vl"):
        sub = cfg.get("text_config")
        if not isinstance(sub, dict):
            raise ConfigError(f"{source}: text_config is missing (model_type {mt})")
        text = sub
    tmt = {"gemma3": "gemma3_text", "mllama": "mllama_text_model"}.get(mt, text.get("model_type") or "llama")
    if notes:
        tmt = "generic"
    if mt in ("llava", "llava_next", "mistral3") and tmt not in ("llama", "mistral", "qwen2"):
        raise ConfigError(f"{source}: text_config.model_type {tmt!r} is not supported for {mt}")
    if mt in ("qwen2_5_vl", "qwen2_vl"):
        tmt = "qwen2"
    defaults = _DEFAULTS.get(tmt, {})

    def get(key: str, default: Any = None, where: dict | None = None) -> Any:
        d = text if where is None else where
        v = d.get(key)
        return default if v is None else v

    def need(key: str, where: dict | None = None, label: str = "") -> Any:
        v = get(key, defaults.get(key), where)
        if v is None:
            raise ConfigError(f"{source}: field {label or ''}{key!r} is missing (model_type {mt})")
        return v

    tag = "text_config." if text is not cfg else ""
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or "bfloat16")
    dtype = _TORCH_DTYPES.get(dtype_name.replace("torch.", ""))
    if dtype is None:
        raise ConfigError(f"{source}: torch_dtype {dtype_name!r} is not supported (bfloat16, float16, float32)")
    layers = need("num_hidden_layers", label=tag)
    card: dict[str, Any] = {
        "name": name,
        "hf_id": cfg.get("_name_or_path") or None,
        "architecture": mt or "unknown",
        "num_layers": layers,
        "hidden_size": need("hidden_size", label=tag),
        "num_attention_heads": need("num_attention_heads", label=tag),
        "num_kv_heads": _kv_heads(text, defaults, source, tag),
        "intermediate_size": need("intermediate_size", label=tag),
        "vocab_size": need("vocab_size", label=tag),
        "max_position_embeddings": get("max_position_embeddings", defaults.get("max_position_embeddings", 4096)),
        "tie_word_embeddings": bool(get("tie_word_embeddings", cfg.get("tie_word_embeddings",
                                                                        defaults.get("tie_word_embeddings", False)))),
        "dtype": dtype,
        "notes": notes,
    }
    if text.get("head_dim") or defaults.get("head_dim"):
        card["head_dim"] = get("head_dim", defaults.get("head_dim"))
    if tmt == "qwen2":
        card["attention_bias"] = True
    if tmt in ("qwen3", "qwen3_moe", "gemma3_text"):
        card["qk_norm"] = True
    if tmt in ("llama", "generic", "seed_oss") and text.get("attention_bias"):
        card["attention_bias"] = True
    if tmt in ("gemma2", "gemma3_text"):
        card["norms_per_layer"] = 4  # input, post-attention, pre- and post-feedforward
        card["tie_word_embeddings"] = bool(get("tie_word_embeddings", True))
        if text.get("final_logit_softcapping"):
            card["final_logit_softcap"] = text["final_logit_softcapping"]
    _sliding(text, tmt, layers, card, defaults, source)
    rope = text.get("rope_scaling")
    if isinstance(rope, dict) and str(rope.get("rope_type") or rope.get("type")) == "linear":
        factor = rope.get("factor")
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1024:
            raise ConfigError(f"{source}: rope_scaling.factor {factor!r} must be a number in (0, 1024]")
        scaled = int(card["max_position_embeddings"] * factor)
        # Gemma-3's sliding layers keep their own unscaled rope (rope_local_base_freq)
        card["rope_caches"] = [card["max_position_embeddings"], scaled] if tmt == "gemma3_text" else [scaled]
    _moe(text, tmt, card, need, source)
    _hybrid(text, tmt, card, need, source)
    if tmt == "gpt_oss":
        card.update(attention_bias=True, attention_out_bias=True, attention_sinks=True, expert_bias=True)
    if tmt == "mllama_text_model":
        cross = text.get("cross_attention_layers") or []
        if not isinstance(cross, list):
            raise ConfigError(f"{source}: text_config.cross_attention_layers {cross!r} is not a list")
        card["cross_attention_layers"] = len(cross)
        card["extra_vocab"] = 8  # the embedding holds vocab_size + 8 rows (image tokens)
    if mt in VISION_TYPES:
        card["vision"] = vision_tower(cfg, mt, card["hidden_size"], source)
    quant = cfg.get("quantization_config") or text.get("quantization_config")
    if quant:
        _quant(quant, card, dtype, source)
    return validate(ModelCard, card, source)


def _kv_heads(text: dict, defaults: dict, source: str, tag: str) -> Any:
    """num_key_value_heads; absent means multi-head attention (as transformers reads it), 0 is an error."""
    v = text.get("num_key_value_heads", defaults.get("num_key_value_heads"))
    if v is None:
        v = text.get("num_attention_heads", defaults.get("num_attention_heads"))
    if v == 0 or isinstance(v, bool):
        raise ConfigError(f"{source}: {tag}num_key_value_heads {v!r} must be a positive integer")
    return v


def _sliding(text: dict, tmt: str, layers: int, card: dict, defaults: dict, source: str) -> None:
    """Which layers attend through a sliding window, as vLLM's KV manager sees them."""
    window = text.get("sliding_window") or defaults.get("sliding_window")
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != layers:
            raise ConfigError(f"{source}: layer_types has {len(types)} entries for {layers} layers")
        n = sum(1 for t in types if t == "sliding_attention")
    elif tmt == "gemma2":
        n = (layers + 1) // 2  # even layers (0, 2, ...) slide
    elif tmt == "gemma3_text":
        pattern = text.get("sliding_window_pattern") or defaults["sliding_window_pattern"]
        n = layers - layers // pattern  # every pattern-th layer is global
    elif tmt in ("mistral", "phi3", "qwen2", "qwen3") and window and not text.get("use_sliding_window", tmt != "qwen2"):
        n = 0  # Qwen ships a sliding_window value but leaves use_sliding_window false
    elif tmt in ("mistral", "phi3") and window and window < (text.get("max_position_embeddings") or 0):
        n = layers  # the whole model slides (Mistral-7B v0.1, Phi-3-mini-4k)
    else:
        n = 0
    if n:
        if not isinstance(window, int) or window <= 0:
            raise ConfigError(f"{source}: sliding_window {window!r} must be a positive token count")
        card["sliding_window"] = window
        card["num_sliding_layers"] = n


def _hybrid(text: dict, tmt: str, card: dict, need, source: str) -> None:
    """Hybrid models' state layers and layer layout (vLLM's get_mamba_state_shape_from_config per family)."""
    if tmt == "nemotron_h":  # one character per layer: M Mamba2, * attention, - MLP, E MoE
        pattern = need("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != card["num_layers"] or set(pattern) - set("M*-E"):
            raise ConfigError(f"{source}: hybrid_override_pattern must have one of M * - E per layer "
                              f"({card['num_layers']} layers)")
        heads, hd = need("mamba_num_heads"), need("mamba_head_dim")
        ssm = str(text.get("mamba_ssm_cache_dtype") or "").replace("torch.", "")
        card["state"] = {"kind": "mamba2", "num_layers": pattern.count("M"), "conv_kernel": need("conv_kernel"),
                         "inner": heads * hd, "groups": text.get("n_groups") or need("mamba_n_groups"),
                         "state_size": need("ssm_state_size"), "heads": heads, "head_dim": hd,
                         "chunk_size": text.get("mamba_chunk_size") or text.get("chunk_size") or 256,
                         "ssm_dtype": {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(ssm)}
        card.update(attention_layers=pattern.count("*"), dense_mlp_layers=pattern.count("-"),
                    moe_layers=pattern.count("E"), gated_mlp=False, norms_per_layer=1)
        if text.get("attention_head_dim") and not text.get("head_dim"):
            card["head_dim"] = text["attention_head_dim"]
        if pattern.count("E"):
            card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                           "moe_intermediate_size": need("moe_intermediate_size"),
                           "num_shared_experts": text.get("n_shared_experts") or 0,
                           "shared_expert_intermediate_size": text.get("moe_shared_expert_intermediate_size"),
                           "latent_size": text.get("moe_latent_size")}
    elif tmt == "granitemoehybrid":  # Granite-4.0-H: layer_types mamba / attention, every layer a MoE or an MLP
        types = need("layer_types")
        if not isinstance(types, list) or len(types) != card["num_layers"] or set(types) - {"mamba", "attention"}:
            raise ConfigError(f"{source}: layer_types must name mamba or attention for each of the "
                              f"{card['num_layers']} layers")
        ssm = str(text.get("mamba_ssm_cache_dtype") or "").replace("torch.", "")
        card["state"] = {"kind": "mamba2", "num_layers": types.count("mamba"), "conv_kernel": need("mamba_d_conv"),
                         "inner": need("mamba_expand") * card["hidden_size"], "groups": need("mamba_n_groups"),
                         "state_size": need("mamba_d_state"), "heads": need("mamba_n_heads"),
                         "head_dim": need("mamba_d_head"), "chunk_size": text.get("mamba_chunk_size") or 256,
                         "ssm_dtype": {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(ssm)}
        card["attention_layers"] = types.count("attention")
        shared = text.get("shared_intermediate_size")
        if text.get("num_local_experts"):
            card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                           "moe_intermediate_size": need("intermediate_size"),
                           "num_shared_experts": 1 if shared else 0, "shared_expert_intermediate_size": shared}
        elif shared:  # the dense variants: one MLP of shared_intermediate_size a layer
            card["intermediate_size"] = shared
    elif tmt in ("qwen3_next", "qwen3_5_text"):  # gated DeltaNet layers and every n-th full attention layer
        layers = card["num_layers"]
        types = text.get("layer_types")
        if isinstance(types, list) and len(types) == layers:
            n_full = sum(1 for t in types if t == "full_attention")
        else:  # vLLM's Qwen3-Next config: (i + 1) % 4 == 0 is a full attention layer
            n_full = layers // int(text.get("full_attention_interval") or 4)
        ssm = str(text.get("mamba_ssm_dtype") or "").replace("torch.", "")
        card["state"] = {"kind": "gated_deltanet", "num_layers": layers - n_full,
                         "conv_kernel": need("linear_conv_kernel_dim"), "inner": 1,
                         "groups": need("linear_num_key_heads"), "state_size": need("linear_key_head_dim"),
                         "heads": need("linear_num_value_heads"), "head_dim": need("linear_value_head_dim"),
                         "ssm_dtype": {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(ssm)}
        card.update(qk_norm=True, attention_output_gate=text.get("attn_output_gate", True) is not False)
        card.pop("sliding_window", None)
        card.pop("num_sliding_layers", None)
        if tmt == "qwen3_next" or text.get("num_experts"):
            card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_tok"),
                           "moe_intermediate_size": need("moe_intermediate_size"),
                           "num_shared_experts": 1 if text.get("shared_expert_intermediate_size") else 0,
                           "shared_expert_intermediate_size": text.get("shared_expert_intermediate_size")}


def _moe(text: dict, tmt: str, card: dict, need, source: str) -> None:
    if tmt in ("mixtral",):
        card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": need("intermediate_size")}
    elif tmt == "gpt_oss":
        card["moe"] = {"num_experts": need("num_local_experts"),
                       "experts_per_token": text.get("num_experts_per_tok") or need("experts_per_token"),
                       "moe_intermediate_size": need("intermediate_size")}
    elif tmt == "qwen3_moe":
        if text.get("mlp_only_layers") or text.get("decoder_sparse_step", 1) != 1:
            raise ConfigError(f"{source}: qwen3_moe with mlp_only_layers/decoder_sparse_step != 1 is not supported")
        card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": need("moe_intermediate_size")}
    elif tmt == "glm4_moe":  # GLM-4.5/4.6/4.7: DeepSeek-style routed and shared experts, GQA attention (no MLA)
        card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": need("moe_intermediate_size"),
                       "num_shared_experts": text.get("n_shared_experts") or 0,
                       "first_dense_layers": text.get("first_k_dense_replace", 0)}
        card.update(attention_bias=bool(text.get("attention_bias")), qk_norm=bool(text.get("use_qk_norm")))
    elif tmt in ("deepseek_v3", "deepseek_v2"):
        card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": need("moe_intermediate_size"),
                       "num_shared_experts": text.get("n_shared_experts") or 0,
                       "first_dense_layers": text.get("first_k_dense_replace", 0)}
        card["mla"] = {"q_lora_rank": text.get("q_lora_rank"), "kv_lora_rank": need("kv_lora_rank"),
                       "qk_nope_head_dim": need("qk_nope_head_dim"), "qk_rope_head_dim": need("qk_rope_head_dim"),
                       "v_head_dim": need("v_head_dim")}


# ---- quantisation ---------------------------------------------------------------------------------
_FAMILY_PATTERNS = (("attention", re.compile(r"self_attn|attention|attn")), ("experts", re.compile(r"experts")),
                    ("shared_experts", re.compile(r"shared_expert")), ("lm_head", re.compile(r"lm_head")),
                    ("vision", re.compile(r"vision|visual|multi_modal")))


def _unquantised_families(names: list[Any]) -> set[str]:
    fams = set()
    for n in names:
        s = str(n)
        for fam, pat in _FAMILY_PATTERNS:
            if pat.search(s) and not re.search(r"\.(gate|router)$|layernorm|norm$", s):
                fams.add(fam)
    return fams


def _quant(quant: Any, card: dict, dtype: str, source: str) -> None:
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
