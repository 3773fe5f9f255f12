"""Batching policies traced by hand: fake requests, a transparent linear step cost, no model, no SimPy in the
policy itself. Every expected number below was worked out on paper from the rules in scheduler.py's
docstring (step time = 1.0 s + 0.1 s per new token)."""
import math

import numpy as np
import pytest

from capacity.cost.step import LinearCost, PrefillChunk, StepPlan
from capacity.errors import ConfigError
from capacity.sched import ContinuousConfig, ContinuousScheduler, StaticConfig, make_scheduler
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Request

COST = LinearCost(fixed_s=1.0, per_token_s=0.1)


def req(i, prompt, out, t=0.0, prio=0, group=-1, prefix=0):
    return Request(i, t, prompt, out, 0, prio, group, prefix)


def run(reqs, policy="continuous", fast=True, **kw):
    res = simulate(reqs, COST, lambda: make_scheduler(policy, **kw), np.random.default_rng(0),
                   SimConfig(fast_forward=fast))
    return res, {int(i): k for k, i in enumerate(res.records.arrival.argsort(kind="stable"))}


def test_continuous_chunked_prefill_trace():
    s = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, max_num_batched_tokens=8, block_size=4, num_blocks=100))
    a, b, c = (s.add(req(0, 6, 3)), s.add(req(1, 5, 2)), s.add(req(2, 2, 1)))
    st = s.schedule(0.0)
    # A's whole prompt (6) and the first 2 tokens of B's fill the 8-token budget; C waits (max_num_seqs=2)
    assert st.plan == StepPlan((PrefillChunk(6, 0, True), PrefillChunk(2, 0, False)))
    emitted, done = s.complete(st, 1.8)
    assert emitted == [a] and done == [] and a.first_token_s == 1.8 and b.computed == 2
    st = s.schedule(1.8)
    # running first: A decodes at context 6, then B's remaining 3 prompt tokens
    assert st.plan == StepPlan((PrefillChunk(3, 2, True),), (6,))
    s.complete(st, 3.2)
    st = s.schedule(3.2)
    assert st.plan == StepPlan((), (7, 5))
    emitted, done = s.complete(st, 4.4)
    assert set(map(id, done)) == {id(a), id(b)}
    st = s.schedule(4.4)
    assert st.plan == StepPlan((PrefillChunk(2, 0, True),)) and c.first_scheduled_s == 4.4
    s.complete(st, 5.6)
    assert c.finish_s == 5.6 and not s.has_work and s.kv_blocks_used == 0


def test_same_trace_through_the_simulator():
    res, _ = run([req(0, 6, 3), req(1, 5, 2), req(2, 2, 1)], max_num_seqs=2, max_num_batched_tokens=8,
                 block_size=4, num_blocks=100)
    r = res.records
    assert r.first_token == pytest.approx([1.8, 3.2, 5.6])
    assert r.finish == pytest.approx([4.4, 4.4, 5.6])
    assert r.first_scheduled == pytest.approx([0.0, 0.0, 4.4])
    # ITL: A's gaps 1.4 (3.2-1.8) and 1.2 (4.4-3.2); B's 1.2 (4.4-3.2)
    assert sorted(np.repeat(res.itl_values, res.itl_weights.astype(int))) == pytest.approx([1.2, 1.2, 1.4])
    assert res.steps == 4


def test_preemption_by_recompute_of_the_newest():
    s = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=100, block_size=2, num_blocks=4))
    a, b = s.add(req(0, 3, 3)), s.add(req(1, 3, 3))
    s.complete(s.schedule(0), 1.6)  # both prefills: 2 blocks each, pool empty
    assert s.kv.num_free_blocks == 0
    s.complete(s.schedule(1.6), 2.8)  # decodes at context 3 fit in the held blocks
    st = s.schedule(2.8)  # A needs a 3rd block: B (newest) is preempted, its 2 blocks freed
    assert st.preempted == [b] and b.computed == 0 and b.preemptions == 1
    assert st.plan == StepPlan((), (4,))  # no admission in a step that preempted
    _, done = s.complete(st, 3.9)
    assert done == [a] and s.kv.num_free_blocks == 4
    st = s.schedule(3.9)  # B recomputes prompt + its 2 outputs = 5 tokens, and samples its 3rd token
    assert st.plan == StepPlan((PrefillChunk(5, 0, True),))
    _, done = s.complete(st, 5.4)
    assert done == [b] and b.finish_s == 5.4


