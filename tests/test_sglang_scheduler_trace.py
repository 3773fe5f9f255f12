"""capacity's SGLang scheduler against SGLang v0.5.5's own scheduler, step by step.

The traces in tests/data/sglang_scheduler/ were recorded by `bench/sglang_scheduler_trace.py`, which builds SGLang's
`sglang.srt.managers.scheduler.Scheduler` with its own `__init__` and runs the body of its `event_loop_normal`
(no model: a model-less TpModelWorker returns one sampled token per request; the overlap scheduler off, the radix
cache off but in one trace, where no prompt shares a prefix and finished requests' KV stays evictable). The same
requests, added before the same steps, go through `capacity.sched.sglang` configured as `capacity/engine/sglang/engine.py`
configures it; every step must run the same kind of batch, schedule the same
tokens for the same requests, retract and finish the same ones, leave the same number of free KV tokens, and end
with the same new_token_ratio (up to float rounding: SGLang subtracts the decay step by step, capacity computes
base - n x decay). One difference of timing is allowed: when the last request leaves, capacity resets
new_token_ratio at once (`SglangScheduler._maybe_idle`), SGLang in its next loop pass, which forms no batch
(`self_check_during_idle`); `test_sglang_resets_the_ratio_in_the_idle_pass_after_the_last_request` checks that the
trace shows that pass. Needs no SGLang.

The traces in tests/data/sglang_scheduler/overlap/ run the body of SGLang's default loop, `event_loop_overlap`, instead
(`bench/sglang_scheduler_trace.py --overlap`): step n+1 is scheduled and launched before step n's output is processed.
They are replayed with `SglangConfig(overlap_schedule=True)`; a request's finish is credited to the step that sampled
its last token, whose end is its finish_s in capacity, which the replay reads (capacity reports it in that step's
complete() where the next step cannot retract the request, else in the next one's, once processed).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity import compiled
from capacity.sched import SglangConfig, SglangScheduler, make_scheduler
from capacity.workload import Request

DATA = Path(__file__).parent / "data/sglang_scheduler"


def replay_config(trace: dict) -> dict:
    """SglangConfig's fields for a trace's engine."""
    e = trace["engine"]
    chunk = e["chunked_prefill_size"]
    kw = dict(max_total_tokens=e["max_total_tokens"], page_size=e["page_size"],
              max_running_requests=e["max_running_requests"],
              chunked_prefill_size=None if chunk is None or chunk <= 0 else chunk,
              max_prefill_tokens=e["max_prefill_tokens"], context_len=e["context_len"],
              schedule_conservativeness=e.get("schedule_conservativeness", 1.0))
    env = e.get("env", {})  # SGLang's environment knobs, as SglangConfig fields
    if "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS" in env:
        kw["new_token_ratio_decay_steps"] = env["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"]
    if "SGLANG_RETRACT_DECODE_STEPS" in env:
        kw["retract_decode_steps"] = env["SGLANG_RETRACT_DECODE_STEPS"]
    return kw


def replay(trace: dict, cls=None, **override) -> list[dict]:
    kw = replay_config(trace)
    s = make_scheduler("sglang", **{**kw, **override}) if cls is None else cls(SglangConfig(**{**kw, **override}))
    by_step: dict[int, list[dict]] = {}
    for r in trace["requests"]:
        by_step.setdefault(r["step"], []).append(r)
    out = []
    fins: dict[int, list[int]] = {}  # step -> the requests whose finish capacity credits to it (by finish_s)
    for st in trace["steps"]:
        k = st["step"]
        for r in sorted(by_step.get(k, []), key=lambda r: r["id"]):
            req = Request(r["id"], float(k), r["prompt"], r["output"])
            assert s.admissible(req) is None
            s.add(req)
        step = s.schedule(float(k))
        kind = "extend" if step.plan.prefills else "decode" if step.scheduled else "idle"
        _, fin = s.complete(step, k + 0.5)
        for q in fin:
            fins.setdefault(int(q.finish_s), []).append(q.req.id)
        out.append({"step": k, "kind": kind, "scheduled": sorted([q.req.id, n] for q, n in step.scheduled),
                    "retracted": sorted(q.req.id for q in step.preempted), "finished": [],
                    "free_tokens": s.kv.num_free_blocks * s.cfg.page_size, "new_token_ratio": s.new_token_ratio,
                    "drained": not s.has_work})
    for o in out:
        o["finished"] = sorted(fins.pop(o["step"], []))
    assert not fins, fins
    return out


def reports(trace: dict, check=None, **override) -> dict[int, tuple[int, float]]:
    """Request id -> (the step whose complete() reported its finish, its finish_s), replaying `trace`;
    check(k, scheduler, step, seqs) runs after each step."""
    s = SglangScheduler(SglangConfig(**{**replay_config(trace), **override}))
    by_step: dict[int, list[dict]] = {}
    for r in trace["requests"]:
        by_step.setdefault(r["step"], []).append(r)
    seqs, out = {}, {}
    for st in trace["steps"]:
        k = st["step"]
        for r in sorted(by_step.get(k, []), key=lambda r: r["id"]):
            seqs[r["id"]] = s.add(Request(r["id"], float(k), r["prompt"], r["output"]))
        step = s.schedule(float(k))
        for q in s.complete(step, k + 0.5)[1]:
            assert q.req.id not in out
            out[q.req.id] = (k, q.finish_s)
        if check is not None:
            check(k, s, step, seqs)
    assert len(out) == len(trace["requests"])
    return out


def first_difference(trace: dict, ours: list[dict], ratio: bool = True) -> str | None:
    """The first step where capacity and SGLang differ (ratio=False: in what they run, retract, finish or hold)."""
    for a, b in zip(trace["steps"], ours):
        for key in ("kind", "scheduled", "retracted", "finished", "free_tokens"):
            if a[key] != b[key]:
                return f"step {a['step']}: {key}: SGLang {a[key]}, capacity {b[key]}"
        if not ratio or b["drained"]:  # capacity resets the ratio as the last request leaves, SGLang in its next pass
            continue
        if abs(a["new_token_ratio"] - b["new_token_ratio"]) > 1e-9:
            return f"step {a['step']}: new_token_ratio: SGLang {a['new_token_ratio']}, capacity {b['new_token_ratio']}"
    return None


def load(name: str, overlap: bool = False) -> dict:
    return json.loads((DATA / ("overlap" if overlap else "") / f"{name}.json").read_text())


CASES = {  # name: SGLang's retractions in the trace
    "small_pool_retract": 1,
    "chunked_prefill_mix": 0,
    "burst_admission": 1,
    "paged_retract": 2,
    "fast_decay_retract": 4,
    "unchunked_cap": 0,
    "small_pool_retract_radix": 1,
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_scheduler_takes_sglangs_steps(name):
    trace = load(name)
    assert trace["sglang"] == "0.5.5"
    assert sum(len(s["retracted"]) for s in trace["steps"]) == CASES[name]  # what SGLang did
    assert sum(len(s["finished"]) for s in trace["steps"]) == len(trace["requests"])
    ours = replay(trace)
    assert first_difference(trace, ours) is None
    assert sum(len(s["finished"]) for s in ours) == len(trace["requests"])


def test_sglang_resets_the_ratio_in_the_idle_pass_after_the_last_request():
    """Where capacity drains (and resets new_token_ratio), SGLang's next pass is idle and resets it, unless a
    request arrives in that very pass (then both run a prefill with nothing else running, where the ratio weighs
    nothing, and the later steps compare the ratio again)."""
    seen = 0
    for name in CASES:
        trace = load(name)
        arrivals = {r["step"] for r in trace["requests"]}
        ours = replay(trace)
        for i, b in enumerate(ours[:-1]):
            nxt = trace["steps"][i + 1]
            if b["drained"] and nxt["step"] not in arrivals:
                init = min(0.7 * trace["engine"].get("schedule_conservativeness", 1.0), 1.0)
                assert nxt["kind"] == "idle" and nxt["new_token_ratio"] == init, (name, nxt)
                seen += 1
    assert seen >= 3


@pytest.mark.parametrize("name, override, first", [
    ("fast_decay_retract", {"new_token_ratio_decay_steps": 600}, "step 45: scheduled"),
    ("small_pool_retract", {"new_token_ratio_decay_steps": 300}, "step 34: kind"),
    ("paged_retract", {"schedule_conservativeness": 1.0}, "step 181: kind"),
    ("paged_retract", {"page_size": 8}, "step 8: free_tokens"),
    ("burst_admission", {"clip_max_new_tokens": 100}, "step 3: scheduled"),
    ("burst_admission", {"init_new_token_ratio": 0.5}, "step 165: scheduled"),
    ("unchunked_cap", {"max_running_requests": 7}, "step 24: kind"),
    ("chunked_prefill_mix", {"max_prefill_tokens": 200}, "step 62: scheduled"),
])
def test_the_traces_tell_the_settings_apart(name, override, first):
    """With one setting changed, what capacity runs differs from SGLang's trace (the ratio aside): the traces pin
    down how each setting acts, not only the defaults."""
    trace = load(name)
    assert (first_difference(trace, replay(trace, **override), ratio=False) or "").startswith(first)


class NoFullMark(SglangScheduler):
    """Tries a prefill every step, as if SGLang never marked the running batch full."""
    batch_full = property(lambda self: False, lambda self, v: None)


class FilterAtOnce(SglangScheduler):
    """Finished requests leave the running batch at once, not at the next decode round's filter_batch."""
    unfiltered = property(lambda self: 0, lambda self, v: None)


