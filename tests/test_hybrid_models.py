"""Hybrid models (state-space / linear-attention layers beside attention) and the model families added with them:
shapes read from real config.json copies (tests/data/startup_v3/hf), checked against the published parameter counts
and hand-computed state sizes."""
from __future__ import annotations

import pytest

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.engine.vllm.layout import hybrid_block_size, mamba_page_bytes
from capacity.engine.vllm.release import release
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.model.weights import count_params
from tests.conftest import ROOT

V3 = ROOT / "tests" / "data" / "startup_v3" / "hf"


@pytest.mark.parametrize("name, published_b, tol", [
    ("nemotron-3-nano-30b-a3b-bf16", 31.6, 0.01),  # NVIDIA's model card: 31.6B total, 3.2B active
    ("nemotron-h-56b-base-8k", 56.0, 0.02),
    ("qwen3-next-80b-a3b-thinking", 80.0, 0.01),
    ("qwen2-vl-7b-instruct", 8.29, 0.01),  # 8.29B on its model page (vision tower 675M)
    ("glm-4.7-fp8-trimmed", 355.0, 0.01),  # 355B with the MTP layer vLLM does not load by default
])
def test_parameter_counts_match_the_published_totals(name, published_b, tol):
    assert count_params(load_model_card(V3 / f"{name}.json")) / 1e9 == pytest.approx(published_b, rel=tol)


def test_layer_layouts_read_from_the_configs():
    nano = load_model_card(V3 / "nemotron-3-nano-30b-a3b-bf16.json")  # 'MEMEM*EMEMEM*...': 23 M, 23 E, 6 *
    assert (nano.state.kind, nano.state.num_layers, nano.num_kv_layers, nano.num_moe_layers, nano.num_dense_layers) \
        == ("mamba2", 23, 6, 23, 0)
    assert not nano.gated_mlp and nano.state.ssm_dtype == "fp32"
    nxt = load_model_card(V3 / "qwen3-next-80b-a3b-thinking.json")  # every 4th of 48 layers is full attention
    assert (nxt.state.kind, nxt.state.num_layers, nxt.num_kv_layers) == ("gated_deltanet", 36, 12)
    assert nxt.attention_output_gate and nxt.qk_norm


def test_state_sizes_by_hand():
    """Qwen3-Next at TP 4: gated DeltaNet conv (4 - 1) x (2 x 16 x 128 + 32 x 128) / 4 = 6,144 and recurrent
    32 / 4 x 128 x 128 = 131,072 elements, bf16: 274,432 B a layer; one attention token 2 x (2 // 4 -> 1) x 256
    x 2 B = 1,024 B; block size 16 x cdiv(274,432, 16,384) = 272."""
    nxt = load_model_card(V3 / "qwen3-next-80b-a3b-thinking.json")
    assert nxt.state.state_elements(4) == (6_144, 131_072)
    rel = release("0.13.0")
    assert mamba_page_bytes(nxt, rel, 4) == 274_432
    assert hybrid_block_size(nxt, rel, 4, "bf16", 16) == 272
    cfg = EngineConfig(engine="vllm@0.13.0", tensor_parallel_size=4, max_model_len=32768)
    b = get_engine(cfg.engine).budget(nxt, get_gpu("h100-sxm"), cfg)
    assert (b.kv_groups.full, b.kv_groups.state, b.kv_groups.group_size) == (1, 3, 12)
    assert b.blocks_for(32768) == 121 + 3  # cdiv(32768, 272) attention blocks + one per state group
    assert b.block_bytes == 272 * 1024 * 12


