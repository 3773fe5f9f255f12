"""Pipeline, data and expert parallelism and LoRA adapters in vLLM's start-up memory (issue 46, item 5): the layer
split, what each stage or rank holds, the adapters' buffers, and one line for a setting a release lacks."""
from __future__ import annotations

import pytest

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.engine.vllm.layout import _stage_sizes, pp_stages
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.model.weights import weight_bytes_per_rank
from tests.conftest import ROOT, run_cli

HF = ROOT / "tests" / "data" / "hf"
QWEN_MOE = load_model_card(HF / "qwen3-30b-a3b.json")  # 48 layers, 128 experts of 768, hidden 2048


def test_layers_split_over_stages_as_get_pp_indices_does():
    """An even split; the remainder one layer each to the stages before the last, from the second-to-last
    (48 over 5: [9, 10, 10, 10, 9]); VLLM_PP_LAYER_PARTITION as given, checked against the layer count."""
    assert _stage_sizes(QWEN_MOE, 5, None) == [9, 10, 10, 10, 9]
    assert _stage_sizes(QWEN_MOE, 2, None) == [24, 24]
    assert _stage_sizes(QWEN_MOE, 2, [16, 32]) == [16, 32]
    with pytest.raises(ConfigError, match=r"pp_layer_partition \[16, 16\]: needs 2 stages summing to 48"):
        _stage_sizes(QWEN_MOE, 2, [16, 16])


def test_stages_hold_the_model_between_them():
    """The first stage keeps the embedding, the last the final norm and the LM head; their weights add up to the
    whole model's (the rotary cache is built on every stage)."""
    stages = pp_stages(QWEN_MOE, 3)
    w = [weight_bytes_per_rank(s, 1) for s in stages]
    whole = weight_bytes_per_rank(QWEN_MOE, 1)
    assert "embed_tokens" in w[0] and "embed_tokens" not in w[1] and "lm_head" in w[2] and "lm_head" not in w[0]
    rope = whole["rope_cache"]
    assert sum(sum(x.values()) - rope for x in w) == pytest.approx(sum(whole.values()) - rope)


def test_the_engine_keeps_the_tightest_stage():
    cfg = EngineConfig(engine="vllm@0.19.0", max_model_len=32768, pipeline_parallel_size=2)
    em = get_engine(cfg.engine)
    b = em.budget(QWEN_MOE, get_gpu("h100-sxm"), cfg)
    per_stage = [em._budget(s, get_gpu("h100-sxm"), cfg) for s in pp_stages(QWEN_MOE, 2)]
    assert b.num_blocks == min(s.num_blocks for s in per_stage)
    assert "pipeline parallel 2: stages of 24, 24 layers" in b.warnings[-1]


def test_expert_parallelism_keeps_whole_experts_on_each_rank():
    """EP over tp x dp = 4 ranks: 128 / 4 = 32 whole experts a rank (3 x 768 x 2048 bf16 each, 48 layers);
    attention and the embeddings stay as tensor parallelism leaves them (TP 1 here: whole)."""
    w1, w4 = weight_bytes_per_rank(QWEN_MOE, 1), weight_bytes_per_rank(QWEN_MOE, 1, ep=4)
    experts = lambda w: w["experts_gate_up"] + w["experts_down"]
    assert experts(w4) == 48 * 32 * 3 * 768 * 2048 * 2
    assert experts(w1) == 4 * experts(w4)
    assert {k: v for k, v in w4.items() if not k.startswith("experts")} == \
        {k: v for k, v in w1.items() if not k.startswith("experts")}
    cfg = EngineConfig(engine="vllm@0.19.0", max_model_len=32768, data_parallel_size=4, enable_expert_parallel=True)
    b = get_engine(cfg.engine).budget(QWEN_MOE, get_gpu("h100-sxm"), cfg)
    assert b.weights_bytes == pytest.approx(sum(w4.values()), rel=1e-9)


def test_lora_buffers_as_the_unsloth_log_loads_them():
    """Llama-3.2-3B in fp16 with one LoRA slot of rank 64 (vLLM 0.8.5, the Unsloth T4 log): 'Loading model
    weights took 6.2473 GiB', of which the adapters' stacked buffers are 0.22 GiB (the weights alone: 5.99)."""
    card = load_model_card(HF / "llama-3.2-3b.json").with_overrides(dtype="fp16")
    cfg = EngineConfig(engine="vllm@0.8.5:v0", gpu_memory_utilization=0.59, max_model_len=2048, max_num_seqs=160,
                       max_num_batched_tokens=2048, enable_chunked_prefill=False, max_loras=1, max_lora_rank=64)
    b = get_engine(cfg.engine).budget(card, get_gpu("t4"), cfg)
    assert b.weights_bytes / 2**30 == pytest.approx(6.2473, rel=0.01)
    plain = get_engine(cfg.engine).budget(card, get_gpu("t4"), cfg.model_copy(update={"max_loras": 0}))
    assert (b.weights_bytes - plain.weights_bytes) / 2**30 == pytest.approx(0.215, abs=0.005)
    assert "--enable-lora --max-loras 1 --max-lora-rank 64" in get_engine(cfg.engine).launch_command(card, cfg, b)


@pytest.mark.parametrize("args, msg", [
    # Mixtral on the old releases: Qwen3-MoE is not in their model registry (capacity/engine/served.py)
    (["--enable-expert-parallel", "--engine", "vllm@0.7", "-m", str(HF / "mixtral-8x7b.json")],
     "enable_expert_parallel: vllm@0.7.3 has no"),
    (["--pp", "2", "--engine", "vllm@0.5.0", "-m", str(HF / "mixtral-8x7b.json")],
     "pipeline_parallel_size 2: vllm@0.5.0 has no pipeline"),
    (["--enable-expert-parallel", "--tp", "8", "--dp", "32"], "256 ranks (tp x data parallel) for the 128 experts"),
    (["--max-loras", "2", "--engine", "sglang"], "max_loras 2: vLLM only (engine sglang does not have this setting)"),
    (["--dp", "2", "--engine", "trtllm"], "data_parallel_size 2: vLLM and SGLang only (engine trtllm does not have this setting)"),
])
def test_a_setting_the_release_or_model_cannot_take_is_one_line(args, msg):
    r = run_cli("memory", "-m", str(HF / "qwen3-30b-a3b.json"), "-g", "h100-sxm", "--max-model-len", "8192", *args)
    assert r.returncode == 1 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_simulate_refuses_what_only_the_memory_model_knows():
    from capacity.pipeline import Deployment, prepare

    cfg = EngineConfig(max_model_len=8192, pipeline_parallel_size=2)  # data and expert parallelism are simulated
    with pytest.raises(ConfigError, match="pipeline_parallel_size: .* its step cost is not"):
        prepare(Deployment(QWEN_MOE, get_gpu("h100-sxm"), cfg))
