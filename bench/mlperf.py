"""Predicted vs published: MLPerf Inference Llama-2-70B, Server (Poisson load) and Offline, NVIDIA's TensorRT-LLM.

    python bench/mlperf.py                  # every run whose harness settings are published (about 6 min)
    python bench/mlperf.py --no-max-qps     # only at the published rates (about 3 min)

The published runs (tests/data/published/mlperf_llama2_70b.yaml: LoadGen's mlperf_log_summary.txt of NVIDIA's
closed-division submissions, rounds v4.0-v5.1, and the harness settings of each submission's configs) are the
project's open-loop check: LoadGen's Server scenario sends Poisson arrivals at `target_qps`, so there is no
closed loop to stay in lock-step, and the run is VALID only if P99 TTFT <= 2 s and P99 TPOT <= 200 ms.

Each run is replayed through the run pipeline with the roofline step cost (Llama-2-70B, FP8 weights and KV cache
for Hopper, NVFP4 weights for Blackwell), as the submission's configs set it: 8 / TP replicas of TP-way engines
behind a router, max_num_seqs = `gpu_batch_size`, the token budget `max_num_tokens`, chunked context as
configured, max_model_len 2,048 (the engines' max_seq_len). TensorRT-LLM's "max_util" capacity scheduler admits
while blocks last and pauses a request when they run out, which is vLLM's admission (kv_reservation prompt);
TensorRT-LLM's KV fraction (0.9-0.95 of the memory left after the weights) is replaced by the vLLM budget at
gpu_memory_utilization 0.9 (a little less KV: the safe side). Not modelled: the power caps of the MaxQ system
and the 1,000-W H200 (CTS) system (the roofline has one peak per GPU), the harness's own dispatch (the
simulator's round-robin router), TensorRT-LLM's per-step overhead (the engine model's default).

Lengths. Input: the 24,576 OpenOrca prompts as the harness sends them (tok_input_length), from the data file's
`dataset.input_tokens`: the 1,000-row calibration subset's quantiles (a random subset of the 24,576) between the
full set's min and max (48, 1,021), joined piecewise-linearly; the bench prints its mean beside the full set's
(222.3). `--shape-check` scores a lognormal of the same mean and spread beside it. Output: the run's own LoadGen
log. E2E latency ~ TTFT + TPOT x (tokens - 1), and the logs' TPOT varies little (P99 within ~15% of the mean),
so each E2E percentile gives an output-length percentile; the lengths are drawn from that piecewise-linear
quantile function (capped at 1,024, the harness's max_output_len). Its mean is within 1% of tokens/s over
samples/s of the same log for every Server run (tests/test_mlperf.py). Offline runs take the output lengths of
the same system's Server run.

Scored: mean and P99 TTFT, mean and P99 TPOT (Server, 600 s of arrivals, the first quarter left out); whether
the simulated run meets LoadGen's latency limits at the published target QPS (it did: a "no" is a false alarm,
the safe side); the highest rate at which it meets them (`max_qps`, against the published target: above it is
the unsafe side, as the real system's limit is near its target); output tokens/s (Offline: 24,576 requests at
t=0 per system, the makespan's throughput). Writes bench/results/mlperf.json with the host.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.cli.common import _lengths, load_card  # noqa: E402
from capacity.engine.config import EngineConfig  # noqa: E402
from capacity.model.gpus import get_gpu  # noqa: E402
from capacity.pipeline import Deployment, RunOptions  # noqa: E402
from capacity.pipeline import run as run_pipeline  # noqa: E402
from capacity.workload import Arrivals, Lengths, WorkloadSpec  # noqa: E402

DATA = ROOT / "tests" / "data" / "published" / "mlperf_llama2_70b.yaml"
OUT = ROOT / "bench" / "results" / "mlperf.json"
GPU = {"H100-SXM-80GB": "h100-sxm", "H200-SXM-141GB": "h200", "H200-SXM-141GB-CTS": "h200", "B200-SXM-180GB": "b200"}
# systems whose clocks the roofline does not know: power-capped (MaxQ) or run at 1,000 W (CTS)
POWER = {"MaxQ": "power-capped", "CTS": "1,000 W"}
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p97", 0.97), ("p99", 0.99), ("p99.9", 0.999))
MAX_OUTPUT = 1024  # the harness's generation_config max_output_len
MAX_SEQ = 2048  # the engines' max_seq_len (max_input_len 1,024)
SHAPE_CHECK = "lognormal:222:0.78:48:1021"  # the inputs' mean, CV and bounds with a lognormal's shape


def input_lengths(data: dict) -> tuple[Lengths, float, float]:
    """The prompts' distribution: the calibration subset's quantiles (its rows are a random 1,000 of the 24,576)
    between the full set's min and max, joined piecewise-linearly. Returns the Lengths, its mean and the full
    set's mean (the check: they should agree within a few tokens)."""
    d = data["dataset"]["input_tokens"]
    q, full = d["calibration_subset_quantiles"], d["full_set"]
    qs = [0.0, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 1.0]
    toks = [full["min"], q["p10"], q["p25"], q["p50"], q["p75"], q["p90"], q["p95"], q["p99"], full["max"]]
    lengths = _quantile_lengths(qs, toks)
    return lengths, lengths.expected, float(full["mean"])


