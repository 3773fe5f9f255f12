"""A/B comparison of two runs (measured load tests, or simulated runs saved in the same format) and a regression gate.

Each run is a set of requests. The comparison is per metric:

- latency metrics: TTFT, TPOT and E2E (ms), at the mean and P50/P90/P95/P99;
- throughput: output tokens/s over the run's window (first send to last finish).

For a latency metric, the change is B / A - 1, and its confidence interval comes from a bootstrap over requests
(`scipy.stats.bootstrap`, percentile intervals). Two load tests share no requests, so A and B are resampled
independently. Two simulated what-ifs of one workload with one seed (`simulate --save-run`, the common random
numbers the planner uses) send the same requests at the same times: then the requests are resampled in pairs,
which removes the workload's own variation from the interval (`paired` in the output). For throughput, each run's interval comes from a paired bootstrap of its
requests (tokens, send and finish times together), and the interval of the change combines the two runs' interval
ends, the wider choice. The verdict at the stated level: "worse" or "better" when the interval excludes 0, else
"no significant change". The regression gate (`capacity compare --fail-on`, `capacity loadtest --baseline`) fails
a metric only when its change is significant and beyond its threshold, so noise does not fail a build.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from capacity.errors import CapacityError, require
from capacity.files import write_atomic
from capacity.truth.runfile import check_run

LATENCY = ("ttft", "tpot", "e2e")
STATS = ("mean", "p50", "p90", "p95", "p99")
METRICS = tuple(f"{s}_{m}" for m in LATENCY for s in STATS) + ("throughput",)
HIGHER_IS_BETTER = {"throughput"}
MIN_REQUESTS = 10  # fewer requests than this per run: no interval worth printing


@dataclass
class Requests:
    """A run as per-request arrays (successful requests only), seconds."""

    sent: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output_tokens: np.ndarray
    label: str = ""
    ids: np.ndarray | None = None

    @classmethod
    def of_run(cls, run: dict, label: str = "") -> Requests:
        check_run(run, label or "run")  # the times of every request in order, its counts whole numbers
        ok = [r for r in run["requests"] if r.get("status") == "ok"]
        if len(ok) < MIN_REQUESTS:
            raise CapacityError(f"{label or 'run'}: {len(ok)} successful requests; a comparison needs at least "
                                f"{MIN_REQUESTS}")
        try:
            f = lambda k: np.array([float(r[k]) for r in ok], dtype=float)
            out = cls(f("sent_s"), f("first_token_s"), f("finish_s"), f("output_tokens"), label,
                      np.array([int(r.get("id", -1)) for r in ok]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CapacityError(f"{label or 'run'}: a request lacks a number for {exc}") from None
        if not (np.isfinite(out.sent).all() and np.isfinite(out.first_token).all() and np.isfinite(out.finish).all()):
            raise CapacityError(f"{label or 'run'}: a request has a non-finite time")
        return out

    def values(self, metric: str) -> np.ndarray:
        """Per-request values (ms) of a latency metric's quantity (ttft, tpot, e2e)."""
        if metric == "ttft":
            return (self.first_token - self.sent) * 1e3
        if metric == "e2e":
            return (self.finish - self.sent) * 1e3
        multi = self.output_tokens > 1
        return ((self.finish - self.first_token)[multi] / (self.output_tokens[multi] - 1)) * 1e3

    def throughput(self, idx: np.ndarray | None = None) -> float:
        i = slice(None) if idx is None else idx
        span = float(np.max(self.finish[i]) - np.min(self.sent[i]))
        return float(np.sum(self.output_tokens[i]) / span) if span > 0 else math.nan


def _stat(name: str):
    if name == "mean":
        return lambda x, axis=-1: np.mean(x, axis=axis)
    q = float(name[1:])
    return lambda x, axis=-1: np.percentile(x, q, axis=axis)


@dataclass
class Change:
    metric: str
    a: float
    b: float
    change: float  # B / A - 1
    low: float  # interval of the change
    high: float
    verdict: str  # worse | better | no significant change | too few samples
    level: float
    paired: bool = False

    HEADER = f"{'metric':11s}{'A':>11s}{'B':>11s}{'B/A-1':>8s}  {'interval':20s}verdict"

    def line(self) -> str:
        """One row of at most 80 columns (latencies in ms, throughput in output tokens/s)."""
        ci = "" if math.isnan(self.low) else f"[{self.low:+.1%}, {self.high:+.1%}]"
        short = {"no significant change": "no change", "too few samples": "too few"}.get(self.verdict, self.verdict)
        return f"{self.metric:11s}{self.a:>11,.1f}{self.b:>11,.1f}{self.change:>+8.1%}  {ci:20s}{short}"


