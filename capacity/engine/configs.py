"""The engine configuration a scenario holds: `AnyEngineConfig`, pydantic's discriminated union of the engines'
classes (VllmConfig, SglangConfig, TrtllmConfig), the member picked by the engine the `engine` field names
(`sglang@0.4.6` -> SglangConfig; no `engine`: vLLM's). A model field typed with it (a scenario's `engine:`, a fleet's)
reads a YAML mapping into the right class, and a setting of another engine is refused in one line naming it."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Tag, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from capacity.engine.config import EngineConfig, pick
from capacity.engine.sglang.config import SglangConfig
from capacity.engine.trtllm.config import TrtllmConfig
from capacity.engine.vllm.config import VllmConfig


def _engine_of(v: Any) -> str:
    """The tag of a mapping or an instance: the engine its `engine` spec names (vllm where it names none known: the
    vLLM class's `engine` field then says the spec is unknown)."""
    if isinstance(v, EngineConfig):
        return type(v).ENGINE or "vllm"
    spec = v.get("engine", "vllm") if isinstance(v, dict) else "vllm"
    return pick(spec).ENGINE


_TAGS = ("vllm", "sglang", "trtllm")


def _untagged(v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """The union's errors without its tag in the field's path (`engine.max_num_seqz`, not `engine.vllm.max_num_seqz`),
    as the one class before it read them."""
    try:
        return handler(v)
    except ValidationError as exc:
        errors = [{**e, "loc": e["loc"][1:] if e["loc"] and e["loc"][0] in _TAGS else e["loc"]}
                  for e in exc.errors(include_url=False)]
        raise ValidationError.from_exception_data(exc.title, errors) from None  # type: ignore[arg-type]


AnyEngineConfig = Annotated[
    Annotated[VllmConfig, Tag("vllm")] | Annotated[SglangConfig, Tag("sglang")] | Annotated[TrtllmConfig, Tag("trtllm")],
    Discriminator(_engine_of), WrapValidator(_untagged)]



def one_of_the_engines(cfg: EngineConfig) -> VllmConfig | SglangConfig | TrtllmConfig:
    """`cfg` typed as the union (every EngineConfig built is one engine's: `EngineConfig(...)` builds it)."""
    if not isinstance(cfg, (VllmConfig, SglangConfig, TrtllmConfig)):
        raise TypeError(f"{type(cfg).__name__}: not an engine's configuration class")
    return cfg


__all__ = ["AnyEngineConfig", "one_of_the_engines"]
