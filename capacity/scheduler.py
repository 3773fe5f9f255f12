"""Batching policies: plain Python, no SimPy, no clock of their own. They turn queue state into a step plan.

Continuous batching follows vLLM v1's scheduler: there is no separate prefill phase; every sequence has
`num_tokens` (prompt + outputs so far) and `computed` (tokens whose KV is cached), and a step gives each
scheduled sequence `num_tokens - computed` new tokens (one for a decode), within a token budget
`max_num_batched_tokens` and `max_num_seqs` sequences, running sequences first, then waiting ones (FCFS, or
by (priority, arrival) with the priority policy). A prefill longer than the remaining budget is chunked
(chunked prefill) or waits (without it). KV lives in paged blocks (`block_size` tokens) from a pool of
`num_blocks`; when a running sequence needs a block and none is free, the newest running sequence (with
priority: the least important, then newest) is preempted by recompute: its blocks are freed and it goes back
to the front of the queue with `computed = 0`. A waiting sequence is admitted only when its whole remaining
input fits in free blocks (vLLM 0.32's default `scheduler_reserve_full_isl`), not just its first chunk, and
no sequence is admitted in a step that had to preempt. Optional prefix caching: a shared-prefix group's full blocks,
once computed, are kept (ref-counted, evictable LRU when unused) and skipped by later requests of the group.

Static batching is the classic server: collect up to `max_batch` requests or wait at most `max_wait_s` for
the first one, prefill them together, decode until every member is done (finished members keep their slot:
their rows are computed and discarded), then take the next batch.

`schedule(now)` returns a `Step` (plan + who gets how many tokens) or, for static batching, the time to wake
up; `complete(step, end_s)` applies it and returns the sequences that emitted a token and those that finished.
`decode_stretch(...)` lets the simulator advance k decode-only steps in one event (see simulator.py).
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from capacity.costs import PrefillChunk, StepPlan
from capacity.errors import ConfigError
from capacity.workload import Request

NAN = float("nan")


@dataclass(slots=True, eq=False)
class Seq:
    req: Request
    computed: int = 0  # tokens whose KV is in the cache (own blocks + shared prefix blocks)
    generated: int = 0  # output tokens emitted so far
    blocks: int = 0  # own KV blocks held
    shared_blocks: int = 0  # prefix-cache blocks referenced (not owned)
    first_scheduled_s: float = NAN
    first_token_s: float = NAN
    last_token_s: float = NAN
    finish_s: float = NAN
    preemptions: int = 0
    replica: int = 0
    prompt: int = 0  # copies of req.prompt_tokens / output_tokens: read in the hot loops
    output: int = 0

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


@dataclass
class Step:
    plan: StepPlan
    scheduled: list[tuple[Seq, int]] = field(default_factory=list)
    preempted: list[Seq] = field(default_factory=list)


class BlockPool:
    """Paged KV blocks with an optional prefix cache: group -> cached full blocks, ref-counted."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ConfigError(f"num_blocks and block_size must be > 0 (got {num_blocks}, {block_size})")
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.free = num_blocks
        self.cached: OrderedDict[int, int] = OrderedDict()  # group -> blocks (LRU order)
        self.refs: dict[int, int] = {}

    @property
    def evictable(self) -> int:
        return sum(b for g, b in self.cached.items() if not self.refs.get(g))

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def available(self) -> int:
        return self.free + self.evictable

    def take(self, n: int) -> bool:
        if n <= self.free:
            self.free -= n
            return True
        if n > self.available():
            return False
        for g in list(self.cached):  # evict least recently used unreferenced prefixes
            if self.free >= n:
                break
            if not self.refs.get(g):
                self.free += self.cached.pop(g)
        self.free -= n
        return True

    def give(self, n: int) -> None:
        self.free += n


@dataclass
class ContinuousConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int = 1 << 20
    chunked_prefill: bool = True
    prefix_caching: bool = False
    priority: bool = False  # order waiting by (priority, arrival) and preempt the least important first
    max_model_len: int | None = None
    # Admit a waiting sequence only if its whole remaining input (prompt, plus outputs to recompute after a
    # preemption) fits in free blocks, not just this step's chunk: vLLM's `scheduler_reserve_full_isl`
    # (default on in vLLM 0.32), which keeps chunked prefill from over-admitting and thrashing the cache.
    reserve_full_input: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0 (got {getattr(self, name)})")