def _verdict(metric: str, low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return "too few samples"
    if low <= 0 <= high:
        return "no significant change"
    up = low > 0
    return ("better" if up else "worse") if metric in HIGHER_IS_BETTER else ("worse" if up else "better")


def compare(a: Requests, b: Requests, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> list[Change]:
    """Every metric of METRICS, B against A (see the module docstring)."""
    from scipy import stats

    if not 0.5 <= level < 1:
        raise CapacityError(f"--level {level}: must be in [0.5, 1)")
    rng = np.random.default_rng(seed)
    paired = same_requests(a, b)
    out = []
    for m in LATENCY:
        xa, xb = a.values(m), b.values(m)
        for s in STATS:
            f = _stat(s)
            va, vb = float(f(xa)), float(f(xb))
            name = f"{s}_{m}"
            if len(xa) < MIN_REQUESTS or len(xb) < MIN_REQUESTS or va <= 0:
                out.append(Change(name, va, vb, vb / va - 1 if va > 0 else math.nan, math.nan, math.nan,
                                  "too few samples", level))
                continue

            def ratio(x, y, axis=-1, f=f):
                return f(y, axis=axis) / f(x, axis=axis) - 1

            res = stats.bootstrap((xa, xb), ratio, paired=paired and len(xa) == len(xb), vectorized=True,
                                  n_resamples=resamples, confidence_level=level, method="percentile",
                                  random_state=rng)
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
            out.append(Change(name, va, vb, vb / va - 1, lo, hi, _verdict(name, lo, hi), level, paired))
    ta, tb = a.throughput(), b.throughput()
    ia, ib = _throughput_ci(a, level, resamples, rng), _throughput_ci(b, level, resamples, rng)
    lo, hi = ib[0] / ia[1] - 1, ib[1] / ia[0] - 1  # the widest change the two intervals allow
    out.append(Change("throughput", ta, tb, tb / ta - 1, lo, hi, _verdict("throughput", lo, hi), level))
    return out


def same_requests(a: Requests, b: Requests) -> bool:
    """Whether the two runs sent the same requests at the same times (simulated what-ifs with one seed)."""
    return (len(a.sent) == len(b.sent) and a.ids is not None and b.ids is not None and bool(np.all(a.ids == b.ids))
            and bool(np.allclose(a.sent, b.sent, rtol=0, atol=1e-9)) and bool(np.all(a.output_tokens == b.output_tokens)))


def _throughput_ci(r: Requests, level: float, resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    """A run's throughput interval: requests resampled with their tokens, send and finish times together."""
    n = len(r.sent)
    idx = rng.integers(0, n, size=(resamples, n))
    vals = np.array([r.throughput(i) for i in idx])
    vals = vals[np.isfinite(vals)]
    tail = (1 - level) / 2 * 100
    return float(np.percentile(vals, tail)), float(np.percentile(vals, 100 - tail))


def records_run(r, start: int = 0, meta: dict | None = None, ids=None) -> dict:
    """Simulated requests (`capacity.sim.metrics.Records`, from index `start`) in `capacity loadtest`'s run-file
    format, so `capacity compare` takes simulated and measured runs alike. `ids`: request ids to use (a replay
    keeps the measured run's)."""
    done = r.finished
    reqs = []
    for i in range(start, len(r)):
        reqs.append({"id": int(ids[i]) if ids is not None else i, "status": "ok" if done[i] else "unfinished",
                     "scheduled_s": float(r.arrival[i]), "sent_s": float(r.arrival[i]),
                     "first_token_s": float(r.first_token[i]), "finish_s": float(r.finish[i]),
                     "prompt_tokens": int(r.prompt_tokens[i]), "output_tokens": int(r.output_tokens[i]),
                     "max_tokens": int(r.output_tokens[i])})
    return {"meta": meta or {}, "requests": reqs}


# ---- the gate --------------------------------------------------------------------------------------------
_RULE = re.compile(r"^\s*([a-z0-9_]+)\s*:\s*([+-])\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_rules(spec: str) -> dict[str, float]:
    """'p95_ttft:+10%,p99_tpot:+10%,throughput:-5%' -> {metric: signed threshold}. A latency rule fails on an
    increase beyond +x%, a throughput rule on a decrease beyond -x%."""
    if len(spec) > 2000:
        raise CapacityError("--fail-on: longer than 2,000 characters")
    rules: dict[str, float] = {}
    for part in spec.split(","):
        m = _RULE.match(part)
        if not m:
            raise CapacityError(f"--fail-on {part.strip()[:80]!r}: expected METRIC:+N% or METRIC:-N%, "
                                "e.g. p95_ttft:+10%,throughput:-5%")
        name, sign, pct = m.group(1), m.group(2), float(m.group(3))
        if name not in METRICS:
            raise CapacityError(f"--fail-on {name!r}: unknown metric; use one of {', '.join(METRICS)}")
        want = "-" if name in HIGHER_IS_BETTER else "+"
        if sign != want:
            raise CapacityError(f"--fail-on {name}:{sign}{pct:g}%: a regression of {name} is a "
                                f"{'drop' if want == '-' else 'rise'}: write {name}:{want}{pct:g}%")
        rules[name] = (-1 if sign == "-" else 1) * pct / 100
    return rules


def gate(changes: list[Change], rules: dict[str, float]) -> list[str]:
    """The rules that fail: the change is significant, in the bad direction and beyond the threshold (its
    interval's near end past it is not required: the point estimate beyond it and the interval excluding 0)."""
    by = {c.metric: c for c in changes}
    bad = []
    for name, thr in rules.items():
        c = by[name]
        if c.verdict == "worse" and ((thr < 0 and c.change < thr) or (thr > 0 and c.change > thr)):
            bad.append(f"{name}: {c.a:,.2f} -> {c.b:,.2f} ({c.change:+.1%}, {c.level:.0%} interval "
                       f"[{c.low:+.1%}, {c.high:+.1%}]) is beyond the allowed {thr:+.0%}")
    return bad


def as_dict(changes: list[Change]) -> list[dict]:
    return [asdict(c) for c in changes]


# ---- the plot ----------------------------------------------------------------------------------------------
def cdf_figure(a: Requests, b: Requests, names: tuple[str, str] = ("A", "B")):
    """CDF overlays of TTFT, TPOT and E2E (ms) for the two runs (plotly), for the dashboard or a CI comment."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "E2E (ms)"))
    for col, m in enumerate(LATENCY, start=1):
        for run, name, colour in ((a, names[0], "#1f77b4"), (b, names[1], "#d62728")):
            x = np.sort(run.values(m))
            y = np.arange(1, len(x) + 1) / len(x)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line={"color": colour},
                                     showlegend=col == 1, legendgroup=name), row=1, col=col)
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    fig.update_layout(height=360, width=1000, margin={"l": 50, "r": 20, "t": 40, "b": 40})
    return fig


def write_plot(a: Requests, b: Requests, path: str, names: tuple[str, str] = ("A", "B")) -> None:
    """`.html`: a standalone plotly page (the dashboard's figure); `.png`: the same overlays drawn by matplotlib,
    an image a CI job can attach to a comment. (plotly's own PNG export drives a headless Chrome through kaleido,
    which failed here with the installed browser bindings: matplotlib needs no browser.)"""
    if path.endswith(".html"):
        require("plotly", "dashboard", "--plot")

        write_atomic(path, cdf_figure(a, b, names).to_html(include_plotlyjs="cdn"), "--plot")
    elif path.endswith(".png"):
        require("matplotlib", "plot", "--plot PNG")
        _cdf_png(a, b, path, names)
    else:
        raise CapacityError(f"--plot {path[:80]!r}: use a .html or .png file")


def _cdf_png(a: Requests, b: Requests, path: str, names: tuple[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display, no GUI toolkit
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), constrained_layout=True)
    for ax, m in zip(axes, LATENCY):
        for run, name, colour in ((a, names[0], "#1f77b4"), (b, names[1], "#d62728")):
            x = np.sort(run.values(m))
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=name, color=colour)
        ax.set_xscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)  # 20, 50, 100 rather than 2x10^1 (which overlap)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
        ax.set_title(f"{m.upper()} (ms)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of requests")
    axes[0].legend(loc="lower right", fontsize=8)
    import io

    buf = io.BytesIO()  # drawn in memory, then written all or nothing
    fig.savefig(buf, dpi=110, format="png")
    plt.close(fig)
    write_atomic(path, buf.getvalue(), "--plot")
