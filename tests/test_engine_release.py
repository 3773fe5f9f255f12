"""Engine releases (`vllm@X.Y`): parsing, the rules each release brings (read from its code), the models the
loader now sizes, the hybrid KV layout of sliding-window models, and the command-line doors."""
from __future__ import annotations

import json

import pytest

from capacity.engine import get_engine
from capacity.engine import memory as mem
from capacity.engine.budget import SchedLimits
from capacity.engine.config import EngineConfig
from capacity.engine.vllm.layout import kv_groups
from capacity.engine.vllm.release import CURRENT, parse_engine, release
from capacity.errors import ConfigError
from capacity.model.card import load_model_card, resolve_model_path
from capacity.model.gpus import get_gpu, with_memory
from capacity.model.hf import from_hf_config
from capacity.model.weights import weight_bytes_per_rank
from capacity.sched.kv import HybridKVCacheManager
from capacity.sched.kv_factory import make_kv_manager
from capacity.units import GiB
from tests.conftest import ROOT, run_cli

HF = ROOT / "tests" / "data" / "hf"


# ---- parsing ------------------------------------------------------------------------------------------
def test_engine_strings():
    assert parse_engine("vllm@0.9.2:v0") == ("vllm", "0.9.2", "v0")
    assert release("0.6").version == (0, 6, 6)  # the last patch of the line
    assert release("0.11.0").version == (0, 11, 0)
    assert release(None).version == CURRENT
    assert release("0.8.5").runner == "v1" and release("0.7.3").runner == "v0"
    assert get_engine("vllm@0.11") is get_engine("vllm@0.11")


@pytest.mark.parametrize("spec, msg", [
    ("vllm@0.99", "not modelled"), ("vllm@0.3", "not modelled"), ("vllm@banana", "expected MAJOR.MINOR"),
    ("vllm@0.12:v0", "removed in 0.11"), ("vllm@0.6:v1", "starts with 0.7"), ("tgi@1.0", "unknown engine"),
    ("vllm@@0.1", "expected MAJOR.MINOR"), ("vllm 0.11", "expected NAME"),
])
def test_bad_engine_strings_are_one_line_errors(spec, msg):
    with pytest.raises((ConfigError, ValueError), match=msg):
        EngineConfig(engine=spec)


# ---- rules by release -----------------------------------------------------------------------------------
@pytest.mark.parametrize("engine, gpu, seqs, mnbt", [
    ("vllm@0.8.0", "h100-sxm", 1024, 8192),  # H100/H200 by device name
    ("vllm@0.8.0", "a100-80gb", 1024, 2048),  # 1024 sequences on every GPU until 0.8.4
    ("vllm@0.8.4", "a100-80gb", 256, 2048),
    ("vllm@0.8.5", "a100-80gb", 1024, 8192),  # >= 70 GiB, no A100 exception yet
    ("vllm@0.9", "a100-80gb", 256, 2048),  # the A100 exception by device name
    ("vllm@0.19", "h200", 1024, 8192),
    ("vllm@0.28", "b200", 1024, 16384),  # >= 160 GiB: 16384 for serve too
    ("vllm@0.28", "h200", 1024, 8192),  # an H200 (139.8 GiB) stays in the 70-160 tier
    ("vllm@0.7:v0", "h100-sxm", 256, 8192),  # V0: max(max_model_len, 2048) without chunked prefill
])
def test_default_limits_by_release(card, engine, gpu, seqs, mnbt):
    b = mem.budget(card("llama-3.1-8b"), get_gpu(gpu), EngineConfig(engine=engine, max_model_len=8192),
                   check_fit=False)
    assert (b.max_num_seqs, b.max_num_batched_tokens) == (seqs, mnbt)


