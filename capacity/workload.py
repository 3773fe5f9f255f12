"""Workloads: who arrives when, with how many prompt and output tokens, in which class.

A `WorkloadSpec` (pydantic, from YAML/JSON or CLI flags) describes arrivals (Poisson, Gamma with a CV knob for
burstiness, constant, closed-loop users with think time, a trace, or a Poisson process whose rate follows a
`RateCurve` such as a daily load curve), lengths (fixed, uniform, lognormal, empirical), request classes with their
priority and SLOs, shared-prefix groups (system prompts, for prefix caching) and multi-turn sessions
(`capacity.sessions`). `generate(spec, rng)` draws the open-loop requests from the `np.random.Generator` passed in:
a run is reproducible from its seed. A request, its lengths and how they are drawn sit below the spec, in
`capacity.draws` (sessions and images build on them); their names are re-exported here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from capacity.curves import RateCurve, curve_arrivals, load_curve, sum_curves
from capacity.draws import (
    Lengths,
    NonNegFloat,
    PosFloat,
    PosInt,
    Request,
    _Strict,
    draw_attributes,
    fixed,
    interarrival_gaps,
)
from capacity.errors import ConfigError
from capacity.limits import MAX_CLOCK_S, MAX_CV, MAX_RATE_PER_S, MIN_CV, MIN_RATE_PER_S, check
from capacity.reasoning import Reasoning
from capacity.replay import iter_trace
from capacity.sessions import Sessions
from capacity.vision_requests import ImageRequests

__all__ = ["Arrivals", "ImageRequests", "Lengths", "NonNegFloat", "PosFloat", "PosInt", "PrefixGroups", "Rate",
           "Request", "RequestClass", "Sessions", "WorkloadSpec", "context_of", "draw_attributes", "fixed",
           "generate", "interarrival_gaps", "least_tokens", "load_trace"]

Rate = Annotated[float, Field(ge=MIN_RATE_PER_S, le=MAX_RATE_PER_S, allow_inf_nan=False)]  # requests/s (capacity.limits)


class Arrivals(_Strict):
    """poisson: exponential gaps at `rate_per_s`; gamma: Gamma gaps with coefficient of variation `cv`
    (cv=1 is Poisson, >1 bursty); constant: equal gaps; closed: `users` each send, wait for the answer,
    think `think_s` (exponential with that mean), repeat; trace: timestamps from `trace`; offline: every request
    at t=0 (a batch job: `vllm bench throughput`, MLPerf Offline), measured by its makespan; curve: a Poisson
    process whose rate follows `curve` or `curve_file` (a daily load curve; one curve for the whole workload,
    classes drawn by weight as for the others, or a class on a curve of its own: RequestClass.curve).
    `max_concurrency`: a benchmark client's cap on requests in flight (`vllm bench serve --max-concurrency C`)."""

    kind: Literal["poisson", "gamma", "constant", "closed", "trace", "offline", "curve"] = "poisson"  # arrival process (see above)
    rate_per_s: Rate | None = None  # requests/s, all replicas (a plan supplies it from its target)
    cv: Annotated[float, Field(ge=MIN_CV, le=MAX_CV, allow_inf_nan=False)] = 1.0  # gamma: coefficient of variation of the gaps (1 = Poisson, > 1 bursty)
    users: PosInt | None = None  # closed: concurrent users
    think_s: NonNegFloat = 0.0  # closed: mean think time between a reply and the next request, s
    curve: RateCurve | None = None  # curve: the rate over time, inline (or curve_file)
    curve_file: str | None = None  # curve: a CSV or YAML rate curve file (see load_curve), read when requests are drawn
    duration_s: PosFloat | None = None  # curve: stop at this time, s, even with fewer than num_requests arrived
    max_concurrency: PosInt | None = None  # poisson/gamma/constant/trace: at most this many in flight, the rest wait at the client (first come, first served) and are timed from their send

    @model_validator(mode="after")
    def _check(self) -> Arrivals:
        # rate_per_s may be left out of a planning scenario (the planner supplies it); generate() checks it
        if self.kind == "closed" and self.users is None:
            raise ValueError("closed-loop arrivals need users")
        if self.kind == "curve":
            if (self.curve is None) == (self.curve_file is None):
                raise ValueError("curve arrivals need one of curve (inline points) or curve_file")
            if self.rate_per_s is not None:
                raise ValueError(f"rate_per_s {self.rate_per_s:g}: curve arrivals take their rate from the curve "
                                 "(scale it with curve.scale)")
        else:
            for f in ("curve", "curve_file", "duration_s"):
                if getattr(self, f) is not None:
                    raise ValueError(f"{f}: only curve arrivals take it (kind is {self.kind})")
        if self.max_concurrency is not None and self.kind not in ("poisson", "gamma", "constant", "trace"):
            raise ValueError(f"max_concurrency {self.max_concurrency}: a client's cap on an open loop (poisson, gamma, "
                             f"constant or trace arrivals), not {self.kind}; everything sent at once behind a cap is "
                             f"a closed loop (kind closed, users {self.max_concurrency})")
        for n in (n for n in ("users", "max_concurrency") if getattr(self, n) is not None):
            _bounded("users", getattr(self, n), n)
        return self

    def rate_curve(self) -> RateCurve:
        """The curve of curve arrivals: inline, or read from curve_file (a ConfigError names the file)."""
        if self.curve is not None:
            return self.curve
        if self.curve_file is None:
            raise ConfigError(f"arrivals: {self.kind} arrivals have no rate curve")
        return load_curve(self.curve_file)


