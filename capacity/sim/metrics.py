"""Latency and throughput metrics from simulated request timelines, as `vllm bench serve` defines them.

TTFT = first token - arrival (includes queue wait); queue wait = first scheduled - arrival;
TPOT = (E2E - TTFT) / (output tokens - 1) per request, requests with one output token excluded;
ITL = every gap between consecutive output tokens (a distribution over tokens, not requests);
E2E = last token - arrival; throughput = output tokens/s and requests/s over the measured window
(first measured arrival to last measured finish). Percentiles P50/P90/P95/P99, P99.9 with >= 10,000
samples, a bootstrap confidence interval for P99 (scipy.stats.bootstrap), and goodput: requests/s that
meet every SLO of their class at once. A reasoning model's requests are first turned into what the benchmark
client sees (`client_view`: which chunk ends TTFT, which tokens TPOT divides by; `capacity.reasoning`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from capacity.reasoning import Reasoning

PCTS = (50, 90, 95, 99)
BOOTSTRAP_CELLS = 8_000_000  # resampled values held at once by the P99 interval (64 MB)
DEFINITIONS = "vllm bench serve conventions: TTFT includes queueing; TPOT excludes the first token; ITL per token"


@dataclass
class Records:
    """Per-request timelines (seconds), one row per request in arrival order."""

    arrival: np.ndarray
    first_scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    cls: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray
    cached_tokens: np.ndarray | None = None  # prompt tokens the prefix cache held at first admission (simulated)

    def __len__(self) -> int:
        return len(self.arrival)

    def subset(self, mask: np.ndarray) -> Records:
        parts: dict[str, Any] = {k: v if v is None else v[mask] for k, v in self.__dict__.items()}
        return Records(**parts)

    @property
    def finished(self) -> np.ndarray:
        return ~np.isnan(self.finish)


@dataclass
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Inverted-CDF percentile of a weighted sample (ITL values, each weighted by how many tokens saw it)."""
    return weighted_percentiles(values, weights, (q,))[0]


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """`weighted_percentile` at each of `qs`, the sample sorted once for all of them."""
    if len(values) == 0:
        return [float("nan")] * len(qs)
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    last = len(v) - 1
    return [float(v[min(int(np.searchsorted(cum, q / 100.0 * cum[-1], side="left")), last)]) for q in qs]


