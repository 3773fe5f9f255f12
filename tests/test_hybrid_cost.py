"""The step cost of hybrid models' state layers (capacity/cost/state_space.py, docs/hybrid.md): hand-computed state
bytes, decode and prefill terms, attention on the attention layers only, a hybrid simulation end to end, and a
pure-attention model left as it was (tests/test_golden.py pins its outputs)."""
from __future__ import annotations

import json

import pytest

from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.files import validate
from capacity.model.card import ModelCard, load_model_card
from capacity.model.gpus import get_gpu
from tests.conftest import ROOT, run_cli

HF3 = ROOT / "tests" / "data" / "startup_v3" / "hf"
NEMOTRON = HF3 / "nemotron-3-nano-30b-a3b-bf16.json"
QWEN3_NEXT = HF3 / "qwen3-next-80b-a3b-thinking.json"

# A small Mamba-2 hybrid: 4 decoder layers, 2 of them Mamba-2 (8 heads x 16, N = 32, 2 groups, conv 4, chunk 128),
# the other 2 GQA attention (4 query heads, 2 KV heads of 64), a dense MLP everywhere, bf16.
SMALL = {"name": "small-hybrid", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_kv_heads": 2,
         "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 8192,
         "state": {"kind": "mamba2", "num_layers": 2, "conv_kernel": 4, "inner": 128, "groups": 2, "state_size": 32,
                   "heads": 8, "head_dim": 16, "chunk_size": 128}}


def small() -> ModelCard:
    return validate(ModelCard, SMALL, "test card")


def test_nemotron_3_nano_decode_state_bytes_by_hand():
    # 64 Mamba-2 heads x 64 x N 128 in fp32 (mamba_ssm_cache_dtype float32) and a conv state of 3 columns of
    # 4096 + 2 x 8 groups x 128 = 6144 channels in bf16, per layer per sequence at TP 1
    r = RooflineCost(load_model_card(NEMOTRON), get_gpu("h200"), 1)
    s = r._state
    assert s is not None and s.layers == 23 and r._La == 6
    assert s.ssm_state_bytes == 64 * 64 * 128 * 4 == 2_097_152
    assert s.conv_state_bytes == 3 * 6144 * 2 == 36_864
    # read and written once per token, plus the token's conv in/out, x/B/C and dt: (3 x 6144 + 4096 + 64) x 2
    assert s.decode_state_bytes() == 2 * (2_097_152 + 36_864) + (3 * 6144 + 4096 + 64) * 2 == 4_313_216


def test_qwen3_next_decode_state_bytes_by_hand():
    # gated DeltaNet at TP 4: 32 / 4 value heads x k 128 x v 128 in bf16 (no mamba_ssm_dtype in the config); conv
    # over q, k (16 key heads x 128 each) and v (32 x 128): 3 x 8192 / 4 channels, bf16
    s = RooflineCost(load_model_card(QWEN3_NEXT), get_gpu("h200"), 4)._state
    assert s is not None and s.layers == 36
    assert s.ssm_state_bytes == 8 * 128 * 128 * 2 == 262_144
    assert s.conv_state_bytes == 3 * 2048 * 2 == 12_288