class RequestClass(_Strict):
    name: str = "default"  # unique; results are reported per class under it
    weight: PosFloat = 1.0  # share of arrivals
    priority: int = 0  # lower is served first
    input_len: Lengths | None = None  # None: the spec's default
    output_len: Lengths | None = None  # this class's output lengths (None: the workload's)
    slo_ttft_s: PosFloat | None = None  # this class's TTFT SLO, s (goodput; the planner holds the class to it)
    slo_tpot_s: PosFloat | None = None  # this class's TPOT SLO, s
    # curve arrivals: this class arrives on a curve of its own (batch jobs at night, chat by day), independent of
    # the others; classes without one share the workload's curve by weight. Inline, or a CSV/YAML file.
    curve: RateCurve | None = None
    curve_file: str | None = None

    @model_validator(mode="after")
    def _one_curve(self) -> RequestClass:
        if self.curve is not None and self.curve_file is not None:
            raise ValueError(f"class {self.name}: give curve or curve_file, not both")
        return self

    @property
    def has_curve(self) -> bool:
        return self.curve is not None or self.curve_file is not None

    def rate_curve(self) -> RateCurve:
        if self.curve is not None:
            return self.curve
        assert self.curve_file is not None
        return load_curve(self.curve_file)


class PrefixGroups(_Strict):
    """`groups` distinct shared prefixes of `tokens` each; a request has one with probability `share`, drawn at
    random or, with `assign: round_robin`, in turn by request number (request j has prefix j mod groups): how
    genai-perf/perf_analyzer reuse their dataset entries (100 by default, sent in turn), which makes a prefix of
    the whole prompt less one token a benchmark's repeated prompts."""

    groups: PosInt = 1  # distinct shared prefixes (system prompts, templates)
    tokens: PosInt
    share: Annotated[float, Field(ge=0, le=1)] = 1.0  # probability that a request carries one
    assign: Literal["random", "round_robin"] = "random"  # round_robin: request j has prefix j mod groups


class WorkloadSpec(_Strict):
    arrivals: Arrivals = Arrivals(rate_per_s=1.0)  # who arrives when
    input_len: Lengths = fixed(1024)  # prompt tokens per request
    output_len: Lengths = fixed(256)  # output tokens per request
    num_requests: PosInt = 1000  # requests per simulation
    classes: list[RequestClass] = [RequestClass()]  # request classes (interactive, batch ...), drawn by weight
    prefix: PrefixGroups | None = None  # shared prefixes, for prefix caching
    trace: str | None = None  # JSONL/CSV path for kind=trace or empirical replay
    sessions: Sessions | None = None  # multi-turn sessions (capacity.sessions): arrivals then start sessions
    images: ImageRequests | None = None  # images in requests (capacity.vision_requests): vision-language serving
    reasoning: Reasoning | None = None  # hidden reasoning tokens and the client's accounting (capacity.reasoning)

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        _bounded("requests", self.num_requests, "num_requests")
        rate = self.arrivals.rate_per_s
        if rate is not None and self.arrivals.kind in ("poisson", "gamma", "constant") and \
                self.num_requests / rate > MAX_CLOCK_S:
            raise ValueError(f"arrivals.rate_per_s {rate:g} with num_requests {self.num_requests:,}: the arrivals "
                             f"would span {self.num_requests / rate:.3g} s, more than {MAX_CLOCK_S:g} s")
        if self.arrivals.kind == "trace" and not self.trace:
            raise ValueError("trace arrivals need `trace` (a JSONL or CSV file)")
        if self.sessions is not None:
            self.sessions.check(self)
        if not self.classes:
            raise ValueError("classes: need at least one class")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: names must be unique (got {names})")
        own = [c.name for c in self.classes if c.has_curve]
        if own and self.arrivals.kind != "curve":
            raise ValueError(f"classes {', '.join(own)}: a class curve needs curve arrivals (arrivals.kind is "
                             f"{self.arrivals.kind})")
        if own and len(own) == len(self.classes):
            raise ValueError("classes: every class has a curve of its own, so the workload's arrivals curve would "
                             "be unused; leave one class on the workload's curve")
        return self

    def total_curve(self) -> RateCurve:
        """Curve arrivals: the total arrival rate, the workload's curve plus every class's own (exact when they
        share shape and period, which is required; see capacity.curves.sum_curves)."""
        base = self.arrivals.rate_curve()
        own = [c.rate_curve() for c in self.classes if c.has_curve]
        return sum_curves([base, *own]) if own else base

    def class_lengths(self, c: int) -> tuple[Lengths, Lengths]:
        k = self.classes[c]
        return k.input_len or self.input_len, k.output_len or self.output_len

    def check_context(self, max_model_len: int, what: str = "max_model_len") -> None:
        """One error when every request of some class is longer (prompt + output) than `max_model_len`: the engine
        rejects each of them, so a search over rates, layouts or pools would only ever see nothing served and
        blame the SLO. (A trace's lengths are its own and are not looked at.)"""
        if self.arrivals.kind == "trace":
            return
        for c, k in enumerate(self.classes):
            li, lo = self.class_lengths(c)
            least = least_tokens(li) + least_tokens(lo)
            if least > max_model_len:
                who = f"class {k.name!r}" if len(self.classes) > 1 else "the workload"
                raise ConfigError(f"{what} {max_model_len:,}: every request of {who} is longer (at least {least:,} "
                                  "tokens, prompt + output), so none could be served: "
                                  + ("raise it or shorten them" if what.endswith("max_model_len") else "shorten them"))

    @property
    def mean_output_tokens(self) -> float:
        w = np.array([k.weight for k in self.classes])
        return float(sum(wi * self.class_lengths(i)[1].expected for i, wi in enumerate(w / w.sum())))