def _quantile_lengths(qs: list[float], toks: list[float], points: int = 1000) -> Lengths:
    """Lengths drawn from a piecewise-linear quantile function (an empirical list of `points` quantiles)."""
    grid = (np.arange(points) + 0.5) / points
    values = np.maximum(np.rint(np.interp(grid, qs, toks)), 1).astype(int)
    return Lengths(kind="empirical", values=[int(v) for v in values])


def output_lengths(run: dict) -> tuple[Lengths, float, float]:
    """The output-length distribution a Server run's own log implies: tokens = 1 + (E2E - TTFT) / TPOT at each
    E2E percentile (mean TTFT and TPOT), joined piecewise-linearly, from 1 token to the cap. Returns the
    Lengths (an empirical list of 1,000 quantiles), its mean and the log's own mean (tokens/s over samples/s)."""
    lat, ttft, tpot = run["latency_ms"], run["ttft_ms"]["mean"], run["tpot_ms"]["mean"]
    qs = [0.0] + [q for _, q in QUANTILES] + [1.0]
    toks = [1.0] + [1 + max(lat[k] - ttft, 0.0) / tpot for k, _ in QUANTILES] + [float(MAX_OUTPUT)]
    toks = list(np.minimum(np.maximum.accumulate(toks), MAX_OUTPUT))
    t = run["throughput"]
    out = _quantile_lengths(qs, toks)
    return out, out.expected, float(t["completed_tokens_per_s"] / t["completed_samples_per_s"])


def inflight_per_replica(requests_per_s: float, e2e_mean_s: float, replicas: int) -> float:
    """Little's law: requests in the system (queued or running) per replica = completed requests/s x mean E2E
    latency / replicas. From a LoadGen log it is the running batch the real engines held (their queues were short:
    mean TTFT a few steps); beside the simulated one it says whether the step costs put the equilibrium at the
    same batch (docs/fidelity.md, "MLPerf Server near saturation")."""
    return requests_per_s * e2e_mean_s / max(1, replicas)


def settings(run: dict, common: dict) -> dict | None:
    """The engine settings of a run, or None where its configs are not published in full (such a run is listed,
    not scored). `common`: the file's harness_common (v4.1's settings shared by every system)."""
    h = dict(run.get("harness") or {})
    if "common_v4_1" in h:
        h = {**common["v4_1"], **h}
    flags = h.get("trtllm_runtime_flags") or {}
    gpu = GPU.get((run.get("system_info") or {}).get("accelerator", "").replace("NVIDIA ", ""))
    tp, batch, tokens = h.get("tensor_parallelism"), h.get("gpu_batch_size"), flags.get("max_num_tokens", h.get("max_num_tokens"))
    if gpu is None or tp is None or batch is None or tokens is None:
        return None
    return {"gpu": gpu, "tp": int(tp), "replicas": int(run["system_info"]["num_gpus"]) // int(tp), "batch": int(batch),
            "weight": "nvfp4" if "fp4" in str(h.get("precision", "")).lower() else "fp8", "tokens": int(tokens),
            "chunked": flags.get("enable_chunked_context") is True}


