"""TensorRT-LLM's concurrency limits by release (capacity.engine.trtllm.release, capacity.sched.trt_dynamic): the
defaults `trtllm-serve MODEL` runs with per release line, pinned from the code read (each quoted with its file and
where it was read: docs/trtllm.md, "Defaults by release"); GUARANTEED_NO_EVICT capping concurrency below what the
pool holds in tokens; the engine backend's dynamic batch size tuning; one-line refusals."""

import numpy as np
import pytest

from capacity.engine import get_engine
from capacity.engine.budget import SchedLimits
from capacity.engine.config import EngineConfig
from capacity.engine.trtllm.engine import Trtllm
from capacity.engine.trtllm.release import parse_trtllm
from capacity.errors import ConfigError
from capacity.sched.trt_dynamic import runtime_batch_size
from capacity.workload import Request
from tests.conftest import ROOT, run_cli


@pytest.mark.parametrize("spec, backend, batch, tokens, block, tuning, overlap", [
    # 0.18.2 docs, commands/trtllm-serve.html (sphinx-click of tensorrt_llm/commands/serve.py): "--backend <backend>
    # Set to 'pytorch' for pytorch path. Default is cpp path. Options: pytorch"; serve.py of that line:
    # `@click.option("--max_batch_size", type=int, default=BuildConfig.max_batch_size` (2048),
    # `@click.option("--max_num_tokens", ..., default=BuildConfig.max_num_tokens` (8192)
    # and `main` builds LlmArgs.from_kwargs(..., build_config=build_config, kv_cache_config=kv_cache_config,
    # backend=...) with no scheduler_config: no dynamic batch size tuning, no overlap scheduler
    ("trtllm@0.18", "tensorrt", 2048, 8192, 64, False, False),
    # the PyTorch backend of 0.17-0.18 takes the build's PluginConfig.tokens_per_block (update_executor_config:
    # `executor_config.tokens_per_block = build_config.plugin_config.tokens_per_block`): 64 before 0.19
    ("trtllm@0.17:pytorch", "pytorch", 2048, 8192, 64, False, False),
    # 0.19.0rc0 / 0.20.0rc1 docs, commands/trtllm-serve.html: "trtllm-serve <model> [--backend pytorch --tp_size
    # <tp> ...]": the PyTorch backend only when asked for; 0.19 builds with paged context FMHA: 32-token blocks;
    # serve.py's get_llm_args: `dynamic_batch_config = DynamicBatchConfig(enable_batch_size_tuning=True, ...)`,
    # `PyTorchConfig(enable_overlap_scheduler=True) if backend == "pytorch" else None`
    ("trtllm@0.19", "tensorrt", 2048, 8192, 32, True, False),
    ("trtllm@0.20.0", "tensorrt", 2048, 8192, 32, True, False),
    # serve.py (1.x): `type=ChoiceWithAlias(["pytorch", "tensorrt", "_autodeploy"], {"trt": "tensorrt"}),
    # default="pytorch"`; 1.0.0rc6 docs: "trtllm-serve <model> [--tp_size <tp> ...]" (no --backend)
    ("trtllm@1.0", "pytorch", 2048, 8192, 32, False, True),
    ("trtllm", "pytorch", 2048, 8192, 32, False, True),
    ("trtllm@1.1.0rc3", "pytorch", 2048, 8192, 32, False, True),
    # `--backend tensorrt` on 1.x: the engine backend, with get_llm_args' DynamicBatchConfig(
    # enable_batch_size_tuning=True, enable_max_num_tokens_tuning=False, dynamic_batch_moving_average_window=128)
    ("trtllm@1.1:tensorrt", "tensorrt", 2048, 8192, 32, True, False),
    ("trtllm@0.20:pytorch", "pytorch", 2048, 8192, 32, False, True),
])
def test_defaults_by_release(spec, backend, batch, tokens, block, tuning, overlap):
    rel = parse_trtllm(spec)
    assert (rel.backend, rel.max_batch_size, rel.max_num_tokens, rel.tokens_per_block) == (backend, batch, tokens,
                                                                                              block)
    assert rel.dynamic_batch_tuning is tuning and rel.overlap_scheduler_default is overlap
    eng = get_engine(spec)
    assert isinstance(eng, Trtllm) and eng.async_scheduling(EngineConfig()) is overlap


