"""SGLang's scheduler (capacity.sched.sglang) traced by hand, its fast path against step by step, and the SGLang
engine model through the run pipeline. Every expected number below is worked out from the rules in the module
docstring (SGLang v0.5.5: PrefillAdder, new_token_ratio, the batch-full mark, retract_decode): init ratio 0.7,
min 0.098, decay (0.7 - 0.098) / 600 per decode step, unless a test says otherwise."""
import numpy as np
import pytest

from capacity.cost.step import LinearCost, PrefillChunk, StepPlan
from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError
from capacity.sched import make_scheduler
from capacity.sched.sglang import SglangConfig, SglangScheduler
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Arrivals, Lengths, Request, WorkloadSpec

DECAY = (0.7 - 0.7 * 0.14) / 600


def req(i, prompt, out, t=0.0):
    return Request(i, t, prompt, out)


class Clock:
    """Drives a scheduler one step at a time, one second per step."""

    def __init__(self, s):
        self.s, self.t, self.steps = s, 0.0, []

    def step(self):
        st = self.s.schedule(self.t)
        self.t += 1.0
        self.steps.append(st)
        return st, self.s.complete(st, self.t)


def ids(seqs):
    return [q.req.id for q in seqs]


# ---- admission: the new_token_ratio reservation --------------------------------------------------------------
def test_admission_refused_by_the_ratio_reservation_then_admitted_once_it_decays():
    """Pool 1400. A (100 + 1000 out), B (100 + 101), C (200 + 400), all at t=0.
    Step 1, empty batch: A 1100 < 1400 (offset 1100), B 201 < 300 (offset 1301), C 600 >= 99: refused, the batch is
    marked full. Step 2: the merged prefill batch clears the mark; C is refused again (free 1200, offset
    (999 + 100) x 0.7 = 769.3, 600 >= 430.7) and the mark stays until B finishes at decode 100 (step 101); B is
    filtered out at the next decode (step 102, decode 101), and step 103 tries C: free 1400 - A's 201 = 1199,
    offset A's 898 left x (0.7 - 101 x decay) = 537.6, 600 < 661.4: admitted. At 0.7 the offset would be 628.6 and
    600 >= 570.4: refused."""
    s = SglangScheduler(SglangConfig(max_total_tokens=1400))
    a, b, c = s.add(req(0, 100, 1000)), s.add(req(1, 100, 101)), s.add(req(2, 200, 400))
    clk = Clock(s)
    st, _ = clk.step()
    assert st.plan == StepPlan((PrefillChunk(100, 0, True), PrefillChunk(100, 0, True)))
    assert ids(s.waiting) == [2] and not s.batch_full  # the prefill batch became the running batch
    st, _ = clk.step()
    assert st.plan == StepPlan((), (100, 100)) and s.batch_full and s.new_token_ratio == pytest.approx(0.7 - DECAY)
    for _ in range(99):
        st, (_, done) = clk.step()
        assert not st.plan.prefills
    assert done == [b] and len(clk.steps) == 101 and s.batch_full
    st, _ = clk.step()  # decode 101: B leaves the running batch now, which clears the mark
    assert st.plan == StepPlan((), (200,)) and not s.batch_full
    assert s.new_token_ratio == pytest.approx(0.7 - 101 * DECAY)
    st, _ = clk.step()
    assert st.plan == StepPlan((PrefillChunk(200, 0, True),)) and c.first_scheduled_s == 102.0
    assert ids(s.running) == [0, 2] and a.generated == 102

    # the same run with a ratio that never decays (min = init): C waits until A is done
    s = SglangScheduler(SglangConfig(max_total_tokens=1400, min_new_token_ratio_factor=1.0))
    a, b, c = s.add(req(0, 100, 1000)), s.add(req(1, 100, 101)), s.add(req(2, 200, 400))
    clk = Clock(s)
    while a.finish_s != a.finish_s:
        st, _ = clk.step()
        assert c.first_scheduled_s != c.first_scheduled_s  # NaN: not admitted while A runs
    assert a.finish_s == 1000.0
    st, _ = clk.step()  # the next round finds nothing to decode (idle: ratio reset), then admits C
    assert st.plan == StepPlan((PrefillChunk(200, 0, True),))


