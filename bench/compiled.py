"""The compiled build against pure Python: the simulator's hot modules compiled by mypyc (`scripts/compile.sh`)
must give the same results bit for bit, and this measures how much faster they are.

    bash scripts/compile.sh && python bench/compiled.py      # identity on 7 workloads x (fast path, step by step),
                                                            # then speed: alternating child processes, best of 3
    python bench/compiled.py --speed ""                     # identity only (CI)

The compiled tree is this checkout (compiled in place); the pure one a copy of its sources without the .so files.
Each child process imports `capacity` from its tree only and hashes every per-request array, the ITL values,
weights and times, the time series, the run's scalars and the repr of the summary (float reprs round-trip, so
equal strings are equal bits). Exit 1 if anything differs. Prints a table and writes bench/results/compiled.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sim_speed import host_cpu  # noqa: E402

WORKLOADS = ("ref10000", "closed", "prefix", "priority", "sglang", "disagg", "capped", "closed1", "front")

CHILD = r"""
import hashlib, json, sys, time, dataclasses
tree, workload, fast, reps = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
sys.path.insert(0, tree)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()]
import numpy as np
from capacity.cost.roofline import RooflineCost
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.sched import make_scheduler
from capacity.sim.metrics import summarize
from capacity.sim.simulator import Disaggregation, SimConfig, simulate
from capacity.workload import Arrivals, PrefixGroups, WorkloadSpec, fixed, RequestClass
import capacity.sched.continuous as _c
stray = [m.__file__ for k, m in list(sys.modules.items()) if k.split(".")[0] == "capacity"
         and getattr(m, "__file__", None) and not m.__file__.startswith(tree)]
assert not stray, f"imported from another tree: {stray[:3]}"
compiled = _c.__file__.endswith(".so")
card = load_model_card(tree + "/models/llama-3.1-8b.yaml")
cost = RooflineCost(card, get_gpu("h100-sxm"))
CB = dict(max_num_seqs=128, max_num_batched_tokens=8192, block_size=16, num_blocks=27_703)
policy, cfg = "continuous", {}
if workload.startswith("ref"):  # bench/sim_speed.py's workload
    n = int(workload[3:] or 10000)
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=4.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=n)
elif workload == "closed":  # closed loop, 2 replicas, least outstanding
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=200, think_s=2.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=4000)
    cfg = dict(replicas=2, router="least_outstanding")
elif workload == "prefix":  # prefix caching with a tight KV pool (evictions, preemptions)
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=6.0), input_len=fixed(1536),
                        output_len=fixed(256), num_requests=4000,
                        prefix=PrefixGroups(groups=16, tokens=1024, share=0.8))
    CB = dict(CB, num_blocks=6000, prefix_caching=True)
elif workload == "priority":  # priority queue, two classes, preemptions
    spec = WorkloadSpec(arrivals=Arrivals(kind="gamma", rate_per_s=6.0, cv=2.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=4000,
                        classes=[RequestClass(name="hi", priority=0, weight=1.0),
                                 RequestClass(name="lo", priority=1, weight=2.0)])
    CB = dict(CB, num_blocks=4000)
    policy = "priority"
elif workload == "sglang":
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=4.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=4000)
    policy, CB = "sglang", dict(max_total_tokens=400_000, overlap_schedule=True)
elif workload == "disagg":  # 2 prefill + 2 decode replicas, async scheduling, decode KV short (preempts)
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=8.0), input_len=fixed(2048),
                        output_len=fixed(256), num_requests=4000)
    CB = dict(CB, async_scheduling=True)
    dec = dict(CB, num_blocks=1800)
    cfg = dict(replicas=2, disagg=Disaggregation(2, 2, cost, lambda: make_scheduler("continuous", **dec),
                                                 kv_bytes_per_token=131072.0, bandwidth_bytes_per_s=50e9,
                                                 latency_s=2e-5))
elif workload == "capped":  # Poisson arrivals behind a client's cap of 24 in flight (most wait for a slot)
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=20.0, max_concurrency=24),
                        input_len=fixed(1024), output_len=fixed(256), num_requests=4000)
    CB = dict(CB, async_scheduling=True)
elif workload == "closed1":  # a plan's capacity loop: users on one engine, vLLM's front end, async scheduling
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=160), input_len=fixed(1024), output_len=fixed(256),
                        num_requests=4000)
    CB = dict(CB, async_scheduling=True)
    cfg = dict(frontend_s=0.0144, frontend_s_per_input_token=1.89e-6)
elif workload == "front":  # a plan's load run: Poisson arrivals through vLLM's front end, async scheduling
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=8.0), input_len=fixed(1024),
                        output_len=fixed(256), num_requests=4000)
    CB = dict(CB, async_scheduling=True)
    cfg = dict(frontend_s=0.0144, frontend_s_per_input_token=1.89e-6)
