"""capacity's continuous-batching scheduler against vLLM 0.32's own scheduler, step by step.

The traces in tests/data/vllm_scheduler/ were recorded by `bench/vllm_scheduler_trace.py`, which drives vLLM's
`vllm.v1.core.sched.scheduler.Scheduler` and KV cache manager themselves (no model: a step returns one sampled
token per request that reached the end of its sequence, none for a partial prefill chunk). The same requests,
added before the same steps, go through `capacity.sched.continuous`; every step must schedule the same tokens
for the same requests, preempt and finish the same ones, and leave the same number of free blocks. The
scheduler is given num_blocks - 1 blocks: vLLM V1 keeps block 0 as its null block.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity import compiled
from capacity.sched import make_scheduler
from capacity.workload import Request

DATA = Path(__file__).parent / "data/vllm_scheduler"


def replay(trace: dict, **override) -> list[dict]:
    e = trace["engine"]
    kw = dict(max_num_seqs=e["max_num_seqs"], max_num_batched_tokens=e["max_num_batched_tokens"],
              block_size=e["block_size"], num_blocks=e["num_blocks"] - 1,
              prefix_caching=bool(e.get("prefix_caching")), chunked_prefill=e.get("chunked_prefill", True))
    if e.get("sliding_window"):  # one full-attention and one sliding-window group (capacity.engine.vllm.layout.kv_groups)
        kw["kv_groups"] = (1, 1, -(-(e["sliding_window"] - 1) // e["block_size"]) + 1, e["sliding_window"])
    asy = bool(trace.get("async_scheduling"))
    if asy:  # two batches in flight: the sliding groups' admission reserve counts both
        kw.update(async_scheduling=True, inflight_tokens=2 * e["max_num_batched_tokens"])
    policy = override.pop("policy", "priority" if e.get("policy") == "priority" else "continuous")
    s = make_scheduler(policy, **{**kw, **override})
    by_step: dict[int, list[dict]] = {}
    for r in trace["requests"]:
        by_step.setdefault(r["step"], []).append(r)
    out = []
    last: list = []
    for st in trace["steps"]:
        k = st["step"]
        for r in sorted(by_step.get(k, []), key=lambda r: r["id"]):
            s.add(Request(r["id"], float(k), r["prompt"], r["output"], priority=r.get("priority", 0),
                          prefix_group=r.get("group", -1), prefix_tokens=r.get("prefix", 0)))
        step = s.schedule(float(k))
        free = s.kv.num_free_blocks + s.kv.num_evictable_blocks  # async: after the last step's output
        _, fin = s.complete(step, k + 0.5)
        hits = sorted(q.req.id for q, _ in step.scheduled if q.shared_blocks and q.first_scheduled_s == k)
        if not asy:
            last, free = fin, s.kv.num_free_blocks + s.kv.num_evictable_blocks
        out.append({"step": k, "scheduled": sorted([q.req.id, n] for q, n in step.scheduled), "hits": hits,
                    "preempted": sorted(q.req.id for q in step.preempted),
                    "finished": sorted(q.req.id for q in last), "free_blocks": free})
        if asy:  # vLLM reports a step's finishes after the next schedule call, with the blocks they free
            last = fin
    return out


def first_difference(trace: dict, ours: list[dict]) -> str | None:
    for a, b in zip(trace["steps"], ours):
        for key in ("scheduled", "preempted", "finished", "free_blocks"):
            if a[key] != b[key]:
                return f"step {a['step']}: {key}: vLLM {a[key]}, capacity {b[key]}"
    return None


@pytest.mark.parametrize("name, preemptions", [("kv_pressure_256_160", 16), ("small_cache_varied", 20),
                                               ("chunked_prefill_mix", 0), ("priority_small_cache", 15),
                                               ("prefix_groups", 4), ("prefix_pressure", 26), ("prefix_priority", 15),
                                               ("no_chunking", 21),
                                               ("sliding_window_hybrid", 0), ("sliding_window_pressure", 2)])
def test_the_scheduler_takes_vllms_steps(name, preemptions):
    trace = json.loads((DATA / f"{name}.json").read_text())
    assert trace["vllm"] == "0.32.0"
    assert sum(len(s["preempted"]) for s in trace["steps"]) == preemptions  # what vLLM did
    ours = replay(trace)
    assert first_difference(trace, ours) is None
    assert sum(1 for s in ours for _ in s["finished"]) == len(trace["requests"])


@pytest.mark.parametrize("name, override", [("kv_pressure_256_160", {"num_blocks": 128}),
                                            ("small_cache_varied", {"reserve_full_input": False}),
                                            ("priority_small_cache", {"policy": "continuous"})])
def test_the_traces_tell_the_rules_apart(name, override):
    """Without vLLM's null block, without its full-input admission reserve, or with FCFS in place of the
    priority queue and its victim rule, the steps differ: the traces pin those rules down."""
    trace = json.loads((DATA / f"{name}.json").read_text())
    assert first_difference(trace, replay(trace, **override)) is not None


ASYNC = sorted(p.stem for p in (DATA / "async").glob("*.json"))


@pytest.mark.parametrize("name", ASYNC)
def test_the_scheduler_takes_vllms_steps_with_async_scheduling(name):
    """vLLM's GPU default since 0.32: EngineCore keeps two batches in flight and schedules the next before it
    processes the last one's output (bench/vllm_scheduler_trace.py --async drives vLLM's AsyncScheduler
    that way). A request whose last token is in flight is not scheduled again but keeps its blocks and its
    batch slot until its output is processed; sliding-window groups free on processed tokens only; prefix
    blocks are cached one token behind. Every step agrees, preemptions and freed blocks included."""
    trace = json.loads((DATA / "async" / f"{name}.json").read_text())
    assert trace["vllm"] == "0.32.0" and trace["async_scheduling"]
    ours = replay(trace)
    assert first_difference(trace, ours) is None
    sync = json.loads((DATA / f"{name}.json").read_text())
    assert len(trace["steps"]) != len(sync["steps"])  # the two modes take different steps on these requests


@pytest.mark.parametrize("rule", ["sync", "sliding frees on scheduled tokens", "prefix cached on time"])
def test_the_async_rules_matter(monkeypatch, rule):
    """Each async rule taken out makes some async trace diverge: scheduling as if synchronously (finished
    requests leave at once); sliding-window frees on every computed token; prefix blocks cached without the
    one-token lag."""
    traces = {n: json.loads((DATA / "async" / f"{n}.json").read_text()) for n in ASYNC}
    if rule == "sync":
        diffs = [first_difference(t, replay(t, async_scheduling=False)) for t in traces.values()]
    else:
        import capacity.sched.continuous as cont

        original = cont.ContinuousScheduler.complete

        def complete(self, step, end_s):  # the in-flight count left at 0 for the rule under test
            out = original(self, step, end_s)
            for q, _ in step.scheduled:
                if (rule == "sliding frees on scheduled tokens") == bool(self.cfg.kv_groups):
                    q.inflight = 0
            return out

        monkeypatch.setattr(cont.ContinuousScheduler, "complete", complete)
        names = [n for n in traces if ("sliding" in n) == (rule == "sliding frees on scheduled tokens")]
        diffs = [first_difference(traces[n], replay(traces[n])) for n in names]
    assert any(d is not None for d in diffs), rule


def test_a_preempted_request_finds_its_own_blocks_as_vllm_does():
    """Prefix caching: vLLM hashes every full block of every request, not only shared prefixes, so a preempted
    request's own blocks stay cached (free, evicted after older ones) and it recomputes only what was reused
    meanwhile. Request 18 of prefix_groups, preempted at step 158, comes back at step 165 with 31 of its blocks
    and computes the last 70 of its 566 tokens; caching the group prefixes alone would recompute from the
    prefix on (254 tokens, the budget)."""
    trace = json.loads((DATA / "prefix_groups.json").read_text())
    assert any(18 in s["preempted"] for s in trace["steps"][150:165])
    assert dict(map(tuple, trace["steps"][165]["scheduled"]))[18] == 566 - 31 * 16
    ours = replay(trace)
    assert dict(map(tuple, ours[165]["scheduled"]))[18] == 70
    assert sum(len(s["hits"]) for s in ours) >= 20  # first admissions that hit a group prefix


@pytest.mark.parametrize("rule", ["group prefixes only", "free in table order", "cache after the step",
                                  "uncached blocks to the tail", "touch before admission"])
def test_the_prefix_cache_rules_matter(monkeypatch, rule):
    """vLLM's block pool with one rule changed at a time: each makes some recorded trace diverge (found by
    running the three prefix traces; the first step that differs is pinned), so each rule is pinned by vLLM's
    own behaviour, not by the model's."""
    if compiled():
        pytest.skip("patches make_kv_manager into the module, which compiled code calls directly; "
                    "the pure-Python run checks it")
    import capacity.sched.kv as kvmod
    from capacity.sched.prefix_cache import PrefixCachingKVCacheManager as Base

    class Mutant(Base):
        __slots__ = ()

        def _key(self, seq, i):
            k = super()._key(seq, i)
            return (k[0], -2 - seq.req.id, i) if rule == "group prefixes only" and k[0] < 0 else k

        def get_computed_blocks(self, seq):
            if rule == "group prefixes only" and seq.req.prefix_group < 0:
                return
            super().get_computed_blocks(seq)
            if rule == "group prefixes only":  # only the leading group blocks count as hits
                hits = self.pending.get(seq, [])
                g = [b for b in hits if self.key[b][0] >= 0]
                if len(g) < len(hits):
                    self.pending[seq] = g
                    seq.shared_blocks, seq.computed = len(g), len(g) * self.block_size
                    if not g:
                        del self.pending[seq]
            if rule == "touch before admission":
                self._touch(seq)

        def drop_computed_blocks(self, seq):
            if rule == "touch before admission" and seq in self.tables and seq.shared_blocks:
                self.free(seq)
                seq.computed = 0
                return
            super().drop_computed_blocks(seq)

        def allocate_slots(self, seq, num_new):
            if rule == "cache after the step":
                return self._grow(seq, seq.computed + num_new, seq.computed)
            return super().allocate_slots(seq, num_new)

        def free(self, seq):
            if rule in ("free in table order", "uncached blocks to the tail") and seq in self.tables:
                table = self.tables[seq]
                order = table if rule == "free in table order" else list(reversed(table))
                self.tables[seq] = order[::-1]  # the base frees the table reversed
                if rule == "uncached blocks to the tail":
                    for b in table:
                        if self.key[b] is None:
                            self.key[b] = (-9, -9, b)  # freed like a cached block: to the tail
                            self.cache[self.key[b]] = {b: None}
                    super().free(seq)
                    for b in table:
                        if self.key[b] is not None and self.key[b][0] == -9:
                            del self.cache[self.key[b]]
                            self.key[b] = None
                            if self.ref[b] == 0:
                                self.hashed_free -= 1
                    return
            super().free(seq)

    monkeypatch.setattr(kvmod, "make_kv_manager", lambda nb, bs, pc=False, g=None, budget=None: Mutant(nb, bs))
    import capacity.sched.continuous as cont
    monkeypatch.setattr(cont, "make_kv_manager", kvmod.make_kv_manager)
    diffs = {name: first_difference(t, replay(t)) for name in ("prefix_groups", "prefix_pressure", "prefix_priority")
             for t in [json.loads((DATA / f"{name}.json").read_text())]}
    assert any(d is not None for d in diffs.values())


