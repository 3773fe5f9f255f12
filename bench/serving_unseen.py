"""Score `capacity simulate` on published serving runs from sources the project had not used (issue 47).

The runs (tests/data/serving_unseen/{dev,heldout}.yaml) were collected on 2026-12-07 and split before any
prediction: a run is held out when int(sha256(source URL)) % 3 == 0, else it is a development run. The
development group is what may be looked at while working; the held-out group is scored once, at the end, by the
main engineer (`--group heldout`). No constant of the model was tuned to either.

For each run the bench builds the `capacity simulate` command a user would type from the published settings
(`simulate_args`) and runs it as its own process with `--json`:

- model: the run's `card` (a bundled card name or an HF config.json under tests/data) and `weight_dtype` where
  the checkpoint is a quantised one of the card's shapes (`kv_dtype`: the server's --kv-cache-dtype), GPU, TP, the engine release (`engine_arg`; an
  assumption where the source states none, see each run's notes);
- DP > 1: that many replicas behind a least-outstanding router (vLLM's data-parallel load balancer);
- lengths: fixed at the published input and output lengths (`vllm bench serve` / `sglang.bench_serving` random
  datasets at their default range ratios, or ratio 1); without --ignore-eos the output length is the printed
  mean (total generated tokens / requests), since EOS ended some requests early;
- arrivals as the load generator sends them: request rate inf with --max-concurrency C is a closed loop of C
  users with no think time; rate inf without a cap is an offline batch (every request at t=0); rate R is a
  Poisson process, behind the client's cap when one is given (`--max-concurrency`);
- every request is measured (`--warmup 0`: the load generators count all of them), seed 0;
- round 2 (`--set v2`, tests/data/serving_unseen_v2) adds what those sources state: `max_num_seqs` (TensorRT-LLM's
  engine batch cap), `gpu_memory_utilization`, `max_model_len`, `image_dataset`, and "LOW-HIGH" lengths where the
  load generator drew them uniformly (`--random-range-ratio`);
- round 3 (`--set v3`, tests/data/serving_unseen_v3) adds `arrival: constant` (guidellm's constant-rate profile: requests
  evenly spaced at the rate, no concurrency cap).

Scored, where printed: mean and median TTFT, TPOT and ITL, mean and median E2E latency, output tokens/s and
requests/s. MAPE per metric over the runs that print it; runs that capacity cannot express today
(`expressible: false`: images, hybrid Mamba, no model config) are counted and listed, not scored. A run whose
workload the source does not pin (`expressible: range`: a reasoning model's hidden tokens, `reasoning:` and the
two ends of `generated_len`) is simulated at both ends; the range and whether each published value lies in it are
reported, outside the MAPE.

A check of the published numbers themselves, from the card and the GPU catalogue only (no prediction): a single
request's prompt needs at least 2 x (active linear parameters) x ISL FLOPs (attention left out, so a lower bound);
a published TTFT shorter than that at the GPUs' dense bf16 peak (`cold_prefill_bound_ms`) cannot be a cold
prefill: the engine reused cached prompt blocks (vLLM V1 caches prefixes by default, and a random dataset with a
fixed seed sends the same prompts run after run). Such runs are flagged `ttft_below_peak_bound`, and the TTFT
MAPE is also given without them (`mean_ttft_ms, cold-prefill runs`).

    python bench/serving_unseen.py                   # dev group: table + bench/results/serving_unseen_dev.json
    python bench/serving_unseen.py --dry-run         # the commands only, nothing simulated
    python bench/serving_unseen.py --group heldout   # once, at the end
    python bench/serving_unseen.py --set v2          # round 2 (tests/data/serving_unseen_v2), dev group
    python bench/serving_unseen.py --set v3          # round 3 (tests/data/serving_unseen_v3), dev group
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sim_speed import host_cpu  # noqa: E402

DATA = ROOT / "tests" / "data" / "serving_unseen"
# the collections: round 1 (v1, the default), round 2 (v2: TensorRT-LLM, ShareGPT on an RTX 3090, a VLM's text sweep)
# and round 3 (v3: gpustack's performance-lab, vLLM / SGLang / trtllm-serve side by side, a hybrid model's rate sweep)
SETS = {"v1": DATA, "v2": ROOT / "tests" / "data" / "serving_unseen_v2",
        "v3": ROOT / "tests" / "data" / "serving_unseen_v3"}
OUT = ROOT / "bench" / "results"
GROUPS = ("dev", "heldout")
# published metric -> (summary field of `capacity simulate --json`, statistic, scale to the published unit)
METRICS: dict[str, tuple[str, str | None, float]] = {
    "mean_ttft_ms": ("ttft_s", "mean", 1e3), "median_ttft_ms": ("ttft_s", "p50", 1e3),
    "mean_tpot_ms": ("tpot_s", "mean", 1e3), "median_tpot_ms": ("tpot_s", "p50", 1e3),
    "mean_itl_ms": ("itl_s", "mean", 1e3), "median_itl_ms": ("itl_s", "p50", 1e3),
    "mean_e2el_ms": ("e2e_s", "mean", 1e3), "median_e2el_ms": ("e2e_s", "p50", 1e3),
    "output_throughput": ("output_tokens_per_s", None, 1.0), "request_throughput": ("requests_per_s", None, 1.0),
}


# a run's `reasoning:` keys -> `capacity simulate` flags (capacity/reasoning.py)
REASONING_FLAGS = {"share": "--reasoning-share", "content_tokens": "--reasoning-content-tokens",
                   "counted": "--reasoning-counted", "first_token": "--reasoning-ttft"}


def group_of(source: str) -> str:
    """The split rule: held out when int(sha256(source URL)) % 3 == 0."""
    return "heldout" if int(hashlib.sha256(source.encode()).hexdigest(), 16) % 3 == 0 else "dev"


def load_runs(group: str, set_: str = "v1") -> list[dict[str, Any]]:
    if group not in GROUPS:
        raise SystemExit(f"--group: dev or heldout (got {group!r})")
    if set_ not in SETS:
        raise SystemExit(f"--set: {' or '.join(SETS)} (got {set_!r})")
    return list((yaml.safe_load((SETS[set_] / f"{group}.yaml").read_text()) or {}).get("runs") or [])


def _inf(x: Any) -> bool:
    return x is None or x == "inf" or (isinstance(x, (int, float)) and math.isinf(x))


def output_len(run: dict[str, Any]) -> int | str:
    """The published output length; without --ignore-eos, the printed mean (EOS ended some requests early); a
    "LOW-HIGH" string where the load generator drew lengths uniformly (a range ratio)."""
    if not run.get("ignore_eos") and run.get("output_tokens_total"):
        return max(1, round(run["output_tokens_total"] / run["num_prompts"]))
    return _length(run["output_len"])


def _length(v: Any) -> int | str:
    return v if isinstance(v, str) else int(v)


def _mid(v: Any) -> float:
    """A length's middle (the mean of a uniform LOW-HIGH range)."""
    return sum(map(float, v.split("-"))) / 2 if isinstance(v, str) else float(v)


