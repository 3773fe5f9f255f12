"""Predicted vs measured: replay a measured load-test run through the simulator, and fit an engine's step-cost
terms from measured runs (`capacity calibrate --from-run`).

`replay(run)` turns the run's requests back into a workload with the *same* arrival times (as scheduled;
trace replay) and lengths. `compare(run, sim)` lines up P50/P90/P99 of TTFT, TPOT, ITL, E2E and throughput
with relative errors. `fit_engine(runs, ...)` fits a `LinearCost` (fixed + per token + per key + per
query x key pair) by simulating each run with candidate terms and minimising the relative error of its
TTFT/TPOT/E2E percentiles (scipy least squares in log-parameter space): the engine's own overheads, measured
end to end through its API, with no access to its internals.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from capacity.costs import LinearCost
from capacity.errors import CapacityError
from capacity.metrics import summarize
from capacity.simulator import SimConfig, simulate
from capacity.workload import Request

STATS = ("p50", "p90", "p99")
METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))


def load_run(path: str | Path) -> dict:
    from capacity.config_io import read_json

    p = Path(path)
    run = read_json(p, "run file")
    if not isinstance(run, dict) or not isinstance(run.get("requests"), list):
        raise CapacityError(f"{p}: not a load-test run (no requests list): write one with `capacity loadtest`")
    if not any(r.get("status") == "ok" for r in run["requests"]):
        raise CapacityError(f"{p}: no successful request in this run: nothing to compare")
    return run


def replay(run: dict) -> list[Request]:
    reqs = [Request(r["id"], float(r["scheduled_s"]), int(r["prompt_tokens"]), int(r["max_tokens"]))
            for r in run["requests"] if r["status"] == "ok"]
    reqs.sort(key=lambda q: q.arrival_s)
    return reqs


def simulate_run(run: dict, cost, sched_kw: dict, seed: int = 0):
    from capacity.scheduler import make_scheduler

    return simulate(replay(run), cost, lambda: make_scheduler("continuous", **sched_kw), np.random.default_rng(seed),
                    SimConfig(timeseries=False))


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


def fit_engine(runs: list[dict], sched_kw: dict, x0: LinearCost | None = None) -> tuple[LinearCost, dict]:
    """Fit LinearCost terms so that simulating each run reproduces its measured percentiles."""
    from scipy.optimize import least_squares

    from capacity.loadtest import summarize_run

    targets = [summarize_run(r) for r in runs]
    x0 = x0 or LinearCost(2e-3, 2e-5, 1e-7, 1e-9)
    names = ("fixed_s", "per_token_s", "per_key_s", "per_pair_s")
    p0 = np.log([max(getattr(x0, n), 1e-12) for n in names])

    def cost_of(p):
        return LinearCost(*np.exp(p), source="engine fit")

    def resid(p):
        c = cost_of(p)
        out = []
        for run, tgt in zip(runs, targets):
            pred = sim_summary(simulate_run(run, c, sched_kw))
            for key in ("ttft_s", "tpot_s", "e2e_s"):
                for st in ("p50", "p90"):
                    m, q = tgt[key].get(st), pred[key].get(st)
                    if m and q:
                        out.append(math.log(q / m))
        return np.array(out)

    res = least_squares(resid, p0, bounds=(np.log(1e-12), np.log(1.0)), x_scale=1.0, diff_step=0.05, max_nfev=60)
    fit = cost_of(res.x)
    err = np.abs(np.expm1(res.fun))
    return fit, {"median_abs_rel_err": float(np.median(err)), "max_abs_rel_err": float(err.max()),
                 "evaluations": int(res.nfev), "runs": len(runs)}


def save_fit(path: str | Path, fit: LinearCost, info: dict, sched_kw: dict, sources: list[str]) -> None:
    Path(path).write_text(json.dumps({"kind": "engine_fit", "schema_version": 1,
                                      "cost": {k: getattr(fit, k) for k in ("fixed_s", "per_token_s", "per_key_s",
                                                                            "per_pair_s")},
                                      "scheduler": sched_kw, "fit": info, "runs": sources}, indent=1) + "\n")


def load_fit(path: str | Path) -> tuple[LinearCost, dict]:
    from capacity.config_io import read_json

    p = Path(path)
    d = read_json(p, "engine fit")
    if not isinstance(d, dict) or d.get("kind") != "engine_fit" or d.get("schema_version") != 1:
        raise CapacityError(f"{p}: not an engine fit of schema_version 1 (write one with `capacity calibrate --from-run`)")
    return LinearCost(**d["cost"], source=f"engine fit {p}"), d["scheduler"]
