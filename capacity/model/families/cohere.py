"""Cohere Command-R / Command-R+ (`cohere`) and Command-R7B / Command-A (`cohere2`), as vLLM builds them
(vllm/model_executor/models/commandr.py serves both).

A parallel block (`CohereDecoderLayer`: one input LayerNorm, weight only, feeds the attention and the MLP, whose
outputs are summed into the residual), q/k/v and o with biases where attention_bias says so, a gated SiLU MLP,
a final LayerNorm (weight only) and the LM head tied to the embedding (CohereConfig's default); logit_scale
multiplies the logits and holds no weight. With use_qk_norm (Command-R+): a q_norm of (num_heads, head_dim) and
a k_norm of (num_kv_heads, head_dim) LayerNorm weights, split with the heads.

cohere2 slides: every layer but each sliding_window_pattern-th attends through sliding_window tokens (the config's
layer_types where it has them: Command-R7B and Command-A, 3 sliding layers to 1 full); the full layers use no
rotary embedding, the sliding ones one cos/sin cache of max_position_embeddings x head_dim.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    act = str(text.get("hidden_act") or "silu")
    if act != "silu":
        raise ConfigError(f"{source}: hidden_act {act[:30]!r} is not supported for {text.get('model_type')} "
                          "(a gated SiLU MLP)")
    if text.get("layer_norm_bias"):
        raise ConfigError(f"{source}: layer_norm_bias true is not supported (Cohere's LayerNorms have no bias)")
    card["norms_per_layer"] = 1  # one LayerNorm a layer, weight only
    if text.get("attention_bias"):
        card.update(attention_bias=True, attention_out_bias=True)


def _sliding(text: dict, layers: int, window: Any, defaults: Mapping[str, Any]) -> int:
    pattern = text.get("sliding_window_pattern") or defaults["sliding_window_pattern"]
    return layers - layers // pattern  # every pattern-th layer is full attention


def _qk_norm_groups(layers: int, nq: int, nkv: int, hd: int) -> list:
    return [TensorGroup("q_norm", layers, nq * hd, 1, "column", None),
            TensorGroup("k_norm", layers, nkv * hd, 1, "kv", None)]


def _cohere_shape(text: dict, card: dict, need: Need, source: str) -> None:
    _shape(text, card, need, source)
    if text.get("use_qk_norm"):
        # the card has no field for per-head LayerNorm weights: the architecture names the family that adds them
        card["architecture"] = "cohere_qk_norm"


def _qk_weights(card, groups: list) -> list:
    return groups + _qk_norm_groups(card.num_layers, card.num_attention_heads, card.num_kv_heads, card.head_dim_)


register(Family("cohere", ("cohere",), "vllm/model_executor/models/commandr.py",
                defaults={"tie_word_embeddings": True}, shape=_cohere_shape),
         Family("cohere_qk_norm", ("cohere_qk_norm",), "vllm/model_executor/models/commandr.py (use_qk_norm)",
                defaults={"tie_word_embeddings": True}, shape=_cohere_shape, weights=_qk_weights),
         Family("cohere2", ("cohere2",), "vllm/model_executor/models/commandr.py",
                defaults={"tie_word_embeddings": True, "sliding_window_pattern": 4}, shape=_shape,
                sliding=_sliding))
