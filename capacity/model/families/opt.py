"""OPT (`opt`: facebook/opt-125m ... opt-66b), as vLLM builds it (vllm/model_executor/models/opt.py).

`OPTDecoderLayer`: attention with biases on q/k/v and out_proj (bias=config.enable_bias, OPTConfig's default true),
two LayerNorms with weight and bias (self_attn_layer_norm, final_layer_norm), a non-gated ReLU MLP (fc1 hidden ->
ffn_dim and fc2 back, with biases); learned positions (`OPTLearnedPositionalEmbedding`: max_position_embeddings + 2
rows, the offset OPT keeps, whole on every rank, and no rotary embedding), a final LayerNorm with bias and the LM
head tied to the embedding (OPTConfig's default). The config names the MLP width ffn_dim (the text hook reads it as
intermediate_size). OPT-350m's project_in/project_out (word_embed_proj_dim other than hidden_size) and its
post-norm layers (do_layer_norm_before false) are refused, naming the field.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup, mlp_and_final_norm_biases

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: num_embeddings + 2


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    if cfg.get("ffn_dim") is None and cfg.get("intermediate_size") is None:
        raise ConfigError(f"{source}: field 'ffn_dim' is missing (model_type {mt})")
    return {**cfg, "intermediate_size": cfg.get("ffn_dim") or cfg.get("intermediate_size")}, "opt"


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    proj = text.get("word_embed_proj_dim")
    if proj is not None and proj != card["hidden_size"]:
        raise ConfigError(f"{source}: word_embed_proj_dim {proj!r} other than hidden_size is not supported "
                          "(OPT-350m's project_in/project_out)")
    for key, want in (("do_layer_norm_before", True), ("enable_bias", True)):
        if text.get(key, want) is not want:
            raise ConfigError(f"{source}: {key} {text.get(key)!r} is not supported for opt ({want} only)")
    act = str(text.get("activation_function") or "relu")
    if act != "relu":
        raise ConfigError(f"{source}: activation_function {act[:30]!r} is not supported for opt (ReLU)")
    card.update(gated_mlp=False, attention_bias=True, attention_out_bias=True, norms_per_layer=4)


def _weights(card, groups: list) -> list:
    """fc1's and fc2's biases, the final LayerNorm's bias and the learned positions."""
    out = [*groups, *mlp_and_final_norm_biases(card)]
    if card.has_embedding:
        out.append(TensorGroup("position_embeddings", 1, card.max_position_embeddings + POSITION_OFFSET,
                               card.hidden_size, "replicated", None))
    return out


register(Family("opt", ("opt",), "vllm/model_executor/models/opt.py", defaults={"tie_word_embeddings": True},
                text=_text, shape=_shape, weights=_weights, rotary=False))
