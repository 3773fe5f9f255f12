"""The memory answer, computed for the surface: what `capacity memory` prints (as JSON or tables). The command
translates its flags into a card, a GPU and an engine configuration and renders what these functions return.

- `memory_answer`: vLLM's (or TensorRT-LLM's) start-up budget (capacity.engine.memory.budget), the batch x
  context table, the longest length's fit problem where the configuration does not fit, and on request the
  inverse questions (smallest utilisation and TP, largest max_model_len, for a concurrency);
- `sglang_memory_answer`: SGLang's start-up memory, from the engine model (`Sglang.startup_memory`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capacity.engine import memory as mem
from capacity.engine.budget import MemoryBudget, fit_problem
from capacity.engine.config import EngineConfig
from capacity.engine.registry import get_engine
from capacity.engine.sglang.engine import Sglang
from capacity.engine.sglang.memory import SglangBudget, parse_release
from capacity.errors import CapacityError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU

INVERSE_KEYS = ("min_gpu_memory_utilization", "min_tp", "max_model_len")


@dataclass
class MemoryAnswer:
    budget: MemoryBudget
    table: list[dict]  # capacity.engine.memory.batch_context_table
    inverse: dict[str, Any] | None = None  # the inverse questions' answers (None: not asked); "<key>_why" if none

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (`capacity memory --json`)."""
        b = self.budget
        out: dict[str, Any] = {"fits": b.fits}
        if not b.fits:
            out["reason"] = b.reason
        out.update({"budget": b.as_dict(), "batch_context_table": self.table, "units": "bytes, tokens"})
        if self.inverse:
            out["inverse"] = self.inverse
        return out


def memory_answer(card: ModelCard, gpu: GPU, cfg: EngineConfig, target_concurrency: int | None = None,
                  at_context: int = 4096) -> MemoryAnswer:
    """The budget of `cfg` (fitting or not: the numbers are the answer), its batch x context table, and with
    `target_concurrency` the inverse questions for that many sequences of `at_context` tokens, each answered or
    said impossible with its reason."""
    b = mem.budget(card, gpu, cfg, check_fit=False)
    if not b.fits and b.paged_kv and b.num_blocks > 0 and b.weights_bytes < b.usable_bytes:
        try:  # one answer for the longest length: the inverse solver's, the budget re-derived at each length
            largest = mem.max_model_len_for(card, gpu, cfg, 1)
        except CapacityError:
            largest = 0
        b.reason = fit_problem(b, card, gpu, largest=largest) or b.reason
    table = mem.batch_context_table(b, mem.default_batches(b.max_num_seqs), mem.default_contexts(b.max_model_len))
    inverse: dict[str, Any] | None = None
    if target_concurrency is not None:  # solved whether or not this configuration fits: it says what would
        if target_concurrency <= 0 or at_context <= 0:
            raise CapacityError(f"--target-concurrency and --at-context must be > 0 (got {target_concurrency}, {at_context})")
        inverse = {"concurrency": target_concurrency, "context": at_context}
        for key, fn in (("min_gpu_memory_utilization", lambda: mem.min_gpu_memory_utilization(card, gpu, cfg, target_concurrency, at_context)),
                        ("min_tp", lambda: mem.min_tp(card, gpu, cfg, target_concurrency, at_context)),
                        ("max_model_len", lambda: mem.max_model_len_for(card, gpu, cfg, target_concurrency))):
            try:
                inverse[key] = fn()
            except CapacityError as exc:  # an answer of "impossible" is a result here, shown with its reason
                inverse[key] = None
                inverse[key + "_why"] = str(exc)
    return MemoryAnswer(b, table, inverse)


def sglang_memory_answer(card: ModelCard, gpu: GPU, tp: int, engine: str, *, mem_fraction_static: float | None,
                         context_len: int | None, kv_cache_dtype: str, chunked_prefill_size: int | None,
                         max_running: int | None, dp_attention: int = 1, ep_size: int = 1) -> SglangBudget:
    """SGLang's start-up memory for `engine` (`sglang` or `sglang@X.Y`: the engine model of the release whose rules
    apply; the release is read first so that a bad one is named as SGLang's release parser names it)."""
    parse_release(engine)
    em = get_engine(engine)
    if not isinstance(em, Sglang):
        raise CapacityError(f"engine {engine!r}: not an SGLang engine")
    return em.startup_memory(card, gpu, tp, mem_fraction_static=mem_fraction_static, context_len=context_len,
                             kv_cache_dtype=kv_cache_dtype, chunked_prefill_size=chunked_prefill_size,
                             max_running=max_running, dp_attention=dp_attention, ep_size=ep_size)


def sglang_json(b: SglangBudget) -> dict[str, Any]:
    """The JSON form of SGLang's answer (`capacity memory --engine sglang --json`)."""
    return {"fits": b.fits, "budget": b.as_dict(), "units": "bytes, tokens"}


def sglang_misfit(b: SglangBudget) -> str:
    """Why SGLang's pool cannot start (the budget's own note), for a budget that does not fit."""
    return next(n for n in b.notes if n.startswith(("no KV pool", "the pool holds")))