@dataclass(frozen=True)
class Dist:
    """Summary statistics of one latency (seconds): count, mean, P50/P90/P95/P99, P99.9 with >= 10,000 samples."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None

    def stat(self, name: str) -> float | None:
        """A statistic by its report name: mean, p50, p90, p95, p99, p99.9."""
        return self.p999 if name == "p99.9" else getattr(self, name, None)

    def as_dict(self) -> dict:
        """The JSON form: {"n": 0} when empty; "p99.9" only when measured."""
        if not self.n:
            return {"n": 0}
        d = {"n": self.n, "mean": self.mean, "p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99}
        if self.p999 is not None:
            d["p99.9"] = self.p999
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Dist:
        return cls(int(d.get("n", 0)), d.get("mean"), d.get("p50"), d.get("p90"), d.get("p95"), d.get("p99"),
                   d.get("p99.9"))


def _pcts(x: np.ndarray) -> Dist:
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Dist()
    p50, p90, p95, p99 = (float(v) for v in np.percentile(x, PCTS))
    return Dist(int(x.size), float(x.mean()), p50, p90, p95, p99,
                float(np.percentile(x, 99.9)) if x.size >= 10_000 else None)


def p99_ci(x: np.ndarray, rng: np.random.Generator, confidence: float = 0.95, resamples: int = 400) -> tuple[float, float]:
    """Bootstrap percentile interval for the 99th percentile."""
    from scipy.stats import bootstrap

    x = x[~np.isnan(x)]
    if x.size < 100:
        return (float("nan"), float("nan"))
    # a million samples x 400 resamples would be 3.2 GB at once: past BOOTSTRAP_CELLS, in batches (the same
    # draws from the same generator, so the same interval: scipy 1.17, tests/test_trace_stream.py)
    batch = None if x.size * resamples <= BOOTSTRAP_CELLS else max(1, BOOTSTRAP_CELLS // x.size)
    res = bootstrap((x,), lambda a, axis: np.percentile(a, 99, axis=axis), vectorized=True, batch=batch,
                    n_resamples=resamples, confidence_level=confidence, method="percentile", random_state=rng)
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


DIST_FIELDS = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s")


@dataclass
class ClassSummary:
    """One request class of a multi-class workload (interactive vs batch): its own latencies and SLO result."""

    n_requests: int
    ttft_s: Dist
    tpot_s: Dist
    e2e_s: Dist
    queue_wait_s: Dist
    slo_attainment: float | None = None  # share meeting the class's own SLOs (None: the class has none)

    def as_dict(self) -> dict:
        return {"n_requests": self.n_requests, "ttft_s": self.ttft_s.as_dict(), "tpot_s": self.tpot_s.as_dict(),
                "e2e_s": self.e2e_s.as_dict(), "queue_wait_s": self.queue_wait_s.as_dict(),
                "slo_attainment": self.slo_attainment}

    @classmethod
    def from_dict(cls, d: dict) -> ClassSummary:
        ttft, tpot, e2e, wait = (Dist.from_dict(d[k]) for k in ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s"))
        return cls(int(d["n_requests"]), ttft, tpot, e2e, wait, d.get("slo_attainment"))


@dataclass
class Summary:
    """What a run delivered, as `vllm bench serve` reports it (see module docstring)."""

    n_requests: int
    window_s: float
    ttft_s: Dist
    tpot_s: Dist
    itl_s: Dist
    e2e_s: Dist
    queue_wait_s: Dist
    output_tokens_per_s: float
    requests_per_s: float
    p99_ci_s: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric -> bootstrap 95% interval
    goodput_req_per_s: float | None = None
    slo_attainment: float | None = None
    preempted_requests: int = 0
    definitions: str = DEFINITIONS
    per_class: dict[str, ClassSummary] = field(default_factory=dict)  # only for workloads with several classes
    prefix_hit_rate: float | None = None  # measured prompt tokens found in the prefix cache (when any were)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        if d["prefix_hit_rate"] is None:  # no prefix cache hit: the key only where it says something
            del d["prefix_hit_rate"]
        for k in DIST_FIELDS:
            d[k] = d[k].as_dict()
        d["per_class"] = {k: v.as_dict() for k, v in self.per_class.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Summary:
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in DIST_FIELDS:
            kw[k] = Dist.from_dict(d[k])
        kw["p99_ci_s"] = {k: tuple(v) for k, v in (d.get("p99_ci_s") or {}).items()}
        kw["per_class"] = {k: ClassSummary.from_dict(v) for k, v in (d.get("per_class") or {}).items()}
        return cls(**kw)


def client_view(rec: Records, reasoning: Reasoning | None) -> Records:
    """The requests as a benchmark client sees a reasoning model's stream (`capacity.reasoning`): with
    `first_token: content` the first token is the first answer token, the (reasoning + 1)-th generated one, placed
    on the line from the first token to the last (exact at a constant inter-token latency, as `tokens_in_window`);
    with `counted: content` the output length is the answer's tokens (TPOT's divisor, output tokens/s). ITL samples
    are left as they are: every chunk's gap (`first_token: any`), or the same steps' gaps (`content`: the answer's
    tokens run through the same batches). None, or the defaults, give `rec` itself."""
    if reasoning is None or (reasoning.counted == "all" and reasoning.first_token == "any"):
        return rec
    out = rec.subset(np.ones(len(rec), dtype=bool))
    generated = rec.output_tokens.astype(float)
    content = reasoning.content(generated)
    if reasoning.first_token == "content":
        step = (rec.finish - rec.first_token) / np.maximum(generated - 1, 1)
        out.first_token = rec.first_token + (generated - content) * step
    if reasoning.counted == "content":
        out.output_tokens = content
    return out


TREND_BATCHES = 20  # batch means in arrival order for the TTFT trend test
TREND_P = 1e-3  # one-sided significance of a rising TTFT
STEADY_ARRIVALS = ("poisson", "gamma", "constant")  # one rate throughout: a stationary queue or a growing one


@dataclass(frozen=True)
class Trend:
    """TTFT against arrival time over a run's measured requests, as `TREND_BATCHES` batch means in arrival order
    (consecutive requests' TTFTs are correlated; means of long batches much less so) and a least-squares line
    through them. In a stationary queue the slope is zero; in an overloaded one the queue, and with it TTFT,
    grows in proportion to time. `rising` asks for both a significant slope (one-sided p < `TREND_P`) and a
    large one (the fitted rise from the first batch to the last exceeds half the mean TTFT, i.e. the line ends
    at more than 5/3 of where it starts): a small drift is not flagged, nor a long run's significant but slight
    one (the MLPerf H200 at 131 req/s over 600 s: 137 -> 177 ms, p 1e-8). On FIFO queues the p-value decides
    the false alarms and the size threshold only the power (tests/test_steady_state.py). Near the capacity it is
    the capacity check (`capacity.steady`) that decides, with no threshold: the planner passes no rate at or
    above it, which sets every MLPerf Server max rate in bench/mlperf.py (tests/test_mlperf.py).

    It cannot tell an overload from a stable queue too close to its capacity to settle within the run (M/D/1 at
    rho 0.9 over 500 requests flags 8% of seeds: their TTFT really is still rising there); either way the
    run's percentiles are a transient's and grow with a longer run (`tests/test_trend.py` pins both rates)."""

    first_s: float  # mean TTFT of the first batch
    last_s: float  # and of the last
    slope: float  # seconds of TTFT per second of arrival time
    p_value: float  # one-sided: the slope is > 0
    rise_s: float  # the fitted rise from the first batch's mean arrival time to the last's
    mean_s: float  # mean of the batch means

    @property
    def rising(self) -> bool:
        return self.p_value < TREND_P and self.rise_s > 0.5 * self.mean_s


def ttft_trend(arrival: np.ndarray, first_token: np.ndarray, batches: int = TREND_BATCHES) -> Trend | None:
    """The trend of TTFT over arrival time (see `Trend`); None with fewer than 10 requests per batch, with a
    request that never got its first token, or when every TTFT is the same."""
    if len(arrival) < 10 * batches or not np.all(np.isfinite(first_token)):
        return None
    from scipy import stats

    order = np.argsort(arrival, kind="stable")
    t = np.asarray(arrival, dtype=float)[order]
    y = np.asarray(first_token, dtype=float)[order] - t
    tb = np.array([c.mean() for c in np.array_split(t, batches)])
    yb = np.array([c.mean() for c in np.array_split(y, batches)])
    if np.ptp(tb) <= 0 or np.ptp(yb) <= 0:
        return None
    lr = stats.linregress(tb, yb, alternative="greater")
    return Trend(float(yb[0]), float(yb[-1]), float(lr.slope), float(lr.pvalue),
                 float(lr.slope * (tb[-1] - tb[0])), float(yb.mean()))


def tokens_in_window(rec: Records, t0: float, t1: float) -> tuple[float, float]:
    """Output tokens that requests outside the measured set (the warm-up) emit inside (t0, t1], the first token at
    its time, the others spread evenly over (first token, finish] (exact at a constant inter-token latency); and
    the requests those tokens make up, each request counted by the share of its output emitted inside."""
    done = rec.subset(rec.finished)
    if not len(done):
        return 0.0, 0.0
    ft, fin, out = done.first_token, done.finish, done.output_tokens
    first = ((ft > t0) & (ft <= t1)).astype(float)
    span = fin - ft
    overlap = np.clip(np.minimum(fin, t1) - np.maximum(ft, t0), 0.0, None)
    rest = np.where(span > 0, (out - 1) * overlap / np.where(span > 0, span, 1.0), 0.0)
    inside = first + rest
    return float(inside.sum()), float((inside / np.maximum(out, 1)).sum())


BACKLOG_GRID = 2001  # points at which `backlogged` reads the stretch's cumulative output tokens


@dataclass(frozen=True)
class Backlogged:
    """A closed loop's throughput while its whole population is in it: from the `skip`-th completion, once the
    start-up burst (every user sending at t=0, the first full batch admitted and finishing together) has passed,
    to the completion that frees the last request to be sent (the (n - users)-th of n), after which fewer and
    fewer users remain and each step runs a smaller batch. Over that stretch every user is always waiting,
    running or thinking, so with no think time the queue never empties: the rate a backlog is served at.

    The stretch is set by completions, the rate by tokens: the least-squares slope of the output tokens emitted
    so far (every token at its emission time, whichever request it belongs to), read at `BACKLOG_GRID` evenly
    spaced times over the stretch, and requests/s that over the mean output length of the run's requests.
    Counting completions between two completions instead swings with where the ends fall on a wave (with fixed
    lengths a backlogged engine's completions come in slow waves: the 8B on an H100 at 1,024/256 tokens, +-12%
    over ~160 s) and can read above what the engine can emit; the slope of a line fitted to a count that never
    rises faster than some rate cannot (up to the staircase's own steps: tests/test_output_paced.py).
    Against the same stretch of a loop of 30 requests per user: `bench/steady_state.py --capacity-only`."""

    requests_per_s: float
    tokens_per_s: float
    completions: int  # the stretch's length in completions
    start_s: float
    end_s: float


def backlogged(rec: Records, users: int, itl_times: np.ndarray, itl_weights: np.ndarray,
               skip: int | None = None) -> Backlogged | None:
    """The closed loop's `Backlogged` stretch over all its requests (warm-up included: the stretch is set by
    completions, not by which requests are measured); `itl_times`/`itl_weights` are every non-first token's
    emission time and count (`SimResult.itl_times`); `skip` defaults to `users`. None when the stretch holds
    fewer than `users` completions (a loop of under 3 x users requests) or a request never finished."""
    skip = users if skip is None else skip
    if users < 1 or not len(rec) or not np.all(np.isfinite(rec.finish)):
        return None
    fin = np.sort(rec.finish)
    k1, k2 = skip, len(fin) - users  # 1-based completion ranks at the stretch's two ends
    if k1 < 1 or k2 - k1 < users:
        return None
    t0, t1 = float(fin[k1 - 1]), float(fin[k2 - 1])
    if not t1 > t0:
        return None
    inside = (itl_times > t0) & (itl_times <= t1)
    firsts = rec.first_token[(rec.first_token > t0) & (rec.first_token <= t1)]
    times = np.concatenate([itl_times[inside], firsts])
    order = np.argsort(times, kind="stable")
    cum = np.cumsum(np.concatenate([itl_weights[inside], np.ones(len(firsts))])[order])
    grid = np.linspace(t0, t1, BACKLOG_GRID)
    emitted = np.concatenate([[0.0], cum])[np.searchsorted(times[order], grid, side="right")]
    tok_s = float(np.polyfit(grid, emitted, 1)[0])
    return Backlogged(tok_s / float(rec.output_tokens.mean()), tok_s, k2 - k1, t0, t1)


def summarize(rec: Records, itl_values: np.ndarray, itl_weights: np.ndarray, rng: np.random.Generator,
              slos: list[SLO] | None = None, ci: bool = True, class_names: list[str] | None = None,
              others: Records | None = None, client: Reasoning | None = None) -> Summary:
    """The run's summary; with `class_names` (two or more), also each class's own latencies (`per_class`).

    Throughput is measured over the window of the measured requests (first arrival to last finish) and counts every
    token emitted in it: those of the requests left out as warm-up (`others`) too, which are still running when the
    window opens (a closed loop of c users has c - 1 of them); counting only the measured requests' tokens would
    report a rate the engine exceeded. Requests/s likewise counts the warm-up requests, each by the share of its
    output emitted in the window: counted whole when they finished in it, a closed loop's start-up cohort (left
    out as warm-up, `capacity.pipeline.warmup_requests`) would make a loop of two requests per user read 27% high
    (`tests/test_steady_state.py`). `client`: a reasoning model's requests as the benchmark client sees them
    (`client_view`)."""
    rec, others = client_view(rec, client), None if others is None else client_view(others, client)
    done = rec.subset(rec.finished)
    n = len(done)
    if n == 0:
        return Summary(0, 0.0, Dist(), Dist(), Dist(), Dist(), Dist(), 0.0, 0.0)
    ttft = done.first_token - done.arrival
    e2e = done.finish - done.arrival
    wait = done.first_scheduled - done.arrival
    multi = done.output_tokens > 1
    tpot = np.where(multi, (e2e - ttft) / np.maximum(done.output_tokens - 1, 1), np.nan)
    window = float(done.finish.max() - done.arrival.min())
    itl = Dist()
    if len(itl_values):
        itl = Dist(int(itl_weights.sum()), float(np.average(itl_values, weights=itl_weights)),
                   *weighted_percentiles(itl_values, itl_weights, PCTS))
    t0, t1 = float(done.arrival.min()), float(done.finish.max())
    extra_tokens, extra_done = 0.0, 0.0
    if others is not None:  # warm-up requests still running in the window: the part of them done in it counts
        extra_tokens, extra_done = tokens_in_window(others, t0, t1)
    s = Summary(n, window, _pcts(ttft), _pcts(tpot), itl, _pcts(e2e), _pcts(wait),
                float((done.output_tokens.sum() + extra_tokens) / window) if window > 0 else float("nan"),
                float((n + extra_done) / window) if window > 0 else float("nan"),
                preempted_requests=int((done.preemptions > 0).sum()))
    if done.cached_tokens is not None and done.cached_tokens.any():
        s.prefix_hit_rate = float(done.cached_tokens.sum() / max(1, done.prompt_tokens.sum()))
    if ci:
        s.p99_ci_s = {"ttft": p99_ci(ttft, rng), "tpot": p99_ci(tpot, rng), "e2e": p99_ci(e2e, rng)}
    if slos and any(x.ttft_s or x.tpot_s for x in slos):
        ok = np.ones(n, dtype=bool)
        for c, slo in enumerate(slos):
            m = done.cls == c
            if slo.ttft_s is not None:
                ok[m] &= ttft[m] <= slo.ttft_s
            if slo.tpot_s is not None:
                ok[m] &= np.nan_to_num(tpot[m], nan=0.0) <= slo.tpot_s
        s.slo_attainment = float(ok.mean())
        # the measured requests' attainment applied to the window's throughput (which counts warm-up finishes too)
        s.goodput_req_per_s = float(ok.mean() * s.requests_per_s) if window > 0 else float("nan")
    if class_names and len(class_names) > 1:
        for c, name in enumerate(class_names):
            m = done.cls == c
            slo = slos[c] if slos and c < len(slos) else SLO()
            att = None
            if slo.ttft_s is not None or slo.tpot_s is not None:
                okc = np.ones(int(m.sum()), dtype=bool)
                if slo.ttft_s is not None:
                    okc &= ttft[m] <= slo.ttft_s
                if slo.tpot_s is not None:
                    okc &= np.nan_to_num(tpot[m], nan=0.0) <= slo.tpot_s
                att = float(okc.mean()) if okc.size else None
            s.per_class[name] = ClassSummary(int(m.sum()), _pcts(ttft[m]), _pcts(tpot[m]), _pcts(e2e[m]),
                                             _pcts(wait[m]), att)
    return s