def test_max_running_requests_marks_the_batch_full():
    s = SglangScheduler(SglangConfig(max_total_tokens=1000, max_running_requests=2))
    for i in range(3):
        s.add(req(i, 10, 5))
    clk = Clock(s)
    st, _ = clk.step()
    assert len(st.plan.prefills) == 2 and ids(s.waiting) == [2]
    st, _ = clk.step()  # 2 running of 2: no prefill, the batch is marked full
    assert st.plan == StepPlan((), (10, 10)) and s.batch_full


# ---- chunked prefill; prefill and decode never share a step ---------------------------------------------------
def test_chunked_prefill_of_a_long_prompt_runs_its_chunks_back_to_back():
    """chunked_prefill_size 64. A (150 + 3) is cut at 64 and becomes the chunked request; B (20 + 2) waits: the
    chunk budget is spent (trunc_len 0: OTHER). Step 2: A's second chunk of 64, B still out. Step 3: A's last 22
    tokens (22 + 3 out to the offset, chunk budget 42 left), then B's 20 fit: both emit. Then one decode of both."""
    s = SglangScheduler(SglangConfig(max_total_tokens=1000, chunked_prefill_size=64))
    a, b = s.add(req(0, 150, 3)), s.add(req(1, 20, 2))
    clk = Clock(s)
    st, (emitted, _) = clk.step()
    assert st.plan == StepPlan((PrefillChunk(64, 0, False),)) and emitted == [] and s.chunked is a
    assert ids(s.waiting) == [1] and not s.running
    st, (emitted, _) = clk.step()
    assert st.plan == StepPlan((PrefillChunk(64, 64, False),)) and emitted == []
    st, (emitted, _) = clk.step()
    assert st.plan == StepPlan((PrefillChunk(22, 128, True), PrefillChunk(20, 0, True)))
    assert emitted == [a, b] and s.chunked is None and ids(s.running) == [0, 1] and a.first_token_s == 3.0
    st, (_, done) = clk.step()
    assert st.plan == StepPlan((), (150, 20)) and done == [b]
    assert s.kv.num_used_blocks == 151  # A's 150 + its second output; B's 21 freed


def test_prefill_and_decode_are_separate_steps():
    """A decodes; B arrives: the next step is B's prefill alone (A does not advance, the ratio does not decay),
    then one decode step of both."""
    s = SglangScheduler(SglangConfig(max_total_tokens=1000))
    a = s.add(req(0, 10, 5))
    clk = Clock(s)
    clk.step()
    st, _ = clk.step()
    assert st.plan == StepPlan((), (10,)) and a.generated == 2 and s.ratio_steps == 1
    b = s.add(req(1, 8, 3, t=2.0))
    st, (emitted, _) = clk.step()
    assert st.plan == StepPlan((PrefillChunk(8, 0, True),)) and emitted == [b]
    assert a.generated == 2 and s.ratio_steps == 1
    st, _ = clk.step()
    assert st.plan == StepPlan((), (11, 8)) and s.ratio_steps == 2 and a.generated == 3 and b.generated == 2


