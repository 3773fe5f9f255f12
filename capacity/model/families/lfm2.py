"""LFM2 (`lfm2`, LiquidAI LFM2-350M/700M/1.2B/2.6B): vLLM lfm2.py over layers/mamba/short_conv.py.

Layer i is `Lfm2AttentionDecoderLayer` where config.layer_types[i] is "full_attention" (transformers' Lfm2Config
builds layer_types from full_attn_idxs when the config has none; every layer attends when it has neither), else
`Lfm2ShortConvDecoderLayer`: a `ShortConv` of conv_dim channels (in_proj hidden -> 3 x conv_dim, a depthwise conv
of conv_L_cache taps, out_proj conv_dim -> hidden; bias only with conv_bias), whose state per sequence is
(conv_L_cache - 1) x conv_dim / tp in the model dtype (`MambaStateShapeCalculator.short_conv_state_shape`,
`short_conv_state_dtype`): the card's short_conv state. Attention: head_dim = hidden_size / num_attention_heads
(vLLM ignores a config head_dim), no biases, q/k RMSNorms of head_dim. Every layer has an `Lfm2MLP` on block_dim: its
width is intermediate_size (block_ff_dim where the config states it, as Lfm2Config reads it), with
block_auto_adjust_ff_dim int(2 x width / 3), times block_ffn_dim_multiplier, rounded up to block_multiple_of."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register

# transformers Lfm2Config defaults (configuration_lfm2.py) for fields a config leaves out
_DEFAULTS = {"intermediate_size": 12288, "max_position_embeddings": 128000, "tie_word_embeddings": True,
             "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0}


def _ff_dim(text: dict, need: Need) -> int:
    width = text.get("block_ff_dim") or need("intermediate_size")
    if text.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        mult = text.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            width = int(mult * width)
        m = need("block_multiple_of")
        width = m * ((width + m - 1) // m)
    return width


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    layers, h = card["num_layers"], card["hidden_size"]
    types = text.get("layer_types")
    if not isinstance(types, list):
        idxs = text.get("full_attn_idxs")
        idxs = list(range(layers)) if idxs is None else idxs
        if not isinstance(idxs, list):
            raise ConfigError(f"{source}: full_attn_idxs {idxs!r} must be a list of layer indices")
        types = ["full_attention" if i in idxs else "conv" for i in range(layers)]
    if len(types) != layers:
        raise ConfigError(f"{source}: layer_types has {len(types)} entries for {layers} layers")
    if text.get("block_dim", h) != h:  # Lfm2MLP runs on block_dim, the norms on hidden_size
        raise ConfigError(f"{source}: block_dim {text.get('block_dim')!r} is not supported (it must equal "
                          f"hidden_size {h})")
    if text.get("conv_bias"):
        raise ConfigError(f"{source}: conv_bias true is not supported (the published LFM2 checkpoints have none)")
    if "tie_embedding" in text:  # Lfm2Config reads the original key over tie_word_embeddings
        card["tie_word_embeddings"] = bool(text["tie_embedding"])
    card["intermediate_size"] = _ff_dim(text, need)
    card["head_dim"] = h // card["num_attention_heads"]
    card["qk_norm"] = True
    convs = sum(1 for t in types if t != "full_attention")
    if convs:
        card["state"] = {"kind": "short_conv", "num_layers": convs, "conv_kernel": need("conv_L_cache"),
                         "inner": need("conv_dim")}


register(Family("lfm2", ("lfm2",), "vllm/model_executor/models/lfm2.py, layers/mamba/short_conv.py",
                defaults=_DEFAULTS, shape=_shape))
