"""Config copies added for issues 46/47 (tests/data/startup_v4/hf, tests/data/startup_v3/hf; sources in each folder's
SOURCES.md): each one is read by capacity's loader, and its parameter count, derived by hand below from the config's
fields and vLLM's model code (qwen3_5.py `Qwen3_5ForConditionalGeneration`, qwen3.py, qwen2_5_vl.py), equals the
checkpoint's own total as the source that printed the config also prints it (a safetensors tensor sum, or a torchinfo
table of the model's modules), never a number read from the code under test."""
from __future__ import annotations

from pathlib import Path

from capacity.engine.budget import kv_bytes_per_token
from capacity.model.card import load_model_card
from capacity.model.weights import count_params

DATA = Path(__file__).parent / "data"
BF16 = 2


def test_qwen3_6_27b():
    """Qwen3.6-27B (`qwen3_5`, dense): 48 gated DeltaNet + 16 gated full-attention layers, a 27-block ViT, and one
    MTP layer that vLLM loads only as a speculative draft (so the served card leaves it out)."""
    card = load_model_card(DATA / "startup_v4" / "hf" / "qwen3.6-27b.json")
    h, L, vocab, nq, nkv, hd, inter = 5120, 64, 248320, 24, 4, 256, 17408
    full, linear = 16, 48  # layer_types: every 4th layer full_attention
    kh, kd, vh, vd, conv = 16, 128, 48, 128, 4  # linear_num_key_heads x key dim, value heads x dim, conv kernel
    attn = 2 * nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 2 * hd  # q + its output gate, k/v, o, q/k norms
    key, value = kh * kd, vh * vd
    deltanet = ((2 * key + 2 * value) * h + 2 * vh * h  # in_proj_qkv + in_proj_z, in_proj_b + in_proj_a
                + (2 * key + value) * conv + 2 * vh + vd + h * value)  # conv1d, dt_bias + A_log, gated norm, out_proj
    mlp = 3 * h * inter
    text = 2 * vocab * h + full * attn + linear * deltanet + L * (mlp + 2 * h) + h
    vh_, vi, p, out = 1152, 4304, 16, 5120  # the ViT: no deepstack mergers (deepstack_visual_indexes [])
    block = 4 * vh_ + (3 * vh_ * vh_ + 3 * vh_) + (vh_ * vh_ + vh_) + (2 * vh_ * vi + vi + vh_)
    merger = 2 * vh_ + (4 * vh_) ** 2 + 4 * vh_ + 4 * vh_ * out + out
    vision = 27 * block + 3 * 2 * p * p * vh_ + vh_ + 2304 * vh_ + merger  # blocks, patch conv (+bias), pos_embed
    mtp = 2 * h * h + attn + mlp + 2 * h + 3 * h  # mtp.fc, one full-attention layer + MLP, its norms, 3 MTP norms
    # The stored report's weight statistics ("参数总量", every tensor of the 15 safetensors files, MTP included):
    assert text + vision + mtp == 27_781_427_952
    assert count_params(card) == text + vision == 27_356_728_560
    # KV: only the 16 full-attention layers (2 KV heads of 256 per rank at tp=2)
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * full * BF16 == 65_536
    assert card.state is not None and card.state.num_layers == linear


def test_qwen3_14b():
    """Qwen3-14B (`qwen3`): the config transformers 5.7.0 prints for the checkpoint (its sources: SOURCES.md)."""
    card = load_model_card(DATA / "startup_v3" / "hf" / "qwen3-14b.json")
    h, L, vocab, nq, nkv, hd, inter = 5120, 40, 151936, 40, 8, 128, 17408
    layer = nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 2 * hd + 3 * h * inter + 2 * h  # q,k/v,o, qk norms, MLP
    total = 2 * vocab * h + L * layer + h  # untied embedding and LM head, final norm
    assert count_params(card) == total == 14_768_307_200  # the report's "参数总量" of the 8 safetensors files
    assert card.qk_norm and card.vision is None
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 163_840


