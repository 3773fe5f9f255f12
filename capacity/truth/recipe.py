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
The held-out check is an open loop the fit never saw: Poisson arrivals at half the rate the short-prompt burst
sustained (derived from the server, so a slow model is not overloaded), 96-token prompts, 24-token outputs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capacity.workload import Request


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
    from capacity.truth.fit import compare, fit_engine, save_fit, sim_summary, simulate_run
    from capacity.truth.loadtest import counts, run_load, summarize_run
    from capacity.truth.provenance import server_info

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
    for p in plan:
        reqs = [Request(i, 0.0, p.prompt, p.output) for i in range(p.requests)]
        run = run_load(url, model, reqs, users=p.users, timeout_s=timeout_s, max_duration_s=timeout_s * p.requests,
                       engine=engine)
        run["meta"]["probe"] = p.name
        path = out_dir / f"probe-{p.name}.json"
        path.write_text(json.dumps(run) + "\n")
        s = summarize_run(run)
        say(f"{p.name}: {p.users} users, {p.prompt}->{p.output} tokens: {counts(run)}, "
            f"TTFT p50 {s['ttft_s']['p50'] * 1e3:.1f} ms, TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms, "
            f"{s['requests_per_s']:.2f} req/s")
        runs.append(run)
        paths.append(str(path))
    fit, fit_info = fit_engine(runs, engine, attention=attention)
    fit_path = out_dir / "fit.json"
    save_fit(fit_path, fit, fit_info, engine, paths, (runs[0].get("meta") or {}).get("provenance"))
    # held out: an open loop at half the short-prompt burst's sustained rate
    rate = 0.5 * summarize_run(runs[1])["requests_per_s"]
    rng = np.random.default_rng(7)
    n_held = max(8, int(round(40 * scale)))
    t = np.cumsum(rng.exponential(1 / rate, n_held))
    held = run_load(url, model, [Request(i, float(t[i]), 96, 24) for i in range(n_held)], timeout_s=timeout_s,
                    max_duration_s=float(t[-1]) + timeout_s * 4, engine=engine)
    held["meta"]["probe"] = "held-out"
    (out_dir / "held-out.json").write_text(json.dumps(held) + "\n")
    rows = compare(summarize_run(held),
                   sim_summary(simulate_run(held, fit, engine, frontend_s=fit_info["frontend_s"])))
    check = [r for r in rows if r["metric"] in ("TTFT", "TPOT") and r["stat"] in ("p50", "p99")]
    report = {"fit": str(fit_path), "probes": paths, "held_out": str(out_dir / "held-out.json"),
              "held_out_rate_per_s": rate, "terms": fit_info.get("uncertainty"),
              "frontend_s": fit_info["frontend_s"], "warnings": fit_info.get("warnings", []),
              "fit_median_abs_rel_err": fit_info["median_abs_rel_err"], "held_out_check": check,
              "server": info}
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
