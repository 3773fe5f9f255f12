"""Kimi-Linear (`kimi_linear`, moonshotai/Kimi-Linear-48B-A3B): vLLM kimi_linear.py over layers/kda.py.

Layer i (0-based) is a Kimi Delta Attention layer where i + 1 is in linear_attn_config.kda_layers (1-based,
`KimiLinearConfig.is_kda_layer`), else multi-head latent attention (`KimiMLAAttention`: q_proj without a
q LoRA, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; vLLM asserts q_lora_rank None and mla_use_nope, and
passes no rotary embedding, so no cos/sin cache). A KDA layer keeps per sequence (MambaStateShapeCalculator.
kda_state_shape, MambaStateDtypeCalculator.kda_state_dtype): q, k and v convolution states of (conv - 1) x
heads x head_dim / tp each in the model dtype, and a recurrent state of heads / tp x head_dim x head_dim in
float32: the card's `state` of kind kda with groups = heads and state_size = head_dim (the gated DeltaNet layout
with as many key heads as value heads). Layers from first_k_dense_replace with i % moe_layer_freq == 0 hold a
`KimiMoE`: num_experts routed experts, num_experts_per_token active, num_shared_experts x moe_intermediate_size
shared, a gate in the compute dtype and `gate.e_score_correction_bias = nn.Parameter(torch.empty(num_experts))`
(the model dtype, unlike DeepSeek-V3's float32); the rest a dense MLP of intermediate_size."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup


def _layers(cfg: dict, key: str, layers: int, source: str) -> list[int]:
    got = cfg.get(key)
    if not isinstance(got, list) or any(not isinstance(i, int) or isinstance(i, bool) or not 1 <= i <= layers
                                         for i in got) or len(set(got)) != len(got):
        raise ConfigError(f"{source}: linear_attn_config.{key} must list distinct 1-based layer numbers up to "
                          f"{layers}")
    return got


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    layers = card["num_layers"]
    lin = text.get("linear_attn_config")
    if not isinstance(lin, dict):
        raise ConfigError(f"{source}: linear_attn_config is missing (model_type kimi_linear)")
    kda = _layers(lin, "kda_layers", layers, source)
    for key, want in (("q_lora_rank", None), ("mla_use_nope", True), ("hidden_act", "silu")):
        if text.get(key, "silu" if key == "hidden_act" else None) != want:  # vLLM asserts the first two and raises on any activation but silu
            raise ConfigError(f"{source}: {key} {text.get(key)!r} is not supported (vLLM's kimi_linear.py takes "
                              f"{want!r})")
    freq = text.get("moe_layer_freq", 1)
    if freq != 1:
        raise ConfigError(f"{source}: moe_layer_freq {freq!r} is not supported (MoE on every layer from "
                          "first_k_dense_replace only)")
    card["mla"] = {"q_lora_rank": None, "kv_lora_rank": need("kv_lora_rank"),
                   "qk_nope_head_dim": need("qk_nope_head_dim"), "qk_rope_head_dim": need("qk_rope_head_dim"),
                   "v_head_dim": need("v_head_dim")}
    if kda:
        heads, hd = need("num_heads", lin, "linear_attn_config."), need("head_dim", lin, "linear_attn_config.")
        card["state"] = {"kind": "kda", "num_layers": len(kda),
                         "conv_kernel": need("short_conv_kernel_size", lin, "linear_attn_config."), "inner": 1,
                         "groups": heads, "state_size": hd, "heads": heads, "head_dim": hd, "ssm_dtype": "fp32"}
    if text.get("num_experts"):
        card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_token"),
                       "moe_intermediate_size": need("moe_intermediate_size"),
                       "num_shared_experts": text.get("num_shared_experts") or 0,
                       "first_dense_layers": text.get("first_k_dense_replace", 0)}
    if not text.get("max_position_embeddings") and text.get("model_max_length"):
        card["max_position_embeddings"] = text["model_max_length"]  # the published config states only this


def _score_bias(card, groups: list) -> list:
    """KimiMoE.gate.e_score_correction_bias: num_experts values per MoE layer in the model dtype, replicated."""
    out = []
    for t in groups:
        out.append(t)
        if t.name == "router":
            out.append(TensorGroup("router_score_bias", t.count, 1, t.rows, "replicated", None))
    return out


register(Family("kimi_linear", ("kimi_linear",), "vllm/model_executor/models/kimi_linear.py, layers/kda.py",
                shape=_shape, weights=_score_bias, rotary=False))
