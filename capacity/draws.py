"""Requests and how they are drawn: the pieces `capacity.workload`, `capacity.sessions`, `capacity.vision_requests`
and `capacity.replay` share (a `Request`, a token-length distribution, open-loop gaps, a request's class, lengths,
prefix group and images). The workload spec itself (`capacity.workload.WorkloadSpec`) sits above them: the
functions here, and those of `capacity.sessions` and `capacity.replay`, take it through `SpecView` (what they read
of it, declared here), so none of them imports the module that imports them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from capacity.errors import ConfigError

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(gt=0)]

@dataclass(slots=True)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cls: int = 0  # index into WorkloadSpec.classes
    priority: int = 0  # lower is served first (vLLM convention)
    prefix_group: int = -1  # -1: no shared prefix
    prefix_tokens: int = 0  # leading prompt tokens shared with the group
    service: int = 0  # which model serves it, in a simulation of several (capacity.sim.simulator.Service)
    block_keys: tuple[int, ...] = ()  # a trace's prefix identity: each `block_key_tokens` chunk's id (Mooncake hash_ids)
    block_key_tokens: int = 0
    session: int = -1  # a multi-turn session's id (capacity.sessions; -1: none): its keys cover its output too
    images: tuple[tuple[int, int, int, int, int], ...] = ()  # (start, tokens, encoder seq, seqs, key) (capacity.vision_requests)
    image_px: tuple[int, ...] = ()  # each image's source pixels, W x H (capacity.engine.image_cpu)


class _Strict(BaseModel):
    # strict: `true` is not a rate, "8" is not a count, 8.0 is not a whole number of requests
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Lengths(_Strict):
    """Token-count distribution. fixed: `value`; uniform: [low, high]; lognormal: `mean` and `cv` (of the
    lognormal itself, not of its log), clipped to [low, high]; empirical: draw from `values`."""

    kind: Literal["fixed", "uniform", "lognormal", "empirical"] = "fixed"  # the distribution; each kind needs its fields below
    value: PosInt | None = None  # fixed: the length, tokens
    low: PosInt = 1  # uniform: lowest length; lognormal: clipped below here
    high: PosInt | None = None  # uniform: highest length; lognormal: clipped above here (none: no cap)
    mean: PosFloat | None = None  # lognormal: mean length, tokens
    cv: PosFloat | None = None  # lognormal: coefficient of variation (sd / mean) of the length
    values: list[PosInt] | None = None  # empirical: lengths drawn uniformly from this list

    @model_validator(mode="after")
    def _check(self) -> Lengths:
        need = {"fixed": ("value",), "uniform": ("high",), "lognormal": ("mean", "cv"), "empirical": ("values",)}
        for f in need[self.kind]:
            if getattr(self, f) is None:
                raise ValueError(f"{self.kind} lengths need `{f}`")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.kind == "empirical" and not self.values:
            raise ValueError("empirical lengths need at least one value")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # the validator guarantees the fields each kind needs (value; high; values; mean and cv)
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, (self.high or self.low) + 1, size=n)
        if self.kind == "empirical":
            return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
        cv, mean = float(self.cv or 0.0), float(self.mean or 0.0)
        sigma2 = np.log1p(cv ** 2)
        mu = np.log(mean) - sigma2 / 2
        x = np.rint(rng.lognormal(mu, np.sqrt(sigma2), size=n)).astype(np.int64)
        return np.clip(x, self.low, self.high if self.high is not None else np.iinfo(np.int64).max)

    @property
    def expected(self) -> float:
        if self.kind == "fixed":
            return float(self.value or 0)
        if self.kind == "uniform":
            return (self.low + (self.high or self.low)) / 2
        if self.kind == "empirical":
            return float(np.mean(self.values or [0]))
        return float(self.mean or 0.0)


def fixed(n: int) -> Lengths:
    return Lengths(kind="fixed", value=n)


class ArrivalsView(Protocol):
    """What the draws read of the arrivals (`capacity.workload.Arrivals`)."""

    @property
    def kind(self) -> str: ...
    @property
    def rate_per_s(self) -> float | None: ...
    @property
    def cv(self) -> float: ...
    @property
    def max_concurrency(self) -> int | None: ...


class ClassView(Protocol):
    """What the draws read of a request class (`capacity.workload.RequestClass`)."""

    @property
    def name(self) -> str: ...
    @property
    def weight(self) -> float: ...
    @property
    def priority(self) -> int: ...


class PrefixView(Protocol):
    """What the draws read of the shared prefixes (`capacity.workload.PrefixGroups`)."""

    @property
    def groups(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def share(self) -> float: ...
    @property
    def assign(self) -> str: ...


class ImagesView(Protocol):
    """The workload's `images:` section as the draws use it (`capacity.vision_requests.ImageRequests`)."""

    def attach(self, reqs: list[Request], rng: np.random.Generator) -> list[Request]: ...


