"""SGLang's configuration: `SglangConfig`, the engine configuration of an `sglang[@X.Y]` scenario. SGLang's own
settings are declared here with `setting(...)` (capacity/engine/settings.py), as SGLang's `ServerArgs`
(python/sglang/srt/server_args.py) names them; the shared ones are `capacity.engine.config.EngineConfig`'s, and another
engine's (vLLM's `max_loras`, `data_parallel_size` ...) are refused when the configuration is read."""
from __future__ import annotations

from typing import ClassVar

from capacity.engine.config import EngineConfig


class SglangConfig(EngineConfig):
    """The settings every engine shares, as SGLang reads them (its own flags: `sglang=` in each declaration)."""

    ENGINE: ClassVar[str] = "sglang"


__all__ = ["SglangConfig"]