# ---- retraction ---------------------------------------------------------------------------------------------
def test_retraction_takes_the_fewest_outputs_longest_prompt_and_resets_the_ratio():
    """schedule_conservativeness 0.3 (ratio 0.21, min 0.0294: it over-admits enough to run out), pool 110.
    A (10 + 80) alone, two decodes (ratio 0.21 - 2 x 0.000301). C (12 + 30) and D (8 + 30) arrive: free 98,
    offset 77 x 0.209398 = 16.1; C 42 < 81.9 (offset 58.1), D 38 < 39.9: both. E (40 + 20) then finds offset
    (77 + 29 + 29) x 0.209398 = 28.3, 60 >= 49.7: refused, the batch marked full. Each decode takes 3 slots of
    the 78 free: after 26 decodes none is left, and decode 27 retracts. Sorted by (outputs, -prompt) descending:
    A (29, -10), D (27, -8), C (27, -12): C, the last, goes (38 slots free, enough for A and D), to the back of
    the queue behind E; new ratio (29 + 27 + 20 x 2) / (80 + 30 + 1) = 96/111."""
    s = SglangScheduler(SglangConfig(max_total_tokens=110, schedule_conservativeness=0.3))
    decay = (0.21 - 0.21 * 0.14) / 600
    a = s.add(req(0, 10, 80))
    clk = Clock(s)
    for _ in range(3):
        clk.step()
    assert a.generated == 3 and s.new_token_ratio == pytest.approx(0.21 - 2 * decay)
    c, d = s.add(req(1, 12, 30)), s.add(req(2, 8, 30))
    st, _ = clk.step()
    assert st.plan == StepPlan((PrefillChunk(12, 0, True), PrefillChunk(8, 0, True)))
    e = s.add(req(3, 40, 20))
    st, _ = clk.step()
    assert st.plan.prefills == () and s.batch_full and ids(s.waiting) == [3]
    for _ in range(25):
        st, _ = clk.step()
        assert not st.preempted
    assert s.kv.num_free_blocks == 0 and (a.generated, c.generated, d.generated) == (29, 27, 27)
    st, _ = clk.step()
    assert st.preempted == [c] and c.computed == 0 and c.generated == 27 and c.preemptions == 1
    assert st.plan == StepPlan((), (38, 34)) and ids(s.running) == [0, 2]  # SGLang keeps the sorted order
    assert ids(s.waiting) == [3, 1] and s.num_preemptions == 1
    assert s.new_token_ratio == 96 / 111 and not s.batch_full
    st, _ = clk.step()  # E then C are refused at the new ratio (free 36, offset (50 + 2) x 96/111 = 45)
    assert st.plan == StepPlan((), (39, 35)) and s.batch_full
    assert s.new_token_ratio == pytest.approx(96 / 111 - decay)
    # D finishes at step 33; E (60 >= 69 - 48 x 0.864 = 27.5) and C wait for A (step 81); the next round finds
    # nothing to decode (idle: ratio back to 0.21) and takes E, then C, which recomputes its 12 + 27 tokens
    while a.finish_s != a.finish_s:
        st, _ = clk.step()
        assert not st.plan.prefills
    assert a.finish_s == 81.0 and d.finish_s == 33.0
    st, (emitted, _) = clk.step()
    assert st.plan == StepPlan((PrefillChunk(40, 0, True), PrefillChunk(39, 0, True)))
    assert emitted == [e, c] and c.generated == 28 and s.new_token_ratio == 0.21


def test_overlap_a_retracted_requests_dropped_token_is_counted_once():
    """Overlap scheduler, pool 60, schedule_conservativeness 0.3 (ratio 0.21); A, B, C (10 + 30) at t=0.
    Step 0: A 40 < 60 is admitted (offset 40), B 40 >= 20 refused. Step 1, decided before A's token is processed
    (SGLang sees 0 outputs): free 50, offset 30 x 0.21 = 6.3, B 40 < 43.7 admitted, C refused. Steps 2-21 decode
    both (2 slots a step: 40 - 40 = 0 free after step 21). Step 22 must retract: SGLang sees 20 outputs each
    (step 21's unprocessed), equal prompts: the stable sort keeps [A, B] and B, the last, goes; its KV but the slot
    step 21 wrote is freed (10 + 20 - 1 = 29), A decodes (28), then step 21 is processed: B's token dropped
    (21 -> 20 outputs), that slot freed (29). A finishes in step 30 (reported by its complete(), finish_s 31.0:
    the next decode fits, so no retraction can take it back). C, ahead of B in the queue, runs in steps 32-61
    (its extra decode in 62); B re-prefills 10 + 20 tokens in step 63 and samples its 21st token again: emitted
    once in all, so the emitted tokens sum to 3 x 30 = 90 (91 if counted again); B finishes in step 72."""
    s = SglangScheduler(SglangConfig(max_total_tokens=60, schedule_conservativeness=0.3, overlap_schedule=True))
    a, b, c = s.add(req(0, 10, 30)), s.add(req(1, 10, 30)), s.add(req(2, 10, 30))
    clk = Clock(s)
    emitted, reported = [], {}
    while s.has_work:
        st, (em, done) = clk.step()
        emitted.append(ids(em))
        for q in done:
            reported[q.req.id] = (len(clk.steps) - 1, q.finish_s)
        if len(clk.steps) == 22:
            assert emitted[21] == [0, 1] and b.generated == 21 and s.kv.num_free_blocks == 0
        if len(clk.steps) == 23:
            assert st.preempted == [b] and b.generated == 20 and s.kv.num_free_blocks == 29
    assert [st.plan.prefills for st in clk.steps[:2]] == [(PrefillChunk(10, 0, True),)] * 2
    assert clk.steps[1].scheduled == [(b, 10)] and clk.steps[32].scheduled == [(c, 10)]
    assert clk.steps[63].plan == StepPlan((PrefillChunk(30, 0, True),)) and emitted[63] == []
    assert (a.finish_s, b.finish_s, c.finish_s) == (31.0, 73.0, 62.0) and b.preemptions == 1
    assert reported == {0: (30, 31.0), 2: (61, 62.0), 1: (72, 73.0)}  # each next decode fits: reported at once
    assert sum(map(len, emitted)) == 90