class RetractMostGenerated(SglangScheduler):
    """Retracts the requests with the most output tokens first (SGLang: the fewest first, ties the longest prompt);
    otherwise SglangScheduler._retract."""

    def _retract(self, step):
        running = self.running
        order = sorted(range(len(running)), key=lambda i: (-running[i].generated, running[i].prompt), reverse=True)
        first = True
        while first or not self._decode_fits([running[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            seq = running[order.pop()]
            self.kv.free(seq)
            seq.computed = 0
            self.waiting.append(seq)
            step.preempted.append(seq)
        self.running = [running[i] for i in order]
        kept = self.running
        self._set_ratio(min(1.0, (sum(s.generated for s in kept) + self.cfg.retract_decode_steps * len(kept))
                            / (sum(s.output for s in kept) + 1)))


@pytest.mark.parametrize("cls, name, first", [(NoFullMark, "small_pool_retract", "step 106: kind"),
                                              (FilterAtOnce, "burst_admission", "step 77: kind"),
                                              (RetractMostGenerated, "fast_decay_retract", "step 284: scheduled")])
def test_the_traces_tell_the_rules_apart(cls, name, first):
    """capacity's scheduler with one of SGLang's rules changed: the batch-full mark, the one-round lag before a
    finished request leaves the batch, the retraction order. Each makes a recorded trace diverge."""
    if compiled() and cls in (NoFullMark, FilterAtOnce, IdleResetAfterABatch):
        pytest.skip("overrides an attribute with a property, which compiled code reads directly; "
                    "the pure-Python run checks it")
    trace = load(name)
    d = first_difference(trace, replay(trace, cls))
    assert d is not None and d.startswith(first), d


def test_the_radix_cache_changes_nothing_without_shared_prefixes():
    """SGLang's default RadixCache, with no prefix shared: the same steps as with ChunkCache (what SGLang counts as
    free is available + evictable tokens, and nothing else differs), as capacity assumes."""
    a, b = load("small_pool_retract"), load("small_pool_retract_radix")
    assert a["requests"] == b["requests"] and b["engine"]["radix_cache"]
    assert a["steps"] == b["steps"]


# ---- the overlap scheduler (SGLang's default event loop) ---------------------------------------------------------
OVERLAP_CASES = {**CASES, "small_pool_retract": 1, "burst_admission": 1, "paged_retract": 1, "fast_decay_retract": 4,
                 "retract_finishing": 1, "admission_offset": 0, "extra_decode_slot": 1,
                 "extra_decode_page": 2}  # name: SGLang's retractions in the overlap trace


@pytest.mark.parametrize("name", list(OVERLAP_CASES))
def test_the_overlap_scheduler_takes_sglangs_steps(name):
    trace = load(name, overlap=True)
    assert trace["sglang"] == "0.5.5" and trace["overlap"]
    assert sum(len(s["retracted"]) for s in trace["steps"]) == OVERLAP_CASES[name]
    assert sum(len(s["finished"]) for s in trace["steps"]) == len(trace["requests"])
    ours = replay(trace, overlap_schedule=True)
    assert first_difference(trace, ours) is None
    assert sum(len(s["finished"]) for s in ours) == len(trace["requests"])


class FinishWhenSampled(SglangScheduler):
    """Reports a finish in the complete() of the step that sampled the last token (SGLang: only once that step's
    output is processed, after the next step was formed, which may have retracted the request)."""

    def _complete_overlap(self, step, end_s):
        emitted, _ = super()._complete_overlap(step, end_s)
        return emitted, list(self.retiring)


def test_a_retracted_request_whose_last_token_was_not_processed_runs_again():
    """retract_finishing: request 98 samples its last token in step 1002; step 1003 is formed before that output is
    processed (event_loop_overlap: run_batch, then process_batch_result of the batch before), retract_decode
    (schedule_batch.py) picks it, process_batch_result_decode drops the token (`req.is_retracted`: continue), and
    it is re-queued, re-prefilled (chunks at 1139-1141) and finishes in step 1141. capacity reports a finish in
    the complete() of the step that sampled the last token when the next step cannot retract (its decode fits),
    else in the next one, once processed: 98's first finish is held back, dropped at step 1003, and it is reported
    once, at step 1141. Reporting every finish when sampled gives a first finish at step 1002 instead."""
    trace = load("retract_finishing", overlap=True)
    assert [(s["step"], s["retracted"]) for s in trace["steps"] if s["retracted"]] == [(1003, [98])]
    assert [s["step"] for s in trace["steps"] if 98 in s["finished"]] == [1141]
    d = first_difference(trace, replay(trace, FinishWhenSampled, overlap_schedule=True))
    assert d is not None and d.startswith("step 1002: finished: SGLang [], capacity [98]"), d

    def check(k, s, step, seqs):
        if k == 1002:  # 7 running, 4 free tokens: step 1003 may retract (it does), so 98's finish waits
            assert seqs[98].finish_s == 1002.5 and s.deferred
        if k == 1003:  # retracted by this decision: its finish (step 1002's) is taken back before it is reported
            assert seqs[98] in step.preempted and seqs[98].finish_s != seqs[98].finish_s  # NaN

    reported = reports(trace, check, overlap_schedule=True)
    assert reported[98] == (1141, 1141.5)
    assert all(k == int(f) for k, f in reported.values())  # the one finish deferred was 98's, then retracted


class UncheckedExtraDecode(SglangScheduler):
    """check_decode_mem leaves out the extra decode of a request whose last token is not processed yet."""

    def _decode_fits(self, seqs):
        return super()._decode_fits([s for s in seqs if s not in self.retiring])


@pytest.mark.parametrize("name, k, done, retracted", [("extra_decode_slot", 84, 0, 9), ("extra_decode_page", 92, 3, 3)])
def test_the_extra_decode_of_a_finished_request_needs_a_free_slot(name, k, done, retracted):
    """A request that sampled its last token in step k-1 is still in the running batch when step k is formed (its
    output is not processed), so check_decode_mem (schedule_batch.py, new_page_count_next_decode over batch.reqs)
    counts its extra decode: a slot, or with pages a new page where it crosses a boundary, and retract_decode frees
    one when none is left. extra_decode_slot (page 1), step 84: 5 requests, 4 free tokens, request 0 done in step
    83: SGLang retracts request 9. extra_decode_page (pages of 16), step 92: requests 1 and 3, no free page,
    request 3 done in step 91 at 112 tokens (7 pages): its extra decode needs an 8th, and SGLang retracts request
    3 itself (77 outputs as it sees them, against 87), so it finishes later, after a re-prefill. capacity takes
    the same steps (reporting request 0's finish a step late, once processed, as step 84 could have retracted it);
    leaving that decode out of the check, it finds no slot for it at step k."""
    trace = load(name, overlap=True)
    st = trace["steps"][k]
    assert st["step"] == k and st["retracted"] == [retracted] and [done, 1] in trace["steps"][k - 1]["scheduled"]
    assert [done, 1] in st["scheduled"] or done == retracted
    ours = replay(trace, overlap_schedule=True)
    assert ours[k - 1]["finished"] == trace["steps"][k - 1]["finished"] == ([done] if done != retracted else [])
    late = {i: r for i, r in reports(trace, overlap_schedule=True).items() if r[0] != int(r[1])}
    assert late == ({} if done == retracted else {done: (k, k - 0.5)})  # held back a step: step k could retract it
    replay({**trace, "steps": trace["steps"][:k]}, UncheckedExtraDecode, overlap_schedule=True)
    with pytest.raises(AssertionError, match="SGLang decode ran out of KV slots"):
        replay({**trace, "steps": trace["steps"][:k + 1]}, UncheckedExtraDecode, overlap_schedule=True)


@pytest.mark.parametrize("name", list(CASES))
def test_the_traces_tell_overlap_apart(name):
    """An overlap trace replayed without the flag, and a normal one with it, diverge at once: with overlap a
    finished request keeps its KV (and decodes once more) for a step."""
    ov, normal = load(name, overlap=True), load(name)
    a = first_difference(ov, replay(ov), ratio=False)
    b = first_difference(normal, replay(normal, overlap_schedule=True), ratio=False)
    assert a is not None and b is not None and a.split(":")[0] == b.split(":")[0], (a, b)
    assert ": free_tokens:" in a


class NoExtraSlot(SglangScheduler):
    """A finished request's extra decode slot is freed with the rest of its KV, not one step later."""

    def _process_output(self, step):
        super()._process_output(step)
        for h in self.holders:
            self.kv.free(h)
        self.holders = []


class KeepInflightToken(SglangScheduler):
    """A retracted request keeps the token its last step sampled (SGLang drops it)."""

    def _drop_inflight(self, seq):
        g = seq.generated
        super()._drop_inflight(seq)
        seq.generated = g


class FreshRetractRatio(SglangScheduler):
    """The ratio a retraction sets counts the last step's tokens (SGLang has not processed them yet)."""

    def _set_ratio(self, value):
        kept = self.running
        if value != self.init_ratio and any(s.inflight for s in kept):
            value = min(1.0, (sum(s.generated for s in kept) + self.cfg.retract_decode_steps * len(kept))
                        / (sum(s.output for s in kept) + 1))
        super()._set_ratio(value)


class IdleResetAfterABatch(SglangScheduler):
    """A pass that forms no batch resets new_token_ratio even right after one that ran (SGLang: only when neither
    did, `if self.last_batch: ... elif batch is None: self_check_during_idle()`)."""
    launched = property(lambda self: False, lambda self, v: None)


class ProcessedAdmissionOffset(SglangScheduler):
    """The admission offset counts the running requests' outputs with the last step's tokens (SGLang has not
    processed them when it forms the next prefill: `len(req.output_ids)` is one short in PrefillAdder)."""

    def _prefill(self, now):
        lagging = [s for s in self.running if s.inflight]
        for s in lagging:
            s.inflight = 0
        try:
            return super()._prefill(now)
        finally:
            for s in lagging:
                s.inflight = 1


@pytest.mark.parametrize("cls, name, first", [
    (NoExtraSlot, "small_pool_retract", "step 17: free_tokens"),
    (ProcessedAdmissionOffset, "admission_offset", "step 57: scheduled"),
    (FinishWhenSampled, "retract_finishing", "step 1002: finished"),
    (NoExtraSlot, "paged_retract", "step 738: free_tokens"),
    (KeepInflightToken, "fast_decay_retract", "step 1976: scheduled"),
    (FreshRetractRatio, "burst_admission", "step 353: new_token_ratio"),
    (IdleResetAfterABatch, "paged_retract", "step 1005: new_token_ratio"),
])
def test_the_overlap_traces_tell_the_rules_apart(cls, name, first):
    """capacity's overlap model with one of its rules changed diverges from SGLang's overlap trace: the extra
    decode slot freed a step late (a page only where it opened one), the dropped token of a retracted request, the
    stale output counts of a retraction's ratio, no idle reset right after a batch, the stale output counts of the
    admission offset, a finish reported before the next decision could retract the request."""
    if compiled() and cls in (NoFullMark, FilterAtOnce, IdleResetAfterABatch):
        pytest.skip("overrides an attribute with a property, which compiled code reads directly; "
                    "the pure-Python run checks it")
    trace = load(name, overlap=True)
    d = first_difference(trace, replay(trace, cls, overlap_schedule=True))
    assert d is not None and d.startswith(first), d
