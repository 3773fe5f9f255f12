"""Predicted vs measured on a real engine: Hugging Face transformers continuous batching on this CPU.

    python bench/fidelity.py            # full: 8 workloads, fit on 2, predict 6
    python bench/fidelity.py --quick    # CI-sized: 3 workloads, fit on 2, predict 1

Starts `transformers serve --continuous-batching` on 127.0.0.1 with a random-weight Llama built from
models/tiny.yaml (word-level tokenizer: exact lengths; EOS disabled: exact output lengths), 1 CPU thread,
an explicit KV cache (num_blocks x block_size) and token budget. Runs each workload with `capacity loadtest`'s
client, fits the engine's step-cost terms on the first two runs (`calibrate --from-run`), replays every
other run through the simulator with the same arrival times and lengths, and prints predicted vs measured
P50/P99 TTFT and TPOT and throughput. Targets: median |error| <= 5% on P50 TTFT/TPOT, <= 10% on P99.
Writes bench/results/fidelity.json.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.loadtest import counts, run_load, summarize_run  # noqa: E402
from capacity.validate import compare, fit_engine, sim_summary, simulate_run  # noqa: E402
from capacity.workload import Arrivals, WorkloadSpec, fixed, generate  # noqa: E402

ENGINE = {"num_blocks": 256, "block_size": 16, "max_num_batched_tokens": 256, "max_num_seqs": 256}

# name, arrival kind, rate (req/s), cv, input, output, requests
WORKLOADS = [
    ("fit-a: poisson 3/s 64->16", "poisson", 3.0, 1.0, 64, 16, 60),
    ("fit-b: poisson 6/s 192->24", "poisson", 6.0, 1.0, 192, 24, 80),
    ("poisson 4/s 128->32", "poisson", 4.0, 1.0, 128, 32, 60),
    ("bursty gamma cv3 5/s 96->16", "gamma", 5.0, 3.0, 96, 16, 80),
    ("long prompts 2/s 768->8", "poisson", 2.0, 1.0, 768, 8, 40),
    ("long outputs 2/s 32->96", "poisson", 2.0, 1.0, 32, 96, 40),
    ("constant 8/s 64->16", "constant", 8.0, 1.0, 64, 16, 100),
    ("past saturation 40/s 256->32", "poisson", 40.0, 1.0, 256, 32, 120),
]


def start_server(model_dir: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [str(Path(sys.executable).with_name("transformers")), "serve", model_dir, "--continuous-batching",
           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--cb-num-blocks", str(ENGINE["num_blocks"]),
           "--cb-block-size", str(ENGINE["block_size"]), "--cb-max-batch-tokens", str(ENGINE["max_num_batched_tokens"]),
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(240):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("transformers serve did not become healthy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(url: str, model: str, spec, seed: int) -> dict:
    name, kind, rate, cv, inp, out, n = spec
    wl = WorkloadSpec(arrivals=Arrivals(kind=kind, rate_per_s=rate, cv=cv), input_len=fixed(inp),
                      output_len=fixed(out), num_requests=n)
    run = run_load(url, model, generate(wl, np.random.default_rng(seed)), timeout_s=120, max_duration_s=300,
                   metrics=False)
    run["workload"] = name
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model-dir", default="/tmp/capacity-tiny-hf")
    ap.add_argument("--out", default=str(ROOT / "bench/results/fidelity.json"))
    args = ap.parse_args()
    from bench.engines.tiny_hf import build

    if not (Path(args.model_dir) / "config.json").is_file():
        build(str(ROOT / "models/tiny.yaml"), args.model_dir)
    workloads = WORKLOADS[:3] if args.quick else WORKLOADS
    port = free_port()
    proc = start_server(args.model_dir, port)
    url = f"http://127.0.0.1:{port}"
    runs = []
    try:
        measure(url, args.model_dir, ("warm-up", "constant", 5.0, 1.0, 32, 4, 10), 99)  # load the model, warm caches
        for i, w in enumerate(workloads):
            t = time.perf_counter()
            runs.append(measure(url, args.model_dir, w, i))
            print(f"measured {w[0]}: {counts(runs[-1])} in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    fit, info = fit_engine(runs[:2], ENGINE)
    rows = []
    for run in runs:
        meas = summarize_run(run)
        pred = sim_summary(simulate_run(run, fit, ENGINE))
        cmp = {f"{r['metric']} {r['stat']}": r for r in compare(meas, pred)}
        rows.append({"workload": run["workload"], "fitted_on": run in runs[:2], "outcomes": counts(run),
                     "saturated_predicted": bool(pred.get("n_requests", 0) and False), "compare": cmp})

    from rich.console import Console
    from rich.table import Table

    keys = ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "output tokens/s mean"]
    t = Table(title=f"transformers CB on CPU vs capacity's simulator (engine fit on 2 runs: fixed "
                    f"{fit.fixed_s * 1e3:.2f} ms, {fit.per_token_s * 1e6:.1f} us/token, "
                    f"{fit.per_key_s * 1e9:.2f} ns/key, {fit.per_pair_s * 1e12:.2f} ps/pair)", title_justify="left")
    t.add_column("workload")
    for k in keys:
        t.add_column(f"{k}\nmeas / pred / err", justify="right")
    for r in rows:
        cells = []
        for k in keys:
            c = r["compare"].get(k)
            scale = 1 if k.startswith("output") else 1e3
            cells.append("-" if c is None else f"{c['measured_s'] * scale:,.1f} / {c['predicted_s'] * scale:,.1f} / "
                                               f"{c['rel_err']:+.0%}")
        t.add_row(("[fit] " if r["fitted_on"] else "") + r["workload"], *cells)
    con = Console()
    con.print(t)
    held = [r for r in rows if not r["fitted_on"]]

    def med(k):
        v = [abs(r["compare"][k]["rel_err"]) for r in held if k in r["compare"]]
        return float(np.median(v)) if v else float("nan")

    summary = {k: med(k) for k in keys}
    con.print("held-out median |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in summary.items())
              + " (targets: P50 <= 5%, P99 <= 10%)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"engine": "transformers serve --continuous-batching (CPU, 1 thread)",
                                          "engine_config": ENGINE, "fit": {**info, "fixed_s": fit.fixed_s,
                                          "per_token_s": fit.per_token_s, "per_key_s": fit.per_key_s,
                                          "per_pair_s": fit.per_pair_s},
                                          "rows": rows, "heldout_median_abs_rel_err": summary}, indent=1,
                                         default=float) + "\n")
    con.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