def test_the_bare_name_is_the_current_release_unchanged():
    """`trtllm` stays what the golden outputs were made with: 1.1, the PyTorch backend, label trtllm@1.1."""
    assert get_engine("trtllm").label == "trtllm@1.1" == get_engine("trtllm@1.1").label
    assert get_engine("trtllm@0.20").label == "trtllm@0.20"
    assert get_engine("trtllm@0.20:pytorch").label == "trtllm@0.20:pytorch"


def test_the_runtime_batch_size_table():
    """DynamicBatchTuner::getRuntimeBatchSize with dynamicBatchConfig.cpp's kDefaultBatchSizeTable {144: 128,
    336: 256, 672: 512, 832: 768, 1280: 1024, 1664: 1536} and the fallback (granularity 512, threshold 128):
    the first limit above the capacity gives the size; past the table, the capacity rounded down to 512 when within
    128 of it."""
    assert [runtime_batch_size(c) for c in (1, 143, 144, 300, 335, 336, 700, 900, 1300, 1663)] == \
        [128, 128, 256, 256, 256, 512, 768, 1024, 1536, 1536]
    assert runtime_batch_size(1664) == 1664  # past the table: 1664 // 512 * 512 = 1536, and 1664 is not < 1536 + 128
    assert runtime_batch_size(1700) == 1700  # 1536 + 128 = 1664 <= 1700
    assert runtime_batch_size(2100) == 2048  # 2048 + 128 > 2100
    assert runtime_batch_size(2200) == 2200


def _running_after_one_step(spec: str, limits: SchedLimits, reqs: list[Request]) -> int:
    sched = get_engine(spec).scheduler_factory(EngineConfig(), limits)()
    for r in reqs:
        sched.add(r)
    sched.schedule(0.0)
    return len(sched.running)


def test_no_evict_with_long_max_tokens_caps_concurrency_below_the_pool():
    """GUARANTEED_NO_EVICT (capacityScheduler.cpp): a request is admitted only if the blocks of its prompt *and*
    its max_tokens fit. A pool of 100 blocks of 32 tokens (3,200 tokens); ten requests of 100 prompt tokens and
    max_tokens 1,500: each reserves ceil(1,600 / 32) = 50 blocks, so 2 run, though the ten prompts need only
    10 x ceil(100 / 32) = 40 blocks (MAX_UTILIZATION admits all ten)."""
    limits = SchedLimits(max_num_seqs=2048, max_num_batched_tokens=8192, block_size=32, num_blocks=100,
                         max_model_len=4096)
    reqs = [Request(i, 0.0, 100, 1500) for i in range(10)]
    assert _running_after_one_step("trtllm", limits, reqs) == 2
    sched = get_engine("trtllm").scheduler_factory(EngineConfig(kv_reservation="prompt"), limits)()
    for r in reqs:
        sched.add(r)
    sched.schedule(0.0)
    assert len(sched.running) == 10


