"""The engine registry: the protocol every engine model implements (`EngineModel`), the current release of each
engine (`ENGINES`) and `get_engine(spec)` for a release spec (`vllm@0.11`, `sglang@0.4.6`, `trtllm@1.1:tensorrt`).
Engine packages import nothing from here; `EngineConfig` (config.py) asks it whether an engine spec is known."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from capacity.engine.budget import MemoryBudget, SchedLimits, SchedulerFactory
from capacity.engine.sglang.engine import Sglang
from capacity.engine.sglang.memory import parse_release
from capacity.engine.trtllm.engine import Trtllm
from capacity.engine.trtllm.release import parse_trtllm
from capacity.engine.vllm.engine import Vllm
from capacity.engine.vllm.release import parse_engine, release
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU

if TYPE_CHECKING:
    from capacity.engine.config import EngineConfig, ResolvedEngine


class EngineModel(Protocol):
    name: str

    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        """Every knob the configuration leaves to the engine, filled in as the engine would."""

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """The start-up memory accounting: weights, activation peak, non-torch, graphs, KV blocks."""

    def default_max_num_batched_tokens(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> int: ...

    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> SchedulerFactory:
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
    """The engine model for `vllm`, `vllm@0.11`, `vllm@0.9.2:v0` (see capacity.engine.vllm.release), `sglang`,
    `sglang@0.4.6` (see capacity.engine.sglang.memory.parse_release)."""
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


__all__ = ["ENGINES", "EngineModel", "get_engine"]
