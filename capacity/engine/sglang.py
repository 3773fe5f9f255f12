"""The same configuration as an SGLang launch command, translated by meaning, not by name.

vLLM's `--gpu-memory-utilization U` bounds everything the engine allocates (weights, activation peak,
non-torch memory, KV cache) to U x total memory. SGLang's `--mem-fraction-static F` is the share of total
memory for weights plus the KV pool only, measured after the weights load; what is left (1 - F) is kept
for activations and CUDA graphs. So F is not U: to give SGLang the KV pool this plan sized, F must hold
weights + that pool + the CUDA context taken before its measurement, and `--max-total-tokens` pins the
pool to the same number of tokens. The other knobs map one to one (`--max-running-requests` =
max_num_seqs, `--context-length` = max_model_len, `--chunked-prefill-size` = max_num_batched_tokens, -1 to
disable chunking). SGLang's radix (prefix) cache is on by default; it is disabled when the plan runs without
prefix caching.

This is a translation of the vLLM plan, not an SGLang engine model: SGLang's own scheduling and memory
accounting are not simulated here (that is a second engine model beside `capacity.engine.vllm`).
"""
from __future__ import annotations

import math

from capacity.engine.budget import MemoryBudget
from capacity.engine.config import EngineConfig
from capacity.model.card import ModelCard

KV_DTYPE = {"auto": "auto", "fp8": "fp8_e4m3", "int8": "auto"}


def mem_fraction_static(b: MemoryBudget, cuda_context_bytes: float) -> float:
    """Share of total memory for weights + the planned KV pool + the context SGLang measures after, rounded up
    to 0.01 (a pool that rounds down would hold fewer tokens than planned)."""
    return math.ceil((b.weights_bytes + b.planning_tokens * b.kv_bytes_per_token + cuda_context_bytes)
                     / b.total_bytes * 100 - 1e-9) / 100


def launch_command(card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str:
    frac = mem_fraction_static(b, cfg.memory_params.cuda_context_bytes)
    parts = [f"python -m sglang.launch_server --model-path {card.hf_id or card.name}", f"--tp {b.tp}",
             f"--max-running-requests {b.max_num_seqs}", f"--context-length {b.max_model_len}",
             f"--mem-fraction-static {frac:.2f}", f"--max-total-tokens {b.planning_tokens}",
             f"--chunked-prefill-size {b.max_num_batched_tokens if cfg.enable_chunked_prefill is not False else -1}",
             f"--kv-cache-dtype {KV_DTYPE[cfg.kv_cache_dtype]}"]
    if not cfg.enable_prefix_caching:
        parts.append("--disable-radix-cache")
    if cfg.enforce_eager:
        parts.append("--disable-cuda-graph")
    if cfg.policy == "priority":
        parts.append("--enable-priority-scheduling")
    return " ".join(parts)
