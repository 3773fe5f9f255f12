"""What every batching policy shares: the sequence state it schedules (`Seq`), the step it returns (`Step`),
and the `Scheduler` protocol the simulator talks to. Plain Python, no SimPy, no clock of its own.

A scheduler turns queue state into a step plan (`schedule(now)`), applies a finished step
(`complete(step, end_s)`), and, for the simulator's decode fast path, says how many decode-only steps can run
with nothing else happening (`decode_stretch`) and applies them (`advance_decodes`). The simulator reads
only what the protocol exposes (queue length, running batch, KV blocks in use, its batch cap), never a
policy's configuration or its block pool.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mypy_extensions import mypyc_attr

from capacity.cost.step import StepPlan
from capacity.workload import Request

if TYPE_CHECKING:
    from capacity.sched.kv import KVCacheManager

NAN = float("nan")


@dataclass(slots=True, eq=False)
class Seq:
    """One request as the engine sees it: `computed` tokens have KV in the cache, `generated` outputs are out."""

    req: Request
    computed: int = 0  # tokens whose KV is in the cache (own blocks + shared prefix blocks)
    generated: int = 0  # output tokens emitted so far
    blocks: int = 0  # own KV blocks held (managed by the KV cache manager only)
    shared_blocks: int = 0  # prefix-cache blocks referenced, not owned (KV cache manager only)
    kv_capacity: int = 0  # tokens its blocks hold (set by the KV cache manager; read by schedulers)
    first_scheduled_s: float = NAN
    first_token_s: float = NAN
    last_token_s: float = NAN
    finish_s: float = NAN
    preemptions: int = 0
    replica: int = 0
    prompt: int = 0  # copies of req.prompt_tokens / output_tokens: read in the hot loops
    output: int = 0
    phase: int = 0  # disaggregated serving: 1 in the prefill pool (one output token), 2 in the decode pool
    inflight: int = 0  # async scheduling: tokens of its last step whose output the engine has not processed yet
    loading: int = 0  # disaggregated decode pool: 1 its prompt's KV is to be loaded on admission, 2 it is loading
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission
    spec_credit: float = 0.0  # speculative decoding: accepted draft tokens owed (the fraction of the mean not yet given)

    def __post_init__(self) -> None:
        self.prompt, self.output = self.req.prompt_tokens, self.req.output_tokens

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output

    @property
    def is_decode(self) -> bool:
        return self.generated > 0 and self.prompt + self.generated - self.computed == 1


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
