"""Jamba (`jamba`, AI21 Jamba v0.1 / 1.5 Mini / 1.5 Large): vLLM jamba.py over layers/mamba/mamba_mixer.py.

Layer i is attention where i % attn_layer_period == attn_layer_offset, else a Mamba (Mamba-1) layer
(transformers' JambaConfig.layers_block_type); its feed-forward is a `JambaMoE` of num_experts experts (each an MLP
of intermediate_size, top num_experts_per_tok, a router without bias) where i % expert_layer_period ==
expert_layer_offset (layers_num_experts), else a dense MLP of intermediate_size. Attention: head_dim =
hidden_size / num_attention_heads, no biases and no positional embedding (vLLM builds no rotary embedding, so no
cos/sin cache). The Mamba layer is `MambaMixer(intermediate_size=mamba_expand x hidden_size, time_step_rank=
mamba_dt_rank, use_conv_bias=mamba_conv_bias, use_bias=mamba_proj_bias, use_rms_norm=True)`: the card's mamba
state layers plus the three RMSNorms use_rms_norm adds (dt_layernorm of dt_rank, b_ and c_layernorm of d_state),
this family's weight hook. Its state per sequence (mamba1_state_shape): (d_conv - 1) x inner / tp and inner / tp x
d_state, in the model dtype."""
from __future__ import annotations

import math

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup

# transformers JambaConfig defaults for fields a config leaves out
_DEFAULTS = {"attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1,
             "num_experts": 16, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
             "max_position_embeddings": 262144}


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    layers, h = card["num_layers"], card["hidden_size"]
    for key in ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset"):
        v = need(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (key.endswith("period") and v == 0):
            raise ConfigError(f"{source}: {key} {v!r} must be a {'positive' if key.endswith('period') else 'non-negative'}"
                              " integer")
    attn = sum(1 for i in range(layers) if i % need("attn_layer_period") == need("attn_layer_offset"))
    experts = need("num_experts")
    moe = sum(1 for i in range(layers) if i % need("expert_layer_period") == need("expert_layer_offset")) \
        if experts > 1 else 0
    dt_rank = text.get("mamba_dt_rank") or "auto"
    if dt_rank == "auto":  # JambaConfig: math.ceil(hidden_size / 16)
        dt_rank = math.ceil(h / 16)
    if text.get("mamba_proj_bias"):
        raise ConfigError(f"{source}: mamba_proj_bias true is not supported (the published Jamba checkpoints have "
                          "none)")
    if text.get("mamba_conv_bias") is False:
        raise ConfigError(f"{source}: mamba_conv_bias false is not supported (the card's Mamba conv has a bias)")
    card["head_dim"] = h // card["num_attention_heads"]
    card.update(attention_layers=attn, moe_layers=moe, dense_mlp_layers=layers - moe)
    if layers - attn:
        card["state"] = {"kind": "mamba", "num_layers": layers - attn, "conv_kernel": need("mamba_d_conv"),
                         "inner": need("mamba_expand") * h, "state_size": need("mamba_d_state"), "dt_rank": dt_rank}
    if moe:
        card["moe"] = {"num_experts": experts, "experts_per_token": need("num_experts_per_tok"),
                       "moe_intermediate_size": card["intermediate_size"]}


def _mixer_norms(card, groups: list) -> list:
    """MambaMixer(use_rms_norm=True): dt_layernorm (dt_rank), b_layernorm and c_layernorm (d_state), replicated."""
    st = card.state
    if st is None:
        return groups
    return groups + [TensorGroup("state_inner_norms", st.num_layers, 1, st.dt_rank + 2 * st.state_size,
                                 "replicated", None)]


register(Family("jamba", ("jamba",), "vllm/model_executor/models/jamba.py, layers/mamba/mamba_mixer.py",
                defaults=_DEFAULTS, shape=_shape, weights=_mixer_norms, rotary=False))
