"""Predicted vs measured: replay a measured load-test run through the simulator, and fit an engine's step-cost
terms from measured runs (`capacity calibrate --from-run`).

`replay(run)` turns the run's requests back into a workload with the *same* arrival times (as scheduled;
trace replay) and lengths. `compare(run, sim)` lines up P50/P90/P99 of TTFT, TPOT, ITL, E2E and throughput
with relative errors. `fit_engine(runs, ...)` fits a `LinearCost` (fixed + per token + per key + per
query x key pair) and a front-end latency by simulating each run with candidate terms and matching every
request's own TTFT and TPOT (robust least squares on log ratios, in log-parameter space): the engine's
overheads, measured end to end through its API, with no access to its internals.

The front-end latency is time a request spends outside the engine loop that the client still sees in TTFT
and E2E: HTTP parsing, tokenisation, the hop to the engine process, detokenisation and the first SSE event.
It costs no engine time (vLLM runs its API server in another process), so the simulator delays each
request's entry into the scheduler by it and counts it in TTFT/E2E. On small models it is not small: with
vLLM on this CPU it is several milliseconds against steps of 3-10 ms. Matching per request rather than
percentiles uses hundreds of residuals instead of a dozen, so runs with mixed lengths (a prefill mix, a
decode mix) pin the per-token, per-key and per-pair terms separately.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from capacity.cost.step import LinearCost
from capacity.engine import SchedLimits, get_engine
from capacity.engine.config import EngineConfig
from capacity.errors import CapacityError
from capacity.files import read_json, short, write_atomic
from capacity.pipeline import RunOptions, simulate_requests
from capacity.sim.metrics import summarize
from capacity.truth.loadtest import summarize_run
from capacity.truth.runfile import load_run as load
from capacity.workload import Request

STATS = ("p50", "p90", "p99")
METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))


def load_run(path: str | Path) -> dict:
    """A run file checked for what a fit replays (capacity.truth.runfile)."""
    return load(path, fit=True)


def replay_key(run: dict) -> str:
    return "sent_s" if (run.get("meta") or {}).get("max_concurrency") else "scheduled_s"


def replay(run: dict) -> list[Request]:
    """The run's successful requests at the times the server got them: the schedule of an open loop; a closed
    loop's users record their sends as their schedule; behind a client's cap (meta max_concurrency) the sends,
    not the arrivals that waited for a slot."""
    key = replay_key(run)
    reqs = [Request(r["id"], float(r[key]), int(r["prompt_tokens"]), int(r["max_tokens"]))
            for r in run["requests"] if r["status"] == "ok"]
    reqs.sort(key=lambda q: q.arrival_s)
    return reqs


def scheduler_for(sched_kw: dict):
    """The engine's scheduler for a fit's limits (blocks, block size, token budget, batch cap): the vLLM engine
    model's V1 scheduler, built the way a simulated deployment builds it."""
    limits = SchedLimits(int(sched_kw["max_num_seqs"]), int(sched_kw["max_num_batched_tokens"]),
                         int(sched_kw["block_size"]), int(sched_kw["num_blocks"]), None)
    # the engines fitted here run on a CPU, where vLLM schedules synchronously (its CPU build turns async off)
    return get_engine("vllm").scheduler_factory(EngineConfig(async_scheduling=bool(sched_kw.get("async_scheduling"))),
                                                limits)


def simulate_run(run: dict, cost, sched_kw: dict, seed: int = 0, frontend_s: float = 0.0, timeseries: bool = False):
    """Simulate the run's requests with the fit's limits; with `frontend_s`, each request passes a front-end
    delay of that length before the scheduler, counted in its TTFT/E2E (records keep the client's arrival)."""
    return simulate_requests(scheduler_for(sched_kw), cost, replay(run), RunOptions(seed=seed, timeseries=timeseries),
                             frontend_s=frontend_s)