def simulate_args(run: dict[str, Any], end: int = 0) -> list[str]:
    """The `capacity simulate` arguments for one published run (see the module docstring); a run expressible only
    as a range (`expressible: range`) at `end` 0 or 1 of its `generated_len` (the tokens the engine generated)."""
    if not run.get("expressible"):
        raise ValueError(f"{run['id']}: not expressible ({run.get('reason')})")
    out = _length(run["generated_len"][end]) if run["expressible"] == "range" else output_len(run)
    a = ["simulate", "-m", str(run["card"]), "-g", str(run["gpu"]), "--tp", str(run["tp"]),
         "-n", str(run["num_prompts"]), "--input-len", str(_length(run["input_len"])), "--output-len", str(out),
         "--warmup", "0", "--seed", "0", "--json"]
    for key, value in (run.get("reasoning") or {}).items():  # a reasoning model as the client counts it
        a += [REASONING_FLAGS[key], str(value)]
    if run.get("engine_arg"):
        a += ["--engine", str(run["engine_arg"])]
    if run.get("weight_dtype"):  # a quantised checkpoint of a card's shapes (AWQ: int4, groups of 128)
        a += ["--weight-dtype", str(run["weight_dtype"])]
    if run.get("kv_dtype"):  # the server's --kv-cache-dtype, where the source states one
        a += ["--kv-dtype", str(run["kv_dtype"])]
    for key in ("gpu_memory_utilization", "max_model_len"):  # the server's, where the source states them
        if run.get(key):
            a += ["--" + key.replace("_", "-"), str(run[key])]
    if run.get("chunked_prefill") is not None:  # the server's chunked prefill, where the source states it
        a += ["--chunked-prefill" if run["chunked_prefill"] else "--no-chunked-prefill"]
    if run.get("max_num_seqs"):  # the server's batch cap (TensorRT-LLM: the engine's max_batch_size)
        a += ["--max-num-seqs", str(run["max_num_seqs"])]
    if run.get("image_dataset"):  # a VLM run on a benchmark dataset's images (capacity/vision_datasets.py)
        a += ["--image-dataset", str(run["image_dataset"])]
    if int(run.get("dp") or 1) > 1:
        a += ["--replicas", str(run["dp"]), "--router", "least_outstanding"]
    rate, conc = run.get("request_rate"), run.get("max_concurrency")
    if _inf(rate):
        a += ["--arrival", "closed", "--users", str(conc)] if conc else ["--arrival", "offline"]
    else:  # Poisson unless the load generator paces requests evenly (guidellm --profile constant: `arrival: constant`)
        a += ["--arrival", str(run.get("arrival") or "poisson"), "--rate", str(rate)] + (
            ["--max-concurrency", str(conc)] if conc else [])
    return a


