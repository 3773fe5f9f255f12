"""MiniMax-M2 / M2.1 / M2.5 (`minimax_m2`), as vLLM builds it (vllm/model_executor/models/minimax_m2.py).

Every layer: `MiniMaxM2Attention` (q/k/v and o without biases; with use_qk_norm, qk_norm_type "per_layer": one
RMSNorm over all num_heads x head_dim query channels and one over num_kv_heads x head_dim key channels, split with
the heads; a rotary embedding over rotary_dim of each head's head_dim channels) and a `MiniMaxM2MoE` of
num_local_experts experts of intermediate_size (no shared expert, no dense layer), num_experts_per_tok per token;
its router `gate` is a ReplicatedLinear kept in float32 and, with use_routing_bias, an `e_score_correction_bias` of
num_local_experts float32 values, both replicated: the weight hook stores them so. The MTP modules
(num_mtp_modules) are loaded only for speculative decoding and are not counted.

The rotary cache is max_position_embeddings x rotary_dim: the family's `partial_rotary` is the published
rotary_dim / head_dim (64 / 128); a config with another ratio is refused, naming the field.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup

ROTARY_SHARE = 0.5  # rotary_dim 64 of head_dim 128 (MiniMax-M2's config.json)


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    hd = text.get("head_dim") or card["hidden_size"] // card["num_attention_heads"]
    rotary = need("rotary_dim")
    if rotary != hd * ROTARY_SHARE:
        raise ConfigError(f"{source}: rotary_dim {rotary!r} is not supported for minimax_m2 (head_dim x "
                          f"{ROTARY_SHARE} = {int(hd * ROTARY_SHARE)} only: the cos/sin cache is sized for it)")
    if text.get("use_qk_norm", True) and text.get("qk_norm_type", "per_layer") != "per_layer":
        raise ConfigError(f"{source}: qk_norm_type {text.get('qk_norm_type')!r} is not supported (per_layer only)")
    types = text.get("attn_type_list")
    if isinstance(types, list) and any(t != 1 for t in types):  # 0: MiniMax-01's lightning (linear) attention
        raise ConfigError(f"{source}: attn_type_list with linear-attention layers (0) is not supported for "
                          "minimax_m2 (every layer full attention)")
    if text.get("shared_intermediate_size"):
        raise ConfigError(f"{source}: shared_intermediate_size {text['shared_intermediate_size']!r} is not "
                          "supported for minimax_m2 (no shared expert)")
    card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("intermediate_size")}


def _weights(card, groups: list) -> list:
    """A float32 router and score-correction bias; the per-layer q/k RMSNorms (q: all heads, k: all KV heads)."""
    out = []
    hd, layers = card.head_dim_, card.num_layers
    for t in groups:
        if t.name == "router":  # count: the MoE layers; rows: the experts; cols: hidden
            out += [TensorGroup("router", t.count, t.rows, t.cols, "replicated", "fp32"),
                    TensorGroup("router_score_bias", t.count, 1, t.rows, "replicated", "fp32")]
        else:
            out.append(t)
    out += [TensorGroup("q_norm", layers, card.num_attention_heads * hd, 1, "column", None),  # split with the heads
            TensorGroup("k_norm", layers, card.num_kv_heads * hd, 1, "kv", None)]
    return out


register(Family("minimax_m2", ("minimax_m2",), "vllm/model_executor/models/minimax_m2.py", shape=_shape,
                weights=_weights, partial_rotary=ROTARY_SHARE))