def test_idle_resets_the_ratio():
    s = SglangScheduler(SglangConfig(max_total_tokens=1000))
    s.add(req(0, 10, 50))
    clk = Clock(s)
    for _ in range(20):
        clk.step()
    assert s.ratio_steps == 19 and s.new_token_ratio < 0.7
    while s.has_work:
        clk.step()
    assert s.new_token_ratio == 0.7 and s.kv.num_used_blocks == 0


def test_requests_sglang_would_cut_are_refused():
    s = SglangScheduler(SglangConfig(max_total_tokens=1000, context_len=512))  # max_req_len = 511
    assert s.admissible(req(0, 100, 410)) is None  # 510 = max_req_len - 1
    assert "would cut its output" in s.admissible(req(0, 100, 411))
    assert "refuses inputs" in s.admissible(req(0, 506, 1))


# ---- the fast path is exact ------------------------------------------------------------------------------------
def test_advance_decodes_equals_single_steps_ratio_included():
    def state():
        s = SglangScheduler(SglangConfig(max_total_tokens=5000))
        for i in range(4):
            s.add(req(i, 20 + i, 300 + 10 * i))
        clk = Clock(s)
        for _ in range(3):
            clk.step()
        return s, clk

    fast, fc = state()
    slow, sc = state()
    k = fast.decode_stretch(1000)
    assert k == 297  # the first finish
    fast.advance_decodes(k, 300.0)
    for _ in range(k):
        sc.step()
    assert fast.new_token_ratio == slow.new_token_ratio and fast.ratio_steps == slow.ratio_steps == 299
    assert [(q.computed, q.generated) for q in fast.running] == [(q.computed, q.generated) for q in slow.running]
    assert fast.kv.num_used_blocks == slow.kv.num_used_blocks


def test_no_stretch_while_a_prefill_is_due():
    s = SglangScheduler(SglangConfig(max_total_tokens=5000))
    s.add(req(0, 20, 100))
    clk = Clock(s)
    clk.step()
    assert s.decode_stretch(1000) == 99
    s.add(req(1, 20, 100))  # waiting, batch not marked full: the next round tries a prefill
    assert s.decode_stretch(1000) == 0


COST = LinearCost(fixed_s=0.01, per_token_s=2e-4, per_key_s=1e-6, per_seq_s=1e-4)


@pytest.mark.parametrize("name, arrivals, pool, chunk, page, retracts", [
    ("overloaded", Arrivals(kind="poisson", rate_per_s=40.0), 3000, 256, 1, True),
    ("overloaded closed loop", Arrivals(kind="closed", users=24), 2500, 128, 1, True),
    ("overloaded, pages of 16, no chunking", Arrivals(kind="closed", users=30), 3200, None, 16, True),
    ("light", Arrivals(kind="poisson", rate_per_s=0.5), 20000, 512, 1, False),
])
@pytest.mark.parametrize("overlap", [False, True])
def test_fast_path_equals_step_by_step(name, arrivals, pool, chunk, page, retracts, overlap):
    """Decode stretches (decode_stretch / advance_decodes) give the step-by-step run, retractions included, with
    SGLang's overlap scheduler off and on."""
    spec = WorkloadSpec(arrivals=arrivals, input_len=Lengths(kind="uniform", low=16, high=700),
                        output_len=Lengths(kind="uniform", low=1, high=300), num_requests=300)
    runs = []
    for fast in (True, False):
        res = simulate(spec, COST, lambda: make_scheduler("sglang", max_total_tokens=pool, chunked_prefill_size=chunk,
                                                          page_size=page, max_running_requests=64,
                                                          overlap_schedule=overlap),
                       np.random.default_rng(3), SimConfig(fast_forward=fast, saturation_queue=10_000))
        runs.append(res)
    fast, slow = runs
    assert not fast.rejected and np.isfinite(fast.records.finish).all()
    assert (fast.preemptions > 0) == retracts, fast.preemptions
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert fast.events < slow.events / 2  # the stretches do run
    np.testing.assert_array_equal(fast.records.preemptions, slow.records.preemptions)
    for attr in ("arrival", "first_scheduled", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)
    assert fast.itl_values @ fast.itl_weights == pytest.approx(slow.itl_values @ slow.itl_weights, rel=1e-9)


