"""Vision-language serving in a run: the workload's images sized for the model, and the vision encoder in the steps.

`serve_images(prepared, card, gpu, workload)` (called by `capacity.pipeline.run`) returns the run's prepared
pieces and workload unchanged for a workload without images; with images it
- binds the workload's `images:` to the model's processor rules (`capacity.model.vision_tokens`), refusing a
  text-only model in one line;
- wraps each replica's scheduler in `EncoderScheduling`. For vLLM V1 it gives the scheduler an
  `EncoderGate` (`capacity.sim.encoder_budget`): the per-step encoder compute budget and the encoder cache, as
  `Scheduler._try_schedule_encoder_inputs` (vllm/v1/core/sched/scheduler.py) and `EncoderCacheManager`
  (vllm/v1/core/encoder_cache_manager.py) apply them: a chunk's image is encoded in the step only if the
  budget and the cache take it, else the chunk stops before the image; both sizes default to
  max(max_num_batched_tokens, the largest image's tokens) (`compute_mm_encoder_budget`). For V0, SGLang and
  TensorRT-LLM (no such budget modelled: docs/vision.md) it finds the images to encode after the engine's own
  scheduling decision: an image whose placeholder range [start, start + tokens) overlaps the chunk
  [computed, computed + new) and that is not cached yet. There an image is encoded once per request (its output
  stays cached until its tokens are all prefilled), again after a preemption that recomputes its tokens, and
  an identical image (`images.identical`) once for the whole run;
- wraps the step cost in `EncoderStepCost` (the GPU's part: under a CPU-overlap wrapper), which adds the
  encoder roofline (`capacity.cost.encoder`) of the step's images to its time.
Not modelled: Llama-3.2-Vision's cross-attention over the encoder output (its image is one prompt token here;
the encoder is costed), user-set `max_num_batched_encoder_embeds` / `encoder_cache_size` (the defaults only),
and SGLang's embedding cache size (`SGLANG_VLM_CACHE_SIZE_MB`, docs/vision.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from capacity.cost.encoder import EncoderRoofline, EncoderStepCost
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.vision_tokens import image_tokens
from capacity.sim.encoder_budget import EncoderGate
from capacity.workload import WorkloadSpec, least_tokens

P = TypeVar("P")
W = TypeVar("W")


class EncoderScheduling:
    """A scheduler whose steps also encode the images their prefill chunks reach (module docstring); every other
    attribute is the wrapped scheduler's."""

    def __init__(self, inner: Any, encoder: EncoderRoofline, gate: EncoderGate | None = None) -> None:
        self.inner = inner
        self.encoder = encoder
        self.gate = gate
        if gate is not None:
            inner.encoder = gate  # the scheduler consults it for every chunk (capacity.sched.continuous)
        self.encoded: dict[Any, tuple[set[int], int]] = {}  # sequence -> (its images in the cache, its chunk's end)
        self.shared: set[int] = set()  # keys of identical images in the encoder cache (every request's same picture)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "encoded", "encoder", "shared", "gate"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def schedule(self, now: float):
        out = self.inner.schedule(now)
        if isinstance(out, float) or not out.scheduled:
            return out
        if self.gate is not None:
            if self.gate.work:
                p = out.plan
                out.plan = dataclasses.replace(p, encoder_s=p.encoder_s + self.encoder.images_s(self.gate.work))
            return out
        work: list[tuple[int, int]] = []
        for seq, n in out.scheduled:
            imgs = seq.req.images
            if not imgs or seq.generated > 0 and seq.computed >= seq.prompt:
                continue
            lo, hi = seq.computed, seq.computed + n
            done, end = self.encoded.get(seq, (set(), 0))
            if lo < end:  # preempted since its last chunk: its references were freed, its images are encoded again
                done = set()
            self.encoded[seq] = (done, hi)
            for k, (start, tokens, enc_seq, enc_n, key) in enumerate(imgs):
                if start >= hi:
                    break
                if start + tokens <= lo or k in done or key in self.shared:
                    continue
                done.add(k)
                if key >= 0:
                    self.shared.add(key)
                work.append((enc_seq, enc_n))
            if hi >= imgs[-1][0] + imgs[-1][1]:  # every image's tokens prefilled: its cache entries are released
                self.encoded.pop(seq, None)
        if work:
            p = out.plan
            out.plan = dataclasses.replace(p, encoder_s=p.encoder_s + self.encoder.images_s(work))
        return out


def image_shape(card: ModelCard):
    """(w, h) -> (placeholder tokens, encoder sequence length, sequences) for this model's images."""
    v = card.vision
    if v is None:
        raise ConfigError(f"images: {card.name} is a text-only model (no vision tower); it takes no images")

    def shape(w: int, h: int) -> tuple[int, int, int]:
        t = image_tokens(v, w, h)
        return t.tokens, t.encoder_seqs[0], len(t.encoder_seqs)
    return shape


