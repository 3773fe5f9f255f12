"""TensorRT-LLM's KV pools for models with sliding-window layers (capacity/engine/trtllm/vswa.py; docs/trtllm.md,
"Sliding-window layers"): one pool at full attention by default, a pool per window with `trtllm_vswa`. The numbers
are worked by hand from TensorRT-LLM's formulas (kvCacheManager.cpp calculateWindowSizeToShare /
calculateMaxNumBlocks, resource_manager.py calculate_max_num_blocks_for_vswa) or read in its logs and tests."""
from __future__ import annotations

import math

import pytest

from capacity.engine import get_engine
from capacity.engine.budget import SchedLimits
from capacity.engine.config import EngineConfig
from capacity.engine.trtllm import vswa
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from tests.conftest import ROOT, run_cli

GIB = 1024**3
OSS = load_model_card(ROOT / "models/gpt-oss-20b.yaml")  # 24 layers, 12 of them a 128-token window, 8 KV heads of 64


def trt(spec: str, **kw) -> EngineConfig:
    return EngineConfig.model_validate({"engine": spec, **kw})


def budget(spec: str, **kw):
    cfg = trt(spec, max_model_len=16384, max_num_seqs=256, **kw)
    return get_engine(spec).budget(OSS, get_gpu("h100-sxm"), cfg, check_fit=False)


# ---- the default: one pool at full attention -----------------------------------------------------------------------
def test_the_default_is_one_pool_over_every_layer():
    """KVCacheManager: max_attention_window None -> [max_seq_len]: every layer keeps every token. gpt-oss-20b in bf16:
    2 x 24 layers x 8 heads x 64 x 2 B = 49,152 B a token (the 1.1.0rc3 gpt-oss-120b log's 'kv size is 73728' is
    the same count over its 36 layers: 2 x 36 x 8 x 64 x 2)."""
    b = budget("trtllm")
    assert b.kv_bytes_per_token == 49_152 and 2 * 36 * 8 * 64 * 2 == 73_728
    assert b.max_num_seqs == 256 and b.kv_tokens == b.num_blocks * 32
    assert any("one KV pool at full attention" in w for w in b.warnings)
    # the engine backend (dense models only): the executor's window vector defaults likewise. Gemma-2-9B:
    # 2 x 42 layers x 8 heads x 256 x 2 B = 344,064 B a token, its 21 sliding layers included
    g2 = load_model_card(ROOT / "models/gemma-2-9b.yaml")
    cpp = get_engine("trtllm@0.20").budget(g2, get_gpu("h100-sxm"), trt("trtllm@0.20", max_model_len=8192),
                                          check_fit=False)
    assert cpp.kv_bytes_per_token == 344_064
    assert any("one KV pool at full attention" in w for w in cpp.warnings)


def test_nvforum354807_is_expressed_and_starts():
    """The development case refused before (ConfigError): gpt-oss-20b on a GB10, 1.1.0rc3, max_tokens 200,000."""
    cfg = trt("trtllm@1.1", max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=16384,
              num_gpu_blocks_override=6250)
    b = get_engine("trtllm@1.1").budget(OSS, get_gpu("gb10"), cfg, check_fit=False)
    assert b.fits and b.kv_tokens == 200_000  # 6,250 blocks of 32 (kv_cache_config.max_tokens keeps the smaller)


# ---- VSWA: the split, by hand -----------------------------------------------------------------------------------
def test_the_weighted_share_matches_tensorrt_llms_own_test():
    """kvCacheManager.h's example (TEST_F BlockManagerTestWindowSizeToShare): windows {1024: 1 layer, 4096: 3,
    8192: 2}, the same bytes per layer -> {1024: 0.0345, 4096: 0.4138, 8192: 0.5517}."""
    s = vswa.shares("weighted", {1024: 1, 4096: 3, 8192: 2})
    assert s == pytest.approx({1024: 0.0345, 4096: 0.4138, 8192: 0.5517}, abs=5e-5)
    assert vswa.shares("equal", {1024: 1, 4096: 3, 8192: 2}) == pytest.approx({1024: 1 / 3, 4096: 1 / 3, 8192: 1 / 3})


