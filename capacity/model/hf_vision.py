"""Vision towers of Hugging Face vision-language configs (`capacity.model.hf` reads the language model): CLIP and
SigLIP ViTs (LLaVA, Gemma-3), Pixtral (Mistral-3), Mllama's tiled encoder, Qwen2-VL's, Qwen2.5-VL's and
Qwen3-VL/Qwen3.5's ViTs, each with its projector, sized from `vision_config`."""
from __future__ import annotations

from typing import Any

from capacity.errors import ConfigError
from capacity.model.vision_tokens import llava_next

# Qwen2-VL / Qwen2.5-VL processors (preprocessor_config.json of the Qwen repositories; Qwen2VLImageProcessor's
# min_pixels 56 x 56, max_pixels 16384 x 28 x 28)
QWEN_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}


def text_config(cfg: dict, mt: str, source: str) -> dict:
    """A vision-language config's language model: its text_config (an error where it has none)."""
    sub = cfg.get("text_config")
    if not isinstance(sub, dict):
        raise ConfigError(f"{source}: text_config is missing (model_type {mt})")
    return sub


# ---- vision towers --------------------------------------------------------------------------------
def vision_tower(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    """The card's `vision` mapping from a config's vision_config (an error names any field it cannot size)."""
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        raise ConfigError(f"{source}: vision_config is missing (model_type {mt})")
    vmt = v.get("model_type")
    expected = {"llava": ("clip_vision_model", "siglip_vision_model"), "llava_next": ("clip_vision_model",), "gemma3": ("siglip_vision_model",),
                "mistral3": ("pixtral",), "mllama": ("mllama_vision_model",), "qwen2_5_vl": ("qwen2_5_vl", None),
                "qwen2_vl": ("qwen2_vl", None), "qwen3_5": ("qwen3_5", "qwen3_vl", None)}[mt]
    if vmt not in expected:
        raise ConfigError(f"{source}: vision_config.model_type {vmt!r} cannot be sized for {mt} "
                          f"(known: {', '.join(str(e) for e in expected if e)})")

    def need(key: str, default: Any = None) -> Any:
        val = v.get(key, default)
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ConfigError(f"{source}: vision_config.{key} {val!r} must be a positive integer")
        return val

    if mt == "qwen2_5_vl":
        return _qwen25vl(v, need)
    if mt in ("qwen2_vl", "qwen3_5"):
        return _qwen_vit(v, mt, need)
    stated = v.get("num_hidden_layers")
    config_layers = stated if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0 else 0
    h = need("hidden_size")
    heads = need("num_attention_heads") if mt != "mllama" else need("attention_heads")
    out: dict[str, Any] = {"hidden_size": h, "intermediate_size": need("intermediate_size"), "num_heads": heads,
                           "patch_size": need("patch_size"), "image_size": need("image_size"),
                           "config_layers": config_layers}
    layers = need("num_hidden_layers")
    if mt in ("llava", "llava_next"):
        feature = cfg.get("vision_feature_layer", -2)
        if not isinstance(feature, int) or isinstance(feature, bool):
            raise ConfigError(f"{source}: vision_feature_layer {feature!r}: a list of layers is not supported")
        used = layers + feature + 1 if feature < 0 else feature  # vLLM builds the encoder up to that layer
        bias = cfg.get("multimodal_projector_bias", True)
        proj = h * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
        kind = "clip" if vmt == "clip_vision_model" else "siglip"
        n = (out["image_size"] // out["patch_size"]) ** 2
        out.update(kind=kind, num_layers=used, post_layernorm=False, projector_params=proj, tokens_per_image=n)
        if mt == "llava_next":
            out.update(_anyres(cfg, out, text_hidden, source))
    elif mt == "gemma3":
        per_image = cfg.get("mm_tokens_per_image", 256)
        out.update(kind="siglip", num_layers=layers, projector_params=h * text_hidden + h, tokens_per_image=per_image)
    elif mt == "mistral3":
        merge = cfg.get("spatial_merge_size", 2)
        bias = cfg.get("multimodal_projector_bias", False)
        proj = h + h * h * merge * merge + h * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
        side = out["image_size"] // out["patch_size"] // merge
        out.update(kind="pixtral", num_layers=layers, projector_params=proj, tokens_per_image=side * side + side,
                   merge_size=merge, longest_edge=out["image_size"])
    else:  # mllama
        ratios = v.get("supported_aspect_ratios") or []
        out_dim = need("vision_output_dim")
        kept = v.get("intermediate_layers_indices") or []
        out.update(kind="mllama", num_layers=layers, num_global_layers=v.get("num_global_layers", 8),
                   kept_layer_outputs=len(kept) if isinstance(kept, list) else 0,
                   max_num_tiles=need("max_num_tiles", 4), num_aspect_ratios=len(ratios) + 1,
                   projector_params=out_dim * text_hidden + text_hidden,
                   tokens_per_image=need("max_num_tiles", 4) * ((out["image_size"] // out["patch_size"]) ** 2 + 1))
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


def _qwen25vl(v: dict, need) -> dict:
    """Qwen2.5-VL's window-attention ViT; its merger (two linears over merge x merge patches) is the projector."""
    h, out_h, merge = need("hidden_size"), need("out_hidden_size"), need("spatial_merge_size", 2)
    m = h * merge * merge
    return {"kind": "qwen2_5_vl", "num_layers": need("depth"), "hidden_size": h,
            "intermediate_size": need("intermediate_size"), "num_heads": need("num_heads"),
            "patch_size": need("patch_size", 14), "image_size": 14 * 256, "projector_params": h + m * m + m + m * out_h + out_h,
            "tokens_per_image": 16384,  # the processor's default max_pixels (12,845,056) in merged tokens
            **QWEN_PIXELS, "merge_size": merge, "window_size": need("window_size", 112),
            "full_attention_layers": len(v.get("fullatt_block_indexes") or [])}


def _qwen_vit(v: dict, mt: str, need) -> dict:
    """Qwen2-VL's and Qwen3-VL/Qwen3.5's ViT (LayerNorms, a GELU MLP) and patch merger (4 patches -> one token).
    An image at the processor's largest size (max_pixels 12,845,056 at 14-pixel patches, 16,777,216 at 16) is
    16,384 merged tokens."""
    merge = need("spatial_merge_size", 2)
    if mt == "qwen2_vl":
        h = need("embed_dim")
        i = h * need("mlp_ratio", 4)
        out, p, pos, extra = need("hidden_size"), need("patch_size", 14), 0, 0
    else:
        h, i, out, p = need("hidden_size"), need("intermediate_size"), need("out_hidden_size"), need("patch_size", 16)
        pos = v.get("num_position_embeddings") or 0
        deep = v.get("deepstack_visual_indexes") or []
        extra = len(deep) if isinstance(deep, list) else 0
    m = h * merge * merge
    return {"kind": "qwen2_vl" if mt == "qwen2_vl" else "qwen3_vl", "num_layers": need("depth"), "hidden_size": h,
            "intermediate_size": i, "num_heads": need("num_heads"), "patch_size": p, "image_size": p * 256,
            "projector_params": (1 + extra) * (m * out + out), "tokens_per_image": 16384, "position_embeddings": pos,
            "extra_mergers": extra, "merge_size": merge,
            **(QWEN_PIXELS if mt == "qwen2_vl" else {"min_pixels": 65536, "max_pixels": 16777216})}
