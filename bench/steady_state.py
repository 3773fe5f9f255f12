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
3. The capacity loop (`capacity.steady.capacity_loop`) on seven workloads (fixed and varied lengths, 8B and 70B,
   H100, A100, L40S): the rate read over the stretch with every user in the loop (`capacity.sim.metrics.
   backlogged`) at four requests per user, as `capacity simulate` and the planner read it, and the whole run's
   requests/s at two requests per user (what they read before), each against the same stretch of a loop of
   thirty requests per user; the whole run at thirty too (its drain at the end reads high).
   `--capacity-only` prints only this table (about 2 minutes).

Prints the tables and writes bench/results/steady_state.json (with the host).
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
CAPACITY_OUT = ROOT / "bench" / "results" / "steady_state_capacity.json"


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


CAPACITY_CASES = (  # (model, GPU, TP, batch cap or None, input, output: N or LOW-HIGH)
    ("llama-3.1-8b", "h100-sxm", 1, None, "1024", "256"),
    ("llama-3.1-8b", "h100-sxm", 1, None, "1024", "128-384"),
    ("llama-3.1-8b", "h100-sxm", 1, None, "128", "128"),
    ("llama-3.1-8b", "a100-80gb", 1, None, "4096", "256-768"),
    ("llama-3.1-8b", "l40s", 1, 64, "1024", "256"),
    ("llama-3.1-70b", "h100-sxm", 4, None, "512", "128-384"),
    ("qwen2.5-7b", "a100-80gb", 1, None, "2048", "128"),
)


def capacity_rows() -> list[dict]:
    from capacity.cli.common import _lengths
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, prepare, run
    from capacity.steady import CAPACITY_LOOP_ROUNDS, capacity_loop
    from capacity.workload import WorkloadSpec

    rows = []
    for model, gpu, tp, seqs, inp, out in CAPACITY_CASES:
        eng = EngineConfig(tensor_parallel_size=tp, **({"max_num_seqs": seqs} if seqs else {}))
        dep = Deployment(load_model_card(ROOT / f"models/{model}.yaml"), get_gpu(gpu), eng)
        p = prepare(dep)
        wl = WorkloadSpec(input_len=_lengths("--input-len", inp), output_len=_lengths("--output-len", out))
        loop = capacity_loop(dep.engine, p.budget, wl, 0)
        users = loop.arrivals.users or 0
        # the whole run: no warm-up left out (the default leaves out the start-up cohort, `warmup_requests`)
        res = {k: run(dep, loop.model_copy(update={"num_requests": k * users}),
                      RunOptions(seed=0, ci=False, timeseries=False, warmup_fraction=0.0), prepared=p)
               for k in (2, CAPACITY_LOOP_ROUNDS, 30)}
        ref = res[30].backlogged.requests_per_s  # type: ignore[union-attr]
        short = model.replace("llama-3.1-", "").replace("qwen2.5-", "qwen-").upper().replace("QWEN", "Qwen")
        row = {"case": f"{short} {gpu.replace('-sxm', '').replace('-80gb', '')}" + (f" tp{tp}" if tp > 1 else "")
                       + (f" b{seqs}" if seqs else "") + f" {inp}/{out}",
               "users": users, "reference_req_per_s": ref,
               "whole_run_2": res[2].summary.requests_per_s,
               "stretch_4": res[CAPACITY_LOOP_ROUNDS].backlogged.requests_per_s,  # type: ignore[union-attr]
               "whole_run_30": res[30].summary.requests_per_s}
        row |= {f"{k}_error": row[k] / ref - 1 for k in ("whole_run_2", "stretch_4", "whole_run_30")}
        rows.append(row)
        print(f"  capacity: {row['case']} done", flush=True)
    return rows


def capacity_table(rows: list[dict]):
    from rich.table import Table

    t = Table(title="Capacity loop, req/s, against its stretch at 30 requests a user", title_justify="left",
              caption="before: the whole run, 2 requests a user; now: the stretch, 4 a user", caption_justify="left")
    for c in ("workload", "users", "30/user", "before", "now", "whole, 30"):
        t.add_column(c, justify="left" if c == "workload" else "right")
    for r in rows:
        t.add_row(r["case"], f"{r['users']:,}", f"{r['reference_req_per_s']:.4g}",
                  *(f"{r[k + '_error']:+.1%}" for k in ("whole_run_2", "stretch_4", "whole_run_30")))
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=300, help="seeds per M/D/1 cell")
    ap.add_argument("--engine-seeds", type=int, default=5, help="seeds per engine cell")
    ap.add_argument("--capacity-only", action="store_true", help="only the capacity loop's table (its own JSON)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if not 10 <= a.seeds <= 10_000 or not 1 <= a.engine_seeds <= 50:
        sys.exit("--seeds: 10-10,000; --engine-seeds: 1-50")
    t0 = time.time()
    if a.capacity_only:
        from rich.console import Console

        rows = capacity_rows()
        Console().print(capacity_table(rows))
        print(f"{time.time() - t0:.0f} s, {host_cpu()}")
        out = a.out or CAPACITY_OUT
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": "python bench/steady_state.py " + " ".join(sys.argv[1:]),
                                   "host": host_cpu(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "capacity": rows, "wall_s": time.time() - t0}, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    md1 = [{"rho": rho, "requests": n, "flagged": md1_flagged(rho, n, a.seeds)} for rho in RHOS for n in LENGTHS]
    eng = engine_rows(a.engine_seeds)
    caps = capacity_rows()
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
    con.print(capacity_table(caps))
    out = a.out or OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python bench/steady_state.py " + " ".join(sys.argv[1:]),
                                 "host": host_cpu(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "trend_p": TREND_P, "trend_batches": TREND_BATCHES, "md1": md1, "engine": eng, "capacity": caps,
                                 "wall_s": time.time() - t0}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
