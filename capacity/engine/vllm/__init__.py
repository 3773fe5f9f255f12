"""vLLM as an engine model: `engine.py` (`Vllm`: defaults, scheduler factory, launch command), `release.py` (what
changes between releases: `release("0.11")`, `parse_engine`), `memory.py` (`VllmMemory`, the start-up memory
accounting), `layout.py` (KV and weight layout per rank: groups, hybrid pages, pipeline stages), `nontorch.py`
(memory outside torch's allocator)."""
from __future__ import annotations

from capacity.engine.vllm.engine import Vllm

__all__ = ["Vllm"]
