"""Score the SGLang engine model (memory, scheduler, roofline step costs) against published SGLang serving
benchmarks (`tests/data/published/sglang_benchmarks.yaml`, collected with sources; read its header first).

    python bench/sglang_published.py [--max-requests 2000]

Each point is re-run as published: the model, GPU, TP and precision; random input/output lengths (uniform
within the published range ratio, fixed when the ratio is 1 or not given); a Poisson request rate, or a closed
loop of `max_concurrency` users, or an offline batch (rate inf without a concurrency cap); the published number
of prompts (capped by --max-requests). Prints, per point and metric, the published and predicted values and the
error, then the MAPE per metric; writes bench/results/sglang_published.json with the host.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sim_speed import host_cpu  # noqa: E402
from capacity.cli.common import load_card  # noqa: E402
from capacity.engine.config import EngineConfig  # noqa: E402
from capacity.errors import CapacityError  # noqa: E402
from capacity.model.gpus import get_gpu  # noqa: E402
from capacity.pipeline import Deployment, RunOptions, run  # noqa: E402
from capacity.workload import Arrivals, Lengths, WorkloadSpec, fixed  # noqa: E402

DATA = ROOT / "tests" / "data" / "published" / "sglang_benchmarks.yaml"
OUT = ROOT / "bench" / "results" / "sglang_published.json"
MODELS = {"llama-3.1-8b": "llama-3.1-8b", "llama-3-8b": "llama-3.1-8b", "llama-3.1-70b": "llama-3.1-70b",
          "llama-3-70b": "llama-3.1-70b", "llama-3.3-70b": "llama-3.1-70b"}
GPUS = {"a100-40gb": "a100-40gb", "a100-80gb": "a100-80gb", "a100": "a100-80gb", "h100": "h100-sxm", "h200": "h200"}
METRICS = ("request_throughput_rps", "input_token_throughput_tps", "output_token_throughput_tps", "mean_ttft_ms",
           "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms", "mean_e2e_ms",
           "median_e2e_ms")


def _key(s: object, table: dict) -> str | None:
    """The catalogue name a published label means: the longest key it contains ("A100 40GB" is not an A100-80GB)."""
    t = str(s or "").lower().replace("meta-llama/", "").replace("meta-", "").replace("-instruct", "")
    t = t.replace("_", "-").replace(" ", "-")
    for k in sorted(table, key=len, reverse=True):
        if k in t:
            return table[k]
    return None


def lengths(length: int, ratio: float | None) -> Lengths:
    """bench_serving's random dataset: each length uniform on [max(1, ratio x L), L]; its range ratio defaulted
    to 0 in the versions the data cites when not given (so [1, L]); 1 is fixed lengths."""
    r = 0.0 if ratio is None else float(ratio)
    if r >= 1:
        return fixed(int(length))
    return Lengths(kind="uniform", low=max(1, int(length * r)), high=int(length))


def predict(p: dict, max_requests: int) -> dict[str, float]:
    model, gpu = _key(p.get("model"), MODELS), _key(p.get("gpu"), GPUS)
    if model is None or gpu is None or not p.get("input_len") or not p.get("output_len"):
        raise CapacityError(f"not reproducible here (model {p.get('model')}, gpu {p.get('gpu')}, lengths)")
    prec = str(p.get("precision") or "bf16").lower()
    card = load_card(model, "fp8" if "fp8" in prec else None, None, None)
    ratio = p.get("random_range_ratio")
    n = min(int(p.get("num_prompts") or 1000), max_requests)
    rate, conc = p.get("request_rate"), p.get("max_concurrency")
    if conc:
        arr = Arrivals(kind="closed", users=int(conc))
    elif rate in (None, "inf", math.inf) or (isinstance(rate, float) and math.isinf(rate)):
        arr = Arrivals(kind="offline")
    else:
        arr = Arrivals(kind="poisson", rate_per_s=float(rate))
    spec = WorkloadSpec(arrivals=arr, input_len=lengths(p["input_len"], ratio),
                        output_len=lengths(p["output_len"], ratio), num_requests=n)
    eng = EngineConfig(engine="sglang", tensor_parallel_size=int(p.get("tp") or 1))
    res = run(Deployment(card, get_gpu(gpu), eng), spec, RunOptions(seed=0, ci=False, timeseries=False,
                                                                       warmup_fraction=0.0))
    s = res.summary
    r = res.sim.records
    done = r.finished
    span = float(r.finish[done].max())  # bench_serving: from its start (t=0) to the last answer
    ms = 1e3
    return {"request_throughput_rps": int(done.sum()) / span,
            "input_token_throughput_tps": float(r.prompt_tokens[done].sum()) / span,
            "output_token_throughput_tps": float(r.output_tokens[done].sum()) / span,
            "mean_ttft_ms": s.ttft_s.mean * ms, "median_ttft_ms": s.ttft_s.p50 * ms,
            "mean_tpot_ms": s.tpot_s.mean * ms, "median_tpot_ms": s.tpot_s.p50 * ms,
            "mean_itl_ms": s.itl_s.mean * ms, "median_itl_ms": s.itl_s.p50 * ms,
            "mean_e2e_ms": s.e2e_s.mean * ms, "median_e2e_ms": s.e2e_s.p50 * ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    points = yaml.safe_load(DATA.read_text())["points"]
    t0 = time.time()
    rows = []
    for i, p in enumerate(points, 1):
        pub = {m: v for m, v in (p.get("metrics") or {}).items() if m in METRICS and isinstance(v, (int, float))}
        try:
            pred = predict(p, a.max_requests)
        except (CapacityError, ValueError) as exc:
            print(f"[{i}/{len(points)}] skipped: {str(exc)[:100]}", flush=True)
            rows.append({"point": i, "skipped": str(exc)})
            continue
        err = {m: pred[m] / v - 1 for m, v in pub.items() if v and m in pred and np.isfinite(pred[m])}
        rows.append({"point": i, "id": p.get("id"), "source": p.get("source_url"), "published": pub,
                     "predicted": pred, "error": err})
        print(f"[{i}/{len(points)}] {p.get('model')} {p.get('gpu')} tp{p.get('tp')} {p.get('input_len')}/"
              f"{p.get('output_len')} rate {p.get('request_rate')} conc {p.get('max_concurrency')}: "
              + ", ".join(f"{m} {pub[m]:,.1f} {e:+.0%}" for m, e in err.items()), flush=True)
    summary = {}
    for m in METRICS:
        e = np.array([r["error"][m] for r in rows if m in r.get("error", {})])
        if e.size:
            summary[m] = {"n": int(e.size), "mape": float(np.mean(np.abs(e))),
                          "median_signed": float(np.median(e))}
    print(f"\nMAPE by metric ({sum('error' in r for r in rows)} points scored; {time.time() - t0:.0f} s)")
    for m, s in summary.items():
        print(f"  {m:26s} n={s['n']:<3d} MAPE {s['mape']:6.1%}  median signed {s['median_signed']:+.1%}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"command": "python bench/sglang_published.py", "data": str(DATA.relative_to(ROOT)),
                                 "host": {"cpu": host_cpu(), "machine": platform.machine()},
                                 "date": time.strftime("%Y-%m-%d"), "summary": summary, "rows": rows},
                                indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
