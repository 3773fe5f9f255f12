"""Static batching, the classic server: collect up to `max_batch` requests or wait at most `max_wait_s` for the
first one, prefill them together, decode until every member is done (finished members keep their row: it is
computed and discarded), then take the next batch. Each member reserves KV blocks for its whole prompt +
output when the batch forms (through the KV cache manager), and the batch frees them when it ends.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.cost.step import PrefillChunk, StepPlan
from capacity.errors import ConfigError
from capacity.sched.base import QueueView, Seq, Step
from capacity.sched.kv_factory import make_kv_manager
from capacity.sched.queues import FCFSQueue
from capacity.workload import Request


@dataclass
class StaticConfig:
    max_batch: int = 8
    max_wait_s: float = 0.0  # how long the first waiting request may wait for the batch to fill
    block_size: int = 16
    num_blocks: int = 1 << 20
    max_model_len: int | None = None
    kv_groups: tuple[int, ...] | None = None  # sliding-window layout: (full groups, sliding groups, window blocks[, window])

    def __post_init__(self) -> None:
        if self.max_batch <= 0:
            raise ConfigError(f"max_batch: must be > 0 (got {self.max_batch})")
        if self.max_wait_s < 0 or not math.isfinite(self.max_wait_s):
            raise ConfigError(f"max_wait_s: must be a finite number >= 0 (got {self.max_wait_s})")


class StaticScheduler(QueueView):
    """Collect a batch, run it to completion, repeat (see module docstring)."""

    def __init__(self, cfg: StaticConfig) -> None:
        self.cfg = cfg
        self.waiting = FCFSQueue()
        self.batch: list[Seq] = []
        self.num_preemptions = 0
        self.kv = make_kv_manager(cfg.num_blocks, cfg.block_size, False, cfg.kv_groups)

    @property
    def running(self) -> list[Seq]:
        return self.batch

    @property
    def has_work(self) -> bool:
        return bool(self.batch or self.waiting)

    @property
    def outstanding(self) -> int:
        return len(self.batch) + len(self.waiting)

    @property
    def max_running(self) -> int:
        return self.cfg.max_batch

    def admissible(self, req: Request) -> str | None:
        total = req.prompt_tokens + req.output_tokens
        if self.cfg.max_model_len is not None and total > self.cfg.max_model_len:
            return f"prompt + output = {total} tokens exceeds max_model_len {self.cfg.max_model_len}"
        if self.kv.blocks_for(total) > self.cfg.num_blocks:
            return f"{total} tokens need more KV blocks than the pool's {self.cfg.num_blocks}"
        return None

    def add(self, req: Request) -> Seq:
        seq = Seq(req)
        self.waiting.add(seq)
        return seq

    def schedule(self, now: float) -> Step | float:
        """A step, or the time at which to look again (batch window still open)."""
        if not self.batch:
            if not self.waiting:
                return math.inf
            full = len(self.waiting) >= self.cfg.max_batch
            deadline = self.waiting.peek().req.arrival_s + self.cfg.max_wait_s
            if not full and now < deadline:
                return deadline
            batch: list[Seq] = []
            while self.waiting and len(batch) < self.cfg.max_batch:
                cand = self.waiting.peek()
                if not self.kv.reserve(cand, cand.prompt + cand.output):
                    break
                batch.append(self.waiting.pop())
            if not batch:
                raise ConfigError("static batching: one request's KV reservation exceeds the pool")
            for s in batch:
                s.first_scheduled_s = now
            self.batch = batch
            plan = StepPlan(tuple(PrefillChunk(s.prompt, 0) for s in batch))
            return Step(plan, [(s, s.prompt) for s in batch])
        # decode the whole batch; finished members still occupy a row (computed, discarded)
        plan = StepPlan(decode_contexts=tuple(s.computed for s in self.batch))
        return Step(plan, [(s, 1) for s in self.batch])

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        emitted: list[Seq] = []
        finished: list[Seq] = []
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
            for s in self.batch:
                self.kv.free(s)
            self.batch = []
        return emitted, finished

    def decode_stretch(self, max_steps: int) -> int:
        return 0  # static batches are short-lived; no fast path needed

    def advance_decodes(self, k: int, end_s: float) -> list[Seq]:
        raise AssertionError("static batching has no decode stretches")
