"""The fallback: a model type no family claims, whose config has the standard decoder fields and nothing else, is
read as a Llama-style decoder (gated MLP, RMSNorm, rotary attention); the card's notes say so and name the fields
read. A config with layers a plain decoder does not have is refused, naming the field."""
from __future__ import annotations

from typing import Any

from capacity.errors import ConfigError
from capacity.model.families.llama import attention_bias
from capacity.model.families.registry import Family, register, supported

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


def generic_decoder(cfg: dict[str, Any], mt: Any, source: str) -> list[str]:
    """A model type with no family here but the standard decoder fields: read as a Llama-style decoder, with
    notes saying so and which fields were read. Exotic layers are refused, naming the field."""
    label = f"model_type {mt!r}" if mt else "a config without model_type"
    families = ", ".join(supported())
    for what, keys in _EXOTIC.items():
        hit = next((k for k in keys if cfg.get(k) not in (None, False, 0, [], {})), None)
        if hit is not None:
            raise ConfigError(f"{source}: {label} is not a modelled family and has field {hit!r} "
                              f"({what}): it cannot be sized as a standard decoder; supported: {families}")
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
                          f"{missing[0]!r}; supported: {families} (or write a capacity model card YAML)")
    read = [k for k in (*_STANDARD, "num_key_value_heads", "head_dim", "max_position_embeddings",
                        "tie_word_embeddings", "attention_bias", "sliding_window", "layer_types") if k in cfg]
    return [f"{label} has no family here: read as a Llama-style decoder (gated MLP, RMSNorm, rotary "
            f"attention) from the fields {', '.join(read)}"]


register(Family("generic", (), "vllm/model_executor/models/llama.py", shape=attention_bias, fallback=generic_decoder))