else:
    raise SystemExit(workload)
walls = []
for _ in range(reps):
    sched = lambda: make_scheduler(policy, **CB)
    t0 = time.perf_counter()
    res = simulate(spec, cost, sched, np.random.default_rng(0), SimConfig(fast_forward=fast, **cfg))
    walls.append(time.perf_counter() - t0)
h = hashlib.sha256()
arrays = {f.name: getattr(res.records, f.name) for f in dataclasses.fields(res.records)}
arrays.update(itl_values=res.itl_values, itl_weights=res.itl_weights, itl_times=res.itl_times,
              timeseries=res.timeseries)
if res.client_waits is not None:
    arrays["client_waits"] = res.client_waits
for k in sorted(arrays):
    a = np.ascontiguousarray(arrays[k])
    h.update(k.encode()); h.update(str(a.dtype).encode()); h.update(a.tobytes())
s = summarize(res.records, res.itl_values, res.itl_weights, np.random.default_rng(0), ci=False)
summary = repr(s)  # float repr round-trips: equal strings = equal bits
scalars = repr((res.saturated, res.saturation, res.capacity_req_per_s, res.time_in_system_area, res.end_s, res.steps,
                res.events, res.preemptions, res.rejected))
print(json.dumps({"wall_s": min(walls), "compiled": compiled, "arrays_sha": h.hexdigest(),
                  "summary_sha": hashlib.sha256(summary.encode()).hexdigest(),
                  "scalars": scalars, "p99_ttft": s.ttft_s.p99, "finished": int(np.isfinite(res.records.finish).sum()),
                  "preemptions": res.preemptions, "steps": res.steps}))
"""


def child(tree: str, workload: str, fast: bool, reps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, workload, "1" if fast else "0", str(reps)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{tree} {workload} fast={fast}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="speed: alternating rounds, best of each (1-20)")
    ap.add_argument("--speed", default="ref10000", help=f"workloads to time, comma-separated, of {WORKLOADS}")
    ap.add_argument("--identity", default=",".join(WORKLOADS), help="workloads checked bit for bit")
    ap.add_argument("--out", default=str(ROOT / "bench/results/compiled.json"))
    args = ap.parse_args()
    speed = [x for x in args.speed.split(",") if x]
    identity = [x for x in args.identity.split(",") if x]
    for w in speed + identity:
        if w.rstrip("0123456789") not in ("ref",) + WORKLOADS[1:]:
            ap.error(f"workload {w!r}: not one of {WORKLOADS} (ref may take a request count: ref2000)")
    if not 1 <= args.rounds <= 20:
        ap.error(f"--rounds {args.rounds}: must be from 1 to 20")
    with tempfile.TemporaryDirectory() as tmp:
        pure = Path(tmp) / "pure"
        shutil.copytree(ROOT / "capacity", pure / "capacity", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        shutil.copytree(ROOT / "models", pure / "models")
        trees = {"compiled": str(ROOT), "pure": str(pure)}
        result: dict = {"host": host_cpu(), "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0],
                        "identity": {}, "speed": {}}
        differ = 0
        for w in identity:
            for fast in (True, False):
                r = {name: child(t, w, fast, 1) for name, t in trees.items()}
                if not r["compiled"]["compiled"]:
                    print("this checkout is not compiled: run `bash scripts/compile.sh` first", file=sys.stderr)
                    return 1
                same = all(r["compiled"][k] == r["pure"][k] for k in ("arrays_sha", "summary_sha", "scalars"))
                differ += not same
                result["identity"][f"{w} fast={fast}"] = same
                print(f"identity {w:9s} fast={fast!s:5s} {'identical' if same else 'DIFFERENT'}  "
                      f"finished={r['pure']['finished']} steps={r['pure']['steps']} "
                      f"preemptions={r['pure']['preemptions']}", flush=True)
        for w in speed:
            n = int(w[3:] or 10000) if w.startswith("ref") else 4000
            for fast in (True, False):
                best: dict[str, float] = {}
                for _ in range(args.rounds):
                    for name, t in trees.items():
                        best[name] = min(best.get(name, float("inf")), child(t, w, fast, 1)["wall_s"])
                p, c = best["pure"], best["compiled"]
                result["speed"][f"{w} fast={fast}"] = {"requests": n, "pure_req_per_s": n / p,
                                                        "compiled_req_per_s": n / c, "ratio": p / c}
                print(f"speed {w:9s} fast={fast!s:5s} pure {n / p:>8,.0f} req/s  compiled {n / c:>8,.0f} req/s  "
                      f"{p / c:.2f}x  (best of {args.rounds})", flush=True)
    print(f"{result['host']}, Python {result['python']}: " + ("every result identical" if not differ else
                                                               f"{differ} runs DIFFER"))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
