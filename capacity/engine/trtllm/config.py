"""TensorRT-LLM's configuration: `TrtllmConfig`, the engine configuration of a `trtllm[@X.Y][:backend]` scenario.
TensorRT-LLM's own settings are declared here with `setting(...)` (capacity/engine/settings.py), as `trtllm-serve`
(tensorrt_llm/commands/serve.py) names them; the shared ones are `capacity.engine.config.EngineConfig`'s, and another
engine's (vLLM's `max_loras`, `data_parallel_size` ...) are refused when the configuration is read."""
from __future__ import annotations

from typing import ClassVar

from capacity.engine.config import EngineConfig


class TrtllmConfig(EngineConfig):
    """The settings every engine shares, as TensorRT-LLM reads them (its own flags: `trtllm=` in each declaration)."""

    ENGINE: ClassVar[str] = "trtllm"


__all__ = ["TrtllmConfig"]
