"""Image -> tokens per model as its processor computes them (issue 47 item 1; docs/vision.md "Image -> tokens"),
each count worked out by hand from the processor's code, not from the function under test:
- Llama-4: transformers Llama4ImageProcessorFast `find_supported_resolutions` / `get_best_fit` pick the tile canvas,
  Llama4Processor `_prompt_split_image` writes the prompt string (vLLM mllama4.py `_get_prompt_updates` calls it);
- GLM-4.1V / GLM-4.5V: Glm4vImageProcessor `smart_resize` with the shipped bounds (12,544 and 9,633,792 pixels,
  compared with 2 frames x h x w);
- Qwen3-VL: Qwen2-VL's smart_resize with 16-pixel patches (factor 32) and the bounds 65,536 / 16,777,216;
- Gemma-3: 256 soft tokens inside Gemma3Processor.full_image_sequence (4 marker tokens)."""
import json

import pytest

from capacity.errors import ConfigError
from capacity.model.card import load_model_card, load_named_card
from capacity.model.hf import from_hf_config
from capacity.model.vision_tokens import glm4v, image_tokens, llama4, llama4_canvas, llama4_canvases, qwen_vl
from tests.conftest import ROOT

SCOUT = load_model_card(ROOT / "tests/data/startup_v3/hf/llama-4-scout-17b-16e-instruct.json")
MAVERICK = load_model_card(ROOT / "tests/data/hf/llama-4-maverick-17b-128e-instruct.json")
QWEN3VL = from_hf_config(json.loads((ROOT / "tests/data/startup_v3/hf/qwen3-vl-8b-instruct.json").read_text()),
                         "qwen3-vl-8b")
GLM41V = load_model_card(ROOT / "tests/data/startup_v3/hf/glm-4.1v-9b-thinking.json")


# ---- Llama-4 ------------------------------------------------------------------------------------------------------
def test_llama4_canvases_are_every_tiling_up_to_16():
    canv = llama4_canvases(16)
    # (rows, cols) with rows x cols <= 16: sum over n = 1..16 of the divisors of n = 50, each once
    assert len(canv) == len(set(canv)) == 50
    # the first ratio group the dict meets: 16 tiles, factor 1 -> ratio 1/16: (1, 16), then (2, 8) has 2/8 = 1/4
    # (a new group holding (1, 4) later), then (4, 4) ratio 1 (with (3, 3), (2, 2), (1, 1) from 9, 4, 1 tiles)
    assert canv[:7] == [(1, 16), (2, 8), (1, 4), (4, 4), (3, 3), (2, 2), (1, 1)]


def test_llama4_336_square_is_one_tile():
    # every canvas has scale min(336 r / 336, 336 c / 336) = min(r, c) >= 1; the smallest, 1, is held by (1, c) and
    # (r, 1); the least area is (1, 1): no global tile. Prompt: <|image_start|> <|image|> 144 x <|patch|>
    # <|image_end|> = 147; the encoder runs one tile of 24 x 24 patches + CLS = 577
    assert llama4_canvas(336, 336) == (1, 1)
    assert llama4(336, 336) == (147, (577,), False)
    assert image_tokens(SCOUT.vision, 336, 336) == (147, (577,), False)


def test_llama4_1024x768_is_12_tiles():
    # h 768, w 1024: a canvas upscales only with rows >= 768 / 336 -> 3 and cols >= 1024 / 336 -> 4 (12 tiles);
    # (3, 4) scales by min(1008 / 768, 1344 / 1024) = 1.3125, so do (3, 5) and (4, 4); least area (3, 4).
    # Prompt: 3 + 144 (the global tile) + 12 x (144 + 1) (each tile's patches and one x/y separator) = 1887;
    # the encoder runs 12 tiles + the global one
    assert llama4_canvas(1024, 768) == (3, 4)
    assert llama4(1024, 768) == (1887, (577,) * 13, False)
    assert llama4_canvas(768, 1024) == (4, 3)  # portrait: rows and cols swap
    assert image_tokens(MAVERICK.vision, 1024, 768).tokens == 1887


def test_llama4_1920x1080_downscales_onto_15_tiles():
    # upscaling needs rows >= 4 and cols >= 6 (24 > 16 tiles): none; the least downscaling is (3, 5):
    # min(1008 / 1080, 1680 / 1920) = min(0.933, 0.875) = 0.875 beats (4, 4) 0.7, (3, 4) 0.7, (2, 8) 0.622.
    # 3 + 144 + 15 x 145 = 2322 tokens; 16 encoder tiles
    assert llama4_canvas(1920, 1080) == (3, 5)
    assert image_tokens(SCOUT.vision, 1920, 1080) == (2322, (577,) * 16, False)


