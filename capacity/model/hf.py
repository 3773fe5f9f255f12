"""Hugging Face `config.json` -> ModelCard, for the architectures people serve with vLLM.

The fields every decoder shares (layers, hidden size, heads, KV heads, MLP width, vocabulary, context, tied
embeddings, dtype, head_dim, sliding layers, linear rope scaling, quantisation) are read here; everything a family
does differently is its module's business in `capacity.model.families` (one module per family: its model types,
the transformers defaults its configs rely on, its MoE / MLA / state layers / cross-attention / vision tower and
any weights the generic layout does not describe), found through the family registry by `model_type` (the
families and their model types: docs/model-families.md, `registry.supported()`; vision towers: hf_vision.py).
Quantised checkpoints: capacity.model.hf_quant.

Where a config leaves a field to the `transformers` config class, the class's default is used (Gemma-3's
vocabulary, Gemma's tied embeddings ...). A model type no family claims is read as a standard decoder where its
config has nothing else, with a note saying what was assumed (families/generic.py); anything the loader cannot
size is an error naming the field and value, never a guess.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity.errors import ConfigError
from capacity.files import validate
from capacity.model.families.registry import PLAIN, Family, fallback, family
from capacity.model.hf_quant import apply_quant
from capacity.model.schema import ModelCard

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", "float": "bf16"}


def from_hf_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelCard:
    """Map a Hugging Face config.json onto a ModelCard through the family its model_type names."""
    mt = cfg.get("model_type")
    notes: list[str] = []
    outer = family(mt)
    if outer is None:
        if mt is not None and not isinstance(mt, str):
            raise ConfigError(f"{source}: model_type {mt!r} must be a string")
        fam = fallback()
        assert fam.fallback is not None
        notes = fam.fallback(cfg, mt, source)
        text: dict[str, Any] = cfg
    elif outer.text is not None:  # a vision-language wrapper: its language model's family does the text part
        text, tmt = outer.text(cfg, str(mt), source)
        fam = family(tmt) or PLAIN
    else:
        text, fam = cfg, outer
    mt = mt or ""
    defaults = fam.defaults

    def get(key: str, default: Any = None, where: dict | None = None) -> Any:
        d = text if where is None else where
        v = d.get(key)
        return default if v is None else v

    def need(key: str, where: dict | None = None, label: str = "") -> Any:
        v = get(key, defaults.get(key), where)
        if v is None:
            raise ConfigError(f"{source}: field {label or ''}{key!r} is missing (model_type {mt})")
        return v

    tag = "text_config." if text is not cfg else ""
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or "bfloat16")
    dtype = _TORCH_DTYPES.get(dtype_name.replace("torch.", ""))
    if dtype is None:
        raise ConfigError(f"{source}: torch_dtype {dtype_name!r} is not supported (bfloat16, float16, float32)")
    layers = need("num_hidden_layers", label=tag)
    card: dict[str, Any] = {
        "name": name,
        "hf_id": cfg.get("_name_or_path") or None,
        "architecture": mt or "unknown",
        "num_layers": layers,
        "hidden_size": need("hidden_size", label=tag),
        "num_attention_heads": need("num_attention_heads", label=tag),
        "num_kv_heads": _kv_heads(text, defaults, source, tag),
        "intermediate_size": need("intermediate_size", label=tag),
        "vocab_size": need("vocab_size", label=tag),
        "max_position_embeddings": get("max_position_embeddings", defaults.get("max_position_embeddings", 4096)),
        "tie_word_embeddings": bool(get("tie_word_embeddings", cfg.get("tie_word_embeddings",
                                                                        defaults.get("tie_word_embeddings", False)))),
        "dtype": dtype,
        "notes": notes,
    }
    if text.get("head_dim") or defaults.get("head_dim"):
        card["head_dim"] = get("head_dim", defaults.get("head_dim"))
    _sliding(text, fam, layers, card, defaults, source)
    rope = text.get("rope_scaling")
    if isinstance(rope, dict) and str(rope.get("rope_type") or rope.get("type")) == "linear":
        factor = rope.get("factor")
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1024:
            raise ConfigError(f"{source}: rope_scaling.factor {factor!r} must be a number in (0, 1024]")
        scaled = int(card["max_position_embeddings"] * factor)
        # a family whose sliding layers keep their own unscaled rope (Gemma-3's rope_local_base_freq) has two caches
        card["rope_caches"] = [card["max_position_embeddings"], scaled] if fam.local_rope else [scaled]
    if fam.shape is not None:
        fam.shape(text, card, need, source)
    if outer is not None and outer.vision is not None:
        card["vision"] = outer.vision(cfg, mt, card["hidden_size"], source)
    quant = cfg.get("quantization_config") or text.get("quantization_config")
    if quant:
        apply_quant(quant, card, dtype, source)
    return validate(ModelCard, card, source)


def _kv_heads(text: dict, defaults: Mapping[str, Any], source: str, tag: str) -> Any:
    """num_key_value_heads; absent means multi-head attention (as transformers reads it), 0 is an error."""
    v = text.get("num_key_value_heads", defaults.get("num_key_value_heads"))
    if v is None:
        v = text.get("num_attention_heads", defaults.get("num_attention_heads"))
    if v == 0 or isinstance(v, bool):
        raise ConfigError(f"{source}: {tag}num_key_value_heads {v!r} must be a positive integer")
    return v


def _sliding(text: dict, fam: Family, layers: int, card: dict, defaults: Mapping[str, Any], source: str) -> None:
    """Which layers attend through a sliding window, as vLLM's KV manager sees them: the config's layer_types where
    it has them, else the family's rule (none: no layer slides)."""
    window = text.get("sliding_window") or defaults.get("sliding_window")
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != layers:
            raise ConfigError(f"{source}: layer_types has {len(types)} entries for {layers} layers")
        n = sum(1 for t in types if t == "sliding_attention")
    elif fam.sliding is not None:
        n = fam.sliding(text, layers, window, defaults)
    else:
        n = 0
    if n:
        if not isinstance(window, int) or window <= 0:
            raise ConfigError(f"{source}: sliding_window {window!r} must be a positive token count")
        card["sliding_window"] = window
        card["num_sliding_layers"] = n
