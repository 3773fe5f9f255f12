"""Image -> tokens: what one image of W x H pixels becomes in a vision-language model, as its Hugging Face processor
and vLLM's multimodal processor count it (docs/vision.md names the file and function of each rule).

`ImageTokens` has three numbers: `tokens`, the placeholder tokens the image adds to the prompt (what the language
model prefills and caches); `encoder_seqs`, the sequence lengths the vision encoder runs over (one per tile or
image, class tokens included: attention is per sequence); `cross`, whether the encoder's output goes to
cross-attention instead of the prompt (Llama-3.2-Vision: the prompt holds one `<|image|>` token).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from capacity.errors import ConfigError
from capacity.model.schema import VisionTower

# LLaVA-NeXT (llava-hf/llava-v1.6-*): image_grid_pinpoints of its config.json, (height, width)
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))
# GLM-4.1V / GLM-4.5V: `size` of the repositories' preprocessor_config.json (Glm4vImageProcessor; the class default
# 28 x 28 x 15000 applies only where a repository ships none), pixels compared with 2 frames x h x w
GLM4V_MIN_PIXELS, GLM4V_MAX_PIXELS = 112 * 112, 28 * 28 * 2 * 6144
GEMMA3_MARKERS = 4  # Gemma-3: "\n\n", <start_of_image>, <end_of_image>, "\n\n" around an image's soft tokens
MAX_SIDE = 1 << 16  # pixels: larger sides are refused (no processor takes a 65,536-pixel side)


class ImageTokens(NamedTuple):
    tokens: int  # placeholder tokens in the prompt
    encoder_seqs: tuple[int, ...]  # the vision encoder's sequence lengths (one per tile / image)
    cross: bool = False  # the encoder output feeds cross-attention (the prompt holds `tokens` = 1)

    @property
    def encoder_tokens(self) -> int:
        return sum(self.encoder_seqs)


def qwen_resize(w: int, h: int, factor: int = 28, min_pixels: int = 3136, max_pixels: int = 12845056,
                frames: int = 1) -> tuple[int, int]:
    """transformers' Qwen2-VL `smart_resize` (image_processing_qwen2_vl.py): both sides rounded to multiples of
    `factor` (patch x merge), then scaled down (floor) above max_pixels or up (ceil) below min_pixels, aspect kept.
    `frames` 2: GLM-4.1V/4.5V's variant (image_processing_glm4v.py), which compares frames x h x w with the
    bounds (an image counts as temporal_patch_size = 2 frames). Returns (width, height)."""
    if max(w, h) / min(w, h) > 200:
        raise ConfigError(f"image size {w}x{h}: the processor refuses an aspect ratio over 200")
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if frames * hb * wb > max_pixels:
        beta = math.sqrt(frames * h * w / max_pixels)
        hb, wb = max(factor, math.floor(h / beta / factor) * factor), max(factor, math.floor(w / beta / factor) * factor)
    elif frames * hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (frames * h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return wb, hb


def qwen_vl(w: int, h: int, patch: int = 14, merge: int = 2, min_pixels: int = 3136,
            max_pixels: int = 12845056, frames: int = 1) -> ImageTokens:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL (and GLM-4.5V with frames=2): the resized image's patch grid, merge x merge
    patches per token (vLLM `Qwen2VLProcessingInfo._get_vision_info`: grid_h x grid_w // merge**2)."""
    wr, hr = qwen_resize(w, h, patch * merge, min_pixels, max_pixels, frames)
    gh, gw = hr // patch, wr // patch
    return ImageTokens(gh * gw // (merge * merge), (gh * gw,))


def glm4v(w: int, h: int, patch: int = 14, merge: int = 2, min_pixels: int = GLM4V_MIN_PIXELS,
          max_pixels: int = GLM4V_MAX_PIXELS) -> ImageTokens:
    """GLM-4.1V / GLM-4.5V: Qwen2-VL-like, 14-pixel patches, 2 x 2 merge; the bounds the repositories'
    preprocessor_config.json ship (`size` shortest_edge 12,544, longest_edge 9,633,792 = 28 x 28 x 2 x 6144 pixels)
    compared with 2 frames x h x w. transformers' Glm4vImageProcessor `smart_resize` (image_processing_glm4v.py)
    refuses a side under patch x merge = 28 pixels, so an image makes at most 6144 tokens (h x w <= 28 x 28 x 6144)."""
    factor = patch * merge
    if w < factor or h < factor:
        raise ConfigError(f"image size {w}x{h}: GLM-4.1V/4.5V's processor (Glm4vImageProcessor smart_resize) refuses "
                          f"a side under {factor} pixels")
    return qwen_vl(w, h, patch, merge, min_pixels, max_pixels, frames=2)


def llama4_canvases(max_tiles: int = 16) -> list[tuple[int, int]]:
    """transformers `find_supported_resolutions` (image_processing_llama4_fast.py), in tiles: every (rows, cols) with
    rows x cols <= max_tiles, grouped by aspect ratio in the order the function builds its dict (tile counts from
    max_tiles down, factors ascending); the order decides ties in `llama4_canvas`."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for n in range(max_tiles, 0, -1):
        for f in sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}):
            by_ratio.setdefault(f / (n // f), []).append((f, n // f))
    return [c for group in by_ratio.values() for c in group]


def llama4_canvas(w: int, h: int, tile: int = 336, max_tiles: int = 16) -> tuple[int, int]:
    """transformers `get_best_fit` (image_processing_llama4_fast.py; resize_to_max_canvas False, the processor's
    default): each canvas's scale is min(canvas height / h, canvas width / w), in float32 as torch divides an int64
    tensor; the smallest scale >= 1 (upscaling), else the largest below 1 (the least downscaling); among the canvases
    with that scale, the smallest area (the first, as torch.argmin). Returns (rows, cols) of tiles."""
    canv = llama4_canvases(max_tiles)
    rows = np.array([r * tile for r, _ in canv], dtype=np.float32)
    cols = np.array([c * tile for _, c in canv], dtype=np.float32)
    scales = np.minimum(rows / np.float32(h), cols / np.float32(w))
    up = scales[scales >= 1]
    chosen = up.min() if up.size else scales[scales < 1].max()
    idx = np.flatnonzero(scales == chosen)
    best = idx[int(np.argmin(rows[idx] * cols[idx]))]
    return canv[int(best)]


def llama4(w: int, h: int, tile: int = 336, per_tile: int = 144, max_tiles: int = 16,
           tile_seq: int = 577) -> ImageTokens:
    """Llama-4 Scout / Maverick: the image is resized onto the best canvas of tiles (`llama4_canvas`); a canvas of more
    than one tile adds a global tile (the whole image resized to one tile: Llama4ImageProcessorFast._preprocess,
    vLLM mllama4.py `Mllama4MultiModalProcessor._call_hf_processor` patches_per_image). The prompt string is
    Llama4Processor `_prompt_split_image` (vLLM `_get_prompt_updates` calls it): <|image_start|>, then for a tiled
    image per row each tile's `per_tile` <|patch|> tokens (336 / 14 = 24, 576 patches x 0.5 x 0.5 pixel shuffle =
    144) with a <|tile_x_separator|> between tiles and a <|tile_y_separator|> after the row (rows x cols x (per_tile +
    1)), then <|image|>, the global tile's `per_tile` and <|image_end|>: per_tile + 3 + n x (per_tile + 1) for n > 1
    tiles. The encoder runs each tile at 577 (576 patches + CLS)."""
    r, c = llama4_canvas(w, h, tile, max_tiles)
    n = r * c
    tokens = per_tile + 3 + (n * (per_tile + 1) if n > 1 else 0)
    return ImageTokens(tokens, (tile_seq,) * (n + 1 if n > 1 else 1))


def pixtral(w: int, h: int, patch: int = 16, merge: int = 1, longest_edge: int = 1024) -> ImageTokens:
    """Pixtral-12B (merge 1, 16-pixel patches, longest edge 1024) and Mistral-3 (merge 2): scaled down to the
    longest edge, then ceil(side / (patch x merge)) columns and rows; each row ends with an [IMG_BREAK] token (the
    last with [IMG_END]), so tokens = (cols + 1) x rows (vLLM mistral3.py `Mistral3HFEncoderInfo.
    get_patch_grid_size` and `_get_prompt_updates`; pixtral.py for merge 1). The encoder runs over the unmerged
    patches."""
    ratio = max(w / longest_edge, h / longest_edge)
    if ratio > 1:
        w, h = math.floor(w / ratio), math.floor(h / ratio)
    step = patch * merge
    cols, rows = (w - 1) // step + 1, (h - 1) // step + 1
    return ImageTokens((cols + 1) * rows, (cols * rows * merge * merge,))


def select_best_resolution(w: int, h: int, pinpoints=LLAVA_NEXT_PINPOINTS) -> tuple[int, int]:
    """transformers `select_best_resolution` (image_processing_utils.py): the pinpoint (height, width) keeping the
    most of the image's resolution, then wasting the least. Returns (height, width)."""
    best, best_eff, best_waste = pinpoints[0], -1, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / w, ph / h)
        dw, dh = int(w * scale), int(h * scale)
        eff = min(dw * dh, w * h)
        waste = pw * ph - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (ph, pw), eff, waste
    return best


