"""TensorRT-LLM as an engine model: `engine.py` (`Trtllm`: defaults, KV sizing at start-up, scheduler factory,
launch command), `cpp_memory.py` (the engine (C++) backend's start-up memory) and `release.py` (each release's
trtllm-serve defaults, `parse_trtllm`)."""
from __future__ import annotations

from capacity.engine.trtllm.engine import Trtllm

__all__ = ["Trtllm"]
