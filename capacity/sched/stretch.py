"""The simulator's fast path for vLLM-style continuous batching: k decode-only steps as one event, a mixin that
`ContinuousScheduler` (`continuous.py`, the scheduling rules themselves) inherits. `decode_stretch` says how many
consecutive steps would do nothing but decode every running sequence (no admission, no finish before the last,
no preemption); `advance_decodes` applies them at once, leaving the state k single steps would. Exact against
step by step (tests/test_simulator.py, tests/test_prefix_cache.py, tests/test_disagg.py): it changes when the
simulator looks, not what the engine does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capacity.sched.base import QueueView
from capacity.sched.kv import longest_stretch

if TYPE_CHECKING:
    from capacity.sched.configs import ContinuousConfig
    from capacity.sched.kv import KVCacheManager
    from capacity.sched.seq import Seq


def advance_running(kv: KVCacheManager, running: list[Seq], k: int, end_s: float) -> list[Seq]:
    """k decode steps of every running sequence, the last ending at `end_s`: their KV slots (which the stretch
    checked were free), their counts and last token times; returns those that finished at the k-th step. Shared
    by the vLLM and SGLang schedulers' fast paths."""
    kv.extend_decodes(running, k)
    finished = []
    for s in running:
        s.computed += k
        g = s.generated = s.generated + k
        s.last_token_s = end_s
        if g >= s.output:
            s.finish_s = end_s
            finished.append(s)
    return finished


class DecodeStretches(QueueView):
    """The fast path of ContinuousScheduler (see the module docstring)."""

    cfg: ContinuousConfig
    kv: KVCacheManager
    waiting: Any
    running: list[Seq]
    retiring: list[Seq]
    unprocessed: list[Seq]
    _track_inflight: bool

    def _retire(self) -> None:  # ContinuousScheduler's (a real method, not a TYPE_CHECKING stub: mypyc)
        raise NotImplementedError

    def decode_stretch(self, max_steps: int) -> int:
        """How many consecutive decode-only steps can run with nothing but decodes happening: every running
        sequence decodes, no waiting sequence can be admitted (queue empty or `max_num_seqs` reached), no
        sequence finishes before the last of them, and the KV cache covers every block needed (no
        preemption). 0 means: take a normal step."""
        run = self.running
        if self.cfg.spec_tokens:  # speculative decoding: a step advances a sequence by more than one token
            return 0
        if self.retiring:  # async scheduling: sequences that finished in the last step leave after the next
            # schedule call, which admits nothing with an empty queue and, if the others' next blocks are free
            # already, preempts nothing: they can leave now (not with prefix caching: the free queue's order)
            if self.waiting or self.cfg.prefix_caching:
                return 0
            others = [s for s in run if s.generated < s.output]
            if not others or self.kv.stretch_blocks(others, 1) > self.kv.stretch_capacity():
                return 0
            self._retire()
            run = self.running
        if not run or len(run) > self.cfg.max_num_batched_tokens:
            return 0
        if self.waiting and len(run) < self.cfg.max_num_seqs and not self._admission_blocked():
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
        k = longest_stretch(self.kv, run, k, self.kv.stretch_capacity())
        return k if k >= 2 else 0

    def _admission_blocked(self) -> bool:
        """Whether the head of the queue stays out for a whole decode-only stretch: it cannot be admitted now
        for want of KV blocks (or of token budget next to the decodes), and a stretch cannot change that. The
        budget left beside the decodes stays the same, free blocks only shrink while the batch decodes (nothing
        finishes before the stretch's last step), and the head is the same (a stretch stops at the step during
        which a request arrives). So a KV-limited queue, the usual state of an overloaded engine, need not stop
        the fast path. Without prefix caching only (admitting would reference cached blocks), and not with a
        sliding window (its blocks are freed as the window moves, so free blocks can grow during a stretch)."""
        cfg = self.cfg
        if cfg.prefix_caching or self.kv.frees_while_decoding:
            return False
        seq = self.waiting.peek()
        budget = cfg.max_num_batched_tokens - len(self.running)
        if budget <= 0:
            return True
        remaining = seq.prompt + seq.generated - seq.computed
        kv = self.kv
        if seq.loading:  # a remote prefill takes its whole prompt's blocks, no tokens of the budget
            if cfg.reserve_output:
                return not kv.can_fit(seq, seq.prompt + seq.output - seq.computed)
            return not kv.can_fit(seq, remaining)
        num_new = min(remaining, budget)
        if not cfg.chunked_prefill and num_new < remaining:
            return True
        if cfg.reserve_output:
            return not kv.can_fit(seq, seq.prompt + seq.output - seq.computed)
        if cfg.reserve_full_input:
            return not kv.can_fit(seq, remaining)
        return seq.computed + num_new > seq.kv_capacity and not kv.can_fit(seq, num_new)

    def advance_decodes(self, k: int, end_s: float) -> list[Seq]:
        """Apply k decode-only steps to every running sequence (the last ending at `end_s`); returns the
        sequences that finished at the k-th step. Token times are the simulator's business."""
        kv = self.kv
        finished = advance_running(kv, self.running, k, end_s)
        if self._track_inflight:
            self.unprocessed = list(self.running)
            for s in self.running:
                s.inflight = 1
        if finished:
            if self.cfg.async_scheduling:
                self.retiring.extend(finished)
            else:
                self.running = [s for s in self.running if s.generated < s.output]
                for s in finished:
                    kv.free(s)
        return finished
