"""Questions answered from a memory budget: the budget itself through the configuration's engine model, the
batch x context table, and the inverse queries (smallest gpu_memory_utilization, smallest TP, largest
max_model_len for a target concurrency). The accounting itself is the engine model's
(`capacity.engine.vllm`)."""
from __future__ import annotations

import math

from capacity.engine.budget import TP_CHOICES, MemoryBudget, check_tp, kv_bytes_per_token
from capacity.engine.config import EngineConfig
from capacity.engine.registry import get_engine
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.units import GiB

__all__ = ["TP_CHOICES", "MemoryBudget", "batch_context_table", "budget", "default_batches", "default_contexts",
           "kv_bytes_per_token", "max_model_len_for", "min_gpu_memory_utilization", "min_tp"]


def budget(card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
    """The VRAM budget as the configuration's engine would reserve it at start-up (DoesNotFit when it cannot)."""
    return get_engine(cfg.engine).budget(card, gpu, cfg, check_fit=check_fit)


# ---- tables --------------------------------------------------------------------------------------
def default_batches(max_num_seqs: int) -> list[int]:
    out = [1, 8, 16, 32, 64, 128, 256, 512, 1024]
    return [x for x in out if x <= max_num_seqs] + ([max_num_seqs] if max_num_seqs not in out else [])


def default_contexts(max_model_len: int) -> list[int]:
    out = [1024 * 2**k for k in range(9) if 1024 * 2**k <= max_model_len]
    return out + ([max_model_len] if max_model_len not in out else [])


def batch_context_table(b: MemoryBudget, batches: list[int], contexts: list[int]) -> list[dict]:
    """For each (batch, context): KV GiB needed, fraction of the KV budget, and whether it fits.

    The seeds' estimate (batch x context x kv_bytes_per_token) generalised: paged KV rounds each sequence
    up to whole blocks (a sliding-window group keeps only its window's blocks); contiguous KV reserves
    max_model_len slots per sequence whatever its context. Fits is judged on the blocks the planner uses.
    """
    rows = []
    for batch in batches:
        for ctx in contexts:
            if b.paged_kv:
                need = batch * b.blocks_for(ctx) * b.block_bytes
                fits = b.concurrency_at(ctx) >= batch  # the last one admitted needs its admission reserve
            else:
                need = batch * b.max_model_len * b.kv_bytes_per_token
                fits = need <= b.kv_budget_bytes
            reason = "fits"
            if ctx > b.max_model_len:
                fits, reason = False, "context > max_model_len"
            elif batch > b.max_num_seqs:
                fits, reason = False, "batch > max_num_seqs"
            elif not fits:
                reason = "KV cache full"
            rows.append({"batch": batch, "context": ctx, "kv_bytes": need,
                         "kv_fraction": need / b.kv_budget_bytes if b.kv_budget_bytes > 0 else math.inf,
                         "fits": fits, "reason": reason})
    return rows


# ---- inverse queries -----------------------------------------------------------------------------
def min_gpu_memory_utilization(card: ModelCard, gpu: GPU, cfg: EngineConfig, concurrency: int, context: int) -> float:
    """Smallest gpu_memory_utilization (2 decimals, rounded up) that holds `concurrency` sequences of
    `context` tokens and one request of max_model_len."""
    b = budget(card, gpu, cfg, check_fit=False)
    g = b.kv_groups
    blocks = max((concurrency - 1) * b.blocks_for(context) + g.admission_blocks(context, b.block_size),
                 g.startup_blocks(b.max_model_len, b.block_size))
    kv_need = blocks * b.block_bytes
    # everything but the KV cache, at the end of its range the planner uses
    planned_kv = b.ranges["kv_budget"][0] if b.kv_estimate == "conservative" else b.kv_budget_bytes
    fixed = b.usable_bytes - planned_kv
    util = math.ceil((fixed + kv_need) / b.total_bytes * 100 + 1e-9) / 100
    if util > 1.0:
        longest = (f" and one request of max_model_len {b.max_model_len:,}"
                   if blocks > (concurrency - 1) * b.blocks_for(context) + g.admission_blocks(context, b.block_size)
                   else "")
        raise DoesNotFit(
            f"{concurrency} sequences of {context:,} tokens{longest} need {(fixed + kv_need) / GiB:.1f} GiB per rank "
            f"(weights {b.weights_bytes / GiB:.1f} + KV {kv_need / GiB:.1f} + other {(fixed - b.weights_bytes) / GiB:.1f}),"
            f" more than the {b.total_bytes / GiB:.1f} GiB of {gpu.name} at tp={b.tp}; raise tp"
        )
    return util


def min_tp(card: ModelCard, gpu: GPU, cfg: EngineConfig, concurrency: int, context: int) -> int:
    """Smallest tensor-parallel size whose budget holds `concurrency` sequences of `context` tokens."""
    tried = []
    for tp in TP_CHOICES:
        try:
            check_tp(card, tp)
        except ConfigError:
            continue
        b = budget(card, gpu, cfg.model_copy(update={"tensor_parallel_size": tp}), check_fit=False)
        got = b.concurrency_at(context) if b.num_blocks and b.weights_bytes < b.usable_bytes else 0
        tried.append(f"tp={tp}: {got}")
        if got >= concurrency and b.kv_groups.startup_blocks(b.max_model_len, b.block_size) <= b.planning_blocks:
            return tp
    raise DoesNotFit(f"no tensor-parallel size holds {concurrency} sequences of {context} tokens ({', '.join(tried)})")


def max_model_len_for(card: ModelCard, gpu: GPU, cfg: EngineConfig, concurrency: int) -> int:
    """Largest max_model_len (a multiple of the block size, at most max_position_embeddings) at which
    `concurrency` sequences of that full length fit at once."""
    lo, hi = 0, card.max_position_embeddings
    while lo < hi:  # the budget depends on max_model_len only through engine defaults: bisect
        mid = (lo + hi + 1) // 2
        b = budget(card, gpu, cfg.model_copy(update={"max_model_len": mid}), check_fit=False)
        ok = b.num_blocks > 0 and b.concurrency_at(mid) >= concurrency and b.weights_bytes < b.usable_bytes
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    if lo == 0:
        raise DoesNotFit(f"{concurrency} concurrent sequences do not fit at any max_model_len on {gpu.name}")
    bs = budget(card, gpu, cfg.model_copy(update={"max_model_len": lo}), check_fit=False).block_size
    return lo if lo == card.max_position_embeddings else lo // bs * bs
