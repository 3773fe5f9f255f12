"""Gemma 4, dense (`gemma4` wrapping `gemma4_text`; google/gemma-4-31B-it), as vLLM builds it
(vllm/model_executor/models/gemma4.py `Gemma4DecoderLayer`, `Gemma4Attention`, `Gemma4MLP`; first served by vLLM
v0.19.0, #38826; read at vllm-project/vllm 001cabc1, whose k_eq_v handling the earlier stored versions share).

Every layer: four RMSNorms (input, post-attention, pre- and post-feedforward), a gated GELU MLP of
intermediate_size, q/k norms with weights (the v norm has none) and a `layer_scalar` buffer of one value. The
layers differ by `layer_types`:

- sliding_attention: num_key_value_heads KV heads of head_dim, the window sliding_window;
- full_attention: head_dim becomes global_head_dim, and with attention_k_eq_v the KV heads become
  num_global_key_value_heads and the checkpoint has no v_proj, but vLLM still builds a `QKVParallelLinear` with
  those KV heads and loads the K weights into its V slot too ("k_eq_v layers load K weights into both K and V
  slots"), and its `Attention` caches K and V: the served V projection and the cached V exist as for any layer.

The card states the sliding layers' geometry (num_kv_heads, head_dim); the weights hook puts the full layers'
q/kv/o projections and q/k norms at global_head_dim and num_global_key_value_heads. The KV cache is sized from
the card, so a full layer is counted at the sliding layers' per-token width (2 x 16 x 256 elements against 2 x 4
x 512 at tp 1): twice its bytes at tp <= 4, equal from tp 8 (one head of 512 per rank, as vLLM replicates KV
heads): never fewer bytes than vLLM's. Rotary caches: two (sliding: rope_theta 10000 over head_dim; full:
"proportional" rope over global_head_dim, partial_rotary_factor 0.25), counted as max_position_embeddings x
(head_dim + global_head_dim), the upper bound of the full layers' cache whichever width vLLM gives it.

The vision tower (`gemma4_vision`, the report's tensors: 27 blocks of q/k/v/o and a gated MLP without biases,
four RMSNorms and q/k norms a block, a patch projection of 3 x patch^2 -> hidden, a position table of 2 x
position_embedding_size x hidden, std_bias and std_scale) and `embed_vision.embedding_projection` (vision hidden
-> text hidden) are counted as replicated weights in the compute dtype at the published sizes (a config with other
sizes is refused): vllm gemma4_mm.py `Gemma4ForConditionalGeneration.__init__` builds the tower with transformers'
`AutoModel.from_config` (unsharded), `embed_vision` as a ReplicatedLinear, and leaves both unquantised unless the
tower's widths divide by 64 (4304 does not) or the method is bitsandbytes / torchao;
the encoder's profiling activations are not modelled (docs/model-families.md says so).

Refused in one line (not derived): per-layer embeddings (hidden_size_per_layer_input > 0: E2B/E4B), KV-shared
layers (num_kv_shared_layers > 0), the MoE block (enable_moe_block: 26B-A4B), attention_k_eq_v false, and full
layers of other sizes than the published 512 x 4.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config
from capacity.model.weights import TensorGroup

GLOBAL_HEAD_DIM, GLOBAL_KV_HEADS = 512, 4  # gemma-4-31B-it text_config: global_head_dim, num_global_key_value_heads
# gemma-4-31B-it vision_config: hidden, MLP width, blocks, patch, position_embedding_size, head_dim
VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 16,
          "position_embedding_size": 10240, "head_dim": 72}


def _refuse(text: dict, source: str) -> None:
    for key, bad in (("hidden_size_per_layer_input", "per-layer embeddings"),
                     ("num_kv_shared_layers", "KV-shared layers"), ("enable_moe_block", "the MoE block")):
        if text.get(key):
            raise ConfigError(f"{source}: {key} {text[key]!r} is not supported for gemma4 ({bad} are not modelled)")
    if text.get("attention_k_eq_v") is not True:
        raise ConfigError(f"{source}: attention_k_eq_v {text.get('attention_k_eq_v')!r} is not supported for "
                          "gemma4 (true only: the published dense checkpoint)")
    for key, want in (("global_head_dim", GLOBAL_HEAD_DIM), ("num_global_key_value_heads", GLOBAL_KV_HEADS)):
        if text.get(key) != want:
            raise ConfigError(f"{source}: {key} {text.get(key)!r} is not supported for gemma4 ({want} only)")
    if text.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ConfigError(f"{source}: hidden_activation {text['hidden_activation']!r} is not supported for gemma4 "
                          "(vLLM's Gemma4MLP accepts gelu_pytorch_tanh only)")


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    _refuse(text, source)
    types = text.get("layer_types")
    if not isinstance(types, list) or set(types) - {"sliding_attention", "full_attention"}:
        raise ConfigError(f"{source}: layer_types {types!r} must list sliding_attention / full_attention per layer")
    card["norms_per_layer"] = 4
    card["qk_norm"] = True
    tie = text.get("tie_word_embeddings")
    card["tie_word_embeddings"] = True if tie is None else bool(tie)
    if text.get("final_logit_softcapping"):
        card["final_logit_softcap"] = text["final_logit_softcapping"]
    card["rope_caches"] = [card["max_position_embeddings"],  # sliding: head_dim wide; full: global_head_dim wide
                           card["max_position_embeddings"] * GLOBAL_HEAD_DIM // need("head_dim")]


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    """The text config; the vision tower is checked here against the published sizes the weights hook counts."""
    v = cfg.get("vision_config")
    if v is not None:
        if not isinstance(v, dict) or v.get("model_type") != "gemma4_vision":
            vmt = v.get("model_type") if isinstance(v, dict) else v
            raise ConfigError(f"{source}: vision_config.model_type {vmt!r} cannot be sized for gemma4 "
                              "(gemma4_vision only)")
        for key, want in VISION.items():
            if v.get(key) != want:
                raise ConfigError(f"{source}: vision_config.{key} {v.get(key)!r} is not supported for gemma4 "
                                  f"({want} only: the published tower)")
    if cfg.get("audio_config"):
        raise ConfigError(f"{source}: audio_config is not supported for gemma4 (the audio tower is not modelled)")
    return text_config(cfg, mt, source), "gemma4_text"


def _full_layers(card) -> list:
    """The full-attention layers' own projections and norms (q at global_head_dim, K/V slots of the global heads)."""
    full, h, nq, d = card.num_layers - card.num_sliding_layers, card.hidden_size, card.num_attention_heads, \
        GLOBAL_HEAD_DIM
    return [TensorGroup("q_proj_full", full, nq * d, h, "column", "attention"),
            TensorGroup("kv_proj_full", full, 2 * GLOBAL_KV_HEADS * d, h, "kv", "attention"),
            TensorGroup("o_proj_full", full, h, nq * d, "row", "attention"),
            TensorGroup("qk_norm_full", full, 2, d, "replicated", None)]