def test_preemption_trace_through_the_simulator_and_itl_includes_the_gap():
    res, _ = run([req(0, 3, 3), req(1, 3, 3)], max_num_seqs=4, max_num_batched_tokens=100, block_size=2,
                 num_blocks=4)
    r = res.records
    assert r.finish == pytest.approx([3.9, 5.4]) and list(r.preemptions) == [0, 1]
    gaps = sorted(np.repeat(res.itl_values, res.itl_weights.astype(int)))
    assert gaps == pytest.approx([1.1, 1.2, 1.2, 2.6])  # A: 1.2, 1.1; B: 1.2, then 2.6 across the preemption


def test_no_chunked_prefill_waits_for_budget():
    s = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=8, chunked_prefill=False))
    s.add(req(0, 6, 2))
    s.add(req(1, 5, 1))
    st = s.schedule(0)
    assert st.plan == StepPlan((PrefillChunk(6, 0, True),))  # B's 5 tokens do not fit in the 2 left
    assert s.admissible(req(2, 9, 1)).startswith("prompt of 9 tokens exceeds max_num_batched_tokens 8")


def test_priority_policy_serves_important_first_and_preempts_the_least_important():
    s = make_scheduler("priority", max_num_seqs=1, max_num_batched_tokens=100)
    s.add(req(0, 4, 1, t=0.0, prio=1))
    s.add(req(1, 4, 1, t=0.4, prio=1))
    s.add(req(2, 4, 1, t=0.5, prio=0))
    order = []
    while s.has_work:
        st = s.schedule(0)
        order += [q.req.id for q, _ in st.scheduled]
        s.complete(st, 0)
    assert order == [2, 0, 1]


def test_prefix_caching_skips_cached_blocks():
    s = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=1000, block_size=4,
                                             num_blocks=100, prefix_caching=True))
    a = s.add(req(0, 20, 1, group=7, prefix=10))
    s.complete(s.schedule(0), 1)  # A computes all 20; its 2 full prefix blocks (8 tokens) join the cache
    assert s.kv.cached_prefix_blocks(7) == 2
    b = s.add(req(1, 30, 1, group=7, prefix=10))
    st = s.schedule(1)
    assert b.computed == 8 and st.plan == StepPlan((PrefillChunk(22, 8, True),))
    s.complete(st, 2)
    # as vLLM: every full block stays cached, evictable when unused: the group's 2, A's own 3 (20 tokens = 5
    # full blocks), B's own 5 (30 tokens = 7 full blocks, 2 of them hits); B's partial 8th block is plain free
    assert s.kv_blocks_used == 10 and s.kv.num_evictable_blocks == 10 and s.kv.num_free_blocks == 90
    assert a.finish_s == 1


def test_static_batching_window_and_batch_to_completion():
    res, _ = run([req(0, 4, 2, t=0.0), req(1, 4, 3, t=0.5), req(2, 4, 1, t=0.6)], policy="static",
                 max_batch=2, max_wait_s=1.0)
    r = res.records
    # A waits for the batch to fill: B arrives at 0.5 -> prefill 8 tokens (1.8 s) -> ends 2.3
    assert r.first_scheduled == pytest.approx([0.5, 0.5, 4.7])
    assert r.first_token == pytest.approx([2.3, 2.3, 4.7 + 1.4])
    # decodes of both rows (1.2 s each): A done at 3.5; B at 4.7 (A's row still computed)
    assert r.finish == pytest.approx([3.5, 4.7, 6.1])


def test_static_window_expires_with_a_partial_batch():
    res, _ = run([req(0, 4, 1, t=0.0)], policy="static", max_batch=8, max_wait_s=0.25)
    assert res.records.first_scheduled == pytest.approx([0.25])
    assert res.records.finish == pytest.approx([0.25 + 1.4])


def test_bad_configs_name_the_field():
    with pytest.raises(ConfigError, match="max_num_seqs: must be > 0"):
        ContinuousConfig(max_num_seqs=0)
    with pytest.raises(ConfigError, match="max_wait_s"):
        StaticConfig(max_wait_s=-1)
    with pytest.raises(ConfigError, match="policy 'fifo'"):
        make_scheduler("fifo")


