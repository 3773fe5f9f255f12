"""A setting the pinned vLLM release has no flag for is refused in one line (capacity/engine/vllm/flags.py); the
release that has it, and `vllm` (the current release), accept it. The boundaries are published facts, pinned here
by hand (not read from the table under test): docs/vllm-releases.md has their sources."""
from __future__ import annotations

import pytest

from capacity.engine.config import EngineConfig
from capacity.engine.registry import get_engine
from capacity.errors import ConfigError
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu
from tests.conftest import run_cli

CARD = load_named_card("llama-3.1-8b")
GPU = get_gpu("h100-sxm")
SPEC = {"num_speculative_tokens": 3, "acceptance_rate": 0.7}


def resolve(engine: str, **kw):
    cfg = EngineConfig(engine=engine, max_model_len=8192, **kw)
    return get_engine(engine).resolve(cfg, CARD, GPU)


def command(engine: str, **kw) -> str:
    cfg = EngineConfig(engine=engine, max_model_len=8192, **kw)
    e = get_engine(engine)
    return e.launch_command(CARD, cfg, e.budget(CARD, GPU, cfg))


# (setting, the newest release without it, the first release with it (or the first after the unpinned gap))
BOUNDARIES = [
    (dict(async_scheduling=True), "vllm@0.9.2", "vllm@0.10.0"),  # 0.10.0's notes: --async-scheduling (#19970)
    (dict(policy="priority"), "vllm@0.6.2:v0", "vllm@0.6.3:v0"),  # #8956 (EngineArgs.scheduling_policy)
    (dict(policy="priority"), "vllm@0.9.1", "vllm@0.9.2"),  # 0.9.2's notes: priority in the V1 engine (#19057)
    (dict(block_size=64), "vllm@0.6.3", "vllm@0.9.0"),  # 0.6.3.post1: {8,16,32}; 0.9.0: Literal[1..128]
    (dict(block_size=128), "vllm@0.6.3", "vllm@0.9.0"),
    (dict(block_size=256), "vllm@0.10.0", "vllm"),  # 0.10.0: Literal[1, 8, 16, 32, 64, 128]
    (dict(speculative={"method": "eagle3", **SPEC}), "vllm@0.8.4", "vllm@0.8.5"),  # 0.8.5 notes: EAGLE-3 (#16937)
    (dict(speculative={"method": "eagle", **SPEC}), "vllm@0.7.3", "vllm@0.8.0"),  # --speculative-config (#14434)
    (dict(speculative={"method": "mtp", **SPEC}), "vllm@0.7.3", "vllm@0.8.0"),
    (dict(speculative={"method": "draft_model", "draft_model": "llama-3.1-8b", **SPEC}), "vllm@0.4.0",
     "vllm@0.4.1"),  # --speculative-model (#3706, merged 2024-04-03)
]


@pytest.mark.parametrize("kw, before, first", BOUNDARIES)
def test_refused_before_the_first_release_and_accepted_on_it(kw, before, first):
    with pytest.raises(ConfigError) as err:
        resolve(before, **kw)
    field = next(iter(kw))
    assert str(err.value).startswith(field) and before.split(":")[0] in str(err.value)
    resolve(first, **kw)  # no error
    resolve("vllm", **kw)  # the current release takes everything it took before


def test_int8_kv_is_no_vllm_choice_in_any_release_the_current_one_included():
    """No vLLM release read has a plain int8 KV cache (vllm/config/cache.py CacheDType, 0.4.2 to the current main):
    refused in one line naming the field and the value, the current release too (it was taken before 2026-12-07)."""
    for engine in ("vllm@0.4.2", "vllm@0.6.6", "vllm@0.8.5", "vllm@0.10.0", "vllm@0.11", "vllm@0.33", "vllm"):
        with pytest.raises(ConfigError, match="kv_cache_dtype int8: vllm@") as err:
            resolve(engine, kv_cache_dtype="int8")
        assert "\n" not in str(err.value)
    resolve("vllm@0.4.2", kv_cache_dtype="fp8")  # 0.4.2's choices: auto, fp8
    resolve("vllm", kv_cache_dtype="fp8")


