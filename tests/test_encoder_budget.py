"""vLLM V1's encoder compute budget and encoder cache in the scheduler (capacity.sim.encoder_budget), step by step.

Every expected number is worked by hand from vLLM's rules (`Scheduler._try_schedule_encoder_inputs`,
`EncoderCacheManager.can_allocate`, `compute_mm_encoder_budget`): see the comments of each case.
"""
from __future__ import annotations

import pytest

from capacity.draws import Request
from capacity.sched.configs import ContinuousConfig
from capacity.sched.continuous import ContinuousScheduler
from capacity.sim.encoder_budget import EncoderGate


def req(i: int, text_before: int, image: int, text_after: int = 0, out: int = 4, key: int = -1) -> Request:
    r = Request(i, 0.0, text_before + image + text_after, out)
    r.images = ((text_before, image, image * 4, 1, key),)  # (start, tokens, encoder seq, sequences, key)
    return r


def sched(mnbt: int, gate: EncoderGate) -> ContinuousScheduler:
    s = ContinuousScheduler(ContinuousConfig(max_num_batched_tokens=mnbt))
    s.encoder = gate
    return s


def run_step(s: ContinuousScheduler, t: float) -> list[tuple[int, int]]:
    step = s.schedule(t)
    out = [(q.req.id, n) for q, n in step.scheduled]
    s.complete(step, t + 1.0)
    return out


@pytest.mark.parametrize("shared", [True, False])
def test_second_image_waits_for_the_next_step_when_the_budget_is_spent(shared):
    # budget = cache = max(8192, 5000) = 8192. Two requests of 100 text tokens + a 5,000-token image (prompt 5,100).
    # Step 1: A takes 5,100 tokens and its image (budget left 3,192). B gets min(5,100, 8,192 - 5,100) = 3,092
    # tokens, which reach its image at 100; 5,000 > 3,192 left, so B's chunk stops before the image: 100 tokens.
    gate = EncoderGate(8192, 8192, shared)
    s = sched(8192, gate)
    s.add(req(0, 100, 5000))
    s.add(req(1, 100, 5000))
    assert run_step(s, 0.0) == [(0, 5100), (1, 100)]
    assert gate.work == [(20000, 1)] and gate.left == 3192 and gate.deferred == 1
    # Step 2: A decodes (1 token); B's 5,000 remaining tokens and its image (a fresh budget of 8,192). A's image is
    # all prefilled, so its reference went: newer code keeps it evictable and evicts it now (free 3,192 < 5,000 <=
    # 8,192 freeable); older code freed its slots at once (no eviction to count).
    assert run_step(s, 1.0) == [(0, 1), (1, 5000)]
    assert gate.work == [(20000, 1)]
    assert gate.evictions == (1 if shared else 0)
    assert gate.free == 8192 - 5000


def test_a_full_cache_keeps_the_next_image_out_until_the_holder_passes_its_image():
    # budget = cache = 4,096 = max_num_batched_tokens. A: 500 text + a 4,000-token image ([500, 4,500)).
    gate = EncoderGate(4096, 4096)
    s = sched(4096, gate)
    s.add(req(0, 500, 4000))
    s.add(req(1, 0, 1000))  # B: a 1,000-token image first
    # Step 1: A's chunk [0, 4,096) encodes its image (cache free 96); no token budget is left for B.
    assert run_step(s, 0.0) == [(0, 4096)]
    # Step 2: A's chunk [4,096, 4,500) still needs its image (its own reference, no encoding). B: 1,000 tokens of
    # budget remain and the step's encoder budget is fresh (4,096), but the cache has 96 free slots and nothing
    # evictable (A still holds its 4,000). B's image starts at its first token (start 0 = computed), so B gets no
    # tokens and admissions stop (a waiting request: `break`).
    assert run_step(s, 1.0) == [(0, 404)]
    assert gate.work == [] and gate.deferred == 1
    # Step 3: A's image is prefilled: its entry is evictable, and B's image evicts it (96 + 4,000 >= 1,000).
    assert run_step(s, 2.0) == [(0, 1), (1, 1000)]
    assert gate.work == [(4000, 1)] and gate.evictions == 1 and gate.free == 4096 - 1000


