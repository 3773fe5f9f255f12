"""CPU work beside the engine that paces it: a server's per-token output handling, overlapped with the GPU.

What the engines' code does: vLLM v1 hands each step's outputs from the engine core process to the API server
process (`vllm/v1/engine/async_llm.py`, read at 00080ee: a background `output_handler` task pulls each step's
`EngineCoreOutputs` and runs `OutputProcessor.process_outputs` on them in chunks of
`VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`, which detokenises every request's new token, builds its output and pushes it to
the request's queue; each request's `generate()` then yields it and the OpenAI server writes one SSE chunk). SGLang
splits the same work between its detokenizer and tokenizer-manager processes. That CPU work runs beside the GPU,
not inside the step, and costs about the same per token per request whatever the model: so at high concurrency
with a small model it, not the GPU, sets the pace. Tokens cannot reach users faster than the server handles them.

The model: a step lasts max(the GPU step, `per_token_s` x the sequences that emit a token in it). Overlapped, so
below the crossover nothing changes; above it the output rate is capped at 1 / `per_token_s` tokens/s and every
step stretches with the batch. (In the real server the engine can run ahead while outputs queue, and frees a
finished request's KV blocks a little earlier; pacing the steps holds them longer: the safe side.)

The figure is the server's, on its CPU: it is not known in advance, so it is 0 (off) unless set
(`EngineConfig.output_cpu_us_per_token`; `docs/fidelity.md` shows NVIDIA NIM's Llama-3.1-8B sweep, whose ITL
grows as 75-82 us x the sequences decoding at 100-250 users).

**The engine's own CPU work, overlapped.** An engine with an overlap scheduler prepares step n+1 on the CPU while
the GPU runs step n. TensorRT-LLM's PyTorch executor (`tensorrt_llm/_torch/pyexecutor/py_executor.py`,
`_executor_loop_overlap`) schedules the next batch and enqueues its forward pass before it processes the previous
batch's outputs, so the GPU has the next step queued while the CPU works. In steady state a step then lasts
max(the GPU step, the CPU's per-step work) instead of their sum. `CpuOverlapCost(inner, per_step_s=...)` is that,
with `inner` the GPU step alone (the engine model says where it applies: `EngineModel.overhead_overlaps`). The CPU's
work can grow with the batch: `per_request_s` x the step's scheduled requests (prefill chunks and decoding sequences)
on top of `per_step_s` (TensorRT-LLM's PyExecutor: capacity/engine/trtllm_host.py). Without the overlap scheduler the
same per-request work comes before the GPU step instead: `HostSerialCost` adds it (`cpu_wrap` picks).
"""
from __future__ import annotations

from capacity.cost.step import StepPlan, decode_run_s


def paced_source(source: str, per_token_s: float) -> str:
    """A step cost's description with the output handling beside it (the same words everywhere)."""
    return f"{source}; output handling {per_token_s * 1e6:g} us/token beside the GPU"


def overlapped_source(source: str, per_step_s: float, per_request_s: float = 0.0) -> str:
    per_req = f" + {per_request_s * 1e6:g} us a scheduled request" if per_request_s else ""
    return f"{source}; engine CPU {per_step_s * 1e3:g} ms a step{per_req} overlapped with the GPU"


def scheduled(plan: StepPlan) -> int:
    """The requests a step schedules: its prefill chunks and its decoding sequences."""
    return len(plan.prefills) + len(plan.decode_contexts)