class ContinuousScheduler:
    """vLLM-v1-style continuous batching (see module docstring)."""

    def __init__(self, cfg: ContinuousConfig) -> None:
        self.cfg = cfg
        self.pool = BlockPool(cfg.num_blocks, cfg.block_size, cfg.prefix_caching)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.num_preemptions = 0

    # ---- queue ------------------------------------------------------------------------------------
    def admissible(self, req: Request) -> str | None:
        """Why a request can never run (None if it can)."""
        total = req.prompt_tokens + req.output_tokens
        if self.cfg.max_model_len is not None and total > self.cfg.max_model_len:
            return f"prompt + output = {total} tokens exceeds max_model_len {self.cfg.max_model_len}"
        if math.ceil(total / self.cfg.block_size) > self.cfg.num_blocks:
            return f"{total} tokens need more KV blocks than the pool's {self.cfg.num_blocks}"
        if not self.cfg.chunked_prefill and req.prompt_tokens > self.cfg.max_num_batched_tokens:
            return (f"prompt of {req.prompt_tokens} tokens exceeds max_num_batched_tokens "
                    f"{self.cfg.max_num_batched_tokens} without chunked prefill")
        return None

    def add(self, req: Request) -> Seq:
        seq = Seq(req)
        if self.cfg.priority:
            # keep waiting sorted by (priority, arrival); appends are nearly always at the end
            i = len(self.waiting)
            key = (req.priority, req.arrival_s)
            while i > 0 and (self.waiting[i - 1].req.priority, self.waiting[i - 1].req.arrival_s) > key:
                i -= 1
            self.waiting.insert(i, seq)
        else:
            self.waiting.append(seq)
        return seq

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    # ---- blocks -----------------------------------------------------------------------------------
    def _blocks_needed(self, seq: Seq, num_new: int) -> int:
        have = seq.blocks + seq.shared_blocks
        return max(0, math.ceil((seq.computed + num_new) / self.cfg.block_size) - have)

    def _release(self, seq: Seq) -> None:
        self.pool.give(seq.blocks)
        seq.blocks = 0
        g = seq.req.prefix_group
        if seq.shared_blocks and g >= 0:
            self.pool.refs[g] -= 1
        seq.shared_blocks = 0

    def _prefix_hit(self, seq: Seq) -> None:
        """On (re)admission: reference the group's cached prefix blocks and skip their tokens."""
        g = seq.req.prefix_group
        if not self.cfg.prefix_caching or g < 0 or seq.computed:
            return
        cached = self.pool.cached.get(g, 0)
        hit = min(cached, seq.req.prefix_tokens // self.cfg.block_size)
        if hit:
            self.pool.cached.move_to_end(g)
            self.pool.refs[g] = self.pool.refs.get(g, 0) + 1
            seq.shared_blocks = hit
            seq.computed = hit * self.cfg.block_size

    def _publish_prefix(self, seq: Seq) -> None:
        """After computing past its shared prefix, a sequence's full prefix blocks join the group's cache."""
        g = seq.req.prefix_group
        if not self.cfg.prefix_caching or g < 0:
            return
        full = seq.req.prefix_tokens // self.cfg.block_size
        if seq.computed < full * self.cfg.block_size:
            return
        have = self.pool.cached.get(g, 0)
        if full > have and seq.shared_blocks == have:
            moved = full - have  # hand over own blocks holding the rest of the prefix
            moved = min(moved, seq.blocks)
            seq.blocks -= moved
            if not seq.shared_blocks:
                self.pool.refs[g] = self.pool.refs.get(g, 0) + 1
            seq.shared_blocks += moved
            self.pool.cached[g] = have + moved
            self.pool.cached.move_to_end(g)

    def _victim(self) -> Seq:
        if self.cfg.priority:
            return max(self.running, key=lambda s: (s.req.priority, s.req.arrival_s))
        return self.running[-1]

    def _preempt(self, seq: Seq, step: Step) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        if self.cfg.priority:  # keep the priority order
            self.waiting = deque(sorted(self.waiting, key=lambda s: (s.req.priority, s.req.arrival_s)))
        step.preempted.append(seq)

    # ---- one step ---------------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> Step:
        cfg, pool, bs = self.cfg, self.pool, self.cfg.block_size
        budget = cfg.max_num_batched_tokens
        step = Step(StepPlan())
        sched: list[tuple[Seq, int]] = []
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            rem = seq.prompt + seq.generated - seq.computed
            num_new = rem if rem < budget else budget
            if num_new < rem and not cfg.chunked_prefill:
                i += 1
                continue
            while True:
                need = -(-(seq.computed + num_new) // bs) - seq.blocks - seq.shared_blocks
                if need <= 0 or pool.take(need):
                    if need > 0:
                        seq.blocks += need
                    sched.append((seq, num_new))
                    budget -= num_new
                    i += 1
                    break
                victim = self._victim()
                self._preempt(victim, step)
                running = self.running
                if victim is seq:
                    break
        if not step.preempted:  # as vLLM: no admissions in a step that had to preempt
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                seq = self.waiting[0]
                self._prefix_hit(seq)
                remaining = seq.num_tokens - seq.computed
                num_new = min(remaining, budget)
                if not cfg.chunked_prefill and num_new < remaining:
                    break
                need = self._blocks_needed(seq, num_new)
                if cfg.reserve_full_input and self._blocks_needed(seq, remaining) > self.pool.available():
                    ok = False
                else:
                    ok = self.pool.take(need)
                if not ok:
                    if seq.shared_blocks:
                        self._release(seq)
                        seq.computed = 0
                    break
                seq.blocks += need
                self.waiting.popleft()
                self.running.append(seq)
                if seq.first_scheduled_s != seq.first_scheduled_s:  # NaN: first time
                    seq.first_scheduled_s = now
                sched.append((seq, num_new))
                budget -= num_new
        prefills, decodes = [], []
        for seq, n in sched:
            c = seq.computed
            if n == 1 and seq.generated > 0 and seq.prompt + seq.generated - c == 1:
                decodes.append(c)
            else:
                prefills.append(PrefillChunk(n, c, c + n == seq.prompt + seq.generated))
        step.plan = StepPlan(tuple(prefills), tuple(decodes))
        step.scheduled = sched
        return step

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        """Apply a step that ended at `end_s`: returns (sequences that emitted a token, finished ones)."""
        emitted, finished = [], []
        prefix = self.cfg.prefix_caching
        for seq, n in step.scheduled:
            seq.computed += n
            if prefix:
                self._publish_prefix(seq)
            if seq.computed == seq.prompt + seq.generated:
                seq.generated += 1
                if seq.generated == 1:
                    seq.first_token_s = end_s
                seq.last_token_s = end_s
                emitted.append(seq)
                if seq.generated >= seq.output:
                    seq.finish_s = end_s
                    finished.append(seq)
        if finished:
            gone = set(map(id, finished))
            self.running = [s for s in self.running if id(s) not in gone]
            for seq in finished:
                self._release(seq)
        return emitted, finished

    # ---- decode-only stretches (simulator fast path) ------------------------------------------------
    def decode_stretch(self, max_steps: int) -> int:
        """How many consecutive decode-only steps can run with nothing but decodes happening: every running
        sequence decodes, no waiting sequence can be admitted (queue empty or `max_num_seqs` reached), no
        sequence finishes before the last of them, and the pool covers every block needed (no preemption).
        0 means: take a normal step."""
        run = self.running
        if not run or len(run) > self.cfg.max_num_batched_tokens:
            return 0
        if self.waiting and len(run) < self.cfg.max_num_seqs:
            return 0
        k = max_steps
        for s in run:
            if s.generated == 0 or s.prompt + s.generated - s.computed != 1:
                return 0
            left = s.output - s.generated
            if left < k:
                k = left
        if k < 2:
            return 0
        bs = self.cfg.block_size
        avail = self.pool.free if not self.pool.cached else self.pool.available()
        if self._stretch_blocks(k, bs) > avail:  # largest k whose blocks fit (needs grow with k): bisect
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._stretch_blocks(mid, bs) <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        return k if k >= 2 else 0

    def _stretch_blocks(self, k: int, bs: int) -> int:
        need = 0
        for s in self.running:
            n = -(-(s.computed + k) // bs) - s.blocks - s.shared_blocks
            if n > 0:
                need += n
        return need

    def advance_decodes(self, k: int, end_s: float) -> list[Seq]:
        """Apply k decode-only steps to every running sequence (the last ending at `end_s`); returns the
        sequences that finished at the k-th step. Token times are the simulator's business."""
        bs, pool = self.cfg.block_size, self.pool
        finished = []
        for s in self.running:
            need = -(-(s.computed + k) // bs) - s.blocks - s.shared_blocks
            if need > 0:
                if not pool.take(need):  # decode_stretch guaranteed it
                    raise AssertionError("decode stretch ran out of blocks")
                s.blocks += need
            s.computed += k
            s.generated += k
            s.last_token_s = end_s
            if s.generated >= s.output:
                s.finish_s = end_s
                finished.append(s)
        if finished:
            self.running = [s for s in self.running if s.generated < s.output]
            for s in finished:
                self._release(s)
        return finished


@dataclass
class StaticConfig:
    max_batch: int = 8
    max_wait_s: float = 0.0  # how long the first waiting request may wait for the batch to fill
    block_size: int = 16
    num_blocks: int = 1 << 20
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch <= 0:
            raise ConfigError(f"max_batch: must be > 0 (got {self.max_batch})")
        if self.max_wait_s < 0 or not math.isfinite(self.max_wait_s):
            raise ConfigError(f"max_wait_s: must be a finite number >= 0 (got {self.max_wait_s})")


class StaticScheduler:
    """Collect a batch, run it to completion, repeat (see module docstring)."""

    def __init__(self, cfg: StaticConfig) -> None:
        self.cfg = cfg
        self.waiting: deque[Seq] = deque()
        self.batch: list[Seq] = []
        self.num_preemptions = 0
        self.pool = BlockPool(cfg.num_blocks, cfg.block_size)

    def admissible(self, req: Request) -> str | None:
        total = req.prompt_tokens + req.output_tokens
        if self.cfg.max_model_len is not None and total > self.cfg.max_model_len:
            return f"prompt + output = {total} tokens exceeds max_model_len {self.cfg.max_model_len}"
        return None

    def add(self, req: Request) -> Seq:
        seq = Seq(req)
        self.waiting.append(seq)
        return seq

    @property
    def has_work(self) -> bool:
        return bool(self.batch or self.waiting)

    @property
    def outstanding(self) -> int:
        return len(self.batch) + len(self.waiting)

    @property
    def running(self) -> list[Seq]:
        return self.batch

    def _tokens_reserved(self, batch: list[Seq]) -> int:
        return sum(math.ceil((s.req.prompt_tokens + s.req.output_tokens) / self.cfg.block_size) for s in batch)

    def schedule(self, now: float) -> Step | float:
        """A step, or the time at which to look again (batch window still open)."""
        if not self.batch:
            if not self.waiting:
                return math.inf
            full = len(self.waiting) >= self.cfg.max_batch
            deadline = self.waiting[0].req.arrival_s + self.cfg.max_wait_s
            if not full and now < deadline:
                return deadline
            batch = []
            while self.waiting and len(batch) < self.cfg.max_batch:
                cand = self.waiting[0]
                if self._tokens_reserved(batch + [cand]) > self.cfg.num_blocks:
                    break
                batch.append(self.waiting.popleft())
            if not batch:
                raise ConfigError("static batching: one request's KV reservation exceeds the pool")
            for s in batch:
                s.first_scheduled_s = now
            self.batch = batch
            plan = StepPlan(tuple(PrefillChunk(s.req.prompt_tokens, 0) for s in batch))
            return Step(plan, [(s, s.req.prompt_tokens) for s in batch])
        # decode the whole batch; finished members still occupy a row (computed, discarded)
        plan = StepPlan(decode_contexts=tuple(s.computed for s in self.batch))
        return Step(plan, [(s, 1) for s in self.batch])

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        emitted, finished = [], []
        for seq, n in step.scheduled:
            seq.computed += n
            if seq.done:
                continue
            seq.generated += 1
            if seq.generated == 1:
                seq.first_token_s = end_s
            seq.last_token_s = end_s
            emitted.append(seq)
            if seq.done:
                seq.finish_s = end_s
                finished.append(seq)
        if all(s.done for s in self.batch):
            self.batch = []
        return emitted, finished

    def decode_stretch(self, max_steps: int) -> int:
        return 0  # static batches are short-lived; no fast path needed


def make_scheduler(policy: str, **kw):
    """One factory for the policies: continuous | priority | static."""
    if policy == "continuous":
        return ContinuousScheduler(ContinuousConfig(**kw))
    if policy == "priority":
        return ContinuousScheduler(ContinuousConfig(priority=True, **kw))
    if policy == "static":
        return StaticScheduler(StaticConfig(**kw))
    raise ConfigError(f"policy {policy!r}: use continuous, priority or static")