def per_request(run: dict) -> tuple[np.ndarray, np.ndarray]:
    """Measured TTFT and TPOT of each successful request, in replay order (TPOT NaN for one-token outputs)."""
    key = replay_key(run)
    ok = sorted((r for r in run["requests"] if r["status"] == "ok"), key=lambda r: r[key])
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in ok])
    out = np.array([r["output_tokens"] for r in ok], dtype=float)
    span = np.array([r["finish_s"] - r["first_token_s"] for r in ok])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, span / np.maximum(out - 1, 1), np.nan)
    return ttft, tpot


def _sim_per_request(sim) -> tuple[np.ndarray, np.ndarray]:
    r = sim.records
    out = r.output_tokens.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (r.finish - r.first_token) / np.maximum(out - 1, 1), np.nan)
    return r.first_token - r.arrival, tpot


def sim_summary(sim) -> dict:
    return summarize(sim.records, sim.itl_values, sim.itl_weights, np.random.default_rng(0), ci=False).as_dict()


def compare(measured: dict, predicted: dict) -> list[dict]:
    rows = []
    for key, label in METRICS:
        for st in STATS:
            m, p = measured[key].get(st), predicted[key].get(st)
            if m is None or p is None:
                continue
            rows.append({"metric": label, "stat": st, "measured_s": m, "predicted_s": p, "rel_err": p / m - 1})
    m, p = measured["output_tokens_per_s"], predicted["output_tokens_per_s"]
    rows.append({"metric": "output tokens/s", "stat": "mean", "measured_s": m, "predicted_s": p,
                 "rel_err": p / m - 1 if m else math.nan})
    return rows


COST_TERMS = ("fixed_s", "per_token_s", "per_seq_s", "per_key_s", "per_pair_s")
MAX_TERM_S = 10.0  # seconds per step, token, sequence, key or pair: a fit past this is not of a serving engine


def fit_engine(runs: list[dict], sched_kw: dict | list[dict], attention: str = "per_sequence",
               x0: LinearCost | None = None) -> tuple[LinearCost, dict]:
    """Fit LinearCost terms (with the engine's attention kind: "per_sequence" for paged/varlen kernels as in
    vLLM, "packed" for one masked attention over the step as transformers CB runs on a CPU) and a front-end
    latency, so that simulating each run reproduces every request's measured TTFT and TPOT. Returns the
    cost and an info dict (with `frontend_s` and the fit's errors). `sched_kw`: the engine's limits, one dict for
    every run or one per run (runs measured with different limits fit together)."""
    from scipy.optimize import least_squares

    if attention not in ("packed", "per_sequence"):
        raise CapacityError(f"attention: must be packed or per_sequence (got {attention!r})")
    measured = [per_request(r) for r in runs]
    scheds = sched_kw if isinstance(sched_kw, list) else [sched_kw] * len(runs)
    if len(scheds) != len(runs):
        raise CapacityError(f"{len(scheds)} engine configurations for {len(runs)} runs")
    x0 = x0 or LinearCost(2e-3, 2e-5, 1e-7, 1e-9, per_seq_s=1e-4)
    p0 = np.log([max(getattr(x0, n), 1e-12) for n in COST_TERMS] + [1e-3])
    k = len(COST_TERMS)

    def cost_of(p):
        return LinearCost(**dict(zip(COST_TERMS, np.exp(p[:k]))), attention=attention, source="engine fit")

    def resid(p):
        c, front = cost_of(p), float(np.exp(p[k]))
        out = []
        for run, sk, (m_ttft, m_tpot) in zip(runs, scheds, measured):
            s_ttft, s_tpot = _sim_per_request(simulate_run(run, c, sk, frontend_s=front))
            if len(s_ttft) != len(m_ttft):
                raise CapacityError("simulated and measured request counts differ; cannot fit per request")
            r = [np.log(s_ttft / m_ttft)]
            ok = ~np.isnan(m_tpot) & ~np.isnan(s_tpot)
            r.append(np.log(s_tpot[ok] / m_tpot[ok]))
            v = np.concatenate(r)
            out.append(v[np.isfinite(v)] / math.sqrt(max(1, len(v))))  # each run weighs the same
        return np.concatenate(out)

    res = least_squares(resid, p0, bounds=(np.log(1e-12), np.log(1.0)), diff_step=0.05, max_nfev=200,
                        loss="soft_l1", f_scale=0.05)
    fit, front = cost_of(res.x), float(np.exp(res.x[k]))
    # Report the fit on the same terms as `compare`: relative error of each run's percentiles.
    errs = []
    for run, sk in zip(runs, scheds):
        cmp = compare(summarize_run(run), sim_summary(simulate_run(run, fit, sk, frontend_s=front)))
        errs += [abs(r["rel_err"]) for r in cmp if r["metric"] in ("TTFT", "TPOT") and r["stat"] in ("p50", "p90")]
    unc, warn = term_uncertainty(res, [*COST_TERMS, "frontend_s"], len(runs))
    return fit, {"frontend_s": front, "median_abs_rel_err": float(np.median(errs)),
                 "max_abs_rel_err": float(np.max(errs)), "evaluations": int(res.nfev), "runs": len(runs),
                 "requests": int(sum(len(m[0]) for m in measured)), "uncertainty": unc, "warnings": warn}