def test_gpt_oss_pools_by_hand():
    """10 GiB, windows {128: 12 layers, 16384: 12}, 12 x 2,048 B = 24,576 B a token in each.
    weighted: 128 / 16,512 of it -> int(3,386.87) = 3,386 tokens, ceil(/32) = 106 blocks; the full window
    int(433,519.79) = 433,519 tokens -> 13,548 blocks. equal: half each -> int(218,453.33 // 32) = 6,826 blocks, as
    one pool over all 24 layers holds (218,453 tokens at 49,152 B): equal shares cost the full layers nothing."""
    layers = vswa.windows(OSS, 16384)
    assert layers == {128: 12, 16384: 12}
    w = vswa.pool_blocks("weighted", 10 * GIB, layers, 2048, 32)
    e = vswa.pool_blocks("equal", 10 * GIB, layers, 2048, 32)
    assert w == {128: 106, 16384: 13_548} and e == {128: 6_826, 16384: 6_826}
    assert int(10 * GIB // 49_152) // 32 == 6_826
    # a window pool holds ceil(128 / 32) + 1 = 5 blocks a sequence: 106 // 5 = 21 sequences, whatever their length
    assert vswa.window_seqs(106, 128, 32) == 21
    # max_tokens: calculateMaxNumBlocks keeps the smaller per window; the equal rule ignores it
    # (min(3,386, 1,000) and min(433,519, 1,000) tokens: ceil(1,000 / 32) = 32 blocks each)
    assert vswa.pool_blocks("weighted", 10 * GIB, layers, 2048, 32, max_tokens=1000) == {128: 32, 16384: 32}
    assert vswa.pool_blocks("equal", 10 * GIB, layers, 2048, 32, max_tokens=1000) == e


def test_the_budget_plans_on_the_binding_pool_at_each_release():
    """1.0 'weighted', 1.2 'equal', 1.1 either: its blocks the fewer of the two (the equal rule's full pool), its batch
    the smaller cap (the weighted rule's window pool)."""
    b10, b11, b12 = (budget(s, trtllm_vswa=True) for s in ("trtllm@1.0", "trtllm@1.1", "trtllm@1.2"))
    mem = b11.kv_budget_bytes  # the KvCacheCreator's estimate, max_gpu_total_bytes
    full = -(-int(mem * 16384 / 16512 / 24_576) // 32)  # weighted, by hand
    assert b11.num_blocks == full and b11.kv_bytes_per_token == 24_576 and b11.block_bytes == 32 * 24_576
    assert b11.planning_blocks == b12.planning_blocks < b10.planning_blocks
    assert b11.max_num_seqs == b10.max_num_seqs < b12.max_num_seqs
    lo = b11.ranges["kv_budget"][0]  # every term high: the conservative memory
    assert b11.max_num_seqs == (-(-int(lo * 128 / 16512 / 24_576) // 32)) // 5
    assert b12.max_num_seqs == 256  # the equal rule's window pool holds more than max_batch_size
    assert b11.planning_blocks == int(lo / 2 / 24_576 // 32)
    limits = SchedLimits.of(b11)  # the scheduler's batch follows the binding window pool
    assert (limits.max_num_seqs, limits.num_blocks, limits.kv_groups) == (b11.max_num_seqs, b11.planning_blocks, None)
    assert any("VSWA" in w for w in b11.warnings)


def test_the_launch_command_writes_the_window_vector():
    """TensorRT-LLM cycles max_attention_window over the layers: gpt-oss and Gemma-2 alternate from a sliding layer,
    Gemma-3 has five sliding layers to a full one (62 layers: 10 full, 52 sliding)."""
    assert vswa.launch_vector(OSS, 16384) == [128, 16384]
    g2 = load_model_card(ROOT / "models/gemma-2-9b.yaml")
    g3 = load_model_card(ROOT / "models/gemma-3-27b.yaml")
    assert vswa.launch_vector(g2, 8192) == [4096, 8192]
    assert vswa.launch_vector(g3, 8192) == [1024] * 5 + [8192] and 62 // 6 == 10
    cfg = trt("trtllm", max_model_len=16384, max_num_seqs=256, trtllm_vswa=True)
    b = get_engine("trtllm").budget(OSS, get_gpu("h100-sxm"), cfg, check_fit=False)
    assert "max_attention_window: [128, 16384]" in get_engine("trtllm").launch_command(OSS, cfg, b)
    assert f"--max_batch_size {b.max_num_seqs}" in get_engine("trtllm").launch_command(OSS, cfg, b)


@pytest.mark.parametrize("args, needle", [
    (["--model", "models/gpt-oss-20b.yaml", "--engine", "trtllm@0.20", "--trtllm-vswa"], "trtllm@0.20"),
    (["--model", "models/gpt-oss-20b.yaml", "--engine", "trtllm@1.1:tensorrt", "--trtllm-vswa"], "1.0-1.2 only"),
    (["--model", "models/llama-3.1-8b.yaml", "--engine", "trtllm", "--trtllm-vswa"], "no mix of sliding-window"),
    (["--model", "models/gpt-oss-20b.yaml", "--engine", "vllm", "--trtllm-vswa"], "trtllm_vswa"),
])
def test_vswa_where_it_is_not_modelled_is_one_line(args, needle):
    r = run_cli("memory", "--gpu", "h100-sxm", *args)
    assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_single_window_is_not_vswa():
    """A window at or above max_seq_len leaves one window size (is_vswa False): one pool."""
    assert vswa.windows(OSS, 128) == {128: 24}
    assert vswa.shares("weighted", {128: 24}) == {128: 1.0}
    assert math.isclose(sum(vswa.shares("weighted", {128: 12, 4096: 12}).values()), 1.0)


def test_a_layer_pattern_that_does_not_repeat_is_refused_at_launch():
    """19 sliding and 5 full layers of 24: no period p gives 24 // p = 5 full layers; the vector cannot be written."""
    odd = OSS.model_copy(update={"num_sliding_layers": 19})
    assert all(24 // p != 5 for p in range(2, 25))
    with pytest.raises(ConfigError, match="not a repeating pattern"):
        vswa.launch_vector(odd, 16384)
