"""Simulator speed: simulated requests per wall-clock second on one core, with and without the decode
fast path, their agreement on every metric, and peak memory for a 100,000-request run.

    python bench/sim_speed.py            # the issue's workload: Llama-3.1-8B-class roofline step cost on an
                                         # H100, 1024 in / 256 out, Poisson 4 req/s, batch cap 128, 10,000 requests
    python bench/sim_speed.py --against 033dba8   # this tree vs an earlier commit, alternating runs in one
                                                  # process each, same workload: prints the speed ratio

    python bench/sim_speed.py --peer blis="./blis run --cache-signal-delay 0 ..." --peer vidur="python -m ..."
                                         # times each peer command (the same workload, its fastest settings)
                                         # side by side with this simulator in the same run and prints ratios

Targets (issue 20): >= 10x BLIS and >= 70x Vidur in their fastest configurations, measured side by side on one
machine; the fast path exact (every metric within 1e-9 of step by step); peak memory <= 500 MiB at 100k
requests. Without --peer, the table shows the peer figures last recorded side by side (PEERS: date, CPU, and
this simulator's own figure in that run), so a ratio is only ever computed within one run. Prints a table and
writes bench/results/sim_speed.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.cost.roofline import RooflineCost  # noqa: E402
from capacity.model.card import load_model_card  # noqa: E402
from capacity.model.gpus import get_gpu  # noqa: E402
from capacity.sched import make_scheduler  # noqa: E402
from capacity.sim.metrics import summarize  # noqa: E402
from capacity.sim.simulator import SimConfig, simulate  # noqa: E402
from capacity.workload import Arrivals, WorkloadSpec, fixed  # noqa: E402

# Peer figures measured side by side (issue 20's measurement: 10,000 requests of this workload, alternating runs,
# each peer in its fastest configuration that gives identical metrics), with this simulator's figure in that run.
PEERS = {"recorded": "2026-12-02 side by side, best of 3 alternating runs, AMD EPYC, 2 cores, the compiled build "
                     "(bench/peers/README.md)", "capacity": 53165.0,
         "peers": {"BLIS": (3934.0, 10.0), "Vidur": (341.0, 70.0)}}


def host_cpu() -> str:
    return next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), "unknown CPU")


def run(n: int, fast: bool, seed: int = 0):
    card = load_model_card(ROOT / "models/llama-3.1-8b.yaml")
    cost = RooflineCost(card, get_gpu("h100-sxm"))
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=4.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=n)
    sched = lambda: make_scheduler("continuous", max_num_seqs=128, max_num_batched_tokens=8192,
                                   block_size=16, num_blocks=27_703)
    t0 = time.perf_counter()
    res = simulate(spec, cost, sched, np.random.default_rng(seed), SimConfig(fast_forward=fast, timeseries=False))
    wall = time.perf_counter() - t0
    return res, wall


AB_CHILD = r"""
import json, sys, time
tree, n, fast, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
sys.path.insert(0, tree)
# an editable install's finder would serve modules missing from `tree` out of the working copy: drop it
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()]
import os
import numpy as np
if os.path.isdir(os.path.join(tree, "capacity", "sim")):  # the layout since the run-pipeline restructuring
    from capacity.cost.roofline import RooflineCost
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.sched import make_scheduler
    from capacity.sim.simulator import SimConfig, simulate
else:  # the flat layout before it
    from capacity.costs import RooflineCost
    from capacity.gpus import get_gpu
    from capacity.model_card import load_model_card
    from capacity.scheduler import make_scheduler
    from capacity.simulator import SimConfig, simulate
from capacity.workload import Arrivals, WorkloadSpec, fixed
stray = [m.__file__ for k, m in list(sys.modules.items()) if k.split(".")[0] == "capacity"
         and getattr(m, "__file__", None) and not m.__file__.startswith(tree)]
assert not stray, f"imported from another tree: {stray[:3]}"
card = load_model_card(tree + "/models/llama-3.1-8b.yaml")
cost = RooflineCost(card, get_gpu("h100-sxm"))
spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=4.0), input_len=fixed(1024), output_len=fixed(256),
                    num_requests=n)
walls = []
for _ in range(reps):
    sched = lambda: make_scheduler("continuous", max_num_seqs=128, max_num_batched_tokens=8192, block_size=16,
                                   num_blocks=27_703)
    t0 = time.perf_counter()
    res = simulate(spec, cost, sched, np.random.default_rng(0), SimConfig(fast_forward=fast, timeseries=False))
    walls.append(time.perf_counter() - t0)