# The probe run that pins each term down: the workload whose steps are dominated by that term.
PINNED_BY = {
    "fixed_s": "a single stream (one request at a time, short prompts: every step is small)",
    "per_token_s": "a long-prompt burst (prefill-heavy steps of many tokens)",
    "per_seq_s": "a decode burst (many short prompts with long outputs: wide decode batches)",
    "per_key_s": "long prompts with long outputs (decodes over long contexts)",
    "per_pair_s": "a long-prompt burst (attention pairs grow with the square of the prompt)",
    "frontend_s": "a single stream at a low rate (the TTFT of an idle engine)",
}
UNPINNED_FACTOR = 2.0  # a term the runs allow anywhere within x/2..2x (95%) is not determined by them
NOISE_FLOOR = 0.01  # relative timing error of one request below which measurements are not trusted


def term_uncertainty(res, names: list[str], n_runs: int = 1) -> tuple[dict, list[str]]:
    """Each fitted term's 95% range from the Jacobian of the least-squares fit (parameters are log terms, so
    the range is a factor), and a warning for every term the runs do not pin down, naming the probe that would.

    Gauss-Newton: cov(log terms) = (J^T J)^-1 x s^2, s^2 = the residual variance. A term whose column of J is
    (nearly) zero, or collinear with another's, gets a huge variance: changing it changes nothing the runs
    measured, so two-run fits that report a small error can still be arbitrary in that term."""
    J = np.asarray(res.jac, dtype=float)
    m, n = J.shape
    # residuals are per-request log errors / sqrt(requests in the run); timings are not trusted below NOISE_FLOOR
    # per request, so a (synthetic) perfect fit does not make every term look pinned
    s2 = max(2.0 * float(res.cost) / max(1, m - n), NOISE_FLOOR ** 2 * n_runs / max(1, m))
    unc, warn = {}, []
    for i, name in enumerate(names):
        # var(term i) = s^2 / |what of column i the other columns do not explain|^2 (the i-th diagonal of
        # s^2 (J^T J)^-1, also when J^T J is singular: a collinear or empty column gets an unbounded variance)
        col, others = J[:, i], np.delete(J, i, axis=1)
        beta = np.linalg.lstsq(others, col, rcond=None)[0] if others.size else np.zeros(0)
        own = float(np.linalg.norm(col - others @ beta)) if others.size else float(np.linalg.norm(col))
        se = math.sqrt(s2) / own if own > 0 else math.inf
        factor = math.exp(1.96 * se) if se < 50 else math.inf
        value = float(np.exp(res.x[i]))
        unc[name] = {"value": value, "factor_95": factor if math.isfinite(factor) else None}  # None: unbounded
        if factor > UNPINNED_FACTOR:
            rng = "any value" if not math.isfinite(factor) else f"{value / factor:.3g} to {value * factor:.3g}"
            warn.append(f"{name} = {value:.3g} is not determined by these runs ({rng} fits as well, 95%); "
                        f"if your workloads stress it, add {PINNED_BY.get(name, 'a run that varies it')}")
    return unc, warn


