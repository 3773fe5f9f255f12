"""The engine registry: the protocol every engine model implements (`EngineModel`), the current release of each
engine (`ENGINES`) and `get_engine(spec)` for a release spec (`vllm@0.11`, `sglang@0.4.6`, `trtllm@1.1:tensorrt`).
An engine package registers its model and a builder from its specs (`register`, called by capacity/engine/__init__.py
in the order the engines are listed); this module imports no engine, so `EngineConfig` (config.py) can ask it
whether an engine spec is known without an import circle (`register` hands each engine's configuration class
`get_engine`; config.py imports nothing of this module). `name@version:runner` specs of no registered prefix are
read by vLLM's spec parser (capacity.engine.vllm.release.parse_engine), whose release vLLM's builder then reads."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from capacity.engine.budget import MemoryBudget, SchedLimits, SchedulerFactory
from capacity.engine.config import EngineConfig, ResolvedEngine, bind_specs
from capacity.engine.vllm.release import parse_engine
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

    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> SchedulerFactory:
        """A builder of one replica's scheduler (the engine's scheduling rules for this configuration)."""

    def launch_command(self, card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str: ...

    def launch_notes(self, cfg: EngineConfig) -> list[str]: ...

    def step_overhead_s(self, cfg: EngineConfig) -> float:
        """CPU time per engine step that the GPU waits for (scheduling, input preparation, output handling)."""

    def overhead_overlaps(self, cfg: EngineConfig) -> bool:
        """Whether that CPU time runs beside the GPU (a step lasts the longer of the two, capacity.cost.overlap)
        rather than before it (the sum)."""


Build = Callable[[str], EngineModel]  # an engine's spec ("sglang@0.4.6") -> that release's engine model
ENGINES: dict[str, EngineModel] = {}  # the current release of each engine, in the order registered
_BUILD: dict[str, Build] = {}
CONFIGS: dict[str, type[EngineConfig]] = {}  # engine name -> its configuration class
_PREFIXES: dict[str, str] = {}  # spec prefix -> engine name (sglang@, trtllm@, trtllm:)
_BY_SPEC: dict[str, EngineModel] = {}


def register(model: EngineModel, build: Build, config_cls: type[EngineConfig], *prefixes: str) -> None:
    """Add an engine: its current release's model, the builder of a release from a spec, its configuration class
    (`engine/<name>/config.py`: the settings it reads; its `engine` field checks a spec here) and the spec prefixes
    that name it (none: its specs are `name@version:runner`, read by parse_engine)."""
    if config_cls.ENGINE != model.name:
        raise ValueError(f"register: {config_cls.__name__} holds {config_cls.ENGINE!r}'s settings, not {model.name!r}'s")
    ENGINES[model.name] = model
    CONFIGS[model.name] = config_cls
    bind_specs(config_cls, get_engine)
    _BUILD[model.name] = build
    for p in prefixes:
        _PREFIXES[p] = model.name


def get_engine(spec: str) -> EngineModel:
    """The engine model for `vllm`, `vllm@0.11`, `vllm@0.9.2:v0` (see capacity.engine.vllm.release), `sglang`,
    `sglang@0.4.6` (see capacity.engine.sglang.memory.parse_release), `trtllm@1.1:tensorrt`
    (capacity.engine.trtllm.release)."""
    if spec in ENGINES:
        return ENGINES[spec]
    got = _BY_SPEC.get(spec)
    if got is not None:
        return got
    name = next((n for p, n in _PREFIXES.items() if spec.startswith(p)), None)
    if name is None:
        name = parse_engine(spec)[0]
        if name not in ENGINES:
            raise ConfigError(f"unknown engine {spec!r}: use {', '.join(ENGINES)} (optionally with @VERSION)")
        if name != "vllm":
            raise ConfigError(f"engine {spec!r}: {name} has no release versions to choose from")
    model = _BUILD[name](spec)
    if len(_BY_SPEC) < 256:
        _BY_SPEC[spec] = model
    return model


def engine_for(spec: str, card) -> EngineModel:
    """get_engine(spec) as it runs `card`: vLLM's V0 fallback or forced eager mode for the model in that release
    (capacity/engine/vllm/fallback.py); the same model for the other engines."""
    em = get_engine(spec)
    pick = getattr(em, "for_card", None)
    return pick(card) if pick is not None else em


__all__ = ["CONFIGS", "ENGINES", "EngineModel", "engine_for", "get_engine", "register"]