def with_encoder_cost(cost: Any) -> Any:
    """`cost` with the encoder's time added to the GPU's part of a step (under a CPU-overlap wrapper)."""
    from capacity.cost.overlap import CpuOverlapCost, OutputPacedCost

    if isinstance(cost, OutputPacedCost):
        return OutputPacedCost(with_encoder_cost(cost.inner), cost.per_token_s)
    if isinstance(cost, CpuOverlapCost):
        return cost.with_inner(with_encoder_cost(cost.inner))
    return cost if isinstance(cost, EncoderStepCost) else EncoderStepCost(cost)


def serve_images(prepared: P, card: ModelCard, gpu: Any, workload: W) -> tuple[P, W]:
    """(prepared, workload) for a run (module docstring); `prepared` is a `capacity.pipeline.Prepared`."""
    if not isinstance(workload, WorkloadSpec) or workload.images is None:
        return prepared, workload
    return _serve(prepared, card, gpu, workload)  # type: ignore[return-value]


def _check_context(workload: WorkloadSpec, max_model_len: int) -> None:
    """WorkloadSpec.check_context with the image tokens: when every request carries images, its fewest images at
    the smallest size count too (else each request would be rejected one by one, and a search blames the SLO)."""
    im = workload.images
    assert im is not None and im._shapes is not None
    if im.share < 1 or workload.arrivals.kind == "trace":
        return
    pr = im.per_request
    fewest = least_tokens(pr) if pr.kind in ("fixed", "empirical", "uniform") else 0
    img = fewest * min(s[0] for s in im._shapes)
    for c, k in enumerate(workload.classes):
        li, lo = workload.class_lengths(c)
        least = least_tokens(li) + least_tokens(lo) + img
        if img and least > max_model_len:
            who = f"class {k.name!r}" if len(workload.classes) > 1 else "the workload"
            raise ConfigError(f"max_model_len {max_model_len:,}: every request of {who} is longer with its images "
                              f"(at least {least:,} tokens: prompt + {img:,} image tokens + output), so none could "
                              "be served: raise it, or use fewer or smaller images")


def _serve(prepared: Any, card: ModelCard, gpu: Any, workload: WorkloadSpec) -> tuple[Any, WorkloadSpec]:
    from capacity.cost.overlap import CpuOverlapCost

    assert workload.images is not None
    if workload.arrivals.kind == "trace":
        raise ConfigError("images: a trace's requests keep their own lengths; images apply to drawn requests")
    if not workload.images.bound:
        workload = workload.model_copy(update={"images": workload.images.bind(image_shape(card))})
    _check_context(workload, prepared.budget.max_model_len)
    cost = prepared.cost
    while isinstance(cost, CpuOverlapCost):
        cost = cost.inner
    if isinstance(cost, EncoderStepCost):  # already wrapped (a capacity loop of the same run)
        return prepared, workload
    assert card.vision is not None  # image_shape refused a text-only model
    enc = EncoderRoofline(card.vision, gpu, prepared.budget.tp)
    factory = prepared.make_scheduler
    gate = gate_factory(prepared.engine_model, card, workload)

    def make() -> EncoderScheduling:
        inner = factory()
        g = gate(inner) if gate is not None and hasattr(inner, "encoder") else None
        return EncoderScheduling(inner, enc, g)
    return dataclasses.replace(prepared, cost=with_encoder_cost(prepared.cost), make_scheduler=make), workload


def gate_factory(em: Any, card: ModelCard, workload: WorkloadSpec):
    """For a vLLM V1 engine: scheduler -> its `EncoderGate`, sized as `compute_mm_encoder_budget` does: budget and
    cache max(max_num_batched_tokens, the largest item's tokens), the item the model's largest image (the card's
    `tokens_per_image`) or the workload's, if larger. None for the other engines (module docstring)."""
    rel = getattr(em, "release", None)
    if getattr(em, "name", "") != "vllm" or rel is None or rel.runner != "v1":
        return None
    assert card.vision is not None and workload.images is not None and workload.images._shapes is not None
    largest = max([card.vision.tokens_per_image, *(t for t, _, _ in workload.images._shapes)])
    shared = rel.version >= SHARED_FROM

    def gate(inner: Any) -> EncoderGate:
        size = max(inner.cfg.max_num_batched_tokens, largest)
        return EncoderGate(size, size, shared)
    return gate


SHARED_FROM = (0, 11, 0)  # encoder cache entries keyed by hash, kept until evicted (vLLM PR #22711; first release
# not pinned: 0.10.2 is counted before it, the side that encodes more)