def _text_weights(card, groups: list) -> list:
    sliding = card.num_sliding_layers
    out = []
    for t in groups:
        if t.name in ("q_proj", "kv_proj", "o_proj", "qk_norm"):
            out.append(TensorGroup(t.name, sliding, t.rows, t.cols, t.shard, t.family))
        else:
            out.append(t)
    return out + _full_layers(card) + [TensorGroup("layer_scalar", card.num_layers, 1, 1, "replicated", None)]


def vision_params() -> int:
    """The published gemma4_vision tower as the checkpoint stores it (the report's tensor list)."""
    h, i, n, p, pos, hd = (VISION[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "patch_size",
                                                "position_embedding_size", "head_dim"))
    block = 4 * h * h + 3 * h * i + 4 * h + 2 * hd  # q/k/v/o, gate/up/down, four norms, q/k norms
    return n * block + 3 * p * p * h + 2 * pos * h + 2 * h  # blocks, patch projection, position table, std


def _mm_weights(card, groups: list) -> list:
    return _text_weights(card, groups) + [
        TensorGroup("vision_tower", 1, vision_params(), 1, "replicated", None),
        TensorGroup("embed_vision", 1, card.hidden_size, VISION["hidden_size"], "replicated", None)]


register(Family("gemma4_text", ("gemma4_text",), "vllm/model_executor/models/gemma4.py",
                defaults={"tie_word_embeddings": True}, shape=_shape, weights=_text_weights),
         Family("gemma4", ("gemma4",), "vllm/model_executor/models/gemma4_mm.py", text=_text,
                weights=_mm_weights))