class SpecView(Protocol):
    """What the draws, the sessions and a trace's replay read of the workload spec (`capacity.workload.WorkloadSpec`,
    which sits above them and imports them)."""

    @property
    def arrivals(self) -> ArrivalsView: ...
    @property
    def classes(self) -> Sequence[ClassView]: ...
    @property
    def prefix(self) -> PrefixView | None: ...
    @property
    def images(self) -> ImagesView | None: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def trace(self) -> str | None: ...
    def class_lengths(self, c: int) -> tuple[Lengths, Lengths]: ...


def interarrival_gaps(arr: ArrivalsView, rng: np.random.Generator, n: int) -> np.ndarray:
    if arr.kind == "curve":
        raise ConfigError("arrivals.kind curve: the gaps change with time; draw the times with curve_arrivals()")
    if arr.rate_per_s is None:
        raise ConfigError(f"arrivals.rate_per_s: {arr.kind} arrivals need a rate")
    mean = 1.0 / arr.rate_per_s
    if arr.kind == "poisson":
        return rng.exponential(mean, size=n)
    if arr.kind == "gamma":
        shape = 1.0 / arr.cv ** 2  # CV of a Gamma(k, theta) is 1/sqrt(k)
        return rng.gamma(shape, mean / shape, size=n)
    if arr.kind == "constant":
        return np.full(n, mean)
    raise ConfigError(f"arrivals.kind {arr.kind}: no open-loop gaps (closed-loop users are simulated)")


def draw_attributes(spec: SpecView, rng: np.random.Generator, n: int, start_id: int = 0,
                    arrivals: np.ndarray | None = None) -> list[Request]:
    """Class, lengths and prefix group for `n` requests (arrival times given or 0)."""
    w = np.array([k.weight for k in spec.classes], dtype=float)
    cls = rng.choice(len(w), size=n, p=w / w.sum()) if len(w) > 1 else np.zeros(n, dtype=np.int64)
    prompt = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for c in range(len(w)):
        idx = np.flatnonzero(cls == c)
        if idx.size:
            li, lo = spec.class_lengths(c)
            prompt[idx], out[idx] = li.draw(rng, idx.size), lo.draw(rng, idx.size)
    group = np.full(n, -1, dtype=np.int64)
    ptoks = np.zeros(n, dtype=np.int64)
    if spec.prefix is not None:
        has = rng.random(n) < spec.prefix.share
        if spec.prefix.assign == "round_robin":
            group[has] = (start_id + np.flatnonzero(has)) % spec.prefix.groups
        else:
            group[has] = rng.integers(0, spec.prefix.groups, size=int(has.sum()))
        prompt[has] = np.maximum(prompt[has], spec.prefix.tokens + 1)  # a prefix leaves >= 1 token to compute
        ptoks[has] = spec.prefix.tokens
    arr = np.zeros(n) if arrivals is None else arrivals
    # tolist(): the Python floats and ints float()/int() of each element give, converted in one call
    prio = [k.priority for k in spec.classes]
    reqs = [Request(start_id + i, a, p, o, c, prio[c], g, t) for i, (a, p, o, c, g, t) in enumerate(zip(
        np.asarray(arr, dtype=float).tolist(), prompt.tolist(), out.tolist(), cls.tolist(), group.tolist(),
        ptoks.tolist()))]
    return reqs if spec.images is None else spec.images.attach(reqs, rng)  # images: capacity.vision_requests


def draw_one(spec: SpecView, rng: np.random.Generator, rid: int) -> Request:
    """`draw_attributes(spec, rng, 1, start_id=rid)[0]` (a closed-loop user's next request, one at a time): built
    directly where that draws nothing from `rng` (one class, fixed lengths, no shared prefix, no images: the
    planner's capacity loops of fixed-length workloads and its context map), the same request; else that call."""
    if len(spec.classes) == 1 and spec.prefix is None and spec.images is None:
        li, lo = spec.class_lengths(0)
        if li.kind == "fixed" and lo.kind == "fixed" and li.value is not None and lo.value is not None:
            return Request(rid, 0.0, li.value, lo.value, 0, spec.classes[0].priority, -1, 0)
    return draw_attributes(spec, rng, 1, start_id=rid)[0]