def test_an_image_larger_than_max_num_batched_tokens_is_encoded_once_and_prefilled_over_chunks():
    # max_num_batched_tokens 2,048 and a 5,000-token image: vLLM raises the budget and the cache to the largest
    # item (max(2,048, 5,000) = 5,000), so the image is encoded in the first chunk's step (alone: nothing else
    # fits beside it) and the next chunks (2,048, then 904) read it from the cache.
    gate = EncoderGate(5000, 5000)
    s = sched(2048, gate)
    s.add(req(0, 0, 5000))
    assert run_step(s, 0.0) == [(0, 2048)]
    assert gate.work == [(20000, 1)]
    assert run_step(s, 1.0) == [(0, 2048)]
    assert gate.work == []
    assert run_step(s, 2.0) == [(0, 904)]
    assert gate.work == [] and gate.deferred == 0


def test_identical_images_are_encoded_once_while_the_cache_holds_them():
    gate = EncoderGate(8192, 8192, shared=True)
    s = sched(8192, gate)
    for i in range(3):
        s.add(req(i, 10, 1000, key=0))
    # Step 1: the first request encodes the picture; the other two hit it (the same hash).
    assert run_step(s, 0.0) == [(0, 1010), (1, 1010), (2, 1010)]
    assert gate.work == [(4000, 1)]
    old = EncoderGate(8192, 8192, shared=False)  # before PR #22711: each request encodes its own copy
    s = sched(8192, old)
    for i in range(3):
        s.add(req(i, 10, 1000, key=0))
    run_step(s, 0.0)
    assert old.work == [(4000, 1)] * 3


def test_a_preempted_request_releases_its_references():
    gate = EncoderGate(4096, 4096)
    s = sched(4096, gate)
    q = s.add(req(0, 0, 3000, 2000))
    s.running.append(s.waiting.pop())
    assert gate.limit(q, 0, 4096) == 4096
    gate.commit(q)
    assert gate.free == 1096 and gate.holders
    gate.release_all(q)  # what _preempt does
    assert not gate.holders and gate.freeable == 4096 and gate.evictable
    # preempted in the same step: its image's budget comes back and it is not encoded in this step
    assert gate.left == 4096 and gate.work == []


def test_text_requests_pass_the_gate_untouched():
    gate = EncoderGate(100, 100)
    s = sched(8192, gate)
    s.add(Request(0, 0.0, 3000, 4))
    assert run_step(s, 0.0) == [(0, 3000)]
    assert gate.work == [] and gate.deferred == 0


def test_the_gate_is_sized_as_compute_mm_encoder_budget_and_only_for_vllm_v1():
    import json
    from pathlib import Path

    from capacity.engine.registry import get_engine
    from capacity.model.hf import from_hf_config
    from capacity.sim.vision import gate_factory, image_shape
    from capacity.vision_requests import ImageRequests
    from capacity.workload import WorkloadSpec

    cfg = Path(__file__).resolve().parents[1] / "tests/data/startup_v3/hf/qwen2.5-vl-7b.json"
    card = from_hf_config(json.loads(cfg.read_text()), "qwen2.5-vl-7b")
    im = ImageRequests(sizes=["1024x768"]).bind(image_shape(card))
    wl = WorkloadSpec(images=im)
    make = gate_factory(get_engine("vllm"), card, wl)
    assert make is not None
    g = make(ContinuousScheduler(ContinuousConfig(max_num_batched_tokens=2048)))
    # Qwen2.5-VL's largest image: max_pixels 12,845,056 / 28^2 = 16,384 tokens > 2,048
    assert (g.budget_tokens, g.cache_tokens) == (16384, 16384)
    g = make(ContinuousScheduler(ContinuousConfig(max_num_batched_tokens=32768)))
    assert (g.budget_tokens, g.cache_tokens, g.shared) == (32768, 32768, True)
    old = gate_factory(get_engine("vllm@0.10.1"), card, wl)
    assert old is not None and old(ContinuousScheduler(ContinuousConfig())).shared is False
    assert gate_factory(get_engine("vllm@0.6.6"), card, wl) is None
    assert gate_factory(get_engine("sglang"), card, wl) is None