def test_a100_rule_can_be_forced_and_follows_the_device_name(card):
    c = card("llama-3.1-8b")
    a100 = get_gpu("a100-80gb")
    forced = mem.budget(c, a100, EngineConfig(max_model_len=8192, large_gpu_defaults=True), check_fit=False)
    assert forced.max_num_seqs == 1024
    renamed = a100.model_copy(update={"device_name": "My Custom Board"})  # not an A100 by vLLM's name test
    assert mem.budget(c, renamed, EngineConfig(engine="vllm@0.19", max_model_len=8192), check_fit=False).max_num_seqs == 1024


def test_v0_switches_chunked_prefill_on_above_32k(card):
    c = card("llama-3.1-8b")
    long = mem.budget(c, get_gpu("h100-sxm"), EngineConfig(engine="vllm@0.6", max_model_len=65536), check_fit=False)
    assert long.max_num_batched_tokens == 2048  # chunked on, the 0.6.5+ budget
    short = mem.budget(c, get_gpu("h100-sxm"), EngineConfig(engine="vllm@0.6.4", max_model_len=65536), check_fit=False)
    assert short.max_num_batched_tokens == 512  # 0.5.5-0.6.4 chunked budget
    old = mem.budget(c, get_gpu("h100-sxm"), EngineConfig(engine="vllm@0.4", max_model_len=65536), check_fit=False)
    assert old.max_num_batched_tokens == 65536  # no automatic chunking before 0.5.5


@pytest.mark.parametrize("version, runner, rows, expect", [
    ("0.5.0", "v0", 256, 3 * 2 + 24), ("0.6.0", "v0", 256, 2 + 38), ("0.6.3", "v0", 256, 2 + 36),
    ("0.7.3", "v1", 1024, 2), ("0.8.5", "v1", 1024, 2 + 36), ("0.8.5", "v1", 64, 2 + 48),
    ("0.13", "v1", 1024, 2 + 36), ("0.17", "v1", 1024, 2 + 12), ("0.21", "v1", 1024, 2 + 12),
])
def test_sampler_bytes_per_logit_by_release(version, runner, rows, expect):
    """Bytes per logit at the sampler peak (bf16 logits), from each release's sampler code."""
    assert release(version, runner).sampler_bytes_per_logit(2, rows, dense=False)[0] == expect


def test_fused_moe_workspace_persists_from_0_14(card):
    c, g = card("mixtral-8x7b"), get_gpu("h100-sxm")
    cfg = dict(tensor_parallel_size=2, max_model_len=8192, max_num_batched_tokens=8192)
    v13 = mem.budget(c, g, EngineConfig(engine="vllm@0.13", **cfg), check_fit=False)
    v19 = mem.budget(c, g, EngineConfig(engine="vllm@0.19", **cfg), check_fit=False)
    # (M, k, max(N/2, K)) + (M, k, max(N, K)) bf16, M = 8192, k = 2, N = 2 x 14336 / 2, K = 4096
    ws = 8192 * 2 * 2 * (max(7168, 4096) + max(14336, 4096))
    assert v19.activation_phases["sampler"] - (v13.activation_phases["sampler"] - 1024 * 32000 * 24) == pytest.approx(
        ws + 132 * 32000 * 4 + 1024 * 4096 * 2 * 0, rel=1e-9)


# ---- models the loader now sizes ------------------------------------------------------------------------
@pytest.mark.parametrize("name, params_b", [("gpt-oss-20b", 20.91), ("gemma-2-9b", 9.24), ("gemma-3-27b-it", 27.43),
                                            ("llama-3.2-11b-vision-instruct", 10.67), ("phi-4", 14.66)])
def test_new_architectures_load(name, params_b):
    from capacity.model.weights import count_params

    c = load_model_card(HF / f"{name}.json")
    assert count_params(c) / 1e9 == pytest.approx(params_b, abs=0.01)