class CpuOverlapCost:
    """A step cost whose steps last max(the wrapped (GPU) step, `per_step_s`, `per_token_s` x the tokens they emit):
    CPU work that runs beside the GPU (see the module docstring). Everything else is the wrapped cost's."""

    def __init__(self, inner, per_token_s: float = 0.0, per_step_s: float = 0.0, per_request_s: float = 0.0) -> None:
        if (not 0 <= per_token_s < 1 or not 0 <= per_step_s < 1 or not 0 <= per_request_s < 1
                or not per_token_s + per_step_s + per_request_s > 0):
            raise ValueError(f"per_token_s, per_step_s, per_request_s: in [0, 1) s, one of them > 0 (got "
                             f"{per_token_s}, {per_step_s}, {per_request_s})")
        self.inner = inner
        self.per_token_s = per_token_s
        self.per_step_s = per_step_s
        self.per_request_s = per_request_s
        src = getattr(inner, "source", type(inner).__name__)
        if per_step_s or per_request_s:
            src = overlapped_source(src, per_step_s, per_request_s)
        self.source = paced_source(src, per_token_s) if per_token_s else src

    # Not the wrapped cost's closed-form decode line: a paced step is not linear in the step index, so the fast
    # path must use `decode_run_s` (the engine loop reads `decode_line` with getattr and a default of None).
    decode_line = None

    def __getattr__(self, name: str):  # the wrapped cost's other attributes (card, gpu, params, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def with_inner(self, inner) -> CpuOverlapCost:
        """The same CPU terms around another GPU step cost."""
        return CpuOverlapCost(inner, self.per_token_s, self.per_step_s, self.per_request_s)

    def _cpu_s(self, sampled: int, requests: int | None = None) -> float:
        """The CPU's work of a step: max(its loop, fixed + per request, and the output handling per token)."""
        n = sampled if requests is None else requests
        return max(self.per_step_s + self.per_request_s * n, self.per_token_s * sampled)

    def step_s(self, plan: StepPlan) -> float:
        if plan.num_tokens == 0:
            return self.inner.step_s(plan)
        return max(self.inner.step_s(plan), self._cpu_s(plan.num_sampled, scheduled(plan)))

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        b = dict(self.inner.breakdown(plan))
        if plan.num_tokens == 0:
            return b
        gpu = self.inner.step_s(plan)
        loop = self.per_step_s + self.per_request_s * scheduled(plan)
        wait = self._cpu_s(plan.num_sampled, scheduled(plan)) - gpu
        if wait > 0:  # the part of the step the GPU waits for the CPU
            key = "output handling" if self.per_token_s * plan.num_sampled > loop else "overhead"
            b[key] = b.get(key, 0.0) + wait
        return b

    def decode_run_s(self, contexts, k: int):
        import numpy as np

        return np.maximum(decode_run_s(self.inner, contexts, k), self._cpu_s(len(contexts), len(contexts)))


class HostSerialCost:
    """A step cost whose steps last the wrapped step + `per_request_s` x the requests they schedule: the engine's
    per-request CPU work when nothing overlaps it with the GPU (the fixed part is already the wrapped cost's
    overhead). Everything else is the wrapped cost's."""

    def __init__(self, inner, per_request_s: float) -> None:
        if not 0 < per_request_s < 1:
            raise ValueError(f"per_request_s: must be in (0, 1) s (got {per_request_s})")
        self.inner = inner
        self.per_request_s = per_request_s
        self.source = (f"{getattr(inner, 'source', type(inner).__name__)}; engine CPU {per_request_s * 1e6:g} us a "
                       "scheduled request before each step")

    decode_line = None  # not the wrapped cost's closed form: the fast path uses decode_run_s

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def step_s(self, plan: StepPlan) -> float:
        if plan.num_tokens == 0:
            return self.inner.step_s(plan)
        return self.inner.step_s(plan) + self.per_request_s * scheduled(plan)

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        b = dict(self.inner.breakdown(plan))
        if plan.num_tokens:
            b["overhead"] = b.get("overhead", 0.0) + self.per_request_s * scheduled(plan)
        return b

    def decode_run_s(self, contexts, k: int):
        return decode_run_s(self.inner, contexts, k) + self.per_request_s * len(contexts)


def cpu_wrap(cost, per_token_s: float, per_step_s: float, per_request_s: float, overlaps: bool):
    """`cost` with the CPU work beside (or, not overlapped, before) it, as capacity.pipeline.prepare builds it:
    output handling per token and the engine's loop (fixed + per scheduled request) overlapped with the GPU; a
    per-request term without overlap adds to the step. Unchanged when there is nothing to add."""
    if per_request_s and not overlaps:
        cost = HostSerialCost(cost, per_request_s)
        per_request_s = 0.0
    if not (per_step_s or per_token_s or per_request_s):
        return cost
    if not (per_step_s or per_request_s):
        return OutputPacedCost(cost, per_token_s)
    return CpuOverlapCost(cost, per_token_s=per_token_s, per_step_s=per_step_s, per_request_s=per_request_s)


class OutputPacedCost(CpuOverlapCost):
    """A step cost whose steps last at least `per_token_s` x the tokens they emit (see the module docstring)."""

    def __init__(self, inner, per_token_s: float) -> None:
        if not 0 < per_token_s < 1:
            raise ValueError(f"per_token_s: must be in (0, 1) s (got {per_token_s})")
        super().__init__(inner, per_token_s=per_token_s)