def context_of(engine, card) -> tuple[int, str]:
    """The longest request an engine serves and its name, for `WorkloadSpec.check_context`: the engine's
    max_model_len, or the model's context when it sets none."""
    if engine.max_model_len is not None:
        return engine.max_model_len, "max_model_len"
    return card.max_position_embeddings, "the model's context (max_position_embeddings)"


def least_tokens(lengths: Lengths) -> int:
    """The fewest tokens a length distribution draws (uniform and lognormal: their `low`)."""
    return {"fixed": int(lengths.value or 1), "empirical": min(lengths.values or [1])}.get(lengths.kind, lengths.low)


def generate(spec: WorkloadSpec, rng: np.random.Generator) -> list[Request]:
    """Open-loop requests in arrival order (closed-loop requests are made by the simulator)."""
    if spec.arrivals.kind == "trace":
        assert spec.trace is not None  # the validator requires it for trace arrivals
        return load_trace(spec.trace, spec)[: spec.num_requests]
    if spec.arrivals.kind == "closed" or spec.sessions is not None:
        raise ConfigError("closed-loop workloads and sessions are generated by the simulator, not up front")
    if spec.arrivals.kind == "offline":
        return draw_attributes(spec, rng, spec.num_requests, arrivals=np.zeros(spec.num_requests))
    if spec.arrivals.kind == "curve":
        arr = spec.arrivals
        if any(c.has_curve for c in spec.classes):
            return _class_curves(spec, rng)
        curve = arr.rate_curve()
        times = curve_arrivals(curve, rng, spec.num_requests, arr.duration_s)
        if not times.size:
            raise ConfigError(f"arrivals.duration_s: no request arrived in the first {arr.duration_s:g} s of the curve "
                              f"(about {curve.integral(0.0, arr.duration_s or 0.0):.3g} expected)")
        return draw_attributes(spec, rng, times.size, arrivals=times)
    times = np.cumsum(interarrival_gaps(spec.arrivals, rng, spec.num_requests))
    return draw_attributes(spec, rng, spec.num_requests, arrivals=times)


def _class_curves(spec: WorkloadSpec, rng: np.random.Generator) -> list[Request]:
    """Curve arrivals with classes on curves of their own: one non-homogeneous Poisson stream per such class and
    one for the classes on the workload's curve (drawn among them by weight); superposed, the first num_requests
    in time order (each stream draws up to num_requests, so none is cut short)."""
    arr = spec.arrivals
    groups = [([i], c.rate_curve()) for i, c in enumerate(spec.classes) if c.has_curve]
    groups.append(([i for i, c in enumerate(spec.classes) if not c.has_curve], arr.rate_curve()))
    sum_curves([g[1] for g in groups])  # one shape and period, or a one-line error, before drawing anything
    out: list[Request] = []
    for members, curve in groups:
        times = curve_arrivals(curve, rng, spec.num_requests, arr.duration_s)
        sub = spec.model_copy(update={"classes": [spec.classes[i].model_copy(update={"curve": None,
                                                                                     "curve_file": None})
                                                  for i in members]})
        for r in draw_attributes(sub, rng, times.size, arrivals=times):
            r.cls = members[r.cls]
            out.append(r)
    out.sort(key=lambda r: (r.arrival_s, r.cls))
    out = out[: spec.num_requests]
    if not out:
        raise ConfigError(f"arrivals.duration_s: no request arrived in the first {arr.duration_s:g} s of the curves")
    for k, r in enumerate(out):
        r.id = k
    return out


def _bounded(name: str, value: int, what: str) -> None:
    try:
        check(name, value, what)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def load_trace(path: str | Path, spec: WorkloadSpec | None = None, max_rows: int | None = None) -> list[Request]:
    """JSONL or CSV with `timestamp` (s), `input_tokens`, `output_tokens` and optional `class` (a class
    name from the spec). Rows must be in time order with non-negative timestamps (an error names the row
    otherwise); time is shifted so the first arrival is at 0. The list of `capacity.replay.iter_trace`'s stream."""
    return list(iter_trace(path, spec, max_rows))