def test_gpt_oss_layout():
    c = load_model_card(HF / "gpt-oss-20b.json")
    assert c.weight_formats == {"experts": "mxfp4"} and c.weight_format == "bf16"
    assert (c.num_sliding_layers, c.sliding_window) == (12, 128) and c.attention_sinks
    w = weight_bytes_per_rank(c, 1)
    # MXFP4: half a byte per element plus one e8m0 scale per 32 inputs
    assert w["experts_down"] == 24 * 32 * 2880 * (2880 * 0.5 + 2880 // 32)
    assert w["q_proj"] == 24 * 64 * 64 * 2880 * 2  # attention stays bf16


def test_compressed_tensors_and_modelopt():
    c = load_model_card(HF / "llama-3.3-70b-fp8-dynamic.json")
    assert c.weight_format == "fp8" and c.quant_group_size is None
    w4 = load_model_card(HF / "llama-3.1-8b-w4a16.json")
    assert (w4.weight_format, w4.quant_group_size) == ("int4", 128)
    nv = from_hf_config({**json.loads((HF / "llama-3.1-8b.json").read_text()),
                         "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "x")
    assert nv.weight_format == "nvfp4"


@pytest.mark.parametrize("patch, msg", [
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "needs load_in_4bit or load_in_8bit true"),
    ({"quantization_config": {"quant_method": "gguf"}}, "quant_method 'gguf' is not supported"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 3}}, "bits 3"),
    ({"model_type": "falcon_h9", "mamba_d_state": 128}, "has field 'mamba_d_state' \\(state-space"),
    ({"model_type": "foo_moe", "num_experts": 64}, "has field 'num_experts' \\(mixture-of-experts"),
    ({"model_type": "foo", "intermediate_size": None}, "lacks the standard decoder field 'intermediate_size'"),
])
def test_unsupported_configs_name_the_field(patch, msg):
    cfg = {**json.loads((HF / "llama-3.1-8b.json").read_text()), **patch}
    with pytest.raises(ConfigError, match=msg) as exc:
        from_hf_config(cfg, "x")
    assert "\n" not in str(exc.value)


def test_an_unknown_model_type_with_the_standard_fields_is_read_as_a_decoder_with_a_note():
    """Issue 46: a model type without a family here but with the standard decoder fields works, and says what it
    assumed and which fields it read; its shapes are the Llama-style decoder's (the same weights and KV as the
    Llama config it copies)."""
    base = json.loads((HF / "llama-3.1-8b.json").read_text())
    c = from_hf_config({**base, "model_type": "seed_oss_like"}, "x")
    ref = from_hf_config(base, "ref")
    assert c.notes and "'seed_oss_like' has no family here" in c.notes[0] and "num_key_value_heads" in c.notes[0]
    assert sum(weight_bytes_per_rank(c, 1).values()) == sum(weight_bytes_per_rank(ref, 1).values())
    assert c.kv_elements_per_token_per_layer(1) == ref.kv_elements_per_token_per_layer(1) == 2 * 8 * 128
    assert from_hf_config({**base, "model_type": "x", "attention_bias": True}, "x").attention_bias


def test_a_vision_tower_that_cannot_be_sized_is_refused():
    cfg = json.loads((HF / "gemma-3-27b-it.json").read_text())
    cfg["vision_config"] = {**cfg["vision_config"], "model_type": "eva_clip"}
    with pytest.raises(ConfigError, match="vision_config.model_type 'eva_clip' cannot be sized"):
        from_hf_config(cfg, "x")
    cfg = json.loads((HF / "gemma-3-27b-it.json").read_text())
    cfg["vision_config"] = {**cfg["vision_config"], "hidden_size": -3}
    with pytest.raises(ConfigError, match="vision_config.hidden_size -3"):
        from_hf_config(cfg, "x")


