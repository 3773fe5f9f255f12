"""AllenAI OLMo-2 and OLMoE (`olmo2`, `olmoe`), as vLLM builds them.

olmo2 (OLMo-2-1124-7B/13B, OLMo-2-0325-32B, OLMo-2-0425-1B): vLLM olmo2.py `Olmo2DecoderLayer`: q/k/v and o without
biases, a gated MLP, norms after each block (post_attention_layernorm, post_feedforward_layernorm: still two
RMSNorms a layer) and a q_norm over all num_heads x head_dim query channels and a k_norm over all KV channels
(`Olmo2Attention`: RMSNorm(hidden_size) and RMSNorm(kv_heads x head_dim), applied after an all-gather across
ranks, so every rank holds them whole).

olmoe (OLMoE-1B-7B-0924, -0125): vLLM olmoe.py: the same full-width q/k norms, pre-norms (input and
post-attention), and every layer an `OlmoeMoE` of num_experts experts of intermediate_size, num_experts_per_tok
per token, with a replicated router `gate` (hidden -> experts); no shared expert. clip_qkv (OLMo-1's clipping) is
refused: neither model uses it and vLLM's OLMoE ignores it.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup


def _common(text: dict, card: dict, source: str) -> None:
    for key in ("attention_bias", "clip_qkv"):
        if text.get(key):
            raise ConfigError(f"{source}: {key} {text[key]!r} is not supported for {text.get('model_type')} "
                              "(the published checkpoints have none)")


def _olmo2(text: dict, card: dict, need: Need, source: str) -> None:
    _common(text, card, source)


def _olmoe(text: dict, card: dict, need: Need, source: str) -> None:
    _common(text, card, source)
    card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("intermediate_size")}


def _qk_norms(card, groups: list) -> list:
    """q_norm (num_heads x head_dim) and k_norm (num_kv_heads x head_dim) per layer, whole on every rank."""
    hd = card.head_dim_
    return groups + [TensorGroup("qk_norm", card.num_layers, 1, (card.num_attention_heads + card.num_kv_heads) * hd,
                                 "replicated", None)]


register(Family("olmo2", ("olmo2",), "vllm/model_executor/models/olmo2.py", shape=_olmo2, weights=_qk_norms),
         Family("olmoe", ("olmoe",), "vllm/model_executor/models/olmoe.py", shape=_olmoe, weights=_qk_norms))
