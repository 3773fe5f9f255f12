"""How well the run pipeline's steady-state checks tell a stable queue from a growing one.

    python bench/steady_state.py [--seeds 300] [--engine-seeds 5]

Two tables:

1. The TTFT trend test (`capacity.sim.metrics.Trend`) on M/D/1 queues (D = 10 ms; TTFT = wait + D, the waits
   exact by Lindley's recursion, which the simulator equals request by request: tests/test_simulator.py): the
   share of seeds flagged at each utilisation and run length. Below 1 that is the false-alarm rate (but near 1 a
   short run has not settled, and its TTFT really is still rising); above 1, the power.
2. The engine: Llama-3.1-8B on an H100, 1,024/256 tokens, Poisson arrivals, roofline costs, vLLM's defaults,
   through the run pipeline with `capacity simulate`'s capacity check: per rate and run length, the share of
   seeds whose TTFT rises, the share called saturated (by the queue bounds or by a rise at or above the
   capacity), the offered rate over the capacity, and P99 TTFT (median over seeds): what a user would have read.

Prints both tables and writes bench/results/steady_state.json (with the host).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sim_speed import host_cpu  # noqa: E402
from capacity.sim.metrics import TREND_BATCHES, TREND_P, ttft_trend  # noqa: E402

RHOS = (0.5, 0.8, 0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 1.1, 1.2)
LENGTHS = (500, 2000, 10_000)
RATES = (16.0, 18.0, 20.0, 21.0, 22.0, 23.0, 24.0)
ENGINE_LENGTHS = (2000, 10_000)
OUT = ROOT / "bench" / "results" / "steady_state.json"


def lindley(arrival: np.ndarray, service: np.ndarray) -> np.ndarray:
    u = np.concatenate([[0.0], np.cumsum(service[:-1] - np.diff(arrival))])
    return u - np.minimum.accumulate(u)


def md1_flagged(rho: float, n: int, seeds: int) -> float:
    hits = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        a = np.cumsum(rng.exponential(0.01 / rho, n))
        w = lindley(a, np.full(n, 0.01))
        m = n // 10
        tr = ttft_trend(a[m:], a[m:] + w[m:] + 0.01)
        hits += bool(tr is not None and tr.rising)
    return hits / seeds


def engine_rows(seeds: int) -> list[dict]:
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.workload import WorkloadSpec

    dep = Deployment(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm"), EngineConfig())
    rows = []
    for n in ENGINE_LENGTHS:
        for rate in RATES:
            spec = WorkloadSpec.model_validate({"arrivals": {"kind": "poisson", "rate_per_s": rate}, "num_requests": n,
                                                "input_len": {"kind": "fixed", "value": 1024},
                                                "output_len": {"kind": "fixed", "value": 256}})
            res = [run(dep, spec, RunOptions(seed=s, ci=False, timeseries=False, capacity_check=True))
                   for s in range(seeds)]
            cap = res[0].capacity.req_per_s if res[0].capacity else float("nan")
            rows.append({"requests": n, "rate_per_s": rate, "capacity_req_per_s": cap, "offered_over_capacity": rate / cap,
                         "rising": sum(r.rising for r in res) / seeds,
                         "saturated": sum(r.sim.saturated for r in res) / seeds,
                         "p99_ttft_s_median": float(np.median([r.summary.ttft_s.p99 for r in res]))})
            print(f"  engine: {n:,} requests at {rate:g} req/s done", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=300, help="seeds per M/D/1 cell")
    ap.add_argument("--engine-seeds", type=int, default=5, help="seeds per engine cell")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    if not 10 <= a.seeds <= 10_000 or not 1 <= a.engine_seeds <= 50:
        sys.exit("--seeds: 10-10,000; --engine-seeds: 1-50")
    t0 = time.time()
    md1 = [{"rho": rho, "requests": n, "flagged": md1_flagged(rho, n, a.seeds)} for rho in RHOS for n in LENGTHS]
    eng = engine_rows(a.engine_seeds)
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"TTFT trend test on M/D/1 ({a.seeds} seeds a cell): share of runs flagged rising",
              title_justify="left")
    t.add_column("utilisation", justify="right")
    for n in LENGTHS:
        t.add_column(f"{n:,} requests", justify="right")
    for rho in RHOS:
        t.add_row(f"{rho:g}", *(f"{next(r['flagged'] for r in md1 if r['rho'] == rho and r['requests'] == n):.1%}"
                                for n in LENGTHS))
    con.print(t)
    t = Table(title=f"Llama-3.1-8B on an H100, 1,024/256 tokens ({a.engine_seeds} seeds a cell)", title_justify="left")
    for c in ("requests", "req/s", "load / capacity", "TTFT rising", "saturated", "P99 TTFT"):
        t.add_column(c, justify="right")
    for r in eng:
        t.add_row(f"{r['requests']:,}", f"{r['rate_per_s']:g}", f"{r['offered_over_capacity']:.0%}", f"{r['rising']:.0%}",
                  f"{r['saturated']:.0%}", f"{r['p99_ttft_s_median'] * 1e3:,.0f} ms")
    con.print(t)
    con.print(f"[dim]rising: one-sided p < {TREND_P:g} over {TREND_BATCHES} batch means and a fitted rise above half "
              f"the mean TTFT (tested only in runs the queue bounds did not already call saturated); saturated: the "
              f"queue bounds, or rising at or above the capacity; {time.time() - t0:.0f} s, "
              f"{host_cpu()}[/]")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"command": "python bench/steady_state.py " + " ".join(sys.argv[1:]),
                                 "host": host_cpu(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "trend_p": TREND_P, "trend_batches": TREND_BATCHES, "md1": md1, "engine": eng,
                                 "wall_s": time.time() - t0}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
