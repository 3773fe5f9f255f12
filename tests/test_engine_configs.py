"""Issue 50 item 2: each engine owns its configuration. The settings every engine shares sit on EngineConfig, each
engine's own on its class (VllmConfig, SglangConfig, TrtllmConfig in capacity/engine/<name>/config.py); the class is
picked by the engine the `engine` spec names (a scenario's `engine:` is a pydantic discriminated union), and a
setting of another engine is refused when it is read, in one line naming the field and its value."""
from __future__ import annotations

import ast
import re

import pytest

from capacity.engine import SglangConfig, TrtllmConfig, VllmConfig
from capacity.engine.config import DataParallelConfig, EngineConfig, own_settings
from capacity.errors import ConfigError
from capacity.files import read_mapping, validate
from capacity.plan.colocate import Fleet
from capacity.plan.fleetday import DayFleet
from capacity.plan.scenario import Scenario, load_scenario
from tests.conftest import ROOT, run_cli

VLLM_ONLY = ("pipeline_parallel_size", "pp_layer_partition", "enable_expert_parallel",
             "large_gpu_defaults", "cuda_graphs_in_budget", "paged_kv", "max_loras", "max_lora_rank",
             "kv_offloading_size", "host_link_gbps")


@pytest.mark.parametrize("spec, cls", [
    ("vllm", VllmConfig), ("vllm@0.11", VllmConfig), ("vllm@0.9.2:v0", VllmConfig), ("sglang", SglangConfig),
    ("sglang@0.4.6", SglangConfig), ("trtllm", TrtllmConfig), ("trtllm@0.20", TrtllmConfig),
    ("trtllm@1.1:tensorrt", TrtllmConfig),
])
def test_the_engine_spec_picks_the_class(spec, cls):
    assert type(EngineConfig(engine=spec)) is cls
    assert type(EngineConfig.model_validate({"engine": spec})) is cls
    assert type(Scenario.model_validate({"model": "llama-3.1-8b", "engine": {"engine": spec}}).engine) is cls
    assert type(EngineConfig()) is VllmConfig and type(Scenario(model="x").engine) is VllmConfig  # no engine: vLLM


def test_vllm_settings_are_vllm_fields_only():
    """The type says which engine reads a setting: vLLM's own are not fields of the other engines' classes."""
    for name in VLLM_ONLY:
        assert name in VllmConfig.model_fields, name
        assert name not in SglangConfig.model_fields and name not in TrtllmConfig.model_fields, name
        assert name not in EngineConfig.model_fields, name
    shared = set(EngineConfig.model_fields)
    assert shared <= set(SglangConfig.model_fields) and shared <= set(TrtllmConfig.model_fields)
    # data parallelism is vLLM's and SGLang's (DP attention), declared once on the class both derive from
    assert "data_parallel_size" in VllmConfig.model_fields and "data_parallel_size" in SglangConfig.model_fields
    assert "data_parallel_size" not in TrtllmConfig.model_fields and "data_parallel_size" not in EngineConfig.model_fields
    assert issubclass(VllmConfig, DataParallelConfig) and issubclass(SglangConfig, DataParallelConfig)
    assert not issubclass(TrtllmConfig, DataParallelConfig)
    assert "data_parallel_size" in DataParallelConfig.__annotations__  # its one declaration
    assert not {"data_parallel_size"} & (set(VllmConfig.__annotations__) | set(SglangConfig.__annotations__))
    assert "enable_dp_attention" in SglangConfig.model_fields and "enable_dp_attention" not in VllmConfig.model_fields
    assert "trtllm_backend" in TrtllmConfig.model_fields and "trtllm_backend" not in SglangConfig.model_fields


