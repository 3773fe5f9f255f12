"""TensorRT-LLM attention data parallelism (`trtllm_attention_dp`, LlmArgs.enable_attention_dp) as start-up memory
(capacity/engine/trtllm/parallel.py; docs/trtllm.md, "Attention data parallelism"): everything but the routed
experts whole on every rank, the KV heads unsplit, a pool per rank; simulate and plan step the ranks in lock step
(capacity/engine/lockstep.py, tests/test_attention_dp.py); a dense model is refused in one line."""
from __future__ import annotations

import pytest

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from tests.conftest import ROOT, run_cli

QWEN3_235B = ROOT / "tests/data/hf/qwen3-235b-a22b-fp8.json"


def budget(**kw):
    card = load_model_card(QWEN3_235B)
    cfg = EngineConfig.model_validate({"engine": "trtllm", "tensor_parallel_size": 8, "max_model_len": 8192, **kw})
    return get_engine("trtllm").budget(card, get_gpu("h200"), cfg, check_fit=False)


def test_attention_dp_replicates_all_but_the_experts_and_keeps_whole_kv_heads():
    """Qwen3-235B-A22B FP8 at tp 8 (94 layers, hidden 4,096, 64 query heads and 4 KV heads of 128, vocabulary 151,936).
    KV a token on a rank: 2 x 94 x 4 x 128 x 2 B = 192,512 (tp 8: one head, 48,128).
    Weights added on a rank: attention at tp 1, 4,096 x (8,192 + 512 + 512 + 8,192) = 71,303,168 FP8 bytes a layer,
    against 4,096 x (1,024 + 128 + 128 + 1,024) = 9,437,184 at tp 8 (a KV head each): 94 x 61,865,984 =
    5,815,402,496 B; the bf16 embedding and LM head whole, 7/8 x 2 x 151,936 x 4,096 x 2 B = 2,178,154,496 B; so
    7,993,556,992 B, plus the attention's FP8 block scales (4 B per 128 x 128 block: about 1.4 MB)."""
    tp, adp = budget(), budget(trtllm_attention_dp=True)
    assert (tp.kv_bytes_per_token, adp.kv_bytes_per_token) == (48_128, 192_512)
    assert adp.weights_bytes - tp.weights_bytes == pytest.approx(7_993_556_992, abs=2_000_000)
    assert adp.kv_budget_bytes < tp.kv_budget_bytes and any("attention DP" in w for w in adp.warnings)


def test_a_dense_model_is_refused_in_one_line():
    for args, needle in (
        (["memory", "--model", "models/llama-3.1-8b.yaml", "--gpu", "h100-sxm"], "a dense model"),
    ):
        r = run_cli(*args, "--engine", "trtllm", "--trtllm-attention-dp")
        assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_the_launch_command_turns_it_on():
    card = load_model_card(QWEN3_235B)
    cfg = EngineConfig.model_validate({"engine": "trtllm", "tensor_parallel_size": 8, "max_model_len": 8192,
                                       "trtllm_attention_dp": True})
    b = get_engine("trtllm").budget(card, get_gpu("h200"), cfg, check_fit=False)
    assert "enable_attention_dp: true" in get_engine("trtllm").launch_command(card, cfg, b)