def widen_for_drift(unc: dict, drift: float) -> dict:
    """Each term's 95% range widened by a run-wide relative error `drift` (the standard deviation of the log of
    the engine's own speed between runs): the Jacobian's range counts each request as an independent sample, but
    a slower engine during one run moves all of that run's requests, and the term it pins, together. In log
    space the two errors add in quadrature: factor = exp(1.96 sqrt(se^2 + drift^2)), se = ln(factor) / 1.96.
    An unbounded term stays unbounded."""
    if not drift > 0:
        return unc
    out = {}
    for name, u in unc.items():
        f = u.get("factor_95")
        if f is not None:
            se = math.log(f) / 1.96
            f = math.exp(1.96 * math.sqrt(se * se + drift * drift))
        out[name] = {**u, "factor_95": f}
    return out


def save_fit(path: str | Path, fit: LinearCost, info: dict, sched_kw: dict, sources: list[str],
             provenance: dict | None = None, run_engines: list[dict] | None = None) -> None:
    """`provenance`: where the fitted runs were measured (host, server), checked when the fit is applied."""
    doc = {"kind": "engine_fit", "schema_version": 1,
           "cost": {**{k: getattr(fit, k) for k in COST_TERMS}, "attention": fit.attention},
           "frontend_s": info.get("frontend_s", 0.0), "scheduler": sched_kw, "fit": info, "runs": sources,
           "run_engines": run_engines or [sched_kw], "provenance": provenance}
    write_atomic(path, json.dumps(doc, indent=1) + "\n", "--out")


def fit_provenance(path: str | Path) -> dict | None:
    """The provenance a fit recorded (None for fits written before it was recorded)."""
    d = read_json(Path(path), "engine fit")
    p = d.get("provenance") if isinstance(d, dict) else None
    return p if isinstance(p, dict) else None


def load_fit(path: str | Path) -> tuple[LinearCost, dict, float]:
    p = Path(path)
    d = read_json(p, "engine fit")
    if not isinstance(d, dict) or d.get("kind") != "engine_fit" or d.get("schema_version") != 1:
        raise CapacityError(f"{p}: not an engine fit of schema_version 1 (write one with `capacity calibrate --from-run`)")
    front = d.get("frontend_s", 0.0)  # fits written before the front-end term have none
    if isinstance(front, bool) or not isinstance(front, (int, float)) or not 0 <= front < 10:
        raise CapacityError(f"{p}: frontend_s must be a number of seconds in [0, 10) (got {short(front)})")
    cost = d.get("cost")
    if not isinstance(cost, dict) or set(cost) - set(COST_TERMS) - {"attention"}:
        raise CapacityError(f"{p}: cost must hold {', '.join(COST_TERMS)} and attention (got {cost!r})")
    import math

    for k in COST_TERMS:  # a negative, non-finite or absurd term makes steps take no, negative or endless time
        v = cost.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_TERM_S:
            raise CapacityError(f"{p}: cost.{k} must be a finite number of seconds in [0, {MAX_TERM_S:g}] "
                                f"(got {v:.4g})" if isinstance(v, (int, float)) and not isinstance(v, bool)
                                else f"{p}: cost.{k} must be a number (got {str(v)[:40]!r})")
    sched = d.get("scheduler")
    if not isinstance(sched, dict):
        raise CapacityError(f"{p}: scheduler must be a mapping (got {type(sched).__name__})")
    for k in ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"):
        v = sched.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 10**9:
            raise CapacityError(f"{p}: scheduler.{k} must be a whole number from 1 to 10^9 (got {v!r})")
    try:
        return LinearCost(**cost, source=f"engine fit {p}"), sched, float(front)
    except (TypeError, ValueError) as exc:
        raise CapacityError(f"{p}: {exc}") from None