def test_llama4_largest_image_and_the_card():
    # vLLM's profiling image (get_image_size_with_most_features): 336 wide, 16 x 336 = 5376 high -> (16, 1) at
    # scale 1: 3 + 144 + 16 x 145 = 2467 prompt tokens; 17 tiles whose output rows, 17 x 144 = 2448, are the card's
    # tokens_per_image (what vLLM's encoder budget counts: the <|patch|> embeddings)
    assert llama4(336, 5376) == (2467, (577,) * 17, False)
    v = SCOUT.vision
    assert v.tokens_per_image == 17 * 144 and v.max_num_tiles == 17
    # no image makes more than that image
    for w, h in ((4000, 100), (100, 4000), (5000, 5000), (1, 1), (65536, 65536)):
        assert image_tokens(v, w, h).tokens <= 2467


# ---- GLM-4.1V / GLM-4.5V ------------------------------------------------------------------------------------------
def test_glm4v_bounds_are_the_shipped_ones():
    v = GLM41V.vision
    assert (v.min_pixels, v.max_pixels) == (12_544, 9_633_792) == (112 * 112, 28 * 28 * 2 * 6144)


def test_glm4v_3000x2000_is_6144_tokens():
    # round(2000 / 28) = 71 -> 1988, round(3000 / 28) = 107 -> 2996; 2 x 1988 x 2996 = 11,912,096 > 9,633,792:
    # beta = sqrt(2 x 6e6 / 9,633,792) = sqrt(15625 / 12544) = 125 / 112; 2000 x 112 / 125 = 1792 = 64 x 28,
    # 3000 x 112 / 125 = 2688 = 96 x 28: 128 x 192 patches / 4 = 6144 tokens
    assert glm4v(3000, 2000) == (6144, (128 * 192,), False)
    assert image_tokens(GLM41V.vision, 3000, 2000).tokens == 6144


def test_glm4v_other_sizes():
    # 1920 x 1080: round(1080 / 28) = 39 -> 1092, round(1920 / 28) = 69 -> 1932; 2 x 1092 x 1932 = 4,219,488 is in
    # bounds: 78 x 138 / 4 = 2691 (as Qwen2-VL)
    assert glm4v(1920, 1080).tokens == 2691 == qwen_vl(1920, 1080).tokens
    # 8000 x 6000: beta = sqrt(2 x 48e6 / 9,633,792) = 3.15673; floor(6000 / beta / 28) = floor(67.88) = 67 -> 1876,
    # floor(8000 / beta / 28) = floor(90.51) = 90 -> 2520: 134 x 180 / 4 = 6030
    assert glm4v(8000, 6000).tokens == 6030
    # vLLM's profiling image, 1708 x 1708: 2 x 1708^2 = 5,834,528, in bounds: 122 x 122 / 4 = 3721
    assert glm4v(1708, 1708).tokens == 3721


def test_glm4v_no_image_exceeds_6144():
    # 2 x h x w <= 9,633,792 after the resize: h x w <= 4,816,896 = 28^2 x 6144, so at most 6144 merged tokens
    for w, h in ((2688, 1792), (65536, 65536), (65536, 400), (5000, 5000), (3000, 2001)):
        assert glm4v(w, h).tokens <= 6144
    assert glm4v(2688, 1792).tokens == 6144  # 96 x 64 multiples of 28, exactly the bound: kept


def test_glm4v_refuses_a_side_under_28_pixels():
    with pytest.raises(ConfigError, match="image size 20x500: .* under 28 pixels"):
        image_tokens(GLM41V.vision, 20, 500)


# ---- Qwen3-VL ------------------------------------------------------------------------------------------------------
def test_qwen3vl_16px_patches():
    v = QWEN3VL.vision
    assert (v.patch_size, v.merge_size, v.min_pixels, v.max_pixels) == (16, 2, 65_536, 16_777_216)
    # 1024 x 768: multiples of 32 already, 786,432 pixels in bounds: 64 x 48 patches = 3072, / 4 = 768
    assert image_tokens(v, 1024, 768) == (768, (3072,), False)
    # 1920 x 1080: round(1080 / 32) = round(33.75) = 34 -> 1088, 1920 = 60 x 32: 120 x 68 = 8160 patches, / 4 = 2040
    assert image_tokens(v, 1920, 1080) == (2040, (8160,), False)
    # 300 x 200: 288 x 192 = 55,296 < 65,536: beta = sqrt(65536 / 60000) = 1.04510; ceil(200 x beta / 32) =
    # ceil(6.53) = 7 -> 224, ceil(300 x beta / 32) = ceil(9.80) = 10 -> 320: 14 x 20 patches = 280, 70 tokens
    assert image_tokens(v, 300, 200) == (70, (280,), False)


# ---- Gemma-3 -------------------------------------------------------------------------------------------------------
def test_gemma3_soft_tokens_and_markers():
    v = load_named_card("gemma-3-27b").vision
    # "\n\n" <start_of_image> 256 x <image_soft_token> <end_of_image> "\n\n": 260 prompt tokens at any size
    # (pan-and-scan off); the encoder runs 896 / 14 = 64^2 = 4096 patches; the card keeps the 256 embeddings
    for w, h in ((1024, 768), (64, 64), (4000, 300)):
        assert image_tokens(v, w, h) == (260, (4096,), False)
    assert v.tokens_per_image == 256