def cold_prefill_bound_ms(run: dict[str, Any]) -> float:
    """The shortest cold prefill of one prompt at the GPUs' dense bf16 peak (2 FLOPs per active linear parameter
    per token; embeddings, the LM head and attention left out, so a lower bound), ms."""
    from capacity.model.card import load_named_card
    from capacity.model.gpus import get_gpu
    from capacity.model.weights import tensor_groups

    card = load_named_card(str(run["card"]))
    moe = card.moe
    active = sum(t.params * (moe.experts_per_token / moe.num_experts if moe and t.family == "experts" else 1)
                 for t in tensor_groups(card) if t.family in ("attention", "dense_mlp", "experts", "shared_experts"))
    return 2 * active * _mid(run["input_len"]) / (get_gpu(str(run["gpu"])).bf16_flops * int(run["tp"])) * 1e3


def command(run: dict[str, Any], end: int = 0) -> str:
    return "capacity " + shlex.join(simulate_args(run, end))


def predict(run: dict[str, Any], timeout: float = 600, end: int = 0) -> dict[str, float]:
    """Run the command as its own process (result cache off) and read the published metrics from its JSON."""
    env = dict(os.environ, CAPACITY_CACHE_DIR="off", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", "from capacity.cli import main; main()", *simulate_args(run, end)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    s = json.loads(p.stdout)["summary"]
    out = {}
    for m, (field, stat, scale) in METRICS.items():
        v = s[field] if stat is None else (s[field] or {}).get(stat)
        if v is not None:
            out[m] = float(v) * scale
    return out


def score(runs: list[dict[str, Any]], dry_run: bool = False) -> dict[str, Any]:
    rows = []
    for i, r in enumerate(runs, 1):
        row: dict[str, Any] = {"id": r["id"], "source": r["source"], "expressible": r.get("expressible") or False,
                               "published": r["metrics"]}
        if not r.get("expressible"):
            row["reason"] = r.get("reason")
            print(f"[{i}/{len(runs)}] {r['id']}: not expressible ({r.get('reason')})", flush=True)
        elif dry_run:
            row["command"] = command(r)
            print(f"[{i}/{len(runs)}] {row['command']}", flush=True)
        elif r["expressible"] == "range":  # both ends of the stated assumption; the published value in or out
            row["reason"], row["commands"] = r.get("reason"), [command(r, 0), command(r, 1)]
            try:
                ends = [predict(r, end=0), predict(r, end=1)]
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row["failed"] = str(exc)
                print(f"[{i}/{len(runs)}] {r['id']}: failed: {exc}", flush=True)
                rows.append(row)
                continue
            row["range"] = {m: sorted((ends[0][m], ends[1][m])) for m in r["metrics"] if m in ends[0] and m in ends[1]}
            row["inside"] = {m: lo <= r["metrics"][m] <= hi for m, (lo, hi) in row["range"].items()}
            print(f"[{i}/{len(runs)}] {r['id']} (range): " + ", ".join(
                f"{m} {r['metrics'][m]:,.1f} in [{lo:,.1f}, {hi:,.1f}]{'' if row['inside'][m] else ' OUT'}"
                for m, (lo, hi) in row["range"].items()), flush=True)
        else:
            row["command"] = command(r)
            try:
                pred = predict(r)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row["failed"] = str(exc)
                print(f"[{i}/{len(runs)}] {r['id']}: failed: {exc}", flush=True)
                rows.append(row)
                continue
            row["predicted"] = {m: pred[m] for m in r["metrics"] if m in pred}
            row["error"] = {m: pred[m] / v - 1 for m, v in r["metrics"].items() if v and m in pred}
            print(f"[{i}/{len(runs)}] {r['id']}: " + ", ".join(
                f"{m} {r['metrics'][m]:,.1f}->{pred[m]:,.1f} ({e:+.0%})" for m, e in row["error"].items()), flush=True)
        if r.get("expressible") is True and r["metrics"].get("mean_ttft_ms"):
            bound = cold_prefill_bound_ms(r)
            row["cold_prefill_bound_ms"] = bound
            row["ttft_below_peak_bound"] = r["metrics"]["mean_ttft_ms"] < bound
        rows.append(row)
    summary = {}
    for m in METRICS:
        e = np.array([row["error"][m] for row in rows if m in row.get("error", {})])
        if e.size:
            summary[m] = {"n": int(e.size), "mape": float(np.mean(np.abs(e))), "median_abs": float(np.median(np.abs(e))),
                          "median_signed": float(np.median(e))}
    cold = np.array([row["error"]["mean_ttft_ms"] for row in rows
                     if "mean_ttft_ms" in row.get("error", {}) and not row.get("ttft_below_peak_bound")])
    if cold.size:
        summary["mean_ttft_ms, cold-prefill runs"] = {
            "n": int(cold.size), "mape": float(np.mean(np.abs(cold))), "median_abs": float(np.median(np.abs(cold))),
            "median_signed": float(np.median(cold))}
    return {"rows": rows, "summary": summary, "runs": len(runs),
            "ttft_below_peak_bound": [row["id"] for row in rows if row.get("ttft_below_peak_bound")],
            "not_expressible": sum(not row["expressible"] for row in rows),
            "ranged": sum("range" in row for row in rows),
            "ranged_inside": {row["id"]: f"{sum(row['inside'].values())}/{len(row['inside'])}" for row in rows
                              if "range" in row},
            "scored": sum("error" in row for row in rows), "failed": sum("failed" in row for row in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", default="dev", choices=GROUPS)
    ap.add_argument("--set", default="v1", choices=tuple(SETS), dest="set_", help="which collection (v2: round 2, v3: round 3)")
    ap.add_argument("--dry-run", action="store_true", help="print each run's command; simulate nothing")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    runs = load_runs(a.group, a.set_)
    t0 = time.time()
    res = score(runs, a.dry_run)
    if a.dry_run:
        return
    print(f"\n{a.group}: {res['runs']} runs, {res['not_expressible']} not expressible, {res['scored']} scored, "
          f"{res['ranged']} as a range, {res['failed']} failed ({time.time() - t0:.0f} s)")
    if res["ttft_below_peak_bound"]:
        print("published TTFT below the cold-prefill bound at peak FLOPs (cached prompt blocks): "
              + ", ".join(res["ttft_below_peak_bound"]))
    print(f"{'metric':34s}{'n':>4s}{'MAPE':>9s}{'median |e|':>12s}{'median e':>10s}")
    for m, s in res["summary"].items():
        print(f"{m:34s}{s['n']:>4d}{s['mape']:>9.1%}{s['median_abs']:>12.1%}{s['median_signed']:>+10.1%}")
    tag = "" if a.set_ == "v1" else f"{a.set_}_"
    out = a.out or OUT / f"serving_unseen_{tag}{a.group}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": "python bench/serving_unseen.py" + ("" if a.set_ == "v1" else f" --set {a.set_}")
                   + ("" if a.group == "dev" else f" --group {a.group}"),
        "data": str((SETS[a.set_] / f"{a.group}.yaml").relative_to(ROOT)), "group": a.group, "set": a.set_,
        "host": {"cpu": host_cpu(), "machine": platform.machine(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **res}, indent=1) + "\n")
    print(f"wrote {out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
