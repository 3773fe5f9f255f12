"""Helpers the vision-language families share (capacity/model/families/: llava.py, gemma.py, mllama.py,
qwen_vl.py size their towers and projectors with them): the language model's text_config, the checked
vision_config with a `need` that names any field it cannot size, and the fields every ViT config states."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capacity.errors import ConfigError

VisionNeed = Callable[..., Any]  # need(key, default=None): a positive integer of vision_config, or an error


def text_config(cfg: dict, mt: str, source: str) -> dict:
    """A vision-language config's language model: its text_config (an error where it has none)."""
    sub = cfg.get("text_config")
    if not isinstance(sub, dict):
        raise ConfigError(f"{source}: text_config is missing (model_type {mt})")
    return sub


def vision_config(cfg: dict, mt: str, expected: tuple[str | None, ...], source: str) -> tuple[dict, VisionNeed]:
    """The config's vision_config, whose model_type must be one of `expected` (None: may be absent), and its
    `need`."""
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        raise ConfigError(f"{source}: vision_config is missing (model_type {mt})")
    vmt = v.get("model_type")
    if vmt not in expected:
        raise ConfigError(f"{source}: vision_config.model_type {vmt!r} cannot be sized for {mt} "
                          f"(known: {', '.join(str(e) for e in expected if e)})")

    def need(key: str, default: Any = None) -> Any:
        val = v.get(key, default)
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ConfigError(f"{source}: vision_config.{key} {val!r} must be a positive integer")
        return val

    return v, need


def vit_fields(v: dict, need: VisionNeed, heads_key: str = "num_attention_heads") -> dict[str, Any]:
    """The fields a CLIP / SigLIP / Pixtral / Mllama vision_config states the same way."""
    stated = v.get("num_hidden_layers")
    config_layers = stated if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0 else 0
    h = need("hidden_size")
    heads = need(heads_key)
    return {"hidden_size": h, "intermediate_size": need("intermediate_size"), "num_heads": heads,
            "patch_size": need("patch_size"), "image_size": need("image_size"), "config_layers": config_layers}
