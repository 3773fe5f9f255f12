"""A pinned engine release whose model registry lacks the card's model type is refused in one line
(capacity/engine/served.py, capacity/data/model_releases.yaml). The first releases pinned here are the ones the
engines' own release notes announce (vLLM v0.19.0 "Gemma 4 support", v0.8.4 Qwen3, v0.8.3 Llama 4, v0.6.6
DeepSeek-V3, v0.8.0 Gemma 3) and those read in vLLM's registry.py for the 2026 families (docs/model-families.md,
"Which release serves a model type"), not values read back from the table under test."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capacity.engine import EngineConfig, get_engine
from capacity.engine.served import first_release, table, version_key
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.families.registry import family
from capacity.model.gpus import get_gpu

HF = Path(__file__).parent / "data" / "startup_v4" / "hf"
GEMMA4 = HF / "gemma-4-31b-it.json"


@pytest.mark.parametrize("engine, model_type, first", [
    ("vllm", "gemma4", "0.19.0"), ("vllm", "gemma4_text", "0.19.0"), ("vllm", "qwen3", "0.8.4"),
    ("vllm", "qwen3_moe", "0.8.4"), ("vllm", "llama4", "0.8.3"), ("vllm", "deepseek_v3", "0.6.6"),
    ("vllm", "gemma3", "0.8.0"), ("vllm", "gpt_oss", "0.10.1"), ("vllm", "glm4_moe_lite", "0.15.0"),
    ("vllm", "glm_moe_dsa", "0.16.0"), ("vllm", "kimi_k25", "0.15.0"), ("vllm", "qwen3_5_moe", "0.17.0"),
    ("sglang", "gemma4", "0.5.12"), ("sglang", "glm_moe_dsa", "0.5.9"), ("sglang", "glm4_moe_lite", "0.5.8"),
])
def test_first_release(engine, model_type, first):
    row = first_release(engine, model_type)
    assert row is not None and row.first == first


def test_table_is_consistent():
    for eng, rows in table().items():
        for mt, row in rows.items():
            assert family(mt) is not None, (eng, mt)  # a model type capacity reads
            assert version_key(row.absent_through) < version_key(row.first), (eng, mt)
    assert first_release("vllm", "llama") is None  # served by every release read: never refused
    assert first_release("trtllm", "gemma4") is None  # TensorRT-LLM not read: never refused


def test_version_key():
    assert version_key("0.5.0rc0") < version_key("0.5.0") < version_key("0.5.0.post1") < version_key("0.5.1")
    assert version_key("0.4.10") > version_key("0.4.9.post3")


def _budget(spec: str):
    card = load_model_card(GEMMA4)
    cfg = EngineConfig(engine=spec, tensor_parallel_size=2, max_model_len=8192)
    return get_engine(spec).budget(card, get_gpu("H100"), cfg, check_fit=False)


@pytest.mark.parametrize("spec", ["vllm@0.11", "vllm@0.18", "vllm@0.9.2:v0", "sglang@0.5.10", "sglang@0.4.6"])
def test_gemma4_refused_before_its_release(spec):
    with pytest.raises(ConfigError, match=r"model_type 'gemma4' \(Gemma4ForConditionalGeneration\) is not served"):
        _budget(spec)


@pytest.mark.parametrize("spec", ["vllm@0.19", "vllm", "sglang@0.5.12", "sglang", "sglang@0.5.11"])
def test_gemma4_served_from_its_release(spec):
    # sglang@0.5.11: between the last wheel read without it (0.5.10) and the first with it: not refused
    assert _budget(spec).num_blocks > 0


def test_cli_one_line_exit_1():
    r = subprocess.run([sys.executable, "-m", "capacity.cli", "memory", "--model", str(GEMMA4), "--gpu", "H100",
                        "--engine", "vllm@0.11", "--tp", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "'gemma4'" in lines[0] and "vllm@0.19.0" in lines[0] and "Traceback" not in r.stderr