def test_qwen2_5_vl_3b_instruct():
    """Qwen2.5-VL-3B-Instruct: per-module counts as the source's torchinfo table prints them for this config's
    shapes (a vision block 19,702,200; the patch conv 1,505,280; the merger MLP 36,707,328; a decoder layer
    77,076,992), checked here against the formula, then summed over the published depths."""
    card = load_model_card(DATA / "startup_v4" / "hf" / "qwen2.5-vl-3b-instruct.json")
    h, L, vocab, nq, nkv, hd, inter = 2048, 36, 151936, 16, 2, 128, 11008
    layer = (nq * hd * h + nq * hd) + 2 * (nkv * hd * h + nkv * hd) + h * nq * hd + 3 * h * inter + 2 * h
    assert layer == 77_076_992  # q/k/v with biases, o without, SwiGLU MLP, two RMSNorms
    vh, vi, merge = 1280, 3420, 2
    block = 2 * vh + (3 * vh * vh + 3 * vh) + (vh * vh + vh) + 2 * (vh * vi + vi) + (vi * vh + vh)
    assert block == 19_702_200  # two RMSNorms, qkv and proj with biases, gated MLP with biases
    m = vh * merge * merge
    mlp = m * m + m + m * h + h
    assert mlp == 36_707_328
    vision = 32 * block + 3 * 2 * 14 * 14 * vh + vh + mlp  # blocks, the patch Conv3d (no bias), ln_q, merger MLP
    text = vocab * h + L * layer + h  # tie_word_embeddings: one matrix
    assert count_params(card) == text + vision == 3_754_622_976  # the model card's "3.75B"
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * L * BF16 == 36_864


def test_qwen3_5_4b():
    """Qwen3.5-4B (`qwen3_5`, dense, tied embeddings): the config transformers 5.7.0 prints for the checkpoint, whose
    vision_config says `qwen3_5_vision` (transformers 5's name for the tower the raw file calls `qwen3_5`)."""
    card = load_model_card(DATA / "startup_v3" / "hf" / "qwen3.5-4b.json")
    h, L, vocab, nq, nkv, hd, inter = 2560, 32, 248320, 16, 4, 256, 9216
    full, linear = 8, 24
    kh, kd, vh, vd, conv = 16, 128, 32, 128, 4
    attn = 2 * nq * hd * h + 2 * nkv * hd * h + h * nq * hd + 2 * hd
    key, value = kh * kd, vh * vd
    deltanet = ((2 * key + 2 * value) * h + 2 * vh * h
                + (2 * key + value) * conv + 2 * vh + vd + h * value)
    mlp = 3 * h * inter
    text = vocab * h + full * attn + linear * deltanet + L * (mlp + 2 * h) + h  # tie_word_embeddings: one matrix
    vh_, vi, p, out = 1024, 4096, 16, 2560
    block = 4 * vh_ + (3 * vh_ * vh_ + 3 * vh_) + (vh_ * vh_ + vh_) + (2 * vh_ * vi + vi + vh_)
    merger = 2 * vh_ + (4 * vh_) ** 2 + 4 * vh_ + 4 * vh_ * out + out
    vision = 24 * block + 3 * 2 * p * p * vh_ + vh_ + 2304 * vh_ + merger
    mtp = 2 * h * h + attn + mlp + 2 * h + 3 * h
    assert text + vision + mtp == 4_659_865_088  # the report's "参数总量" of the 2 safetensors files, MTP included
    assert count_params(card) == text + vision == 4_539_265_536
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nkv * hd * full * BF16 == 32_768


def test_kimi_linear_raw_config_matches_the_assembled_one():
    """moonshotai/Kimi-Linear-48B-A3B-Instruct's raw config.json (startup_v3/hf) gives the same card as the copy
    tests/data/families assembled from field lists, whose parameters tests/test_family_kimi.py derives by hand
    (49,122,681,728); the checkpoint's own tensor sum, as the report that prints the raw file gives it, is that number."""
    raw = load_model_card(DATA / "startup_v3" / "hf" / "kimi-linear-48b-a3b-instruct.json")
    assembled = load_model_card(DATA / "families" / "kimi-linear-48b-a3b-instruct.json")
    assert raw.model_dump() == assembled.model_dump()
    assert count_params(raw) == 49_122_681_728  # the report's "参数总量" of the 20 safetensors files