def test_the_sliding_window_rules_matter(monkeypatch):
    """vLLM's hybrid allocator, two of its rules taken out one at a time, and the pressure trace tells: without
    the admission cap (min(cdiv(T), cdiv(W - 1 + budget, block) + 1) free blocks per sliding group) capacity
    admits a request vLLM keeps waiting; freeing below the window of a chunk's last token instead of its first
    leaves more blocks free than vLLM has."""
    if compiled():
        pytest.skip("patches make_kv_manager into the module, which compiled code calls directly; "
                    "the pure-Python run checks it")
    import capacity.sched.continuous as cont
    from capacity.sched.kv import HybridKVCacheManager

    trace = json.loads((DATA / "sliding_window_pressure.json").read_text())
    make = cont.make_kv_manager
    monkeypatch.setattr(cont, "make_kv_manager", lambda nb, bs, pc, g, budget=None: make(nb, bs, pc, g, None))
    assert first_difference(trace, replay(trace)).startswith("step 164: scheduled")

    class LastToken(HybridKVCacheManager):
        def allocate_slots(self, seq, num_new):
            end, skip = self._slide(seq, seq.computed + num_new - 1)
            return self._grow(seq, end, skip, seq.computed + num_new)

    monkeypatch.setattr(cont, "make_kv_manager", lambda nb, bs, pc, g, budget=None: LastToken(nb, bs, g, budget))
    assert first_difference(trace, replay(trace)).startswith("step 4: free_blocks")


def test_chunked_prefill_off_matters():
    """no_chunking (vLLM with --no-enable-chunked-prefill: a prompt runs whole or waits) agrees step by step
    above; replayed with chunking on, capacity splits a prompt vLLM kept whole and diverges."""
    trace = json.loads((DATA / "no_chunking.json").read_text())
    assert trace["engine"]["chunked_prefill"] is False
    assert first_difference(trace, replay(trace, chunked_prefill=True)) is not None