# ---- sliding-window layers: vLLM's hybrid allocator -------------------------------------------------------
def test_hybrid_groups():
    gemma3 = load_model_card(HF / "gemma-3-27b-it.json")
    g = kv_groups(gemma3, release("0.19"), 16)
    assert (g.full, g.sliding, g.group_size, g.window_blocks) == (1, 6, 10, 65)  # cdiv(1023, 16) + 1
    oss = kv_groups(load_model_card(HF / "gpt-oss-20b.json"), release("0.19"), 16)
    assert (oss.full, oss.sliding, oss.group_size) == (1, 1, 12)
    assert kv_groups(gemma3, release("0.9.0"), 16).groups == 1  # before the hybrid allocator: all full
    # a long sequence holds every full-group block but only the window's blocks in each sliding group
    assert g.blocks_for(8192, 16) == 512 + 6 * 65 and g.blocks_for(100, 16) == 7 * 7


def test_sliding_groups_reserve_the_batches_in_flight():
    """vLLM 0.32 reserves max_num_batched_tokens x max_concurrent_batches in flight (2 with async scheduling,
    its GPU default) at admission and at start-up; 0.19's code reserves one batch. gpt-oss-20b (window 128)
    at max_model_len 32k and a 2,048-token budget: a sliding group reserves cdiv(127 + 4096, 16) + 1 = 265
    blocks on the current release, cdiv(127 + 2048, 16) + 1 = 137 on 0.19."""
    card = load_model_card(HF / "gpt-oss-20b.json")
    for eng, inflight, cap in (("vllm", 4096, 265), ("vllm@0.19", 2048, 137)):
        cfg = EngineConfig(engine=eng, max_model_len=32768, max_num_batched_tokens=2048)
        b = mem.budget(card, get_gpu("h100-sxm"), cfg)
        g = b.kv_groups
        assert g.inflight == inflight and g.window == 128
        assert g.startup_blocks(32768, 16) == 2048 + cap
        assert g.admission_blocks(1000, 16) == 63 + 63 and g.admission_blocks(8000, 16) == 500 + cap
        assert b.max_concurrency == pytest.approx(b.num_blocks / (2048 + cap))
        kv = get_engine(eng).scheduler_factory(cfg, SchedLimits.of(b))().kv  # the simulator admits the same way
        assert kv.admission_blocks(8000) == 500 + cap


def test_hybrid_kv_manager_charges_sequences_as_vllm_does():
    from capacity.sched.base import Seq
    from capacity.workload import Request

    kv = make_kv_manager(1000, 16, False, (1, 1, 9, 128))
    assert isinstance(kv, HybridKVCacheManager)
    s = Seq(Request(0, 0.0, 4000, 10))
    # one 4000-token chunk from nothing: the sliding group holds every block of it until the next step
    assert kv.allocate_slots(s, 4000) and s.blocks == 250 + 250
    s.computed = 4000
    # the next token's window starts at 4000 - 127 = 3873: blocks 0..241 are freed, 242..250 kept (9)
    assert kv.allocate_slots(s, 1) and s.blocks == 251 + 9 and kv.num_free_blocks == 1000 - 260
    assert not kv.allocate_slots(Seq(Request(1, 0.0, 16000, 10)), 16000)  # 1000 + 1000 > 740 free
    with pytest.raises(ConfigError, match="prefix caching"):
        make_kv_manager(1000, 16, True, (1, 1, 9))


def test_sliding_models_fit_more_long_sequences(card):
    # gemma-3 (52 of 62 layers slide, window 1024), served by both releases (gpt-oss, 0.10.1+, is refused on 0.8.5:
    # capacity/engine/served.py); 0.8.5 counts every layer as full attention, 0.19 keeps a sliding layer's window
    gemma = load_model_card(HF / "gemma-3-27b-it.json")
    g = get_gpu("h100-sxm")
    hybrid = mem.budget(gemma, g, EngineConfig(engine="vllm@0.19", max_model_len=32768, tensor_parallel_size=2))
    flat = mem.budget(gemma, g, EngineConfig(engine="vllm@0.8.5", max_model_len=32768, tensor_parallel_size=2))
    assert hybrid.concurrency_at(32768) > 1.8 * flat.concurrency_at(32768)