@pytest.mark.parametrize("engine, field, value, whose", [
    ("sglang", "max_loras", 2, "vLLM"), ("trtllm@0.20", "data_parallel_size", 4, "vLLM and SGLang"),
    ("trtllm", "pipeline_parallel_size", 2, "vLLM"), ("trtllm", "paged_kv", False, "vLLM"),
    ("sglang", "kv_offloading_size", 8.0, "vLLM"), ("trtllm:pytorch", "large_gpu_defaults", True, "vLLM"),
    ("vllm@0.11", "enable_dp_attention", True, "SGLang"), ("sglang@0.4.6", "trtllm_backend", "engine", "TensorRT-LLM"),
])
def test_another_engines_setting_is_one_line_naming_it(engine, field, value, whose):
    want = f"{field} {value}: {whose} only (engine {engine} does not have this setting)"
    with pytest.raises(ConfigError) as e:
        validate(EngineConfig, {"engine": engine, field: value}, "engine")
    assert "\n" not in str(e.value) and str(e.value) == f"engine: {want}"
    with pytest.raises(ValueError, match=re.escape(want)):
        EngineConfig(engine=engine, **{field: value})


def test_a_scenario_that_gives_sglang_a_vllm_setting_is_refused_in_one_line(tmp_path):
    sc = tmp_path / "sc.yaml"
    sc.write_text("model: llama-3.1-8b\nengine: {engine: sglang, max_loras: 2}\n")
    r = run_cli("plan", "-m", str(sc))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "engine: max_loras 2: vLLM only (engine sglang does not have this setting)" in r.stderr, r.stderr


def test_error_paths_do_not_show_the_union_tag():
    """A typo reads as it did with one class: `engine.max_num_seqz`, not `engine.vllm.max_num_seqz`."""
    for engine in ("vllm", "sglang", "trtllm"):
        with pytest.raises(ConfigError) as e:
            validate(Scenario, {"model": "x", "engine": {"engine": engine, "max_num_seqz": 64}}, "sc.yaml")
        assert "sc.yaml: engine.max_num_seqz: unknown field (got 64)" == str(e.value)
    with pytest.raises(ConfigError, match=r"engine\.engine: unknown engine 'tgi'"):
        validate(Scenario, {"model": "x", "engine": {"engine": "tgi"}}, "sc.yaml")


def test_a_commands_defaults_for_another_engine_are_not_given():
    """A command passes every option's default (--max-loras 0, --pp 1): for SGLang those are dropped, a value that
    is not the default is kept (and refused when validated)."""
    given = {"engine": "sglang", "max_loras": 0, "pipeline_parallel_size": 1, "tensor_parallel_size": 2}
    assert own_settings(given) == {"engine": "sglang", "tensor_parallel_size": 2}
    assert own_settings({**given, "max_loras": 2})["max_loras"] == 2
    assert own_settings({"max_loras": 0}) == {"max_loras": 0}  # vLLM's own: kept
    ok = run_cli("memory", "-m", "llama-3.1-8b", "--engine", "trtllm", "--json")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("simulate", "-m", "llama-3.1-8b", "--engine", "sglang", "--kv-offload-gb", "8", "--rate", "1",
                  "--requests", "10")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "kv_offloading_size 8.0: vLLM only (engine sglang does not have this setting)" in bad.stderr


def test_the_bundled_scenarios_and_fleets_still_load():
    sc, _card = load_scenario(str(ROOT / "examples/scenario.yaml"), {})
    assert type(sc.engine) is VllmConfig
    for name, cls in (("fleet.yaml", Fleet), ("fleet-day.yaml", DayFleet)):
        f = validate(cls, read_mapping(ROOT / "examples" / name), name)
        assert all(type(m.engine) is VllmConfig for m in f.models)  # type: ignore[attr-defined]


def test_the_config_module_imports_neither_the_registry_nor_an_engine():
    """The circle config <-> registry is gone (a TYPE_CHECKING or function-level import would count)."""
    tree = ast.parse((ROOT / "capacity/engine/config.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and (m.startswith("capacity.engine.registry") or m == "capacity.engine"
                                                 or m.split(".")[:3][-1] in ("vllm", "sglang", "trtllm"))}
    reg = ast.parse((ROOT / "capacity/engine/registry.py").read_text())
    assert not any(isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test) for n in ast.walk(reg))