def test_small_hybrid_decode_step_by_hand():
    """1024 sequences at context 999: every term of the decode step by hand. The state update and the KV read are
    memory-bound (checked), attention is paid on the 2 attention layers only."""
    gpu = get_gpu("h100-sxm")
    p = RooflineParams()
    r = RooflineCost(small(), gpu, 1)
    bw = gpu.mem_bw_bytes_per_s * p.mem_bw_eff
    b = 1024
    plan = StepPlan(decode_contexts=(999,) * b)
    terms = r.breakdown(plan)
    # state, per layer per sequence: ssm 8 x 16 x 32 x 2 B = 8192, conv 3 x (128 + 2 x 2 x 32) x 2 B = 1536, each read
    # and written; activations (3 x 256 + 128 + 8) x 2 B = 1808: 21,264 B. FLOPs 5 x 4096 + 2 x 4 x 256 = 22,528.
    per_seq = 2 * (8192 + 1536) + 1808
    assert per_seq == 21_264
    assert b * 22_528 / (gpu.peak_flops("bf16") * p.attn_flops_eff) < b * per_seq / bw  # memory-bound
    # 2 layers x (one batched conv-update + state-update op + its second launch)
    assert terms["state"] == pytest.approx(2 * (b * per_seq / bw + 2 * p.kernel_launch_s), rel=1e-12)
    # attention: 2 layers x (keys x 2 x 2 KV heads x 64 x 2 B / bandwidth + one launch)
    keys = b * 1000
    assert 2 * 4 * 128 / (gpu.peak_flops("bf16") * p.attn_flops_eff) < 512 / bw  # memory-bound per key
    assert terms["attention"] == pytest.approx(2 * (keys * 512 / bw + p.kernel_launch_s), rel=1e-12)
    assert r.step_s(plan) == pytest.approx(sum(terms.values()), rel=1e-12)
    assert r.decode_step_s(b, keys) == pytest.approx(r.step_s(plan), rel=1e-12)
    f0, g = r.decode_line([999] * b)  # the fast path: the state term is the same every step, attention grows
    assert f0 == pytest.approx(r.step_s(plan), rel=1e-12)
    assert g == pytest.approx(2 * b * 512 / bw, rel=1e-12)


def test_one_mamba2_layer_prefill_flops_by_hand():
    """300 new tokens through one Mamba-2 layer of the small card (chunks of 128: 128, 128, 44)."""
    s = RooflineCost(small(), get_gpu("h100-sxm"), 1)._state
    assert s is not None
    # conv1d: 2 x 4 taps x 256 channels x 300 tokens
    conv = 614_400
    # per chunk of l: C B^T 2 x 2 groups x l^2 x 32 + chunk states and C x states 4 x 8 x 16 x 32 x l
    # + the causal intra-chunk product 2 x 8 x 16 x l(l+1)/2
    full = 2_097_152 + 2_097_152 + 2_113_536  # l = 128
    last = 247_808 + 720_896 + 253_440  # l = 44
    assert s.scan_flops(300) == conv + 2 * full + last == 14_452_224
    # in_proj (2 x 128 + 2 x 2 x 32 + 8 = 392 outputs) and out_proj (128 -> 256): 2 FLOPs per weight per token
    assert s.gemm_flops(300) == 2 * 300 * (392 * 256 + 256 * 128) == 79_872_000


def test_a_long_prefill_costs_more_in_state_layers_than_a_short_one():
    r = RooflineCost(small(), get_gpu("h100-sxm"), 1)
    short = r.breakdown(StepPlan(prefills=(PrefillChunk(512),)))
    long = r.breakdown(StepPlan(prefills=(PrefillChunk(8192),)))
    assert long["state"] > short["state"] > 0 and long["gemm"] > short["gemm"]


def test_pure_attention_model_has_no_state_term():
    card = load_model_card(ROOT / "tests" / "data" / "hf" / "qwen3-8b.json")
    r = RooflineCost(card, get_gpu("h100-sxm"), 1)
    assert r._state is None and r._La == card.num_layers
    terms = r.breakdown(StepPlan(prefills=(PrefillChunk(256),), decode_contexts=(100, 200)))
    assert "state" not in terms


def test_hybrid_simulation_completes_with_the_assumption_noted():
    out = run_cli("simulate", "-m", str(NEMOTRON), "-g", "h200", "-n", "40", "--rate", "4", "--input-len", "512",
                  "--output-len", "64", "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["requests"] == 40 and d["rejected"] == 0
    assert any("hybrid: 23 mamba2 state layers" in n and "attention on 6 layers only" in n for n in d["notes"])
    cost = RooflineCost(load_model_card(NEMOTRON), get_gpu("h200"), 1)
    assert cost.breakdown(StepPlan(decode_contexts=(600,) * 8))["state"] > 0