def test_oversized_request_is_rejected_not_hung():
    res, _ = run([req(0, 50, 10), req(1, 4, 1)], max_model_len=32, num_blocks=100)
    assert res.rejected == [(0, "prompt + output = 60 tokens exceeds max_model_len 32")]
    assert len(res.records) == 1 and not math.isnan(res.records.finish[0])


@pytest.mark.parametrize("reserve", [True, False])
def test_admission_reserves_the_whole_prompt_as_vllm_does(reserve):
    """10 blocks of 4 tokens. A (prompt 20 -> 5 blocks) runs; B's prompt of 24 tokens needs 6 blocks in all
    but only 4 for its first 16-token chunk. With the full-input reserve (vLLM's scheduler_reserve_full_isl)
    B waits for blocks instead of starting a prefill it cannot finish; without it, B starts."""
    s = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=16, block_size=4, num_blocks=10,
                                             reserve_full_input=reserve))
    a = s.add(req(0, 20, 2))
    st = s.schedule(0.0)
    assert st.plan == StepPlan((PrefillChunk(16, 0, False),))  # budget 16: A's first chunk, 4 blocks
    s.complete(st, 1.0)
    s.add(req(1, 24, 2))
    st = s.schedule(1.0)
    # A's last 4 prompt tokens (block 5); 12 budget left; 5 blocks free; B needs 6 for its whole prompt
    if reserve:
        assert st.plan == StepPlan((PrefillChunk(4, 16, True),)) and len(s.waiting) == 1
    else:
        assert st.plan == StepPlan((PrefillChunk(4, 16, True), PrefillChunk(12, 0, False))) and not s.waiting
    assert a.computed == 16


def test_vllm_v1_keeps_block_zero_as_its_null_block():
    """vLLM V1's BlockPool takes block 0 out of the free queue as the null block (vllm/v1/core/block_pool.py,
    0.11-0.19; its get_usage divides by num_gpu_blocks - 1): with "# GPU blocks: 3" and 16-token prompts of one
    block each, V1 runs two at once and the third waits; V0's block manager had no null block and ran three."""
    from capacity.engine import get_engine
    from capacity.engine.budget import SchedLimits
    from capacity.engine.config import EngineConfig
    from capacity.workload import Request

    limits = SchedLimits(max_num_seqs=8, max_num_batched_tokens=256, block_size=16, num_blocks=3, max_model_len=64)
    for spec, running in (("vllm@0.19", 2), ("vllm@0.6.4", 3)):
        eng = get_engine(spec)
        sched = eng.scheduler_factory(EngineConfig(), limits)()
        assert sched.kv_blocks_total == running
        for i in range(3):
            sched.add(Request(i, 0.0, 16, 1))
        out = sched.schedule(0.0)
        assert len(out.scheduled) == running, spec


def test_async_engine_admits_the_queue_at_once_when_the_last_finisher_leaves():
    """Async scheduling: a finished sequence keeps its blocks until after the next decision, so that decision
    cannot admit a queue blocked on KV. vLLM's engine loop, with requests waiting, schedules again at once; the
    simulator must not sleep until the next arrival (here there is none: it would never serve B). By hand, 8
    blocks of 16, 10 ms + 1 ms per token: A (100 in, 2 out) prefills 0 -> 0.110 and decodes -> 0.121 (7
    blocks held); B (100 in, t = 0.001) needs 7, finds 1 until A leaves at 0.121, then prefills 0.121 -> 0.231
    and decodes -> 0.242."""
    cost = LinearCost(fixed_s=0.010, per_token_s=0.001)
    sched = lambda: make_scheduler("continuous", max_num_seqs=4, max_num_batched_tokens=256, block_size=16,
                                   num_blocks=8, async_scheduling=True)
    res = simulate([Request(0, 0.0, 100, 2), Request(1, 0.001, 100, 2)], cost, sched, np.random.default_rng(0),
                   SimConfig())
    assert res.records.first_token == pytest.approx([0.110, 0.231])
    assert res.records.finish == pytest.approx([0.121, 0.242])
