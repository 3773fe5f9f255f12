"""Engine models: one object per serving engine that owns its defaults, its start-up memory accounting, its
scheduling behaviour and its launch command (`EngineModel`). vLLM is the first (`vllm.py`, every release from
0.4: `vllm@0.11`; its start-up memory in `vllm_memory.py`); SGLang the second (`sglang.py`: `sglang`,
`sglang@0.4.6`, scheduling of v0.5.5; memory by release in `sglang_memory.py`); TensorRT-LLM the third
(`trtllm.py`: `trtllm`, the PyTorch backend of 1.x, its capacity scheduler's no-evict admission;
`trtllm@0.20`, `trtllm@1.1:tensorrt`: each release's trtllm-serve defaults, `trtllm_release.py`); another engine is a new module
with the same methods and one line in `ENGINES`.

`EngineConfig` (config.py) is the one typed configuration every door uses; `MemoryBudget` (budget.py) the
shape of the memory answer; `memory.py` the questions built on a budget (tables, inverse queries).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from capacity.engine.budget import MemoryBudget, SchedLimits
from capacity.engine.config import EngineConfig, ResolvedEngine
from capacity.engine.sglang import Sglang, parse_release
from capacity.engine.trtllm import Trtllm
from capacity.engine.vllm import Vllm
from capacity.engine.vllm_release import parse_engine, release
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU


class EngineModel(Protocol):
    name: str

    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        """Every knob the configuration leaves to the engine, filled in as the engine would."""

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """The start-up memory accounting: weights, activation peak, non-torch, graphs, KV blocks."""

    def default_max_num_batched_tokens(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> int: ...

    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> Callable[[], object]:
        """A builder of one replica's scheduler (the engine's scheduling rules for this configuration)."""

    def launch_command(self, card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str: ...

    def launch_notes(self, cfg: EngineConfig) -> list[str]: ...

    def step_overhead_s(self, cfg: EngineConfig) -> float:
        """CPU time per engine step that the GPU waits for (scheduling, input preparation, output handling)."""

    def overhead_overlaps(self, cfg: EngineConfig) -> bool:
        """Whether that CPU time runs beside the GPU (a step lasts the longer of the two, capacity.cost.overlap)
        rather than before it (the sum)."""


ENGINES: dict[str, EngineModel] = {"vllm": Vllm(), "sglang": Sglang(), "trtllm": Trtllm()}  # the current release of each engine
_BY_SPEC: dict[str, EngineModel] = {}


def get_engine(spec: str) -> EngineModel:
    """The engine model for `vllm`, `vllm@0.11`, `vllm@0.9.2:v0` (see capacity.engine.vllm_release), `sglang`,
    `sglang@0.4.6` (see capacity.engine.sglang.parse_release)."""
    if spec in ENGINES:
        return ENGINES[spec]
    got = _BY_SPEC.get(spec)
    if got is not None:
        return got
    if spec.startswith("sglang@"):
        try:
            rel = parse_release(spec)
        except ConfigError as exc:
            raise ConfigError(f"unknown engine {spec!r}: {str(exc).split(': ', 1)[-1]}") from None
        sg = Sglang(rel)
        if len(_BY_SPEC) < 256:
            _BY_SPEC[spec] = sg
        return sg
    if spec.startswith("trtllm@") or spec.startswith("trtllm:"):
        from capacity.engine.trtllm_release import parse_trtllm

        trt = Trtllm(parse_trtllm(spec))
        if len(_BY_SPEC) < 256:
            _BY_SPEC[spec] = trt
        return trt
    name, version, runner = parse_engine(spec)
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {spec!r}: use {', '.join(ENGINES)} (optionally with @VERSION)")
    if name != "vllm":
        raise ConfigError(f"engine {spec!r}: {name} has no release versions to choose from")
    model = Vllm(release(version, runner))
    if len(_BY_SPEC) < 256:
        _BY_SPEC[spec] = model
    return model


__all__ = ["ENGINES", "EngineConfig", "EngineModel", "MemoryBudget", "ResolvedEngine", "SchedLimits", "get_engine"]
