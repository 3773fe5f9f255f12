"""The engine and graph mode a vLLM release gives a model (capacity/engine/vllm/fallback.py): the V1 -> V0 fallback
for SupportsV0Only classes (0.8.0-0.10.2), mllama's removal in 0.11.0, and the eager mode ModelConfig._verify_cuda_graph
forces on mllama in 0.7.0-0.8.1. The boundaries are the releases' own code (docs/vllm-releases.md)."""
from __future__ import annotations

import json

import pytest

from capacity.engine import EngineConfig, engine_for, get_engine
from capacity.errors import ConfigError
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu
from tests.conftest import run_cli

MLLAMA = "tests/data/hf/llama-3.2-90b-vision-instruct.json"


@pytest.fixture(scope="module")
def mllama():
    return load_named_card(MLLAMA)


@pytest.mark.parametrize("spec, runner, eager", [
    ("vllm@0.6.6", "v0", False),    # mllama arrived in 0.6.2; 0.6.x captures its decode graphs
    ("vllm@0.7.0", "v0", True),     # MODEL_NOT_SUPPORT_CUDA_GRAPH = ['mllama'] from 0.7.0
    ("vllm@0.8.0", "v0", True),     # V1 is the default, mllama is SupportsV0Only: V0, still eager
    ("vllm@0.8.1", "v0", True),     # the last release with the list
    ("vllm@0.8.2", "v0", False),    # the list is gone (0.8.3+: ROCm only)
    ("vllm@0.9", "v0", False),      # V0 with full decode graphs
    ("vllm@0.10.2", "v0", False),   # the last release with mllama
])
def test_mllama_engine_and_graph_mode_by_release(mllama, spec, runner, eager):
    em = engine_for(spec, mllama)
    assert (em.release.runner, em.forced_eager) == (runner, eager)


def test_a_text_model_keeps_v1(mllama):
    llama = load_named_card("llama-3.1-8b")
    em = engine_for("vllm@0.9", llama)
    assert em is get_engine("vllm@0.9") and em.release.runner == "v1" and not em.forced_eager


def test_gemma3_vision_is_v0_only_in_080_only():
    g = load_named_card("tests/data/hf/gemma-3-27b-it.json")
    assert engine_for("vllm@0.8.0", g).release.runner == "v0"
    assert engine_for("vllm@0.8.1", g).release.runner == "v1"


@pytest.mark.parametrize("spec, match", [
    ("vllm@0.9:v1", r"engine vllm@0.9.2:v1: MllamaForConditionalGeneration .* is V0-only in vLLM 0.7.0-0.10.2"),
    ("vllm@0.7.3:v1", r"engine vllm@0.7.3:v1: MllamaForConditionalGeneration"),  # 0.7's V1: no encoder-decoder
    ("vllm@0.11", r"engine vllm@0.11.2: MllamaForConditionalGeneration .* was removed in vLLM 0.11.0"),
])
def test_a_mode_the_release_cannot_run_is_refused(mllama, spec, match):
    with pytest.raises(ConfigError, match=match):
        engine_for(spec, mllama)


def test_forced_eager_has_no_graph_memory_and_the_v0_defaults(mllama):
    gpu = get_gpu("h100-sxm")
    cfg = EngineConfig(engine="vllm@0.8.0", tensor_parallel_size=4, max_num_seqs=32, max_model_len=8192)
    b = get_engine("vllm@0.8.0").budget(mllama, gpu, cfg)
    assert b.cuda_graph_bytes == 0
    r = get_engine("vllm@0.9").resolve(cfg.model_copy(update={"engine": "vllm@0.9"}), mllama, gpu)
    # V0 without chunking for a multimodal model: the budget is max(max_model_len, 5120) (config.py)
    assert not r.chunked_prefill and r.max_num_batched_tokens == 8192 and r.release == "vllm@0.9.2:v0"


def test_the_eager_step_waits_for_the_dispatch_of_the_text_layers():
    # 80 text layers (100 - 20 cross-attention, skipped by a text-only step: MllamaTextModel.forward) x vLLM's eager
    # LlamaDecoderLayer at tp 4 (capacity/cost/piecewise.py): 12 kernel-launching calls (10 + 2 all-reduces) at the
    # stack's op less its views, (19.308 ms / 32 - 12 x 5 us) / 42, + 29 dispatches launching nothing at 5 us (the
    # view range's high end)
    call = (19.308e-3 / 32 - 60e-6) / 42
    dispatch = 80 * (12 * call + 29 * 5e-6)  # 24.02 ms
    args = ["simulate", "-m", MLLAMA, "-g", "h100-sxm", "--tp", "4", "--max-num-seqs", "32", "--max-model-len",
            "8192", "--arrival", "closed", "--users", "1", "-n", "2", "--input-len", "128", "--output-len", "64",
            "--warmup", "0", "--seed", "0", "--json"]
    eager = json.loads(run_cli(*args, "--engine", "vllm@0.8.0").stdout)
    graphs = json.loads(run_cli(*args, "--engine", "vllm@0.9").stdout)
    assert f"no CUDA graphs: {dispatch * 1e3:.2f} ms of eager dispatch" in eager["step_cost_source"]
    assert "24.02 ms" in eager["step_cost_source"]
    # a decode step: 2 ms overhead + 24.02 ms of dispatch is above the 90B model's 22 ms of GPU work at tp 4, so the
    # eager release decodes at the dispatch's pace, 0.9's graphs at the GPU's (both V0, the same step otherwise)
    g = graphs["summary"]["tpot_s"]["mean"]
    assert g < 2e-3 + dispatch and g < 0.03
    assert eager["summary"]["tpot_s"]["mean"] == pytest.approx(max(g, 2e-3 + dispatch), rel=1e-6)


def test_the_launch_command_needs_no_vllm_use_v1_for_the_fallback(mllama):
    gpu = get_gpu("h100-sxm")
    cfg = EngineConfig(engine="vllm@0.9", tensor_parallel_size=4, max_num_seqs=32, max_model_len=8192)
    em = get_engine("vllm@0.9")
    cmd = em.launch_command(mllama, cfg, em.budget(mllama, gpu, cfg))
    assert "VLLM_USE_V1" not in cmd
    assert any("falls back to its V0 engine" in n for n in engine_for("vllm@0.9", mllama).launch_notes(cfg))


def test_the_cli_refuses_it_in_one_line():
    r = run_cli("simulate", "-m", MLLAMA, "-g", "h100-sxm", "--tp", "4", "--engine", "vllm@0.9:v1", "--rate", "1",
                "-n", "2")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "is V0-only" in r.stderr and "Traceback" not in r.stderr


def test_the_startup_estimate_has_no_graphs_or_compile_for_the_fallback(mllama):
    from capacity.engine.startup import estimate_startup

    gpu = get_gpu("h100-sxm")
    for spec in ("vllm@0.8.0", "vllm@0.9"):  # V0 (no torch.compile); 0.8.0 eager: no graphs to capture
        est = estimate_startup(mllama, gpu, EngineConfig(engine=spec, tensor_parallel_size=4, max_num_seqs=32,
                                                         max_model_len=8192), 2.0)
        assert est["engine"].endswith(":v0") and list(est["terms"]["compile_s"]) == [0.0, 0.0]
        assert (est["capture_sizes"] == 0) == (spec == "vllm@0.8.0")
