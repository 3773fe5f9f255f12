"""What every batching policy shares: the sequence state it schedules (`Seq`, defined in `capacity.sched.seq`
below the KV cache managers, re-exported here), the step it returns (`Step`), and the `Scheduler` protocol the
simulator talks to. Plain Python, no SimPy, no clock of its own.

A scheduler turns queue state into a step plan (`schedule(now)`), applies a finished step
(`complete(step, end_s)`), and, for the simulator's decode fast path, says how many decode-only steps can run
with nothing else happening (`decode_stretch`) and applies them (`advance_decodes`). The simulator reads
only what the protocol exposes (queue length, running batch, KV blocks in use, its batch cap), never a
policy's configuration or its block pool.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from capacity.cost.step import StepPlan
from capacity.sched.kv import KVCacheManager
from capacity.sched.seq import NAN, Seq
from capacity.workload import Request

__all__ = ["NAN", "QueueView", "Scheduler", "Seq", "Step", "accept_drafts"]  # Seq: capacity.sched.seq's


def accept_drafts(seq: Seq, kv: KVCacheManager, k: int, extra_mean: float) -> int:
    """Speculative decoding, after a decode (verify) step of `seq` that emitted its one sure token: how many of its
    k draft tokens were accepted, applied to its counts (KV computed, outputs). The expected value, not a draw:
    each verify step owes the sequence `extra_mean` = E - 1 accepted drafts (E the mean accepted length, bonus token
    included), paid in whole tokens as the credit reaches them, so over n steps it gets n x E tokens to within
    one, exactly, whatever the seed. (A per-step random draw would add variance that averages out over a request's
    hundreds of steps; the variance that matters, acceptance differing from prompt to prompt, is not a per-step
    draw either.) Capped at the request's remaining outputs and at the KV slots the pool can give (vLLM reserves
    the k lookahead slots when it schedules the step, `allocate_slots(num_lookahead_tokens=...)` in
    vllm/v1/core/sched/scheduler.py; here they are taken after it, and a full pool accepts fewer)."""
    c = seq.spec_credit + extra_mean
    a = int(c)
    seq.spec_credit = c - a
    left = seq.output - seq.generated
    if a > left:
        a = left
    if a > k:
        a = k
    if a <= 0:
        return 0
    if seq.computed + a > seq.kv_capacity and not kv.allocate_slots(seq, a):
        a = seq.kv_capacity - seq.computed
        if a <= 0:
            return 0
    seq.computed += a
    seq.generated += a
    return a


@mypyc_attr(allow_interpreted_subclasses=True)  # SglangScheduler's base (its tests subclass it)
class QueueView:
    """The read-only views every scheduler derives the same way from its waiting queue and its KV cache manager
    (`self.waiting`, `self.kv`)."""

    waiting: Any
    kv: KVCacheManager  # every scheduler's (mypyc: a subclass may not narrow an attribute's type)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used_blocks

    @property
    def kv_blocks_total(self) -> int:
        return self.kv.num_blocks


@dataclass
class Step:
    plan: StepPlan
    scheduled: list[tuple[Seq, int]] = field(default_factory=list)  # (sequence, new tokens this step)
    preempted: list[Seq] = field(default_factory=list)
    loads: list[Seq] = field(default_factory=list)  # admitted to load their prompt's KV from a prefill replica
    load_s: float = 0.0  # host-memory KV loads the step waits for (capacity.sched.offload), s


class Scheduler(Protocol):
    """The interface between a batching policy and the simulator (see module docstring)."""

    num_preemptions: int

    @property
    def running(self) -> list[Seq]:
        """The sequences in the current batch, in scheduling order (read-only here: static batching's is its batch)."""

    def admissible(self, req: Request) -> str | None:
        """Why this request can never run here (too long, needs more KV than exists), or None."""

    def add(self, req: Request) -> Seq: ...

    def schedule(self, now: float) -> Step | float:
        """The next step, or (a batching window still open) the time at which to look again."""

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        """Apply a step that ended at `end_s`: (sequences that emitted a token, sequences that finished)."""

    def decode_stretch(self, max_steps: int) -> int: ...

    def advance_decodes(self, k: int, end_s: float) -> list[Seq]: ...

    @property
    def has_work(self) -> bool: ...

    @property
    def outstanding(self) -> int:
        """Requests here that have not finished (running + waiting): what a least-outstanding router compares."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def max_running(self) -> int:
        """The batch cap (max_num_seqs, or the static batch size)."""

    @property
    def kv_blocks_used(self) -> int: ...

    @property
    def kv_blocks_total(self) -> int: ...