def test_overlap_simulation_counts_each_output_token_once():
    """The simulator's token count (tokens_total: what complete() and the decode stretches report emitted) equals
    the output tokens of the finished requests under SGLang's overlap scheduler with retractions, fast path on or
    off: the token a retraction dropped is counted once, not again when resampled."""
    from capacity.sim.simulator import Simulation

    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=24), input_len=Lengths(kind="uniform", low=16, high=700),
                        output_len=Lengths(kind="uniform", low=1, high=300), num_requests=300)
    for fast in (True, False):
        sim = Simulation(COST, lambda: make_scheduler("sglang", max_total_tokens=2500, chunked_prefill_size=128,
                                                      max_running_requests=64, overlap_schedule=True),
                         np.random.default_rng(3), SimConfig(fast_forward=fast, saturation_queue=10_000))
        res = sim.run(spec)
        assert res.preemptions > 0 and np.isfinite(res.records.finish).all()
        assert sim.recorder.tokens_total == res.records.output_tokens.sum()


# ---- the engine model --------------------------------------------------------------------------------------
def test_sglang_engine_runs_through_the_pipeline():
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from tests.conftest import ROOT

    card, gpu = load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")
    em = get_engine("sglang")
    assert get_engine("sglang@0.5.5").release == "0.5.5" and get_engine("sglang@0.4.6").release == "0.4.6"
    cfg = EngineConfig(engine="sglang", max_model_len=4096)
    b = em.budget(card, gpu, cfg)
    assert b.engine == "sglang" and b.block_size == 1 and b.max_num_batched_tokens == 8192  # chunk on an H100
    assert b.planning_blocks == b.num_blocks_range[0] < b.num_blocks  # the conservative end (kv_tokens_low)
    # the budget's terms add up to SGLang's pool: total - context - reserve T0 x (1 - F) - weights
    assert b.kv_budget_bytes == pytest.approx(b.usable_bytes - b.non_torch_bytes - b.activation_bytes - b.weights_bytes)
    assert b.num_blocks == int(b.kv_budget_bytes // b.kv_bytes_per_token)
    cmd = em.launch_command(card, cfg, b)
    assert cmd.startswith("python -m sglang.launch_server") and f"--max-total-tokens {b.planning_blocks}" in cmd
    # the newest rules (0.5.20): 0.5.5's reserve plus the prefill graph's 58 x 8 MiB -> 0.828 on the 79.16 GiB H100
    assert "--mem-fraction-static 0.828" in cmd and "--context-length 4096" in cmd

    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=8.0), input_len=Lengths(kind="uniform", low=100,
                        high=2000), output_len=Lengths(kind="uniform", low=16, high=300), num_requests=300)
    res = run(Deployment(card, gpu, cfg), spec, RunOptions(seed=1, ci=False))
    assert not res.sim.saturated and not res.sim.rejected and np.isfinite(res.sim.records.finish).all()
    assert res.budget.engine == "sglang" and any("SGLang modelled" in n for n in res.notes)
    assert 0 < res.summary.ttft_s.stat("p50") < 1 and 0 < res.summary.tpot_s.stat("p50") < 0.1

    with pytest.raises(ConfigError, match="gpu_memory_utilization 0.8: no SGLang meaning"):
        em.budget(card, gpu, cfg.model_copy(update={"gpu_memory_utilization": 0.8}))
    with pytest.raises(ConfigError, match="FCFS"):
        em.scheduler_factory(cfg.model_copy(update={"policy": "priority"}), None)
