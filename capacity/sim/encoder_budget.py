"""vLLM V1's encoder compute budget and encoder cache, as the scheduler consults them for each prefill chunk.

`EncoderGate` is what `capacity.sched.continuous.ContinuousScheduler` asks (its `encoder` attribute, set by
`capacity.sim.vision` for a vLLM V1 run with images) before it gives a prefill chunk its KV blocks, as vLLM's
`Scheduler.schedule` calls `_try_schedule_encoder_inputs` (vllm/v1/core/sched/scheduler.py) before
`allocate_slots`. For the chunk [computed, computed + new) of a request, image by image in prompt order:
- an image starting at or after the chunk's end is not needed yet (the loop stops); one whose placeholder
  tokens are all computed (its KV is cached: prefill done, or a prefix-cache hit) is skipped;
- an image whose encoder output is in the encoder cache is a hit (`EncoderCacheManager.check_and_update_cache`:
  the request takes a reference, and an unreferenced entry leaves the evictable list);
- otherwise `EncoderCacheManager.can_allocate` decides: the image's tokens must fit the step's remaining
  encoder compute budget, and (with the images already taken for this request) the cache's free slots, or the
  free slots plus the unreferenced entries it may evict, oldest first. If not, the chunk stops before the image
  (new = start - computed), or, when the chunk starts inside the image (a prefix-cache hit past its start), the
  request gets no tokens this step: a running request is skipped (`continue`), a waiting one ends the step's
  admissions (`break`). vLLM assumes an image is encoded whole (bidirectional attention), so a chunk that ends
  inside an image still encodes all of it and the output stays cached for the next chunk.
After the request's blocks are allocated, its images are committed (`EncoderCacheManager.allocate`: the
budget and the free slots drop by their tokens) and their encoding is the step's encoder work.

Sizes (`compute_mm_encoder_budget`, vllm/v1/core/encoder_cache_manager.py; `compute_encoder_budget` in older
releases): the per-step budget `max_num_batched_encoder_embeds` (`max_num_encoder_input_tokens` before) and the
cache `encoder_cache_size` both default to max_num_batched_tokens and are raised to the largest item's tokens
(the model's `get_max_image_tokens`: here the card's `vision.tokens_per_image`, or the workload's largest image
if that is larger, so an image always fits an empty budget). An image over max_num_batched_tokens is therefore
encoded alone in its step (nothing else fits the budget beside it) and its tokens prefilled over several chunks.

Releases: rules are counted in placeholder tokens here; the newest code counts only embedding positions
(`get_num_embeds`: Pixtral's and Mistral-3's [IMG_BREAK] tokens are not), so an image costs it a little less
budget (the safe side here). Freeing: after each step, an image whose tokens are all computed loses the
request's reference (`Scheduler._free_encoder_inputs`); preemption and a finished request release them all
(`encoder_cache_manager.free`). From PR #22711 (entries keyed by the image's hash and shared between requests,
unreferenced ones evicted only when space is needed) a released entry stays until evicted, so an identical
image, or a preempted request's own image, can hit again; before it (0.7-0.10 here: the PR's first release is
not pinned, 0.10.2 is counted before it, the safe side) the cache was per request and a released image's slots
were free at once: no request shares an encoder output and a preempted request encodes its images again.
V0 (`vllm/core/scheduler.py`) has no encoder budget or cache: `capacity.sim.vision` keeps its every-image-in-the-
chunk rule for V0, SGLang and TensorRT-LLM.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

Key = tuple[int, int]  # (request id, image index) for a distinct image; (-1, key) for an identical one


class EncoderGate:
    """The per-step encoder budget and the encoder cache of one vLLM V1 replica (module docstring)."""

    def __init__(self, budget_tokens: int, cache_tokens: int, shared: bool = True) -> None:
        self.budget_tokens = budget_tokens  # max_num_batched_encoder_embeds, per step
        self.cache_tokens = cache_tokens  # encoder_cache_size
        self.shared = shared  # entries keyed by hash, kept until evicted (PR #22711)
        self.left = budget_tokens  # this step's remaining budget
        self.free = cache_tokens  # free slots
        self.freeable = cache_tokens  # free + unreferenced (evictable) slots
        self.cached: dict[Key, set[int]] = {}  # entry -> ids of the requests referencing it
        self.sizes: dict[Key, int] = {}
        self.evictable: OrderedDict[Key, int] = OrderedDict()  # unreferenced entries, oldest first
        self.holders: dict[int, tuple[Any, list[int]]] = {}  # request id -> (its Seq, image indices it references)
        self.pending: list[int] = []  # images of the request being scheduled, to commit
        self.work: list[tuple[int, int]] = []  # this step's images to encode: (encoder seq length, sequences)
        self.taken: dict[int, list[tuple[int, tuple[int, int]]]] = {}  # request id -> its images committed this step
        self.evictions = 0
        self.deferred = 0  # chunks cut before an image (budget or cache)

    def key(self, seq: Any, k: int) -> Key:
        ident = seq.req.images[k][4]
        return (-1, ident) if ident >= 0 and self.shared else (seq.req.id, k)

    # ---- the step ------------------------------------------------------------------------------------
    def begin(self) -> None:
        """A new step: a fresh budget, and the references of images now wholly computed released (vLLM does it
        after the previous step's output, `_free_encoder_inputs`)."""
        self.left = self.budget_tokens
        self.work = []
        self.taken = {}
        self.pending = []
        for rid in list(self.holders):
            seq, ks = self.holders[rid]
            c = seq.computed
            imgs = seq.req.images
            keep = [k for k in ks if imgs[k][0] + imgs[k][1] > c]
            for k in ks:
                if k not in keep:
                    self._release(seq, k)
            if keep:
                self.holders[rid] = (seq, keep)
            else:
                del self.holders[rid]

    def limit(self, seq: Any, computed: int, num_new: int) -> int:
        """The chunk's tokens after the encoder's checks (module docstring); its images wait in `pending`."""
        self.pending = []
        imgs = seq.req.images
        end = computed + num_new
        taking = 0
        rid = seq.req.id
        for k, (start, tokens, _s, _n, _key) in enumerate(imgs):
            if start >= end:
                break
            if start + tokens <= computed:
                continue
            key = self.key(seq, k)
            refs = self.cached.get(key)
            if refs is not None:
                if rid not in refs:  # a hit (or its own entry, still referenced from an earlier chunk)
                    if not refs:
                        self.freeable -= self.evictable.pop(key)
                    refs.add(rid)
                    self._hold(seq, k)
                continue
            if not self._can_allocate(tokens, taking):
                self.deferred += 1
                return start - computed if computed < start else 0
            taking += tokens
            self.pending.append(k)
        return num_new

    def commit(self, seq: Any) -> None:
        """The request was scheduled: its pending images take cache slots and budget, and are encoded."""
        imgs = seq.req.images
        rid = seq.req.id
        for k in self.pending:
            tokens = imgs[k][1]
            key = self.key(seq, k)
            self.cached[key] = {rid}
            self.sizes[key] = tokens
            self.free -= tokens
            self.freeable -= tokens
            self.left -= tokens
            self._hold(seq, k)
            w = (imgs[k][2], imgs[k][3])
            self.work.append(w)
            self.taken.setdefault(rid, []).append((tokens, w))
        self.pending = []

    def release_all(self, seq: Any) -> None:
        """Preempted or finished: every reference of the request goes (`EncoderCacheManager.free`); a request
        preempted in the step that scheduled its images gives their budget back and they are not encoded
        (`Scheduler.schedule`: `scheduled_encoder_inputs.pop`, `encoder_compute_budget += ...`)."""
        for tokens, w in self.taken.pop(seq.req.id, ()):
            self.left += tokens
            self.work.remove(w)
        held = self.holders.pop(seq.req.id, None)
        if held is not None:
            for k in held[1]:
                self._release(seq, k)

    # ---- the cache -----------------------------------------------------------------------------------
    def _can_allocate(self, tokens: int, taking: int) -> bool:
        if tokens > self.left:
            return False
        need = tokens + taking
        if need <= self.free:
            return True
        if need > self.freeable:
            return False
        while need > self.free:
            key, n = self.evictable.popitem(last=False)
            del self.cached[key]
            del self.sizes[key]
            self.free += n
            self.evictions += 1
        return True

    def _hold(self, seq: Any, k: int) -> None:
        rid = seq.req.id
        held = self.holders.get(rid)
        if held is None:
            self.holders[rid] = (seq, [k])
        elif k not in held[1]:
            held[1].append(k)

    def _release(self, seq: Any, k: int) -> None:
        key = self.key(seq, k)
        refs = self.cached.get(key)
        if not refs:
            return
        refs.discard(seq.req.id)
        if refs:
            return
        n = self.sizes[key]
        if self.shared:  # kept, evictable, until the space is needed
            self.evictable[key] = n
            self.freeable += n
        else:  # before PR #22711: freed at once
            del self.cached[key]
            del self.sizes[key]
            self.free += n
            self.freeable += n
