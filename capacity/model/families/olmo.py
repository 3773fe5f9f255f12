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

olmo3 (Olmo-3-7B/32B, Olmo-3.1-32B): vLLM builds Olmo3ForCausalLM with olmo2.py (the registry maps it there;
`Olmo2Attention` accepts Olmo3Config): OLMo-2's layer, plus a sliding window on the layers config.layer_types names
"sliding_attention" (`per_layer_sliding_window`; the loader counts them from layer_types). Rope scaling is applied on
the full-attention layers only (`self.rope_scaling = config.rope_scaling if sliding_window is None else None`), so
a YaRN-scaled model keeps two cos/sin caches: max_position_embeddings rows for the sliding layers and
original_max_position_embeddings x factor rows for the YaRN layers (`YaRNScalingRotaryEmbedding`).
head_dim is hidden_size / num_attention_heads (`Olmo2Attention`), whatever the config says.
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


def _olmo3(text: dict, card: dict, need: Need, source: str) -> None:
    _common(text, card, source)
    card["head_dim"] = card["hidden_size"] // card["num_attention_heads"]
    rope = text.get("rope_scaling")
    if card.get("num_sliding_layers") and isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "yarn":
        factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1024:
            raise ConfigError(f"{source}: rope_scaling.factor {factor!r} must be a number in (0, 1024]")
        if not isinstance(original, int) or isinstance(original, bool) or original <= 0:
            raise ConfigError(f"{source}: rope_scaling.original_max_position_embeddings {original!r} must be a "
                              "positive token count")
        card["rope_caches"] = [card["max_position_embeddings"], int(original * factor)]


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
         Family("olmo3", ("olmo3",), "vllm/model_executor/models/olmo2.py", shape=_olmo3, weights=_qk_norms),
         Family("olmoe", ("olmoe",), "vllm/model_executor/models/olmoe.py", shape=_olmoe, weights=_qk_norms))