def test_draft_models_left_with_v0s_spec_decode_workers_in_0_10_and_were_still_missing_in_0_13():
    spec = {"method": "draft_model", "draft_model": "llama-3.1-8b", **SPEC}
    for engine in ("vllm@0.10.0", "vllm@0.10.2:v0", "vllm@0.11", "vllm@0.13.0"):  # #21152, #22047, #31883
        with pytest.raises(ConfigError, match="speculative.method draft_model: vllm@0.1[0-3]"):
            resolve(engine, speculative=spec)
    for engine in ("vllm@0.9.2", "vllm@0.9.2:v0", "vllm@0.14.0", "vllm"):  # 0.9.2 ran it (#22047); #24322 after 0.13
        resolve(engine, speculative=spec)


def test_the_v0_engine_of_a_release_keeps_priority():
    resolve("vllm@0.8.5:v0", policy="priority")


@pytest.mark.parametrize("args, said", [
    (("simulate", "--rate", "1", "-n", "20", "--engine", "vllm@0.6", "--async-scheduling"),
     "async_scheduling true: vllm@0.6.6 has no --async-scheduling (added in 0.10.0, vllm-project/vllm#19970)"),
    (("simulate", "--rate", "1", "-n", "20", "--engine", "vllm@0.4", "--speculative", "eagle3:3", "--acceptance",
      "0.7"), "speculative.method eagle3: vllm@0.4.3 has no --speculative-config"),
    (("simulate", "--rate", "1", "-n", "20", "--engine", "vllm@0.7", "--speculative", "eagle:3", "--acceptance",
      "0.7"), "speculative.method eagle: vllm@0.7.3 has no --speculative-config (added in 0.8.0"),
    (("memory", "--engine", "vllm@0.6.3", "--block-size", "64"), "block_size 64: vllm@0.6.3 has no --block-size 64"),
    (("memory", "--engine", "vllm@0.10.0", "--block-size", "256"), "block_size 256: vllm@0.10.0 has no"),
    (("memory", "--engine", "vllm@0.8", "--kv-dtype", "int8"), "kv_cache_dtype int8: vllm@0.8.5 has no"),
])
def test_the_cli_says_it_in_one_line(args, said):
    r = run_cli(args[0], "-m", "llama-3.1-8b", "-g", "h100-sxm", "--max-model-len", "8192", *args[1:])
    assert r.returncode == 1 and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [
    ("simulate", "--rate", "1", "-n", "20", "--engine", "vllm@0.10.0", "--async-scheduling"),
    ("memory", "--engine", "vllm@0.9.0", "--block-size", "64"),
    ("simulate", "--rate", "1", "-n", "20", "--engine", "vllm@0.8.5", "--speculative", "eagle3:3", "--acceptance",
     "0.7"),
])
def test_the_cli_accepts_it_on_a_release_that_has_it(args):
    r = run_cli(args[0], "-m", "llama-3.1-8b", "-g", "h100-sxm", "--max-model-len", "8192", *args[1:])
    assert r.returncode == 0, r.stderr


def test_the_launch_command_speaks_the_release():
    draft = {"method": "draft_model", "draft_model": "llama-3.1-8b", **SPEC}
    old = command("vllm@0.4.1", speculative=draft)
    assert "--speculative-model " in old and "--num-speculative-tokens 3" in old and "--speculative-config" not in old
    assert "--speculative-config '{\"method\":\"draft_model\"" in command("vllm@0.9.2", speculative=draft)
    # 0.6.3's --enable-prefix-caching is store_true (off by default): no --no-enable-prefix-caching there
    assert "prefix-caching" not in command("vllm@0.6.3")
    assert "--enable-prefix-caching" in command("vllm@0.6.3", enable_prefix_caching=True)
    assert "--no-enable-prefix-caching" in command("vllm")
    # synchronous scheduling needs no flag before --async-scheduling exists; from it, it is spelled out
    assert "async-scheduling" not in command("vllm@0.6", async_scheduling=False)
    assert "--no-async-scheduling" in command("vllm@0.10.0", async_scheduling=False)
    # V1 before 0.8 is opt-in; V0 from 0.8 opts out
    assert command("vllm@0.7.3:v1").startswith("VLLM_USE_V1=1 vllm serve")
    assert command("vllm@0.8.5:v0").startswith("VLLM_USE_V1=0 vllm serve")
    assert command("vllm@0.7.3").startswith("vllm serve")


def test_the_default_command_of_the_current_release_is_unchanged():
    cmd = command("vllm")
    assert cmd.startswith("vllm serve ") and "VLLM_USE_V1" not in cmd
    assert "--no-enable-prefix-caching" in cmd and "--async-scheduling" in cmd  # 0.32+'s GPU default spelled out