print(json.dumps({"wall_s": min(walls), "steps": res.steps, "finish_sum": float(np.nansum(res.records.finish))}))
"""


def against(rev: str, n: int, rounds: int) -> int:
    """This tree vs `rev` on the same workload: alternating child processes, best of 3 runs each, per mode."""
    import tempfile

    from rich.console import Console
    from rich.table import Table

    con = Console()
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        trees = {"base": str(base), "head": str(ROOT)}
        best: dict[tuple[str, str], float] = {}
        check: dict[tuple[str, str], tuple] = {}
        for _ in range(rounds):
            for mode, fast, count in (("fast path", "1", n), ("step by step", "0", max(1, n // 4))):
                for name, tree in trees.items():
                    out = subprocess.run([sys.executable, "-c", AB_CHILD, tree, str(count), fast, "3"],
                                         capture_output=True, text=True, check=True)
                    r = json.loads(out.stdout)
                    best[(name, mode)] = min(best.get((name, mode), float("inf")), r["wall_s"])
                    check[(name, mode)] = (r["steps"], r["finish_sum"])
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "unknown CPU")
        t = Table(title=f"Simulator speed, this tree vs {rev} ({cpu}; best of {3 * rounds} alternating runs)",
                  title_justify="left")
        for c in ("mode", f"{rev} s", "this tree s", "ratio (>1: faster now)", "same result"):
            t.add_column(c, justify="right" if c != "mode" else "left")
        out = {"against": rev, "cpu": cpu, "rows": []}
        for mode in ("fast path", "step by step"):
            a, b = best[("base", mode)], best[("head", mode)]
            (sa, fa), (sb, fb) = check[("base", mode)], check[("head", mode)]
            rel = abs(fa - fb) / abs(fa) if fa else abs(fb)
            same = sa == sb and rel <= 1e-9  # same steps; finish times equal up to float summation order
            t.add_row(mode, f"{a:.3f}", f"{b:.3f}", f"{a / b:.3f}",
                      ("yes" if rel == 0 else f"yes ({rel:.0e})") if same else "NO")
            out["rows"].append({"mode": mode, "base_s": a, "head_s": b, "speed_ratio": a / b, "same_result": same,
                                "finish_sum_rel_diff": rel})
        con.print(t)
        path = ROOT / "bench/results/sim_speed_ab.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        con.print(f"wrote {path}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--slow-requests", type=int, default=10_000, help="requests for the step-by-step comparison")
    ap.add_argument("--memory-requests", type=int, default=100_000)
    ap.add_argument("--out", default=str(ROOT / "bench/results/sim_speed.json"))
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--against", metavar="REV", help="compare with this git revision, alternating runs")
    ap.add_argument("--rounds", type=int, default=3, help="--against: alternating rounds")
    ap.add_argument("--peer-rounds", type=int, default=3, help="--peer: alternating rounds (best of each)")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=COMMAND",
                    help="a peer simulator's command for the same workload, timed side by side (repeatable)")
    args = ap.parse_args()
    if not 1 <= args.peer_rounds <= 20:
        ap.error(f"--peer-rounds {args.peer_rounds}: must be from 1 to 20")
    if args.against:
        return against(args.against, args.requests, args.rounds)
    if args.child:  # peak memory in a fresh process
        res, wall = run(args.child, True)
        print(json.dumps({"wall_s": wall, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                          "finished": int(np.isfinite(res.records.finish).sum())}))
        return 0

    load_start = os.getloadavg()  # other work on the machine: ratios are only as good as the runs were alike
    fast, wall_fast = run(args.requests, True)
    slow, wall_slow = run(args.slow_requests, False)
    rng = np.random.default_rng(0)
    sf = summarize(fast.records, fast.itl_values, fast.itl_weights, rng, ci=False)
    if args.slow_requests == args.requests:
        ss = summarize(slow.records, slow.itl_values, slow.itl_weights, rng, ci=False)
        worst, worst_at, worst_abs = 0.0, "", 0.0
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s"):
            for stat in ("mean", "p50", "p90", "p95", "p99"):
                a, b = getattr(getattr(sf, key), stat), getattr(getattr(ss, key), stat)
                worst_abs = max(worst_abs, abs(a - b))
                if b and abs(a / b - 1) > worst:
                    worst, worst_at = abs(a / b - 1), f"{key} {stat} ({b * 1e3:.4g} ms)"
        if abs(sf.output_tokens_per_s / ss.output_tokens_per_s - 1) > worst:
            worst, worst_at = abs(sf.output_tokens_per_s / ss.output_tokens_per_s - 1), "output tokens/s"
    else:
        worst, worst_at, worst_abs = float("nan"), "", float("nan")
    # the simulated clock's last reading and its float spacing: every time is a sum of step durations on that
    # clock, which the fast path adds in closed form and step by step one by one, so each differs by a few ulps
    horizon = float(np.nanmax(fast.records.finish))
    ulp = float(np.spacing(horizon))
    child = subprocess.run([sys.executable, __file__, "--child", str(args.memory_requests)], capture_output=True,
                           text=True, check=True)
    mem = json.loads(child.stdout)

    peers: dict[str, float] = {}
    rate_fast = args.requests / wall_fast
    for _ in range(args.peer_rounds if args.peer else 0):  # alternating: this simulator, then each peer; best of
        _, w = run(args.requests, True)
        rate_fast = max(rate_fast, args.requests / w)
        for spec_ in args.peer:  # NAME=COMMAND: timed in this run, on this machine
            name, _, cmd = spec_.partition("=")
            t0 = time.perf_counter()
            r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"--peer {name}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
            peers[name] = max(peers.get(name, 0.0), args.requests / (time.perf_counter() - t0))

    from rich.console import Console
    from rich.table import Table

    cpu = host_cpu()
    from capacity import compiled

    build = "compiled (mypyc, scripts/compile.sh)" if compiled() else "pure Python"
    t = Table(title=f"Simulator speed (one core, {cpu}, {build}): Llama-3.1-8B roofline on H100, 1024/256 tokens, "
                    "Poisson 4 req/s, batch cap 128", title_justify="left")
    for c in ("run", "requests", "engine events", "steps", "wall s", "sim req / wall s"):
        t.add_column(c, justify="right" if c != "run" else "left")
    rate_slow = args.slow_requests / wall_slow
    t.add_row("fast path", f"{args.requests:,}", f"{fast.events:,}", f"{fast.steps:,}",
              f"{args.requests / rate_fast:.2f}", f"{rate_fast:,.0f}")
    t.add_row("step by step", f"{args.slow_requests:,}", f"{slow.events:,}", f"{slow.steps:,}", f"{wall_slow:.2f}",
              f"{rate_slow:,.0f}")
    t.add_row("fast path, memory run", f"{args.memory_requests:,}", "", "", f"{mem['wall_s']:.2f}",
              f"{args.memory_requests / mem['wall_s']:,.0f}")
    con = Console()
    con.print(t)
    pt = Table(title="Against the peers, each in its fastest configuration (ratios only within one run)",
               title_justify="left")
    for c in ("peer", "peer req/s", "ours req/s", "ratio", "target", "measured"):
        pt.add_column(c, justify="left" if c in ("peer", "measured") else "right")
    ratios = {}
    for name, rate in peers.items():
        ratios[name] = rate_fast / rate
        target = next((t for p, (_, t) in PEERS["peers"].items() if p.lower() == name.lower()), None)
        pt.add_row(name, f"{rate:,.0f}", f"{rate_fast:,.0f}", f"{rate_fast / rate:.1f}x",
                   f">= {target:.0f}x" if target else "", f"now, best of {args.peer_rounds}")
    for name, (rate, target) in PEERS["peers"].items():
        if name.lower() not in {p.lower() for p in peers}:
            pt.add_row(name, f"{rate:,.0f}", f"{PEERS['capacity']:,.0f}", f"{PEERS['capacity'] / rate:.1f}x",
                       f">= {target:.0f}x", "recorded")
    con.print(pt)
    con.print(f"BLIS: Go, --cache-signal-delay 0; Vidur: per-token metrics off (bench/peers/README.md). Recorded: "
              f"{PEERS['recorded']}")
    if not peers:
        con.print("no --peer given: the ratios above are the last side-by-side run's; this run's own figure "
                  f"({rate_fast:,.0f}/s on {cpu}) is not comparable with peer figures from another run")
    con.print(f"worst fast-vs-step metric difference {worst:.2e} relative, at {worst_at}; worst absolute "
              f"{worst_abs:.1e} s = {worst_abs / ulp:.0f} ulps of the clock at its last reading ({horizon:,.0f} s): "
              "float summation order, as a difference of two clock readings carries the clock's rounding (target "
              "1e-9); "
              f"peak RSS for {args.memory_requests:,} requests: {mem['maxrss_kib'] / 1024:.0f} MiB (target <= 500); "
              f"p99 TTFT {sf.ttft_s.p99 * 1e3:.1f} ms, p99 TPOT {sf.tpot_s.p99 * 1e3:.2f} ms")
    out = {"workload": "llama-3.1-8b roofline h100-sxm, 1024/256, poisson 4/s, max_num_seqs 128", "cpu": cpu,
           "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_avg_1_5_15_start": load_start, "load_avg_1_5_15_end": os.getloadavg(), "build": build,
           "peer_rounds": args.peer_rounds if args.peer else 0,
           "requests": args.requests, "wall_s_fast": wall_fast, "sim_req_per_s_fast": rate_fast,
           "wall_s_step_by_step": wall_slow, "sim_req_per_s_step_by_step": rate_slow,
           "peers_side_by_side": peers, "ratios_side_by_side": ratios, "peers_recorded": PEERS,
           "max_rel_metric_diff_fast_vs_step": worst, "max_rel_diff_at": worst_at,
           "max_abs_metric_diff_fast_vs_step_s": worst_abs, "clock_last_s": horizon, "clock_ulp_s": ulp,
           "events_fast": fast.events, "events_step": slow.events,
           "peak_rss_mib_100k": mem["maxrss_kib"] / 1024, "memory_run_requests": args.memory_requests,
           "memory_met": mem["maxrss_kib"] / 1024 <= 500}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    con.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
