"""Qwen2-VL and Qwen2.5-VL (vLLM qwen2_vl.py, qwen2_5_vl.py: a Qwen2 language model whose fields sit at the top of
the config, a ViT with a patch merger) and Qwen3.5 (qwen3_5.py: text_config is a qwen3_5_text hybrid, families/
hybrid.py; a Qwen3-VL-style ViT). An image at the processor's largest size is 16,384 merged tokens."""
from __future__ import annotations

from capacity.model.families.registry import Family, register
from capacity.model.hf_vision import text_config, vision_config

# Qwen2-VL / Qwen2.5-VL processors (preprocessor_config.json of the Qwen repositories; Qwen2VLImageProcessor's
# min_pixels 56 x 56, max_pixels 16384 x 28 x 28)
QWEN_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}


def _qwen2(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return cfg, "qwen2"


def _qwen3_5(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    text = text_config(cfg, mt, source)
    return text, text.get("model_type") or "llama"


def _qwen25vl(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    """Qwen2.5-VL's window-attention ViT; its merger (two linears over merge x merge patches) is the projector."""
    v, need = vision_config(cfg, mt, ("qwen2_5_vl", None), source)
    h, out_h, merge = need("hidden_size"), need("out_hidden_size"), need("spatial_merge_size", 2)
    m = h * merge * merge
    return {"kind": "qwen2_5_vl", "num_layers": need("depth"), "hidden_size": h,
            "intermediate_size": need("intermediate_size"), "num_heads": need("num_heads"),
            "patch_size": need("patch_size", 14), "image_size": 14 * 256, "projector_params": h + m * m + m + m * out_h + out_h,
            "tokens_per_image": 16384,  # the processor's default max_pixels (12,845,056) in merged tokens
            **QWEN_PIXELS, "merge_size": merge, "window_size": need("window_size", 112),
            "full_attention_layers": len(v.get("fullatt_block_indexes") or [])}


def _qwen_vit(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    """Qwen2-VL's and Qwen3-VL/Qwen3.5's ViT (LayerNorms, a GELU MLP) and patch merger (4 patches -> one token).
    An image at the processor's largest size (max_pixels 12,845,056 at 14-pixel patches, 16,777,216 at 16) is
    16,384 merged tokens."""
    # "qwen3_5_vision": transformers 5 names Qwen3.5's tower so where the checkpoint's file says "qwen3_5" (the
    # same Qwen3.6-27B config printed both ways, tests/data/startup_v4/hf/SOURCES.md)
    expected = ("qwen2_vl", None) if mt == "qwen2_vl" else ("qwen3_5", "qwen3_5_vision", "qwen3_vl", None)
    v, need = vision_config(cfg, mt, expected, source)
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


def _vision(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    return (_qwen25vl if mt == "qwen2_5_vl" else _qwen_vit)(cfg, mt, text_hidden, source)


register(Family("qwen2_vl", ("qwen2_5_vl", "qwen2_vl"), "vllm/model_executor/models/qwen2_vl.py, qwen2_5_vl.py",
                text=_qwen2, vision=_vision),
         Family("qwen3_5", ("qwen3_5",), "vllm/model_executor/models/qwen3_5.py", text=_qwen3_5, vision=_qwen_vit,
                partial_rotary=0.25))  # the quarter-width rotary of families/hybrid.py's qwen3_5_text
