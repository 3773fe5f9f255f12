"""Engine models: one object per serving engine that owns its defaults, its start-up memory accounting, its
scheduling behaviour and its launch command (`EngineModel`), each engine a package: vLLM the first (`vllm/`: every
release from 0.4, `vllm@0.11`; `engine.py` the model, `release.py` the defaults per release, `memory.py` the
start-up memory, `layout.py` and `nontorch.py` its terms); SGLang the second (`sglang/`: `sglang`, `sglang@0.4.6`,
scheduling of v0.5.5; `memory.py` the memory and defaults by release, `mm.py` the multimodal runners); TensorRT-LLM
the third (`trtllm/`: `trtllm`, the PyTorch backend of 1.x, its capacity scheduler's no-evict admission;
`trtllm@0.20`, `trtllm@1.1:tensorrt`: each release's trtllm-serve defaults in `release.py`). Another engine is a new
package with the same methods, its configuration class (`config.py`) and one `register(...)` line below.

`EngineConfig` (config.py) holds the settings every engine shares, each engine's `config.py` its own
(`VllmConfig`, `SglangConfig`, `TrtllmConfig`; `EngineConfig(engine=...)` builds the one its engine names); `MemoryBudget` (budget.py) the
shape of the memory answer; `memory.py` the questions built on a budget (tables, inverse queries).
"""
from __future__ import annotations

from capacity.engine.budget import MemoryBudget, SchedLimits, SchedulerFactory
from capacity.engine.config import EngineConfig, ResolvedEngine
from capacity.engine.registry import ENGINES, EngineModel, engine_for, get_engine, register
from capacity.engine.sglang.config import SglangConfig
from capacity.engine.sglang.engine import Sglang
from capacity.engine.trtllm.config import TrtllmConfig
from capacity.engine.trtllm.engine import Trtllm
from capacity.engine.vllm.config import VllmConfig
from capacity.engine.vllm.engine import Vllm

register(Vllm(), Vllm.from_spec, VllmConfig)
register(Sglang(), Sglang.from_spec, SglangConfig, "sglang@")
register(Trtllm(), Trtllm.from_spec, TrtllmConfig, "trtllm@", "trtllm:")

__all__ = ["ENGINES", "EngineConfig", "SglangConfig", "TrtllmConfig", "VllmConfig", "EngineModel", "MemoryBudget", "ResolvedEngine", "SchedLimits", "SchedulerFactory",
           "engine_for", "get_engine"]
