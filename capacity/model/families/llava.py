"""LLaVA-1.5 and LLaVA-NeXT (vLLM llava.py, llava_next.py: a CLIP or SigLIP tower built up to vision_feature_layer,
a two-layer projector; NeXT's anyres tiles and image_newline row) and Mistral-3 (mistral3.py: a Pixtral tower, a
patch merger, a two-layer projector) over a Llama, Mistral or Qwen2 language model (text_config)."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, register
from capacity.model.hf_vision import text_config, vision_config, vit_fields
from capacity.model.vision_tokens import llava_next


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    text = text_config(cfg, mt, source)
    tmt = text.get("model_type") or "llama"
    if tmt not in ("llama", "mistral", "qwen2"):
        raise ConfigError(f"{source}: text_config.model_type {tmt!r} is not supported for {mt}")
    return text, tmt


def _llava(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    expected = ("clip_vision_model", "siglip_vision_model") if mt == "llava" else ("clip_vision_model",)
    v, need = vision_config(cfg, mt, expected, source)
    out = vit_fields(v, need)
    h, layers = out["hidden_size"], need("num_hidden_layers")
    feature = cfg.get("vision_feature_layer", -2)
    if not isinstance(feature, int) or isinstance(feature, bool):
        raise ConfigError(f"{source}: vision_feature_layer {feature!r}: a list of layers is not supported")
    used = layers + feature + 1 if feature < 0 else feature  # vLLM builds the encoder up to that layer
    bias = cfg.get("multimodal_projector_bias", True)
    proj = h * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
    kind = "clip" if v.get("model_type") == "clip_vision_model" else "siglip"
    n = (out["image_size"] // out["patch_size"]) ** 2
    out.update(kind=kind, num_layers=used, post_layernorm=False, projector_params=proj, tokens_per_image=n)
    if mt == "llava_next":
        out.update(_anyres(cfg, out, text_hidden, source))
    return out


def _anyres(cfg: dict, out: dict, text_hidden: int, source: str) -> dict:
    """LLaVA-NeXT: its `image_grid_pinpoints` (height, width), the image_newline row (a projector parameter), the
    tokens of its largest image (capacity.model.vision_tokens.llava_next) and its most tiles plus the base image
    (what the encoder runs: `max_num_tiles`)."""
    pins = cfg.get("image_grid_pinpoints")
    tile = out["image_size"]
    if (not isinstance(pins, list) or not pins or len(pins) > 64 or
            not all(isinstance(p, list) and len(p) == 2 and all(type(x) is int and 0 < x <= 16 * tile for x in p)
                    for p in pins)):
        raise ConfigError(f"{source}: image_grid_pinpoints {str(pins)[:80]}: expected [[height, width], ...] in pixels")
    grid = [(p[0], p[1]) for p in pins]
    most = max(llava_next(w, h, tile, out["patch_size"], tuple(grid)).tokens for h, w in grid)
    return {"grid_pinpoints": grid, "projector_params": out["projector_params"] + text_hidden, "tokens_per_image": most,
            "max_num_tiles": 1 + max((h // tile) * (w // tile) for h, w in grid)}


def _mistral3(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    v, need = vision_config(cfg, mt, ("pixtral",), source)
    out = vit_fields(v, need)
    h, layers = out["hidden_size"], need("num_hidden_layers")
    merge = cfg.get("spatial_merge_size", 2)
    bias = cfg.get("multimodal_projector_bias", False)
    proj = h + h * h * merge * merge + h * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
    side = out["image_size"] // out["patch_size"] // merge
    out.update(kind="pixtral", num_layers=layers, projector_params=proj, tokens_per_image=side * side + side,
               merge_size=merge, longest_edge=out["image_size"])
    return out


register(Family("llava", ("llava", "llava_next"), "vllm/model_executor/models/llava.py, llava_next.py", text=_text,
                vision=_llava),
         Family("mistral3", ("mistral3",), "vllm/model_executor/models/mistral3.py", text=_text, vision=_mistral3))
