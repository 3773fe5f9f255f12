"""Predicted vs published: TensorRT-LLM's offline max-throughput tables and NVIDIA NIM's concurrency sweeps.

    python bench/published.py                     # TensorRT-LLM: 80 rows (Llama 3.1 8B/70B/405B, H100/H200/B200)
    python bench/published.py --quick             # 8B and 70B on H100 only, 1,000 requests per row
    python bench/published.py --sweeps            # NIM 1.8.0: TTFT, ITL, tokens/s at concurrency 1-250 (79 rows)

Concurrency sweeps (tests/data/published/concurrency_sweeps.yaml: NIM 1.8.0, Llama-3.1-8B on 1 x H100 and
Llama-3.3-70B on 2 x H100, FP8; mostly from a third-party transcription of NVIDIA's page, see the file) run as
closed loops of c users with no think time, fixed lengths, max(8c, 80) requests (at most 1,500), the first 10%
left out, the same engine settings as below; scored on mean TTFT, mean ITL (TPOT: the page's ITL excludes the
first token) and output tokens/s, in the variants below and a fourth, `+ reused prompts`: genai-perf sends its
100 dataset entries in turn (perf_analyzer's round-robin over `--num-dataset-entries`, default 100), so from the
101st request on every prompt was seen before; with the engine's prefix cache on (vLLM's default; whether NIM's
TensorRT-LLM had KV reuse on is not stated) a prompt computes only its last partial block. Two more: `+ whole
prompts` (no chunked prefill, a 32,768-token step) and `+ lengths ±5%` (output lengths uniform within 5% of the
published, so the simulated users drift apart: the other end of a fixed-length closed loop's TTFT; the summary
counts the lock-step rows whose published TTFT lies between the two ends). Writes bench/results/published_nim.json.

Each published row (trtllm-bench throughput: ISL/OSL fixed, every request queued at once, total output tokens/s of
the TP group) is replayed as an offline batch (`--arrival offline`) through the run pipeline with the roofline step
cost, in four variants that show what each modelling choice does to the answer:

- `bf16 GEMMs`: FP8 weights costed at the bf16 tensor rate (what the roofline did before FP8 compute was modelled)
  and vLLM's admission (reserve the prompt, preempt when the cache fills);
- `fp8 GEMMs`: the GEMMs at the rate of the dtype engines multiply in (capacity.model.compute), FP8 attention;
- `+ no-evict`: and TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler (kv_reservation prompt_and_output);
- `+ bench's batch settings`: and the batch cap and token budget trtllm-bench picks per dataset when given none
  (`trtllm_bench_settings`), as the page's runs were made.

Engine settings of the first three (the page gives none): max_batch_size 2048, max_num_tokens 8192, FP8 KV
cache, KV memory from the vLLM budget at gpu_memory_utilization 0.9 (TensorRT-LLM's free-memory fraction 0.9-0.95
gives a little more: on the safe side). Requests per row: the page's count, capped by --max-requests (the makespan
of a capped batch has relatively more ramp-up and tail, which lowers the predicted throughput a little).
Writes bench/results/published_trtllm.json (rows, MAPE per variant, the host).
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
from capacity.model.gpus import get_gpu  # noqa: E402
from capacity.pipeline import Deployment, RunOptions, run  # noqa: E402
from capacity.workload import Arrivals, Lengths, PrefixGroups, WorkloadSpec, fixed  # noqa: E402

DATA = ROOT / "tests" / "data" / "published" / "trtllm_perf_overview.yaml"
SWEEPS = ROOT / "tests" / "data" / "published" / "concurrency_sweeps.yaml"
OUT_SWEEPS = ROOT / "bench" / "results" / "published_nim.json"
SWEEP_MODEL = {"llama-3.1-8b": "llama-3.1-8b", "llama-3.3-70b": "llama-3.1-70b"}
OUT = ROOT / "bench" / "results" / "published_trtllm.json"
VARIANTS = {  # name -> (compute dtype override, kv_reservation)
    "bf16 GEMMs": ("bf16", "prompt"),
    "fp8 GEMMs": (None, "prompt"),
    "+ no-evict": (None, "prompt_and_output"),
}
# the offline table adds one: trtllm-bench's own batch cap and token budget (trtllm_bench_settings)
# and the TensorRT-LLM engine model (capacity.engine.trtllm) at those settings: its KV pool, 32-token blocks, whole
# prompts (chunked prefill off, trtllm-bench's default), the overlap scheduler
TABLE_VARIANTS = {**{k: (*v, False, "vllm") for k, v in VARIANTS.items()},
                  "+ bench's batch settings": (None, "prompt_and_output", True, "vllm"),
                  "TensorRT-LLM engine": (None, "prompt_and_output", True, "trtllm")}
WEIGHT = {"fp8": "fp8", "fp4": "nvfp4"}
# the sweeps add one: genai-perf's 100 prompts, sent in turn, hitting the engine's prefix cache (NVIDIA's page
# does not say whether KV reuse was on: a hypothesis, scored beside the others)
# and another: whole prompts (no chunked prefill) in a 32,768-token step budget, so that a wave of closed-loop
# users' prompts is prefilled together and stays together (NIM does not publish its engines' batch settings: a
# hypothesis about them, scored beside the others, not a setting fitted to the rows)
# and a last one: output lengths drawn uniformly within 5% of the published, so that the simulated users drift
# apart (the other end of a fixed-length closed loop's TTFT; does the published lie between the two?)
# and the TensorRT-LLM engine model (capacity.engine.trtllm) in place of vLLM's: its KV pool (0.9 of the memory
# free after its profile, not of the device), 32-token blocks, no-evict admission, the overlap scheduler; chunked
# prefill on (NIM serves 20,000-token prompts with an 8,192-token budget, so its engines must chunk them)
SWEEP_VARIANTS = {**{k: (*v, False, None, 0.0, "vllm") for k, v in VARIANTS.items()},
                  "+ reused prompts": (None, "prompt_and_output", True, None, 0.0, "vllm"),
                  "+ whole prompts": (None, "prompt_and_output", False, 32768, 0.0, "vllm"),
                  "+ lengths ±5%": (None, "prompt_and_output", False, None, 0.05, "vllm"),
                  "TensorRT-LLM": (None, "prompt_and_output", False, None, 0.0, "trtllm"),
                  "TensorRT-LLM ±5%": (None, "prompt_and_output", False, None, 0.05, "trtllm")}
ENDS = {"vLLM": ("+ no-evict", "+ lengths ±5%"), "TensorRT-LLM": ("TensorRT-LLM", "TensorRT-LLM ±5%")}


def trtllm_bench_settings(card, gpu, row: dict, fraction: float = 0.95) -> tuple[int, int]:
    """The max_batch_size and max_num_tokens `trtllm-bench throughput` picks when it is given neither, as
    TensorRT-LLM's bench/build/tuning.py (calc_engine_setting, finetune_setting) computes them, read there:
    the KV bytes per token of the whole model (FP8 KV: the checkpoints' FP8/NVFP4 quantisation maps to an FP8 KV
    cache; at least one KV head per rank) into the GPUs' memory less the weights (parameters x 1 byte for FP8,
    0.5 for NVFP4), times the KV fraction (0.95, the heuristic's default and the page's usual setting), gives the
    requests of ISL + OSL that fit; the batch is that (at most 4,096) rounded up to 32/128/256 and at least 64;
    the token budget is batch x (1 + ISL/OSL) (at most 32,768) rounded up to 256/512/1,024 and at least 2,048.
    With chunked prefill off (trtllm-bench's default) the budget is raised to the longest prompt plus the batch."""
    from capacity.model.weights import count_params

    gib = 2**30
    kv_per_token = 2 * card.num_layers * max(row["tp"], card.num_kv_heads) * card.head_dim_ / gib
    weights = count_params(card) * {"fp8": 1.0, "fp4": 0.5}[row["dtype"]] / gib
    fits = (gpu.usable_memory_bytes / gib * row["tp"] - weights) * fraction / (kv_per_token * (row["isl"] + row["osl"]))
    bs = min(fits, 4096)
    tokens = min(bs * (1 + row["isl"] / row["osl"]), 32768)
    step_bs = 32 if bs < 256 else 128 if bs < 1024 else 256
    batch = step_bs * math.ceil(bs / step_bs)
    batch = max(64, batch) if bs < 256 else batch
    step_tok = 256 if tokens < 4096 else 512 if tokens < 8192 else 1024
    budget = step_tok * math.ceil(tokens / step_tok)
    budget = max(2048, budget) if tokens < 4096 else budget
    return batch, max(budget, row["isl"] + batch)


def predict(row: dict, n_requests: int, compute: str | None, reservation: str, bench_settings: bool = False,
            engine: str = "vllm") -> float:
    """Total output tokens/s of the TP group for one published row, as an offline batch. `bench_settings`:
    the batch cap and token budget trtllm-bench picks (`trtllm_bench_settings`), not 2,048 and 8,192."""
    card = load_card(row["model"], WEIGHT[row["dtype"]], None, compute)
    seqs, budget = trtllm_bench_settings(card, get_gpu(row["gpu"]), row) if bench_settings else (2048, 8192)
    # chunked prefill stays on: the vLLM engine model refuses a budget below max_model_len without it, and the
    # budget holds every prompt (TensorRT-LLM would make a prompt that does not fit the step wait, not split it)
    eng = EngineConfig(engine=engine, tensor_parallel_size=row["tp"], kv_cache_dtype="fp8", max_num_seqs=seqs,
                       max_num_batched_tokens=budget, max_model_len=row["isl"] + row["osl"],
                       kv_reservation=reservation,  # type: ignore[arg-type]
                       frontend_ms=0.0, frontend_us_per_input_token=0.0)  # trtllm-bench hands token ids to the
    # executor: no server front end, no tokenising (docs/fidelity.md, "The server's front end")
    spec = WorkloadSpec(arrivals=Arrivals(kind="offline"), input_len=fixed(row["isl"]), output_len=fixed(row["osl"]),
                        num_requests=n_requests)
    res = run(Deployment(card, get_gpu(row["gpu"]), eng), spec, RunOptions(seed=0, ci=False, timeseries=False))
    off = res.offline()
    assert off is not None
    return float(off["output_tokens_per_s"])


def predict_sweep(src: dict, row: dict, compute: str | None, reservation: str,
                  reused: bool = False, whole: int | None = None, spread: float = 0.0,
                  engine: str = "vllm") -> dict[str, float]:
    """Mean TTFT (ms), mean ITL (ms) and output tokens/s of a closed loop of `concurrency` users. `reused`:
    genai-perf's prompts, its 100 dataset entries sent in turn, with the engine's prefix cache on. `whole`: no
    chunked prefill, this step budget (at least one whole request). `spread`: output lengths uniform within this
    fraction of the published (the same mean). `engine`: the engine model (trtllm: its own defaults but for the
    batch cap, the token budget and chunked prefill, set as for vLLM)."""
    c = row["concurrency"]
    card = load_card(SWEEP_MODEL[src["model"]], "fp8", None, compute)
    half = int(row["osl"] * spread)
    out_len = Lengths(kind="uniform", low=row["osl"] - half, high=row["osl"] + half) if half else fixed(row["osl"])
    mml = row["isl"] + row["osl"] + half
    eng = EngineConfig(engine=engine, tensor_parallel_size=src["tp"], kv_cache_dtype="fp8", max_num_seqs=2048,
                       max_num_batched_tokens=8192 if whole is None else max(whole, mml), max_model_len=mml,
                       enable_chunked_prefill=whole is None,
                       kv_reservation=reservation, enable_prefix_caching=reused)  # type: ignore[arg-type]
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=c), input_len=fixed(row["isl"]),
                        output_len=out_len, num_requests=min(1500, max(8 * c, 80)),
                        prefix=PrefixGroups(groups=100, tokens=row["isl"] - 1, assign="round_robin") if reused else None)
    res = run(Deployment(card, get_gpu("h100-sxm"), eng), spec, RunOptions(seed=0, ci=False, timeseries=False))
    s = res.summary
    return {"ttft_ms": s.ttft_s.mean * 1e3, "itl_ms": s.tpot_s.mean * 1e3, "output_tokens_per_s": s.output_tokens_per_s,
            "lock_step": float(any(n.startswith("closed loop in lock-step") for n in res.notes))}  # the run's own lock-step note


