"""Images in requests (vision-language serving): the workload's `images:` section and how drawn requests get them.

`ImageRequests` says which requests carry images (`share`), how many (`per_request`, a length distribution) and
at what resolution (`sizes`, WxH, drawn by `weights`). What an image becomes depends on the model (its processor:
`capacity.model.vision_tokens`), so a spec is bound to a model before requests are drawn (`bind`, done by
`capacity.sim.vision.serve_images` when a run starts); the bound spec adds each image's placeholder tokens to
the request's prompt, right after its shared prefix (a system prompt), and records each image on the request
(`Request.images`: start in the prompt, placeholder tokens, the encoder's sequence length and sequences) for the
vision encoder's cost. Images are distinct by default: their tokens are never shared by the prefix cache (vLLM
keys a block holding image tokens by the image's hash, `_gen_mm_extra_hash_keys` in vllm/v1/core/kv_cache_utils.py,
so only an identical image hits). With `identical: true` every request's images are the same picture(s) (a
benchmark resending one image): they extend the request's shared prefix (its prefix group's, or a group of their
own), so the prefix cache shares their blocks, and the encoder cache (keyed by the same hash,
`EncoderCacheManager.check_and_update_cache`) shares their encoder output. `dataset` names a load generator's
benchmark dataset instead (`capacity.vision_datasets`: VisionArena, vLLM random-mm, SGLang image, MMMU): its
images per request and sizes fill the fields not given.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

import numpy as np
from pydantic import Field, PrivateAttr, field_validator, model_validator

from capacity.draws import Lengths, Request, _Strict, fixed
from capacity.errors import ConfigError
from capacity.vision_datasets import alternatives, expand

SIZE = re.compile(r"^\s*(\d{1,7})\s*[xX]\s*(\d{1,7})\s*$")
MAX_SIDE = 1 << 16  # pixels (capacity.model.vision_tokens.MAX_SIDE)
MAX_IMAGES = 64  # per request (vLLM's --limit-mm-per-prompt is per deployment; none takes more in practice)
IMAGE_GROUP = 1 << 30  # the prefix group of identical images in requests without a shared prefix of their own
# what one image is for the model: (placeholder tokens in the prompt, encoder sequence length, encoder sequences)
ImageShape = tuple[int, int, int]


def parse_size(text: str, field: str = "images.sizes") -> tuple[int, int]:
    """'1024x768' -> (1024, 768); an error names the field and the value."""
    m = SIZE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{field}: {text!r} is not WxH (e.g. 1024x768)")
    w, h = int(m.group(1)), int(m.group(2))
    if not (0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE):
        raise ValueError(f"{field}: {text!r}: each side must be 1 to {MAX_SIDE:,} pixels")
    return w, h


class ImageRequests(_Strict):
    """Images per request: a request has images with probability `share`; it then has `per_request` of them
    (drawn, at most 64), each of a size drawn from `sizes` with `weights` (capacity.vision_requests)."""

    share: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 1.0  # share of requests with images
    per_request: Lengths = fixed(1)  # images in a request that has images (fixed, uniform, lognormal, empirical)
    sizes: Annotated[list[str], Field(min_length=1, max_length=64)] = ["1024x768"]  # image resolutions, WxH pixels
    weights: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = None  # relative weight of each size (none: equal)
    identical: bool = False  # every request's images are the same picture(s): shared by the prefix and encoder caches (needs a fixed per_request and one size)
    dataset: str | None = None  # a benchmark dataset (visionarena, random-mm:base=2,ratio=0.5, sglang-image:count=2,resolution=720p...; docs/vision_datasets.md): fills the fields not given
    _shapes: list[ImageShape] | None = PrivateAttr(default=None)
    _px: list[int] = PrivateAttr(default_factory=list)  # source pixels of each size (capacity.engine.image_cpu)

    @model_validator(mode="before")
    @classmethod
    def _dataset(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("dataset") is not None:
            given = {k: v for k, v in data.items() if v is not None}
            preset = expand(data["dataset"])
            if "sizes" in given:  # the dataset's weights go with its sizes
                preset.pop("weights", None)
            data = preset | given
        return data

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: list[str]) -> list[str]:
        for s in v:
            parse_size(s)
        return v

    @model_validator(mode="after")
    def _check(self) -> ImageRequests:
        if self.weights is not None and len(self.weights) != len(self.sizes):
            raise ValueError(f"images.weights: {len(self.weights)} weights for {len(self.sizes)} sizes")
        if self.identical and (self.per_request.kind != "fixed" or len(self.sizes) != 1):
            raise ValueError("images.identical: the same picture(s) in every request need a fixed per_request and "
                             f"one size (got {self.per_request.kind} per_request, {len(self.sizes)} sizes)")
        pr = self.per_request
        high = {"fixed": pr.value, "empirical": max(pr.values or [1])}.get(pr.kind, pr.high)
        if high is None or high > MAX_IMAGES:
            raise ValueError(f"images.per_request: up to {'any number of' if high is None else high} images per "
                             f"request; at most {MAX_IMAGES} (a lognormal needs `high`)")
        return self

    @property
    def bound(self) -> bool:
        return self._shapes is not None

    def bind(self, shape: Callable[[int, int], ImageShape]) -> ImageRequests:
        """A copy that knows what each size becomes for one model (`shape(w, h)`)."""
        ends = alternatives(self.dataset)
        if ends and self.sizes in ends and self.weights is None:  # a real-image dataset's bracket: the end with
            # more image tokens for this model (the conservative one), then more encoder tokens
            def load(sizes: list[str]) -> tuple[int, int]:
                s = [shape(*parse_size(x)) for x in sizes]
                return sum(t for t, _, _ in s), sum(q * n for _, q, n in s)
            out = self.model_copy(update={"sizes": max(ends, key=load)})
        else:
            out = self.model_copy()
        out._shapes = [shape(*parse_size(s)) for s in self.sizes]
        out._px = [w * h for w, h in map(parse_size, out.sizes)]
        return out

    def _probs(self) -> np.ndarray:
        w = np.asarray(self.weights or [1.0] * len(self.sizes), dtype=float)
        return w / w.sum()

    def attach(self, reqs: list[Request], rng: np.random.Generator) -> list[Request]:
        """Give drawn requests their images (module docstring)."""
        if self._shapes is None:
            raise ConfigError("images: this command cannot size images (they need the model's processor rules: "
                              "capacity simulate or plan)")
        n = len(reqs)
        if not n or self.share == 0:
            return reqs
        has = np.ones(n, dtype=bool) if self.share == 1 else rng.random(n) < self.share
        idx = np.flatnonzero(has)
        counts = self.per_request.draw(rng, idx.size)
        total = int(counts.sum())
        k = len(self._shapes)
        which = np.zeros(total, dtype=np.int64) if k == 1 else rng.choice(k, size=total, p=self._probs())
        at = 0
        for i, c in zip(idx, counts):
            r = reqs[int(i)]
            pos = r.prefix_tokens
            imgs, px = [], []
            for k, j in enumerate(which[at: at + int(c)]):
                tokens, seq, seqs = self._shapes[int(j)]
                imgs.append((pos, tokens, seq, seqs, k if self.identical else -1))
                px.append(self._px[int(j)])
                pos += tokens
            at += int(c)
            r.prompt_tokens += pos - r.prefix_tokens
            if self.identical:  # the images extend the shared prefix (a group of their own without one)
                r.prefix_group = r.prefix_group if r.prefix_group >= 0 else IMAGE_GROUP
                r.prefix_tokens = pos
            r.images = tuple(imgs)
            r.image_px = tuple(px)
        return reqs


def image_flags(per_request: str | None, sizes: str | None, share: float | None,
                lengths: Callable[[str, str], Lengths], dataset: str | None = None) -> dict | None:
    """The `images:` mapping from the CLI's --images-per-request, --image-size, --image-share and --image-dataset
    (None: none given). --images-per-request: N, LOW-HIGH or lognormal:MEAN:CV; --image-size: WxH[,WxH...] or
    WxH:WEIGHT[,...]; --image-dataset: a benchmark dataset (capacity.vision_datasets), the other flags over it.
    `lengths`: the CLI's length parser."""
    if per_request is None and sizes is None and share is None and dataset is None:
        return None
    out: dict = {}
    if dataset is not None:
        try:
            expand(dataset)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("images.dataset:", "--image-dataset", 1)) from None
        out["dataset"] = dataset
    if per_request is not None:
        v = per_request.strip()
        if v.startswith("-") or v == "0":
            raise ConfigError(f"--images-per-request {per_request!r}: must be at least 1 (use --image-share for "
                              "requests without images)")
        out["per_request"] = lengths("--images-per-request", v)
    if sizes is not None:
        names, weights = [], []
        for part in sizes.split(","):
            size, _, weight = part.partition(":")
            try:
                parse_size(size, "--image-size")
                wt = float(weight) if weight else 1.0
            except ValueError as exc:
                raise ConfigError(str(exc) if "--image-size" in str(exc) else
                                  f"--image-size {part!r}: weight {weight!r} is not a number") from None
            if not (wt > 0 and np.isfinite(wt)):
                raise ConfigError(f"--image-size {part!r}: weight must be > 0")
            names.append(size.strip().lower())
            weights.append(wt)
        out["sizes"] = names
        if any(weight != 1.0 for weight in weights):
            out["weights"] = weights
    if share is not None:
        if not 0 <= share <= 1:
            raise ConfigError(f"--image-share {share:g}: must be in [0, 1]")
        out["share"] = share
    return out