def deployment(s: dict) -> Deployment:
    card = load_card("llama-2-70b", s["weight"], None, None)
    # without chunking, the budget must hold a whole request (the vLLM engine model refuses less): v4.1's 4,096 does
    eng = EngineConfig(tensor_parallel_size=s["tp"], kv_cache_dtype="fp8", max_num_seqs=s["batch"],
                       max_num_batched_tokens=max(s["tokens"], MAX_SEQ) if not s["chunked"] else s["tokens"],
                       enable_chunked_prefill=s["chunked"], max_model_len=MAX_SEQ, kv_reservation="prompt",
                       frontend_ms=0.0, frontend_us_per_input_token=0.0)  # LoadGen sends the SUT token ids: no
    # server front end, no tokenising (docs/fidelity.md, "The server's front end")
    return Deployment(card, get_gpu(s["gpu"]), eng, replicas=s["replicas"])


def simulate_server(run: dict, s: dict, inputs: Lengths, duration_s: float, rate: float | None = None,
                    seed: int = 0, capacity: float | None = None) -> dict:
    """One Server run at `rate` (default: its published target QPS) for about `duration_s` of arrivals: the
    latency statistics LoadGen reports (ms), output tokens/s and whether LoadGen's P99 limits hold. With
    `s["replicas"]` 1 and a rate per replica: one replica of the system alone. Two verdicts: LoadGen's (the P99
    limits over the run, whatever its trend) and the planner's (also no TTFT still rising through the run, and,
    with the deployment's `capacity` in req/s, a rate under it: `capacity.plan.planner.Planner.rate_search`)."""
    rate = float(run["target_qps"]) if rate is None else rate
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=rate), input_len=inputs,
                        output_len=output_lengths(run)[0], num_requests=max(1000, round(rate * duration_s)))
    # a quarter left out: the engines' batches take about one E2E (30-40 s at these loads) to fill
    res = run_pipeline(deployment(s), spec, RunOptions(seed=seed, ci=False, timeseries=False, warmup_fraction=0.25))
    sm = res.summary
    lim = run.get("constraints_ms") or {}
    out = {"ttft_mean": sm.ttft_s.mean * 1e3, "ttft_p99": sm.ttft_s.p99 * 1e3, "tpot_mean": sm.tpot_s.mean * 1e3,
           "tpot_p99": sm.tpot_s.p99 * 1e3, "tokens_per_s": sm.output_tokens_per_s, "preempted": sm.preempted_requests,
           "inflight": inflight_per_replica(sm.requests_per_s, sm.e2e_s.mean, s["replicas"])}
    out["ttft_rising"] = res.rising
    # LoadGen's verdict: the P99s over the run (a run the simulator stopped as saturated never finished its queries)
    out["meets_limits_loadgen"] = bool(not res.sim.saturated and out["ttft_p99"] <= lim.get("ttft_latency_ms", 2000.0)
                                       and out["tpot_p99"] <= lim.get("tpot_latency_ms", 200.0))
    # the planner's: a transient's P99s (TTFT still rising) or a rate at or above the capacity do not pass
    out["meets_limits"] = bool(out["meets_limits_loadgen"] and not res.rising
                               and (capacity is None or rate < capacity))
    return out


def replica_capacity(run: dict, s: dict, inputs: Lengths) -> float:
    """One replica's capacity (req/s) for this run's lengths: the planner's closed loop (`capacity.steady`)."""
    from capacity.pipeline import prepare
    from capacity.steady import capacity_loop

    dep = deployment(s)
    wl = capacity_loop(dep.engine, prepare(dep).budget, WorkloadSpec(input_len=inputs,
                                                                   output_len=output_lengths(run)[0]), 1000)
    res = run_pipeline(dep, wl, RunOptions(seed=0, ci=False, timeseries=False))
    return res.backlogged.requests_per_s if res.backlogged is not None else res.summary.requests_per_s


