"""The guided engine fit (`capacity fit-engine`): run the probe set against a live server, fit, check on a held-out run.

Two-run fits are not identifiable (a fit can reproduce its own runs and still be arbitrary in a term: see
`capacity.truth.fit.term_uncertainty`), so the recipe measures one probe per term family, each a closed loop (a
closed loop cannot overload the server, whatever its speed):

| probe               | users | prompt | output | pins                                              |
| ------------------- | ----- | ------ | ------ | ------------------------------------------------- |
| single stream       | 1     | 128    | 32     | the fixed step cost and the front end (idle engine) |
| short-prompt burst  | 8     | 32     | 16     | per-sequence cost (many small sequences per step)  |
| long-prompt burst   | 4     | long   | 4      | per-token and attention-pair costs (prefill)       |
| decode burst        | 16    | 64     | 128    | per-sequence and per-key costs (wide decode batches) |

"long" is 1,024 tokens, or less when the engine's KV cache or max_model_len is smaller; the decode burst's users
are capped by max_num_seqs. Warm-up requests go first (start-up compilation is not what the engine serves at).

Each burst is followed by an open loop of the same lengths: Poisson arrivals at half the rate the burst
sustained (so the server sets it: loaded, not overloaded), twice as many requests. A closed-loop burst sends
every user's next request the instant the last one ends, so the server's front end (HTTP, tokenisation,
streaming: on a CPU server, the cores the engine also uses) is at its busiest exactly when the engine is;
open-loop arrivals are what users send. Measured on vLLM's CPU build (bench/recipe_fidelity.py, three repeats
on the same held-out runs), fits on the bursts alone missed held-out P50 TTFT by a median 40-95%, fits with the
open loops by 14-26%.

Speed checks: before the first probe and after every probe, four single requests (64 -> 16 tokens, one at a
time) time the engine's decode step. The spread of those times (the standard deviation of their logarithm) is
how much the engine's own speed moved during the recipe: a busy or throttled machine, another tenant. A fit's
term ranges come from the requests of its runs, and a run-wide slowdown moves every request of a run together,
so the ranges are widened by that spread (`capacity.truth.fit.widen_for_drift`) and a warning says so when it
is above 5%.
The held-out check is an open loop the fit never saw: Poisson arrivals at half the rate the short-prompt burst
sustained (derived from the server, so a slow model is not overloaded), 96-token prompts, 24-token outputs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capacity.files import write_atomic
from capacity.truth.fit import compare, fit_engine, save_fit, sim_summary, simulate_run, widen_for_drift
from capacity.truth.loadtest import counts, run_load, summarize_run
from capacity.truth.provenance import server_info
from capacity.workload import Request

DRIFT_WARN = 0.05  # a spread of the speed checks above which the recipe warns


@dataclass(frozen=True)
class Probe:
    name: str
    users: int
    requests: int
    prompt: int
    output: int


def probes(engine: dict, max_model_len: int | None = None, scale: float = 1.0) -> list[Probe]:
    kv_tokens = engine["num_blocks"] * engine["block_size"]
    long = max(64, min(1024, kv_tokens // 8, (max_model_len or 1 << 30) - 8))
    n = lambda k: max(4, int(round(k * scale)))
    return [Probe("single-stream", 1, n(8), 128, 32),
            Probe("short-prompt-burst", 8, n(24), 32, 16),
            Probe("long-prompt-burst", 4, n(12), long, 4),
            Probe("decode-burst", max(2, min(16, engine["max_num_seqs"])), n(32), 64, 128)]


def run_recipe(url: str, model: str, engine: dict, out_dir: Path, *, attention: str = "per_sequence",
               scale: float = 1.0, warmup: int = 3, timeout_s: float = 120.0, say=print) -> dict:
    """Measure the probes and the held-out run, fit, check; writes every run, the fit and a report to `out_dir`."""
    url = url.rstrip("/")
    info = server_info(url)
    mml = next((m.get("max_model_len") for m in info.get("models", []) if isinstance(m.get("max_model_len"), int)),
               None)
    plan = probes(engine, mml, scale)
    if warmup:
        w = run_load(url, model, [Request(-1 - i, 0.0, 64, 8) for i in range(warmup)], users=1, timeout_s=timeout_s,
                     max_duration_s=timeout_s * warmup, metrics=False)
        say(f"warm-up: {counts(w)}")
    runs, paths = [], []
    rng = np.random.default_rng(11)
    speed: list[float] = []  # TPOT p50 of each speed check, s

    def speed_check() -> None:
        r = run_load(url, model, [Request(-100 - i, 0.0, 64, 16) for i in range(4)], users=1, timeout_s=timeout_s,
                     max_duration_s=timeout_s * 4, metrics=False)
        tpot = summarize_run(r)["tpot_s"].get("p50")
        if tpot is not None and tpot > 0:
            speed.append(float(tpot))

    def keep(run: dict, name: str, what: str) -> dict:
        run["meta"]["probe"] = name
        path = out_dir / f"probe-{name}.json"
        write_atomic(path, json.dumps(run) + "\n", "--out-dir")
        s = summarize_run(run)
        say(f"{name}: {what}: {counts(run)}, TTFT p50 {s['ttft_s']['p50'] * 1e3:.1f} ms, "
            f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms, {s['requests_per_s']:.2f} req/s")
        runs.append(run)
        paths.append(str(path))
        return s

    speed_check()
    for p in plan:
        reqs = [Request(i, 0.0, p.prompt, p.output) for i in range(p.requests)]
        run = run_load(url, model, reqs, users=p.users, timeout_s=timeout_s, max_duration_s=timeout_s * p.requests,
                       engine=engine)
        s = keep(run, p.name, f"{p.users} users, {p.prompt}->{p.output} tokens")
        if p.users > 1 and s["requests_per_s"] > 0:  # the same lengths, open loop at half the burst's rate
            rate, n = 0.5 * s["requests_per_s"], 2 * p.requests
            t = np.cumsum(rng.exponential(1 / rate, n))
            run = run_load(url, model, [Request(i, float(t[i]), p.prompt, p.output) for i in range(n)],
                           timeout_s=timeout_s, max_duration_s=float(t[-1]) + timeout_s * 4, engine=engine)
            keep(run, f"{p.name}-poisson", f"Poisson {rate:.2f}/s, {p.prompt}->{p.output} tokens")
        speed_check()
    fit, fit_info = fit_engine(runs, engine, attention=attention)
    drift = float(np.std(np.log(speed), ddof=1)) if len(speed) >= 3 else 0.0
    fit_info["speed_checks_tpot_s"], fit_info["speed_drift"] = speed, drift
    fit_info["uncertainty"] = widen_for_drift(fit_info["uncertainty"], drift)
    say(f"speed checks: decode step {min(speed) * 1e3:.2f}-{max(speed) * 1e3:.2f} ms over {len(speed)} checks "
        f"(spread {drift:.1%})" if speed else "speed checks: no timing")
    if drift > DRIFT_WARN:
        fit_info.setdefault("warnings", []).append(
            f"the engine's own speed moved by {drift:.0%} (standard deviation of its decode step over {len(speed)} "
            f"speed checks) while the probes ran: every term's range includes it; fit on a quiet machine for "
            f"tighter ranges")
    fit_path = out_dir / "fit.json"
    save_fit(fit_path, fit, fit_info, engine, paths, (runs[0].get("meta") or {}).get("provenance"))
    # held out: an open loop at half the short-prompt burst's sustained rate
    rate = 0.5 * summarize_run(next(r for r in runs if r["meta"]["probe"] == "short-prompt-burst"))["requests_per_s"]
    rng = np.random.default_rng(7)
    n_held = max(8, int(round(40 * scale)))
    t = np.cumsum(rng.exponential(1 / rate, n_held))
    held = run_load(url, model, [Request(i, float(t[i]), 96, 24) for i in range(n_held)], timeout_s=timeout_s,
                    max_duration_s=float(t[-1]) + timeout_s * 4, engine=engine)
    held["meta"]["probe"] = "held-out"
    write_atomic(out_dir / "held-out.json", json.dumps(held) + "\n", "--out-dir")
    rows = compare(summarize_run(held),
                   sim_summary(simulate_run(held, fit, engine, frontend_s=fit_info["frontend_s"])))
    check = [r for r in rows if r["metric"] in ("TTFT", "TPOT") and r["stat"] in ("p50", "p99")]
    report = {"fit": str(fit_path), "probes": paths, "held_out": str(out_dir / "held-out.json"),
              "held_out_rate_per_s": rate, "terms": fit_info.get("uncertainty"),
              "frontend_s": fit_info["frontend_s"], "warnings": fit_info.get("warnings", []),
              "fit_median_abs_rel_err": fit_info["median_abs_rel_err"], "held_out_check": check,
              "speed_checks_tpot_s": speed, "speed_drift": drift,
              "server": info}
    write_atomic(out_dir / "report.json", json.dumps(report, indent=1) + "\n", "--out-dir")
    return report