def test_the_engine_backend_runs_fewer_than_no_evict_allows():
    """The engine backend's runtime batch size: 400 requests of 16 prompt + 16 output tokens, a pool of 300 blocks
    of 32: each needs ceil(32 / 32) = 1 block, so GUARANTEED_NO_EVICT alone would run 300 (the PyTorch backend);
    the tuner's capacity is 300 // 1 = 300, which the table (300 < 336) turns into 256."""
    limits = SchedLimits(max_num_seqs=2048, max_num_batched_tokens=8192, block_size=32, num_blocks=300,
                         max_model_len=4096)
    reqs = [Request(i, 0.0, 16, 16) for i in range(400)]
    assert _running_after_one_step("trtllm@1.1", limits, reqs) == 300
    assert _running_after_one_step("trtllm@1.1:tensorrt", limits, reqs) == 256
    assert _running_after_one_step("trtllm@0.20", limits, reqs) == 256
    # the engine's built max_batch_size caps the runtime size
    small = SchedLimits(max_num_seqs=64, max_num_batched_tokens=8192, block_size=32, num_blocks=300,
                        max_model_len=4096)
    assert _running_after_one_step("trtllm@0.20", small, reqs) == 64


@pytest.mark.parametrize("spec, words", [
    ("trtllm@0.9", "trtllm@0.9: not modelled"),
    ("trtllm@2.7", "trtllm@2.7: not modelled"),
    ("trtllm@0.20:onnx", "backend 'onnx'"),
])
def test_unknown_releases_and_backends_are_one_line(spec, words):
    with pytest.raises(ConfigError) as e:
        get_engine(spec)
    assert words in str(e.value) and "\n" not in str(e.value)
    r = run_cli("simulate", "--model", str(ROOT / "models/llama-3.1-8b.yaml"), "--gpu", "h100-sxm", "--engine", spec,
                "--rate", "2", "--requests", "20")
    assert r.returncode == 1 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_setting_the_release_backend_lacks_is_one_line():
    """The overlap scheduler (`disable_overlap_scheduler`) is the PyTorch backend's; trtllm@0.20 runs the engine
    backend by default, so `async_scheduling: true` there is refused (and accepted on trtllm@0.20:pytorch)."""
    limits = SchedLimits(max_num_seqs=8, max_num_batched_tokens=512, block_size=32, num_blocks=10)
    with pytest.raises(ConfigError) as e:
        get_engine("trtllm@0.20").scheduler_factory(EngineConfig(async_scheduling=True), limits)
    assert "async_scheduling True" in str(e.value) and "trtllm@0.20:pytorch" in str(e.value)
    get_engine("trtllm@0.20:pytorch").scheduler_factory(EngineConfig(async_scheduling=True), limits)
    r = run_cli("simulate", "--model", str(ROOT / "models/llama-3.1-8b.yaml"), "--gpu", "h100-sxm", "--engine",
                "trtllm@0.20", "--async-scheduling", "--rate", "2", "--requests", "20")
    assert r.returncode == 1 and "async_scheduling" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_launch_command_names_the_backend():
    from capacity.cli.common import load_card
    from capacity.engine.memory import budget
    from capacity.model.gpus import get_gpu

    card = load_card("llama-3.1-8b", None, None, None)
    cfg = EngineConfig(engine="trtllm@0.20", max_model_len=8192)
    b = budget(card, get_gpu("h100-sxm"), cfg)
    cmd = get_engine("trtllm@0.20").launch_command(card, cfg, b)
    assert "--backend tensorrt" in cmd and "disable_overlap_scheduler" not in cmd and b.block_size == 32
    assert "--backend pytorch" in get_engine("trtllm").launch_command(card, cfg.model_copy(update={"engine": "trtllm"}),
                                                                      budget(card, get_gpu("h100-sxm"),
                                                                             cfg.model_copy(update={"engine": "trtllm"})))


def test_engines_lists_the_trtllm_releases():
    import json

    r = run_cli("engines", "--json")
    assert r.returncode == 0, r.stderr
    trt = [row["engine"] for row in json.loads(r.stdout) if row["engine"].startswith("trtllm")]
    assert trt == ["trtllm@0.13", "trtllm@0.17", "trtllm@0.18", "trtllm@0.19", "trtllm@0.20", "trtllm@0.21", "trtllm@1.0",
                   "trtllm@1.1", "trtllm@1.2"]
    np.testing.assert_equal(len(trt), 9)