def max_qps(run: dict, s: dict, inputs: Lengths, duration_s: float, steps: int = 6) -> dict[str, float]:
    """The highest Poisson rate at which the simulated system meets LoadGen's P99 limits (bisection between 0.5x
    and 2x the published target QPS), judged two ways (`simulate_server`): as the planner judges a probe
    (`max_qps`: the answer `capacity plan` gives for this SLO) and as LoadGen judges a run (`max_qps_loadgen`).
    The published target is a rate the real system met, near the most its submitter could pass. Resolution:
    2^(2 / 2^steps) - 1 (2.2% with 6 steps). Also the system's capacity (`capacity_qps`).
    One replica is searched, with Poisson arrivals at its share of the rate: the harness's dispatch is not
    published, and a round-robin share of Poisson arrivals is smoother than Poisson (the safe side; at the
    published rates the two differ by a few percent in P99 TTFT). Rates are of the whole system."""
    n = s["replicas"]
    one = {**s, "replicas": 1}
    target = float(run["target_qps"]) / n
    cap = replica_capacity(run, one, inputs)
    memo: dict[float, dict] = {}

    def probe(rate: float) -> dict:
        if rate not in memo:
            memo[rate] = simulate_server(run, one, inputs, duration_s, rate, capacity=cap)
        return memo[rate]

    def search(verdict: str) -> float:
        lo, hi = 0.5 * target, 2.0 * target
        if not probe(lo)[verdict]:
            return 0.0
        if probe(hi)[verdict]:
            return hi * n
        for _ in range(steps):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if probe(mid)[verdict] else (lo, mid)
        return lo * n

    return {"max_qps": search("meets_limits"), "max_qps_loadgen": search("meets_limits_loadgen"),
            "capacity_qps": cap * n}


def simulate_offline(run: dict, s: dict, inputs: Lengths, outputs: Lengths, n: int, seed: int = 0) -> dict:
    spec = WorkloadSpec(arrivals=Arrivals(kind="offline"), input_len=inputs, output_len=outputs, num_requests=n)
    res = run_pipeline(deployment(s), spec, RunOptions(seed=seed, ci=False, timeseries=False))
    off = res.offline()
    assert off is not None
    return {"offline_tokens_per_s": off["output_tokens_per_s"], "makespan_s": off["makespan_s"]}


SERVER_METRICS = (("ttft_mean", "ttft_ms", "mean"), ("ttft_p99", "ttft_ms", "p99"), ("tpot_mean", "tpot_ms", "mean"),
                  ("tpot_p99", "tpot_ms", "p99"), ("tokens_per_s", "throughput", "completed_tokens_per_s"))
