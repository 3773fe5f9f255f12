"""A million-request trace through `capacity simulate --trace` in bounded memory (issue 51's acceptance).

Writes a synthetic trace in capacity's JSONL form (Poisson arrivals at --rate, prompts uniform 64-512 tokens,
outputs uniform 16-128, seeded) to a temporary folder, then replays its first N requests, for each N of --sizes,
in a child process of its own:

    capacity simulate -m llama-3.1-8b --trace TRACE -n N --replicas 1 --json

(roofline step cost on the default H100, vLLM's defaults). Each child reports its wall time and peak resident
memory (resource.getrusage, RUSAGE_SELF ru_maxrss), so the growth of peak memory per request between two sizes is
what a run keeps per request; requests/s is N over the wall time (import, trace conversion, the capacity check's
10,000-request loop and the summary included). Writes bench/results/trace_scale.json with the host's CPU.

    python bench/trace_scale.py                       # sizes 1,000, 100,000 and 1,000,000
    python bench/trace_scale.py --sizes 1000,100000   # without the million (about a minute)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "trace_scale.json"
MODEL_ARGS = ["-m", "llama-3.1-8b", "--replicas", "1"]


def write_trace(path: Path, n: int, rate: float, seed: int = 0) -> None:
    """n rows of capacity's JSONL, in time order, written in chunks (the writer holds one chunk)."""
    rng = np.random.default_rng(seed)
    t = 0.0
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            k = min(100_000, n - start)
            times = t + np.cumsum(rng.exponential(1.0 / rate, k))
            t = float(times[-1])
            ins, outs = rng.integers(64, 513, k), rng.integers(16, 129, k)
            f.writelines(f'{{"timestamp":{a:.6f},"input_tokens":{b},"output_tokens":{c}}}\n'
                         for a, b, c in zip(times.tolist(), ins.tolist(), outs.tolist()))


def child(trace: str, n: int) -> None:
    """Run the CLI in this process (its JSON on stdout); print wall time and peak RSS as one JSON line on stderr."""
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    sys.argv = ["capacity", "simulate", *MODEL_ARGS, "--trace", trace, "-n", str(n), "--json"]
    from capacity.cli import main

    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"exit": code, "wall_s": wall, "peak_rss_bytes": peak}), file=sys.stderr)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,100000,1000000", help="requests per run, comma-separated")
    ap.add_argument("--rate", type=float, default=50.0, help="the trace's mean arrival rate, requests/s")
    ap.add_argument("--child", nargs=2, metavar=("TRACE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]))
        return
    sizes = sorted(int(x) for x in a.sizes.split(","))
    runs = []
    with tempfile.TemporaryDirectory(prefix="trace-scale-") as d:
        trace = Path(d) / "trace.jsonl"
        t0 = time.perf_counter()
        write_trace(trace, sizes[-1], a.rate)
        print(f"trace: {sizes[-1]:,} rows, {trace.stat().st_size / 1e6:.0f} MB, written in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        for n in sizes:
            out = Path(d) / f"out-{n}.json"
            with out.open("w") as fo:
                p = subprocess.run([sys.executable, __file__, "--child", str(trace), str(n)], stdout=fo,
                                   stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
            last = (p.stderr.strip().splitlines() or ["{}"])[-1]
            try:
                r = json.loads(last)
            except json.JSONDecodeError:
                r = {}
            if p.returncode or r.get("exit") or not out.exists():
                sys.exit(f"run of {n:,} requests failed: {p.stderr.strip()[-800:]}")
            res = json.loads(out.read_text())
            s = res["summary"]
            row = {"requests": n, "wall_s": round(r["wall_s"], 2), "peak_rss_mib": round(r["peak_rss_bytes"] / 2**20, 1),
                   "requests_per_wall_s": round(n / r["wall_s"], 1), "simulated_s": round(res["simulated_s"], 1),
                   "steps": res["steps"], "measured_requests": s["n_requests"],
                   "ttft_p99_ms": round(s["ttft_s"]["p99"] * 1e3, 2), "saturation": res["saturation"]}
            runs.append(row)
            print(f"{n:>9,} requests: {row['wall_s']:8.1f} s wall, peak RSS {row['peak_rss_mib']:7.1f} MiB, "
                  f"{row['requests_per_wall_s']:8,.0f} req/s, {row['simulated_s']:,.0f} s simulated, "
                  f"TTFT P99 {row['ttft_p99_ms']} ms {row['saturation']}", flush=True)
    growth = None
    if len(runs) >= 2:
        lo, hi = runs[-2], runs[-1]
        growth = (hi["peak_rss_mib"] - lo["peak_rss_mib"]) * 2**20 / (hi["requests"] - lo["requests"])
        print(f"peak memory per request between {lo['requests']:,} and {hi['requests']:,}: {growth:,.0f} bytes")
    doc = {"what": "capacity simulate --trace on a synthetic trace: wall time and peak RSS by trace length",
           "command": " ".join(["capacity simulate", *MODEL_ARGS, "--trace TRACE -n N --json"]),
           "trace": {"rate_per_s": a.rate, "input_tokens": "uniform 64-512", "output_tokens": "uniform 16-128",
                     "arrivals": "Poisson", "seed": 0},
           "host": {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg()},
           "date": time.strftime("%Y-%m-%d", time.gmtime()),
           "compiled": "pure Python (no mypyc build)" if not any((ROOT / "capacity").rglob("*.so")) else "mypyc",
           "runs": runs, "peak_rss_bytes_per_request_between_last_two": growth}
    if not a.no_write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
