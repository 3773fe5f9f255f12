"""The published-results bench's model of the benchmark tools (bench/published.py): the batch settings
`trtllm-bench throughput` picks when given none, worked out by hand from TensorRT-LLM's heuristic
(bench/build/tuning.py: calc_engine_setting, finetune_setting)."""
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def published():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import published as mod
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return mod


def test_trtllm_bench_batch_settings_by_hand(published):
    """Llama-3.1-8B FP8 on one H100 (79.16 GiB as torch sees it), 128 in / 2048 out:
    KV per token 2 x 32 layers x 8 KV heads x 128 x 1 B (FP8) = 65,536 B = 6.1035e-5 GiB;
    weights 8,030,261,248 x 1 B = 7.4787 GiB; (79.16 - 7.4787) x 0.95 = 68.097 GiB;
    / (6.1035e-5 x 2,176 tokens) = 512.7 requests -> under 1,024: 128 x ceil(512.7 / 128) = 640;
    tokens 512.7 x (1 + 128 / 2048) = 544.8 -> under 4,096: max(2,048, 256 x 3) = 2,048 >= 128 + 640.
    Llama-3.1-70B FP8 on two H100s, 20,000 / 2,000: KV 2 x 80 x 8 x 128 B = 163,840 B per token;
    (2 x 79.16 - 65.708) x 0.95 = 87.98 GiB / (1.5259e-4 x 22,000) = 26.2 requests -> 64 (the floor);
    tokens 26.2 x 11 = 288 -> 2,048, but the longest prompt plus the batch is 20,064 (chunked prefill off).
    8B on H100, 128 / 128: 68.097 / (6.1035e-5 x 256) = 4,358 requests, capped at 4,096 -> 4,096;
    tokens 4,096 x 2 = 8,192 -> 1,024 x 8 = 8,192."""
    from capacity.cli.common import load_card
    from capacity.model.gpus import get_gpu

    h100 = get_gpu("h100-sxm")
    assert h100.usable_memory_bytes / 2**30 == pytest.approx(79.16)
    c8, c70 = load_card("llama-3.1-8b", "fp8", None, None), load_card("llama-3.1-70b", "fp8", None, None)
    row = dict(tp=1, dtype="fp8")
    assert published.trtllm_bench_settings(c8, h100, {**row, "isl": 128, "osl": 2048}) == (640, 2048)
    assert published.trtllm_bench_settings(c8, h100, {**row, "isl": 128, "osl": 128}) == (4096, 8192)
    assert published.trtllm_bench_settings(c70, h100, {"tp": 2, "dtype": "fp8", "isl": 20000, "osl": 2000}) == \
        (64, 20064)


def test_trtllm_bench_batch_settings_match_a_real_log(published):
    """TensorRT-LLM issue #6294 (0.20.0): Llama-3.1-8B FP8 on an H100, 128-token prompts and outputs of about
    28 tokens (derived in the data file), and trtllm-bench printed max_num_requests=4096, max_num_tokens=23552.
    By hand: 68.097 GiB / (6.1035e-5 x 156) = 7,152 requests, capped at 4,096; 4,096 x (1 + 128 / 28) = 22,821
    tokens -> 1,024 x 23 = 23,552."""
    import yaml

    from capacity.cli.common import load_card
    from capacity.model.gpus import get_gpu

    (log,) = yaml.safe_load((ROOT / "tests/data/published/trtllm_bench_logs.yaml").read_text())["logs"]
    card = load_card(log["model"], log["dtype"], None, None)
    row = {"tp": log["tp"], "dtype": log["dtype"], "isl": log["isl"], "osl": log["osl_derived"]}
    got = published.trtllm_bench_settings(card, get_gpu(log["gpu"]), row)
    assert got == (log["expected"]["max_batch_size"], log["expected"]["max_num_tokens"])
    assert f"max_num_requests={got[0]}, max_num_tokens={got[1]}" in log["printed"]["settings_line"]


def test_trtllm_engine_gives_nim_70b_the_kv_blocks_the_real_engine_had(published):
    """NIM's Llama-3.3-70B (2 x H100, FP8) at 500/2000 and 150 users: under vLLM's pool both simulated ends
    queue for KV blocks (mean TTFT 14x the published 296.7 ms); TensorRT-LLM's pool (0.9 of the memory free after
    its profile) holds more, so the simulated TTFT falls, and the batch that decodes (ITL) grows. The committed
    bench JSON has the same figures (python bench/published.py --sweeps)."""
    import yaml

    data = yaml.safe_load(published.SWEEPS.read_text())
    src = next(s for s in data["sources"] if s["model"] == "llama-3.3-70b")
    row = next(r for r in data["rows"] if r["source"] == src["id"] and (r["isl"], r["osl"], r["concurrency"])
               == (500, 2000, 150))
    vllm = published.predict_sweep(src, row, None, "prompt_and_output")
    trt = published.predict_sweep(src, row, *published.SWEEP_VARIANTS["TensorRT-LLM"])
    assert vllm["ttft_ms"] > 10 * row["ttft_ms"]
    # 2.8x lower (3.9x before TensorRT-LLM's overlap scheduler took new requests a step late, which the
    # synchronous vLLM variant here does not: tests/test_input_lag.py)
    assert trt["ttft_ms"] < vllm["ttft_ms"] / 2
    assert trt["output_tokens_per_s"] > vllm["output_tokens_per_s"]