def llava_next(w: int, h: int, tile: int = 336, patch: int = 14, pinpoints=LLAVA_NEXT_PINPOINTS) -> ImageTokens:
    """LLaVA-NeXT anyres: the base image (24 x 24 = 576 features, CLS dropped) plus the best pinpoint's tiles,
    unpadded back to the image's aspect ratio, one newline token per row (vLLM llava_next.py
    `LlavaNextProcessingInfo.get_num_image_tokens` / `_get_num_unpadded_features`). The encoder runs every tile
    and the base image at 577 tokens."""
    n = tile // patch
    ph, pw = select_best_resolution(w, h, pinpoints)
    nh, nw = ph // tile, pw // tile
    ch, cw = n * nh, n * nw
    if w / h > cw / ch:
        new_h = int(round(h * (cw / w), 7))
        ch -= 2 * ((ch - new_h) // 2)
    else:
        new_w = int(round(w * (ch / h), 7))
        cw -= 2 * ((cw - new_w) // 2)
    return ImageTokens(ch * cw + ch + n * n, (n * n + 1,) * (1 + nh * nw))


def mllama_tiles(w: int, h: int, tile: int = 560, max_tiles: int = 4) -> int:
    """Llama-3.2-Vision's tile count: transformers mllama `get_optimal_tiled_canvas` (image_processing_mllama.py),
    the (a, b) arrangement with a x b <= max_tiles that needs the least upscaling, else the least downscaling
    (the arrangement's first number is compared with the height, as the function does)."""
    grids = sorted(((a, b) for a in range(1, max_tiles + 1) for b in range(1, max_tiles + 1) if a * b <= max_tiles),
                   key=lambda g: g[0] * g[1])
    scales = [min(a * tile / h, b * tile / w) for a, b in grids]
    if all(s < 1 for s in scales):
        i = max(range(len(grids)), key=lambda k: (scales[k], -k))
    else:
        i = min(range(len(grids)), key=lambda k: (scales[k] if scales[k] >= 1 else 1e10, k))
    return grids[i][0] * grids[i][1]


def image_tokens(v: VisionTower, w: int, h: int) -> ImageTokens:
    """The tokens a `w` x `h` image becomes for a card's vision tower (module docstring)."""
    if not (0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE):
        raise ConfigError(f"image size {w}x{h}: each side must be 1 to {MAX_SIDE:,} pixels")
    if v.kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        return qwen_vl(w, h, v.patch_size, v.merge_size, v.min_pixels or 3136, v.max_pixels or 12845056)
    if v.kind == "glm4v":  # bounds compared with 2 frames x h x w (image_processing_glm4v.py smart_resize)
        return glm4v(w, h, v.patch_size, v.merge_size, v.min_pixels, v.max_pixels)
    if v.kind == "pixtral":
        return pixtral(w, h, v.patch_size, v.merge_size, v.longest_edge or v.image_size)
    if v.grid_pinpoints:  # LLaVA-NeXT
        return llava_next(w, h, v.image_size, v.patch_size, tuple(v.grid_pinpoints))
    if v.kind == "mllama":
        per_tile = v.patches_per_tile + 1
        return ImageTokens(1, (per_tile,) * mllama_tiles(w, h, v.image_size, v.max_num_tiles), cross=True)
    if v.kind == "clip" and v.max_num_tiles > 1:  # Llama-4 (families/llama4.py: max_patches + the global tile)
        return llama4(w, h, v.image_size, v.tokens_per_image // v.max_num_tiles, v.max_num_tiles - 1,
                      v.patches_per_tile + 1)
    # CLIP (LLaVA-1.5: 336 / 14 = 24, 576 tokens, the encoder with its CLS token) and SigLIP (Gemma-3: 896 / 14 = 64,
    # 4096 patches pooled to mm_tokens_per_image 256, pan-and-scan off): any image is resized to image_size square
    if v.kind == "siglip" and v.tokens_per_image < v.patches_per_tile:  # Gemma-3 (pooled; LLaVA's SigLIP is not)
        # Gemma3Processor.full_image_sequence replaces the template's <start_of_image>: "\n\n", <start_of_image>,
        # 256 <image_soft_token>, <end_of_image>, "\n\n" ("\n\n" is one token): 256 + 4 (vLLM gemma3_mm.py
        # `Gemma3ProcessingInfo.get_image_repl`, PromptUpdateDetails.select_token_id marks the 256 as embeddings)
        return ImageTokens(v.tokens_per_image + GEMMA3_MARKERS, (v.patches_per_tile,))
    return ImageTokens(v.tokens_per_image, (v.patches_per_tile + (1 if v.kind == "clip" else 0),))
