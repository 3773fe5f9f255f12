"""Aggregated vs disaggregated prefill/decode on one 8-GPU node: the highest rate each layout sustains under a
P99 TTFT and a P99 TPOT SLO, for a long-prompt and a long-output workload.

    python bench/disagg.py [--model llama-3.1-70b] [--gpu h100-sxm] [--gpus 8] [--requests 600]

Llama-3.1-70B with FP8 weights (so TP 2 holds it) on H100s, roofline step costs, vLLM's engine model, KV over
NVLink inside the node. Layouts: every aggregated TP (replicas x TP = the GPU budget) and every split of the
budget into a prefill pool and a decode pool (TP 2, 4 or 8 per role). Each layout's max rate comes from a
bisection on open-loop Poisson probes (a probe passes when it is not saturated and both P99s meet the SLO).
Prints a table and writes bench/results/disagg.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.engine.config import EngineConfig  # noqa: E402
from capacity.model.card import load_model_card  # noqa: E402
from capacity.model.gpus import get_gpu  # noqa: E402
from capacity.pipeline import Deployment, Disagg, RunOptions, run  # noqa: E402
from capacity.workload import Arrivals, WorkloadSpec, fixed  # noqa: E402

WORKLOADS = {"4k in / 256 out": (4096, 256), "512 in / 1k out": (512, 1024)}
SLO = {"ttft_s": 2.0, "tpot_s": 0.035}


def layouts(gpus: int, tps=(2, 4, 8)):
    out = [("aggregated", gpus // t, t, 0, 0) for t in tps if gpus % t == 0]
    for tp_p in tps:
        for tp_d in tps:
            for n_p in range(1, gpus // tp_p + 1):
                rest = gpus - n_p * tp_p
                if rest > 0 and rest % tp_d == 0:
                    out.append(("disaggregated", n_p, tp_p, rest // tp_d, tp_d))
    return out


def probe(card, gpu, layout, inp, out_len, rate, n, seed=0):
    kind, n1, tp1, n2, tp2 = layout
    eng = EngineConfig(tensor_parallel_size=tp1, max_model_len=8192)
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=rate), input_len=fixed(inp),
                        output_len=fixed(out_len), num_requests=n)
    opts = RunOptions(seed=seed, ci=False, timeseries=False)
    if kind == "aggregated":
        res = run(Deployment(card, gpu, eng, replicas=n1), spec, opts)
    else:
        dec = Deployment(card, gpu, eng.model_copy(update={"tensor_parallel_size": tp2}), replicas=n2)
        res = run(Deployment(card, gpu, eng, replicas=n1), spec, opts, disagg=Disagg(dec, "nvlink"))
    s = res.summary
    ok = (not res.sim.saturated and s.ttft_s.p99 is not None and s.ttft_s.p99 <= SLO["ttft_s"]
          and (s.tpot_s.p99 or 0) <= SLO["tpot_s"])
    return ok, s.ttft_s.p99, s.tpot_s.p99


def max_rate(card, gpu, layout, inp, out_len, n, lo=0.25, hi=64.0, tol=0.08):
    best = None
    ok, *_ = probe(card, gpu, layout, inp, out_len, lo, n)
    if not ok:
        return 0.0, None
    while hi / lo > 1 + tol:
        mid = math.sqrt(lo * hi)
        ok, pt, pp = probe(card, gpu, layout, inp, out_len, mid, n)
        if ok:
            lo, best = mid, (pt, pp)
        else:
            hi = mid
    return lo, best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--out", default=str(ROOT / "bench/results/disagg.json"))
    args = ap.parse_args()
    card = load_model_card(ROOT / f"models/{args.model}.yaml").with_overrides(weight_dtype="fp8")
    gpu = get_gpu(args.gpu)
    rows = []
    t0 = time.perf_counter()
    for wname, (inp, out_len) in WORKLOADS.items():
        for lay in layouts(args.gpus):
            try:
                r, best = max_rate(card, gpu, lay, inp, out_len, args.requests)
            except Exception as exc:  # a layout that does not fit (memory): shown with its reason
                rows.append({"workload": wname, "layout": lay, "max_rate": None, "why": str(exc)[:120]})
                continue
            rows.append({"workload": wname, "layout": lay, "max_rate": r,
                         "p99_ttft_s": best[0] if best else None, "p99_tpot_s": best[1] if best else None})
            print(f"{wname:16} {lay}: {r:.2f} req/s  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for wname in WORKLOADS:
        t = Table(title=f"{card.name} (fp8 weights) on {args.gpus} x {gpu.name}, {wname}: max rate under P99 TTFT "
                        f"<= {SLO['ttft_s']:g} s and P99 TPOT <= {SLO['tpot_s'] * 1e3:g} ms", title_justify="left")
        for c in ("layout", "req/s", "P99 TTFT ms", "P99 TPOT ms"):
            t.add_column(c, justify="left" if c == "layout" else "right")
        sel = sorted((r for r in rows if r["workload"] == wname), key=lambda r: -(r["max_rate"] or 0))
        for r in sel:
            kind, n1, tp1, n2, tp2 = r["layout"]
            name = (f"{n1} x TP{tp1}" if kind == "aggregated" else f"{n1} x TP{tp1} prefill + {n2} x TP{tp2} decode")
            if r["max_rate"] is None:
                t.add_row(name, "-", r["why"], "")
                continue
            t.add_row(name, f"{r['max_rate']:.2f}", f"{r['p99_ttft_s'] * 1e3:.0f}" if r["p99_ttft_s"] else "-",
                      f"{r['p99_tpot_s'] * 1e3:.1f}" if r["p99_tpot_s"] else "-")
        con.print(t)
    Path(args.out).write_text(json.dumps({"model": card.name, "weights": "fp8", "gpu": gpu.name, "gpus": args.gpus,
                                          "slo": SLO, "requests_per_probe": args.requests, "rows": rows,
                                          "wall_s": time.perf_counter() - t0}, indent=1) + "\n")
    con.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
