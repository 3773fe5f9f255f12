"""Aggregated vs disaggregated prefill/decode on one 8-GPU node: the highest rate each layout sustains under a
P99 TTFT and a P99 TPOT SLO, for a long-prompt and a long-output workload (`capacity.plan.disagg.compare`, the
same as `capacity disagg`).

    python bench/disagg.py [--model llama-3.1-70b] [--gpu h100-sxm] [--gpus 8] [--requests 600] [--tune]

--tune: then each role's batch cap and token budget are searched for the best layout of each kind
(`capacity disagg --tune`), and the two are compared as tuned.

Llama-3.1-70B with FP8 weights (so TP 2 holds it) on H100s, roofline step costs, vLLM's engine model, KV over
NVLink inside the node. Prints a table per workload and writes bench/results/disagg.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.engine.config import EngineConfig  # noqa: E402
from capacity.model.card import load_model_card  # noqa: E402
from capacity.model.gpus import get_gpu  # noqa: E402
from capacity.plan.disagg import compare  # noqa: E402
from capacity.workload import WorkloadSpec, fixed  # noqa: E402

WORKLOADS = {"4k in / 256 out": (4096, 256), "512 in / 1k out": (512, 1024)}
SLO = (2.0, 0.035)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--tune", action="store_true", help="search each role's settings for the two winners")
    ap.add_argument("--out", default=str(ROOT / "bench/results/disagg.json"))
    args = ap.parse_args()
    card = load_model_card(ROOT / f"models/{args.model}.yaml").with_overrides(weight_dtype="fp8")
    gpu = get_gpu(args.gpu)
    t0 = time.perf_counter()
    results = {}
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for wname, (inp, out_len) in WORKLOADS.items():
        spec = WorkloadSpec(input_len=fixed(inp), output_len=fixed(out_len), num_requests=args.requests)
        res = compare(card, gpu, EngineConfig(max_model_len=8192), spec, SLO, gpus=args.gpus, tune_roles=args.tune,
                      progress=lambda name, w=wname: print(f"{w}: {name} ({time.perf_counter() - t0:.0f} s)",
                                                  file=sys.stderr))
        results[wname] = res
        t = Table(title=f"{card.name} (fp8 weights) on {args.gpus} x {gpu.name}, {wname}: max rate under P99 TTFT "
                        f"<= {SLO[0]:g} s and P99 TPOT <= {SLO[1] * 1e3:g} ms", title_justify="left")
        for c in ("layout", "req/s", "P99 TTFT ms", "P99 TPOT ms"):
            t.add_column(c, justify="left" if c == "layout" else "right")
        for r in sorted(res["rows"], key=lambda r: -(r["max_rate"] or 0)):
            if r["max_rate"] is None:
                t.add_row(r["layout"], "-", r["why"][:40], "")
                continue
            t.add_row(r["layout"], f"{r['max_rate']:.2f}",
                      f"{r['p99_ttft_s'] * 1e3:.0f}" if r["p99_ttft_s"] is not None else "-",
                      f"{r['p99_tpot_s'] * 1e3:.1f}" if r["p99_tpot_s"] is not None else "-")
        con.print(t)
        for tp, why in res["tp_that_does_not_fit"].items():
            con.print(f"TP {tp} left out: {why}")
        for r in (res["best_aggregated"], res["best_disaggregated"]) if args.tune else ():
            if r is not None:
                con.print(f"tuned {r['layout']}: {r['settings']}: {r['max_rate_as_given']:.2f} -> {r['max_rate']:.2f} "
                          f"req/s (P99 TTFT {r['p99_ttft_s'] * 1e3:.0f} ms, TPOT {r['p99_tpot_s'] * 1e3:.1f} ms)")
        con.print(res["verdict"])
    Path(args.out).write_text(json.dumps({"model": card.name, "weights": "fp8", "gpu": gpu.name, "gpus": args.gpus,
                                          "slo": {"ttft_s": SLO[0], "tpot_s": SLO[1]},
                                          "requests_per_probe": args.requests, "tuned": args.tune,
                                          "workloads": results,
                                          "wall_s": time.perf_counter() - t0}, indent=1) + "\n")
    con.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