def sweeps(out_path: Path) -> None:
    data = yaml.safe_load(SWEEPS.read_text())
    srcs = {x["id"]: x for x in data["sources"]}
    rows = data["rows"]
    metrics = ("ttft_ms", "itl_ms", "output_tokens_per_s")
    print(f"{len(rows)} published concurrency-sweep rows (NIM 1.8.0; see {SWEEPS.name} for provenance)", flush=True)
    t0 = time.time()
    out = []
    for i, r in enumerate(rows):
        src = srcs[r["source"]]
        pred = {v: predict_sweep(src, r, *args) for v, args in SWEEP_VARIANTS.items()}
        err = {v: {m: p[m] / r[m] - 1 for m in metrics if r.get(m)} for v, p in pred.items()}
        out.append({"source": r["source"], "model": src["model"], "isl": r["isl"], "osl": r["osl"],
                    "concurrency": r["concurrency"], "check": r.get("check"),
                    "published": {m: r.get(m) for m in metrics}, "predicted": pred, "error": err})
        e = err["+ no-evict"]
        e2 = err["+ whole prompts"]
        print(f"[{i + 1}/{len(rows)}] {src['model']:13s} {r['isl']:>5}/{r['osl']:<5} c={r['concurrency']:<3}  "
              + "  ".join(f"{m.split('_')[0]} {r[m]:>9,.1f} {e[m]:+.0%} {e2[m]:+.0%}" for m in metrics if r.get(m)),
              flush=True)
    summary: dict = {}
    for v in SWEEP_VARIANTS:
        summary[v] = {}
        for m in metrics:
            e = np.array([o["error"][v][m] for o in out if m in o["error"][v]])
            summary[v][m] = {"mape": float(np.mean(np.abs(e))), "median_abs": float(np.median(np.abs(e))),
                             "median_signed": float(np.median(e)), "n": len(e)}
    for v in SWEEP_VARIANTS:  # where the TTFT error sits: rows whose run ended in lock-step, and the others
        splits = {"ttft_ms in lock-step": lambda o, v=v: o["predicted"][v]["lock_step"] == 1.0,
                  "ttft_ms drifted apart": lambda o, v=v: o["predicted"][v]["lock_step"] == 0.0,
                  **{f"ttft_ms {mdl}": (lambda o, mdl=mdl: o["model"] == mdl) for mdl in sorted({o["model"] for o in out})}}
        for name, keep in splits.items():
            e = np.array([o["error"][v]["ttft_ms"] for o in out if "ttft_ms" in o["error"][v] and keep(o)])
            summary[v][name] = {"mape": float(np.mean(np.abs(e))) if e.size else float("nan"),
                                "median_abs": float(np.median(np.abs(e))) if e.size else float("nan"),
                                "median_signed": float(np.median(e)) if e.size else float("nan"), "n": len(e)}
    # The two ends of a fixed-length closed loop: lock-step (fixed lengths) and drifted apart (lengths within 5%),
    # for each engine model
    for eng, (lock, drift) in ENDS.items():
        ends = [o for o in out if o["predicted"][lock]["lock_step"] == 1.0]
        lo = {id(o): min(o["predicted"][v]["ttft_ms"] for v in (lock, drift)) for o in ends}
        hi = {id(o): max(o["predicted"][v]["ttft_ms"] for v in (lock, drift)) for o in ends}
        inside = [o for o in ends if lo[id(o)] <= o["published"]["ttft_ms"] <= hi[id(o)]]
        below = [o for o in ends if o["published"]["ttft_ms"] < lo[id(o)]]
        key = "ttft between the two ends" + ("" if eng == "vLLM" else f" ({eng})")
        summary[key] = {"rows_in_lock_step": len(ends), "inside": len(inside), "below_both": len(below),
                        "above_both": len(ends) - len(inside) - len(below)}
    # two tables of 80 columns, a variant per line: MAPE (median signed error)
    cell = lambda v, m: f"{summary[v][m]['mape']:>6.1%} ({summary[v][m]['median_signed']:+.0%})"
    print(f"\nMAPE (median signed error), {len(out)} rows, {time.time() - t0:.0f} s")
    print(f"{'variant':18s}{'mean TTFT':>16s}{'mean ITL':>16s}{'output tok/s':>16s}")
    for v in SWEEP_VARIANTS:
        print(f"{v:18s}" + "".join(f"{cell(v, m):>16s}" for m in metrics))
    splits = [k for k in summary[next(iter(SWEEP_VARIANTS))] if k.startswith("ttft_ms ")]
    print(f"\nTTFT by run{'':7s}" + "".join(f"{k.removeprefix('ttft_ms ').replace('llama-', '')[:15]:>15s}"
                                       for k in splits))
    for v in SWEEP_VARIANTS:
        print(f"{v:18s}" + "".join(f"{summary[v][k]['mape']:>9.0%} n={summary[v][k]['n']:<2}" for k in splits))
    for eng in ENDS:
        b = summary["ttft between the two ends" + ("" if eng == "vLLM" else f" ({eng})")]
        print(f"{eng}: published TTFT of the {b['rows_in_lock_step']} lock-step rows: between lock-step and drifted "
              f"apart in {b['inside']}, below both in {b['below_both']}, above both in {b['above_both']}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "source": [x["url"] for x in data["sources"]], "command": "python bench/published.py --sweeps",
        "host": {"cpu": host_cpu(), "machine": platform.machine(), "processor": platform.processor() or platform.platform(),
                 "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "variants": list(SWEEP_VARIANTS),
        "summary": summary, "rows": out}, indent=1) + "\n")
    print(f"wrote {out_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8B and 70B on H100 only, 1,000 requests per row")
    ap.add_argument("--max-requests", type=int, default=3000, help="cap on requests per row")
    ap.add_argument("--sweeps", action="store_true", help="score NIM's concurrency sweeps instead")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.sweeps:
        return sweeps(a.out or OUT_SWEEPS)
    a.out = a.out or OUT
    data = yaml.safe_load(DATA.read_text())
    counts = {(d["isl"], d["osl"]): d["num_requests"] for d in data["source"]["dataset_num_requests"]}
    rows = data["rows"]
    cap = a.max_requests
    if a.quick:
        rows = [r for r in rows if r["gpu"] == "h100-sxm" and r["model"] != "llama-3.1-405b"]
        cap = min(cap, 1000)
    print(f"{len(rows)} published rows ({data['source']['url']})", flush=True)
    t0 = time.time()
    out = []
    for i, r in enumerate(rows):
        n = min(counts[(r["isl"], r["osl"])], cap)
        pred = {v: predict(r, n, c, k, b, e) for v, (c, k, b, e) in TABLE_VARIANTS.items()}
        err = {v: p / r["output_tokens_per_s"] - 1 for v, p in pred.items()}
        out.append({**{k: r[k] for k in ("model", "gpu", "tp", "dtype", "isl", "osl")}, "requests": n,
                    "published": r["output_tokens_per_s"], "predicted": pred, "error": err})
        print(f"[{i + 1}/{len(rows)}] {r['model']:15s} {r['gpu']:8s} tp{r['tp']} {r['dtype']} "
              f"{r['isl']:>5}/{r['osl']:<5} published {r['output_tokens_per_s']:>8,.0f}  "
              + "  ".join(f"{e:+.0%}" for e in err.values()), flush=True)
    summary = {}
    for v in TABLE_VARIANTS:
        e = np.array([o["error"][v] for o in out])
        summary[v] = {"mape": float(np.mean(np.abs(e))), "median_abs": float(np.median(np.abs(e))),
                      "median_signed": float(np.median(e)), "within_10pct": int((np.abs(e) <= 0.10).sum()),
                      "within_25pct": int((np.abs(e) <= 0.25).sum()), "n": len(e)}
    groups: dict[str, dict[str, float]] = {}
    for key in sorted({(o["model"], o["gpu"], o["tp"], o["dtype"]) for o in out}):
        sel = [o for o in out if (o["model"], o["gpu"], o["tp"], o["dtype"]) == key]
        groups[f"{key[0]} {key[1]} tp{key[2]} {key[3]}"] = {
            v: float(np.mean([abs(o["error"][v]) for o in sel])) for v in TABLE_VARIANTS}
    print(f"\nthroughput MAPE by group ({len(out)} rows; {time.time() - t0:.0f} s)")
    print(f"{'group':38s}" + "".join(f"{v:>14s}" for v in TABLE_VARIANTS))
    for g, m in groups.items():
        print(f"{g:38s}" + "".join(f"{m[v]:>14.1%}" for v in TABLE_VARIANTS))
    print(f"{'all: MAPE':38s}" + "".join(f"{summary[v]['mape']:>14.1%}" for v in TABLE_VARIANTS))
    print(f"{'all: median signed error':38s}" + "".join(f"{summary[v]['median_signed']:>+14.1%}" for v in TABLE_VARIANTS))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "source": data["source"]["url"], "command": "python bench/published.py" + (" --quick" if a.quick else ""),
        "host": {"cpu": host_cpu(), "machine": platform.machine(), "processor": platform.processor() or platform.platform(),
                 "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "max_requests": cap, "variants": list(TABLE_VARIANTS),
        "summary": summary, "groups": groups, "rows": out}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
