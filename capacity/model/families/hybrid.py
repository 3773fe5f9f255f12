"""Hybrid decoders whose state layers keep a fixed-size recurrent state per sequence instead of a KV cache, sized as
vLLM's get_mamba_state_shape_from_config does per family: Nemotron-H (vLLM nemotron_h.py: one character per layer
of hybrid_override_pattern, M Mamba2, * attention, - MLP, E MoE), Granite-4.0-H (granitemoehybrid.py: layer_types
mamba / attention, every layer a MoE or an MLP) and Qwen3-Next / Qwen3.5 (qwen3_next.py, qwen3_5.py: gated
DeltaNet layers and every n-th layer full attention). Qwen3-Next's and Qwen3.5's attention rotates a quarter of each
head (partial_rotary_factor 0.25, vLLM get_rope(rotary_dim=head_dim x 0.25)): the families' `partial_rotary`
sizes the cos/sin cache so, and a config stating another factor is refused, naming the field."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register

_SSM_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _nemotron_h(text: dict, card: dict, need: Need, source: str) -> None:
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
                     "ssm_dtype": _SSM_DTYPES.get(ssm)}
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


def _granite(text: dict, card: dict, need: Need, source: str) -> None:
    types = need("layer_types")
    if not isinstance(types, list) or len(types) != card["num_layers"] or set(types) - {"mamba", "attention"}:
        raise ConfigError(f"{source}: layer_types must name mamba or attention for each of the "
                          f"{card['num_layers']} layers")
    ssm = str(text.get("mamba_ssm_cache_dtype") or "").replace("torch.", "")
    card["state"] = {"kind": "mamba2", "num_layers": types.count("mamba"), "conv_kernel": need("mamba_d_conv"),
                     "inner": need("mamba_expand") * card["hidden_size"], "groups": need("mamba_n_groups"),
                     "state_size": need("mamba_d_state"), "heads": need("mamba_n_heads"),
                     "head_dim": need("mamba_d_head"), "chunk_size": text.get("mamba_chunk_size") or 256,
                     "ssm_dtype": _SSM_DTYPES.get(ssm)}
    card["attention_layers"] = types.count("attention")
    shared = text.get("shared_intermediate_size")
    if text.get("num_local_experts"):
        card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": need("intermediate_size"),
                       "num_shared_experts": 1 if shared else 0, "shared_expert_intermediate_size": shared}
    elif shared:  # the dense variants: one MLP of shared_intermediate_size a layer
        card["intermediate_size"] = shared


QUARTER = 0.25  # Qwen3-Next's and Qwen3.5's partial_rotary_factor


def quarter_rotary(text: dict, source: str) -> None:
    params = text.get("rope_parameters")
    rope: dict = params if isinstance(params, dict) else {}
    factor = text.get("partial_rotary_factor", rope.get("partial_rotary_factor", QUARTER))
    if factor != QUARTER:
        raise ConfigError(f"{source}: partial_rotary_factor {factor!r} is not supported for "
                          f"{text.get('model_type') or 'this model'} ({QUARTER} only: the cos/sin cache is sized "
                          "for a quarter of each head)")


def _deltanet(text: dict, card: dict, need: Need, source: str, moe: bool) -> None:
    quarter_rotary(text, source)
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
                     "ssm_dtype": _SSM_DTYPES.get(ssm)}
    card.update(qk_norm=True, attention_output_gate=text.get("attn_output_gate", True) is not False)
    card.pop("sliding_window", None)
    card.pop("num_sliding_layers", None)
    if moe or text.get("num_experts"):
        card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": need("moe_intermediate_size"),
                       "num_shared_experts": 1 if text.get("shared_expert_intermediate_size") else 0,
                       "shared_expert_intermediate_size": text.get("shared_expert_intermediate_size")}


def _qwen3_next(text: dict, card: dict, need: Need, source: str) -> None:
    _deltanet(text, card, need, source, moe=True)


def _qwen3_5_text(text: dict, card: dict, need: Need, source: str) -> None:
    _deltanet(text, card, need, source, moe=False)


register(Family("nemotron_h", ("nemotron_h",), "vllm/model_executor/models/nemotron_h.py", shape=_nemotron_h,
                sglang_states_per_request=True, ssm_dtype_from_config=True),
         Family("granitemoehybrid", ("granitemoehybrid",), "vllm/model_executor/models/granitemoehybrid.py",
                shape=_granite),
         Family("qwen3_next", ("qwen3_next",), "vllm/model_executor/models/qwen3_next.py", shape=_qwen3_next,
                partial_rotary=QUARTER),
         Family("qwen3_5_text", ("qwen3_5_text",), "vllm/model_executor/models/qwen3_5.py", shape=_qwen3_5_text,
                partial_rotary=QUARTER))
