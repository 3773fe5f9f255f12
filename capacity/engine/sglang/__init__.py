"""SGLang as an engine model: `engine.py` (`Sglang`: defaults, scheduler factory, launch command, and the vLLM
plan's translation into an SGLang command), `memory.py` (`SglangMemory`, `sglang_budget`: the start-up memory
accounting and each release's defaults), `mm.py` (the multimodal runners' memory factor)."""
from __future__ import annotations

from capacity.engine.sglang.engine import Sglang

__all__ = ["Sglang"]
