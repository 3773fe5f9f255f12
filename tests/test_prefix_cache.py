"""vLLM's block-level prefix cache (capacity.sched.prefix_cache), by hand and against its own step-by-step use.
The step-by-step rules themselves are checked against vLLM's recorded allocator in test_vllm_scheduler_trace.py."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from capacity.sched.base import Seq
from capacity.sched.prefix_cache import PrefixCachingKVCacheManager
from capacity.workload import Request


def seq(i: int, prompt: int, group: int = -1, prefix: int = 0) -> Seq:
    return Seq(Request(i, 0.0, prompt, 1000, prefix_group=group, prefix_tokens=prefix))


def run_prefill(kv, s: Seq) -> None:
    kv.get_computed_blocks(s)
    assert kv.allocate_slots(s, s.prompt - s.computed)
    s.computed = s.prompt
    s.generated = 1


def test_freed_blocks_stay_cached_and_are_evicted_oldest_first_tail_first():
    """Block size 4, 10 blocks. A (prompt 10: 2 full blocks + 1 partial) and B (prompt 8: 2 full) run and are
    freed, A first. The free queue is then: the partial block at the head (uncached blocks are reused first),
    the 5 never-used blocks, A's full blocks tail first (a1, a0), then B's (b1, b0). Taking 9 blocks evicts
    a1, a0 and b1 in that order: A finds nothing again, B its first block (b0)."""
    kv = PrefixCachingKVCacheManager(10, 4)
    a, b = seq(0, 10), seq(1, 8)
    run_prefill(kv, a)
    run_prefill(kv, b)
    assert kv.num_free_blocks == 5 and kv.num_evictable_blocks == 0
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 6 and kv.num_evictable_blocks == 4
    keys = [kv.key_of(x) for x in kv.free_queue()]
    assert keys == [None] * 6 + [(-1, 0, 1), (-1, 0, 0), (-1, 1, 1), (-1, 1, 0)]
    c = seq(2, 36)
    assert kv.allocate_slots(c, 36)  # 9 blocks: 6 plain, then a1, a0, b1 evicted
    assert kv.num_free_blocks == 0 and kv.num_evictable_blocks == 1
    a2, b2 = seq(0, 10), seq(1, 8)
    kv.get_computed_blocks(a2)
    kv.get_computed_blocks(b2)
    assert a2.computed == 0 and b2.computed == 4


def test_a_request_hits_its_group_then_its_own_blocks_but_recomputes_its_last_token():
    """Block size 4. A of group 7 (prefix 6: one full shared block) computes 12 tokens; B of the same group
    hits block 0 only (block 1 holds A's own tokens 4..7). A preempted and readmitted with 12 + 3 generated
    tokens hits its 3 full blocks (at most (15 - 1) // 4 = 3) and recomputes 3 tokens; with exactly 12 tokens
    it would hit 2 blocks, since the last token is always computed again."""
    kv = PrefixCachingKVCacheManager(20, 4)
    a = seq(0, 12, group=7, prefix=6)
    run_prefill(kv, a)
    assert kv.cached_prefix_blocks(7) == 1
    b = seq(1, 9, group=7, prefix=6)
    kv.get_computed_blocks(b)
    assert b.computed == 4 and b.shared_blocks == 1
    a.generated = 3
    kv.free(a)  # a preemption
    a.computed = 0
    kv.get_computed_blocks(a)
    assert a.computed == 12
    a2 = seq(0, 12, group=7, prefix=6)
    kv.get_computed_blocks(a2)
    assert a2.computed == 8


def test_an_admission_that_fails_touches_nothing():
    """Hits are touched only once the request is admitted: a failed allocation leaves the hit blocks where they
    were in the free queue (vLLM's get_computed_blocks does not touch; allocate_slots does)."""
    kv = PrefixCachingKVCacheManager(6, 4)
    a = seq(0, 8, group=1, prefix=8)
    run_prefill(kv, a)
    kv.free(a)
    before = kv.free_queue()
    b = seq(1, 40, group=1, prefix=8)
    kv.get_computed_blocks(b)
    assert b.computed == 8
    assert not kv.can_fit(b, 32) and not kv.allocate_slots(b, 32)  # needs 8 more blocks, 4 plain + 2 hits free
    kv.drop_computed_blocks(b)
    assert b.computed == 0 and kv.free_queue() == before and kv.num_evictable_blocks == 2


@pytest.mark.parametrize("seed", range(6))
def test_k_decode_slots_at_once_leave_the_state_of_k_single_steps(seed):
    """The fast path's decode_slots(seq, k) for every running sequence, against k rounds of one slot each (the
    order vLLM takes them), from a pool with cached free blocks to evict: the same keys are cached per table
    position, the same keys are evicted, the free queue holds the same keys in the same order."""
    rng = np.random.default_rng(seed)

    def build():
        kv = PrefixCachingKVCacheManager(120, 4)
        old = [seq(100 + i, int(rng.integers(5, 30))) for i in range(6)]
        for s in old:
            run_prefill(kv, s)
        for s in old[::2]:
            kv.free(s)  # cached free blocks: the stretch evicts some of them
        run = [seq(i, int(rng.integers(3, 25)), group=i % 2, prefix=6) for i in range(5)]
        for s in run:
            run_prefill(kv, s)
        return kv, run

    state = rng.bit_generator.state
    fast, run_f = build()
    rng.bit_generator.state = state
    slow, run_s = build()
    k = int(rng.integers(2, 30))
    assert fast.stretch_blocks(run_f, k) <= fast.stretch_capacity()
    for s in run_f:
        assert fast.decode_slots(s, k)
        s.computed += k
        s.generated += k
    for _ in range(k):
        for s in run_s:
            assert slow.allocate_slots(s, 1)
            s.computed += 1
            s.generated += 1

    def snapshot(kv, run):
        return ([[kv.key[b] for b in kv.tables[s]] for s in run], [kv.ncached[s] for s in run],
                [kv.key_of(b) for b in kv.free_queue()], kv.hashed_free, sorted(kv.cache))

    assert snapshot(fast, run_f) == snapshot(slow, run_s)
    for kv, run in ((fast, run_f), (slow, run_s)):
        for s in run:
            kv.free(s)
    assert snapshot(fast, []) == snapshot(slow, [])


@pytest.mark.parametrize("hybrid", [False, True])
def test_k_decode_slots_with_async_scheduling_leave_the_state_of_k_single_steps(hybrid):
    """Async scheduling: each single step is scheduled with the previous step's token in flight (the sliding
    window frees on processed tokens, prefix blocks are cached up to the tokens known), and the previous
    step's output is processed after the schedule call. decode_slots(seq, k) with the manager's one-token lag
    must leave what k such steps leave; without the lag it does not."""
    from capacity.sched.kv import HybridKVCacheManager

    def make(lag):
        kv = HybridKVCacheManager(400, 4, (1, 1, 3, 9)) if hybrid else PrefixCachingKVCacheManager(400, 4)
        kv.lag = lag
        run = [seq(i, p) for i, p in enumerate((13, 22, 7, 30))]
        for s in run:
            assert kv.allocate_slots(s, s.prompt)
            s.computed, s.generated, s.inflight = s.prompt, 1, 1
            kv.cache_processed(s)
        return kv, run

    def state(kv, run):
        if hybrid:
            return [kv.state[s] for s in run], [s.blocks for s in run], kv.num_free_blocks
        return [kv.ncached[s] for s in run], [len(kv.tables[s]) for s in run], kv.num_free_blocks

    k = 11
    slow, run_s = make(1)
    for _ in range(k):
        for s in run_s:
            assert slow.allocate_slots(s, 1)
        for s in run_s:  # the previous step's output processed after the schedule call
            slow.cache_processed(s)
        for s in run_s:
            s.computed += 1
            s.generated += 1
            s.inflight = 1
    for lag, same in ((1, True), (0, False)):
        fast, run_f = make(lag)
        for s in run_f:
            assert fast.decode_slots(s, k)
            s.computed += k
            s.generated += k
        assert (state(fast, run_f) == state(slow, run_s)) is same
def test_the_pool_costs_what_is_in_use_not_its_size():
    """A pool of 100 million blocks is set up in well under a MB (the free queue's never-used blocks are a
    counter, not 100 million entries), and taking 1,000 blocks costs in proportion to them."""
    from capacity.sched.base import Seq
    from capacity.workload import Request

    tracemalloc.start()
    try:
        kv = PrefixCachingKVCacheManager(100_000_000, 16)
        assert kv.num_free_blocks == 100_000_000 and kv.stretch_capacity() == 100_000_000
        s = Seq(Request(0, 0.0, 16_000, 10))
        assert kv.allocate_slots(s, 16_000)
        s.computed = 16_000
        assert kv.num_free_blocks == 100_000_000 - 1000 and kv.num_used_blocks == 1000
        kv.free(s)
        assert kv.num_free_blocks == 100_000_000 - 1000 and kv.num_evictable_blocks == 1000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, peak