# Server tokens/s is the offered load when the system keeps up (rate x mean output): scored, but it says little;
# Offline tokens/s is the capacity
METRICS = ("ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99", "tokens_per_s", "max_qps", "max_qps_loadgen",
           "offline_tokens_per_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input-len", default=None, help="prompt lengths instead of the dataset's (N, LOW-HIGH or lognormal:MEAN:CV[:MIN:MAX])")
    ap.add_argument("--shape-check", default=SHAPE_CHECK,
                    help=f"a second input distribution scored beside (default {SHAPE_CHECK}: the same mean and spread, another shape; '' for none)")
    ap.add_argument("--duration", type=float, default=600.0,
                    help="seconds of Poisson arrivals per Server run (default 600: LoadGen ran 2,400; at 150 an overload can pass)")
    ap.add_argument("--offline-requests", type=int, default=24576, help="requests per Offline run (LoadGen: 24,576)")
    ap.add_argument("--no-max-qps", action="store_true", help="skip the search for the highest rate meeting the limits")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    if not 20 <= a.duration <= 3600 or not 100 <= a.offline_requests <= 200_000:
        sys.exit("--duration: 20-3,600 s; --offline-requests: 100-200,000")
    data = yaml.safe_load(DATA.read_text())
    dataset, qmean, full_mean = input_lengths(data)
    main_name = a.input_len or "dataset"
    variants = {main_name: _lengths("--input-len", a.input_len) if a.input_len else dataset}
    if a.shape_check:
        variants[a.shape_check] = _lengths("--shape-check", a.shape_check)
    runs = [(r, settings(r, data["harness_common"])) for r in data["runs"]]
    skipped = [r["id"] for r, s in runs if s is None]
    runs = [(r, s) for r, s in runs if s is not None]
    print(f"{len(runs)} MLPerf Llama-2-70B runs with published settings ({len(skipped)} without: listed in the JSON)")
    print(f"inputs: {main_name}" + (f" (calibration quantiles: mean {qmean:.1f}; the full set's {full_mean:.1f})"
                                    if not a.input_len else "") + f"; beside it: {a.shape_check or 'none'}")
    t0 = time.time()
    rows = []
    for i, (r, s) in enumerate(runs):
        power = next((v for k, v in POWER.items() if k in r["system"]), None)
        pred: dict[str, dict] = {}
        if r["scenario"] == "Offline":
            server = next((x for x, _ in runs if x["system"] == r["system"] and x["round"] == r["round"]
                           and x["scenario"] == "Server"), None)
            if server is None:
                skipped.append(r["id"] + " (no Server run to take output lengths from)")
                continue
            pub = {"offline_tokens_per_s": r["throughput"]["tokens_per_s"]}
            for name, inp in variants.items():
                pred[name] = simulate_offline(r, s, inp, output_lengths(server)[0], a.offline_requests)
        else:
            out_mean, log_mean = output_lengths(r)[1:]
            pub = {m: r[k][f] for m, k, f in SERVER_METRICS} | {"max_qps": float(r["target_qps"]),
                                                                 "max_qps_loadgen": float(r["target_qps"])}
            inflight_pub = inflight_per_replica(r["throughput"]["completed_samples_per_s"],
                                                r["latency_ms"]["mean"] / 1e3, s["replicas"])
            for name, inp in variants.items():
                pred[name] = simulate_server(r, s, inp, a.duration)
                if not a.no_max_qps and name == main_name:
                    pred[name] |= max_qps(r, s, inp, a.duration)
        err = {v: {m: p[m] / pub[m] - 1 for m in pub if m in p} for v, p in pred.items()}
        rows.append({"id": r["id"], "scenario": r["scenario"], "settings": s, "target_qps": r.get("target_qps"),
                     "power": power, "published": pub, "predicted": pred, "error": err,
                     **({} if r["scenario"] == "Offline" else {"output_mean": out_mean, "output_mean_log": log_mean,
                                                               "inflight_per_replica": inflight_pub})})
        e = err[main_name]
        print(f"[{i + 1}/{len(runs)}] {r['id']}" + (f" ({power}: not modelled)" if power else ""))
        print("    " + "  ".join(f"{m} {pub[m]:,.0f} {e[m]:+.0%}" for m in pub if m in e)
              + ("" if r["scenario"] == "Offline" else
                 f"  limits {'met' if pred[main_name]['meets_limits'] else 'MISSED'}"
                 f"  in flight per replica {inflight_pub:,.0f} / {pred[main_name]['inflight']:,.0f} simulated"), flush=True)
    summary: dict = {}
    for v in variants:
        summary[v] = {}
        for m in METRICS:
            e = np.array([o["error"][v][m] for o in rows if v in o["error"] and m in o["error"][v] and not o["power"]])
            if e.size:
                summary[v][m] = {"mape": float(np.mean(np.abs(e))), "median_signed": float(np.median(e)), "n": int(e.size)}
        met = [o["predicted"][v]["meets_limits"] for o in rows if o["scenario"] != "Offline" and v in o["predicted"]]
        summary[v]["limits_met"] = f"{sum(met)}/{len(met)}"
    print(f"\nerror by metric, runs at the modelled clocks ({time.time() - t0:.0f} s): MAPE (median signed)")
    print(f"{'inputs':20s}" + "".join(f"{v[:26]:>28s}" for v in variants))
    for m in METRICS:
        print(f"{m:20s}" + "".join(f"{summary[v][m]['mape']:>15.1%} ({summary[v][m]['median_signed']:+.0%}) n={summary[v][m]['n']:<2}"
                                   if m in summary[v] else f"{'-':>28s}" for v in variants))
    print(f"{'limits met':20s}" + "".join(f"{summary[v]['limits_met']:>28s}" for v in variants))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "source": str(DATA.relative_to(ROOT)), "command": "python bench/mlperf.py " + " ".join(sys.argv[1:]),
        "host": {"machine": platform.machine(), "processor": platform.processor() or platform.platform(),
                 "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "inputs": main_name,
        "input_mean": {"quantile_function": qmean, "full_set": full_mean}, "duration_s": a.duration,
        "summary": summary, "skipped": skipped, "rows": rows}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