# ---- ranges and the planner's end ----------------------------------------------------------------------------
def test_planner_uses_the_conservative_end_unless_asked(card):
    c, g = card("llama-3.1-8b"), get_gpu("h100-sxm")
    cons = mem.budget(c, g, EngineConfig(max_model_len=8192))
    mid = mem.budget(c, g, EngineConfig(max_model_len=8192, kv_estimate="middle"))
    assert cons.planning_blocks == cons.num_blocks_range[0] < cons.num_blocks == mid.planning_blocks
    assert cons.concurrency_at(4096) < mid.concurrency_at(4096)


def test_unchecked_releases_carry_wider_ranges(card):
    c, g = card("llama-3.1-8b"), get_gpu("h100-sxm")
    checked = mem.budget(c, g, EngineConfig(engine="vllm@0.19", max_model_len=8192))
    unchecked = mem.budget(c, g, EngineConfig(engine="vllm@0.16", max_model_len=8192))
    width = lambda b: b.ranges["activation"][1] - b.ranges["activation"][0]
    assert width(unchecked) > width(checked)
    assert any("not yet checked" in w for w in unchecked.warnings)


def test_gpu_memory_gib_overrides_the_catalogue(card):
    g = with_memory(get_gpu("h100-sxm"), 79.19)
    assert g.usable_memory_bytes == 79.19 * GiB and g.usable_memory_basis == "given"
    with pytest.raises(ConfigError, match="--gpu-memory-gib 0.1"):
        with_memory(get_gpu("h100-sxm"), 0.1)


# ---- the command line --------------------------------------------------------------------------------------
def test_memory_for_the_new_architectures_from_config_json():
    for f in ("gpt-oss-20b.json", "gemma-2-9b.json", "llama-3.2-11b-vision-instruct.json"):
        r = run_cli("memory", "-m", str(HF / f), "-g", "h100-sxm", "--max-model-len", "8192", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["fits"] and out["budget"]["num_blocks"] > 0


def test_does_not_fit_still_prints_the_budget_as_json():
    r = run_cli("memory", "-m", "llama-3.1-70b", "-g", "l40s", "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["fits"] is False and "weights need" in out["reason"] and out["budget"]["weights_bytes"] > 0
    assert r.stderr.count("\n") == 1 and "does not fit" in r.stderr


def test_huggingface_ids_resolve_to_bundled_cards():
    assert resolve_model_path("meta-llama/Llama-3.1-8B-Instruct").stem == "llama-3.1-8b"
    assert resolve_model_path("META-LLAMA/Llama-3.1-8B").stem == "llama-3.1-8b"  # an alias, any case
    r = run_cli("memory", "-m", "someone/Unknown-Model-7B", "--json")
    assert r.returncode == 1 and "config.json" in r.stderr and "nothing is downloaded" in r.stderr


def test_engine_and_gpu_memory_flags_reach_the_budget():
    r = run_cli("memory", "-m", "llama-3.1-8b", "-g", "rtx-3090", "--gpu-memory-gib", "23.58", "--engine",
                "vllm@0.6.4", "--max-model-len", "20000", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["budget"]
    # vllm#10517: 'kv_cache_size=3.81GiB' for this configuration
    assert b["release"] == "vllm@0.6.4" and b["kv_budget_bytes"] / GiB == pytest.approx(3.81, abs=0.04)
    bad = run_cli("memory", "-m", "llama-3.1-8b", "--engine", "vllm@9.9")
    assert bad.returncode == 1 and "vllm@9.9" in bad.stderr and bad.stderr.count("\n") == 1


def test_usage_context_changes_the_defaults():
    serve = json.loads(run_cli("memory", "-m", "llama-3.1-8b", "--max-model-len", "8192", "--json").stdout)
    llm = json.loads(run_cli("memory", "-m", "llama-3.1-8b", "--max-model-len", "8192", "--usage-context", "llm",
                             "--json").stdout)
    assert serve["budget"]["max_num_batched_tokens"] == 8192 and llm["budget"]["max_num_batched_tokens"] == 16384