def test_sglang_state_pool():
    """SGLang 0.5.5: a Qwen3-Next request's state at TP 4 is 36 layers x (6,144 conv x 2 B + 131,072 SSM x 4 B)
    = 19,316,736 B; with the radix cache the KV pool gets 1/1.9 of what the state and KV pools share."""
    from capacity.engine.sglang.memory import sglang_budget

    nxt = load_model_card(V3 / "qwen3-next-80b-a3b-thinking.json")
    b = sglang_budget(nxt, get_gpu("h100-sxm"), 4, release="0.5.5", context_len=32768)
    assert any("18.4 MiB per request" in n for n in b.notes)
    assert 36 * (6_144 * 2 + 131_072 * 4) == 19_316_736
    assert b.kv_bytes_per_token == 12 * 2 * 1 * 256 * 2  # the 12 attention layers only
    with pytest.raises(ConfigError, match="hybrid models .* are modelled from the SGLang 0.5.3 rules"):
        sglang_budget(nxt, get_gpu("h100-sxm"), 4, release="0.4.9")


def test_hybrids_before_the_v1_allocator_are_one_line():
    nano = load_model_card(V3 / "nemotron-3-nano-30b-a3b-bf16.json")
    cfg = EngineConfig(engine="vllm@0.9.2", max_model_len=8192)
    with pytest.raises(ConfigError, match="modelled from vLLM 0.10.2"):
        get_engine(cfg.engine).budget(nano, get_gpu("h100-sxm"), cfg)
    cfg = EngineConfig(engine="trtllm", max_model_len=8192)
    with pytest.raises(ConfigError, match="state layers are not modelled"):
        get_engine(cfg.engine).budget(nano, get_gpu("h100-sxm"), cfg)


def test_granite_hybrid_layout_from_its_config_fields():
    """Granite-4.0-H (granitemoehybrid): layer_types of mamba / attention, the Mamba2 inner width mamba_expand x
    hidden, every layer a MoE of num_local_experts with a shared expert of shared_intermediate_size. A small
    config with the fields of transformers' GraniteMoeHybrid (no real checkpoint's copy was found): 6 Mamba2
    layers of conv (4 - 1) x (1,024 + 2 x 1 x 128) = 3,840 and SSM 8 x 128 x 128 = 131,072 elements, 2 attention
    layers."""
    from capacity.model.hf import from_hf_config

    cfg = {"model_type": "granitemoehybrid", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 49152, "tie_word_embeddings": True,
           "layer_types": ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"], "mamba_d_conv": 4,
           "mamba_d_head": 128, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 8,
           "num_local_experts": 8, "num_experts_per_tok": 2, "shared_intermediate_size": 512,
           "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
    c = from_hf_config(cfg, "granite-tiny")
    assert (c.state.kind, c.state.num_layers, c.num_kv_layers) == ("mamba2", 6, 2)
    assert c.state.state_elements(1) == (3_840, 131_072)
    assert (c.moe.num_experts, c.moe.moe_intermediate_size, c.moe.shared_intermediate) == (8, 1024, 512)
    with pytest.raises(ConfigError, match="layer_types must name mamba or attention"):
        from_hf_config({**cfg, "layer_types": ["mamba"] * 7 + ["x"]}, "bad")
    dense = from_hf_config({**cfg, "num_local_experts": 0}, "granite-dense")
    assert dense.moe is None and dense.intermediate_size == 512


def test_the_simulator_sets_a_state_page_aside_per_sequence_slot():
    """The scheduler sees attention blocks only: every slot it may run keeps a state page per state group, so the
    slots are capped where their states and one block each fit, and the blocks left are the attention groups'."""
    from capacity.engine.budget import SchedLimits

    nano = load_model_card(V3 / "nemotron-3-nano-30b-a3b-bf16.json")
    cfg = EngineConfig(engine="vllm@0.19.0", max_model_len=8192)
    b = get_engine(cfg.engine).budget(nano, get_gpu("h100-sxm"), cfg)
    lim = SchedLimits.of(b)
    g = b.kv_groups
    assert lim.max_num_seqs == min(b.max_num_seqs, b.planning_blocks // (g.state + g.full))
    assert lim.num_blocks == (b.planning_blocks - lim.max_num_seqs * g.state) // g.full
    assert lim.block_size == b.block_size > 16
