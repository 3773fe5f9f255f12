"""What vLLM's async scheduling changes in scheduling steps, measured on vLLM's own scheduler.

    python bench/vllm_async_effect.py

Reads the traces of `bench/vllm_scheduler_trace.py --async`: the same requests through vLLM 0.32's Scheduler
(synchronous: tests/data/vllm_scheduler/*.json) and AsyncScheduler driven as EngineCore's two-batch queue does
(tests/data/vllm_scheduler/async/*.json). Per trace: batches, preemptions, and per request the steps from arrival
to first token (the step whose chunk completes the prompt; not for prefix-cached traces, where hits skip prompt
tokens) and to finish, as mean and P99. Ratios within one trace: a step is one batch. Prints a table and writes
bench/results/vllm_async_effect.json. Needs no vLLM.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests/data/vllm_scheduler"


def per_request(trace: dict) -> tuple[dict, dict, dict]:
    req = {r["id"]: r for r in trace["requests"]}
    first: dict[int, int] = {}
    done: dict[int, int] = {}
    computed: dict[int, int] = {}
    for st in trace["steps"]:
        for rid, n in st["scheduled"]:
            computed[rid] = computed.get(rid, 0) + n
            if rid not in first and computed[rid] >= req[rid]["prompt"]:
                first[rid] = st["step"]
        for f in st["finished"]:
            done[f] = st["step"]
    return first, done, req


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    rows = []
    for path in sorted((DATA / "async").glob("*.json")):
        a = json.loads(path.read_text())
        s = json.loads((DATA / path.name).read_text())
        fa, da, req = per_request(a)
        fs, ds, _ = per_request(s)
        ids = sorted(req)
        prefix = bool(a["engine"].get("prefix_caching"))
        row = {"trace": path.stem, "batches_async": len(a["steps"]), "batches_sync": len(s["steps"]),
               "preemptions_async": sum(len(x["preempted"]) for x in a["steps"]),
               "preemptions_sync": sum(len(x["preempted"]) for x in s["steps"])}
        for name, fx, fy in (("first_token", fa, fs), ("finish", da, ds)):
            if name == "first_token" and prefix:
                continue
            x = np.array([fx[i] - req[i]["step"] for i in ids], dtype=float)
            y = np.array([fy[i] - req[i]["step"] for i in ids], dtype=float)
            row[f"{name}_mean_ratio"] = float(x.mean() / y.mean())
            row[f"{name}_p99_ratio"] = float(np.percentile(x, 99) / np.percentile(y, 99))
        rows.append(row)
    t = Table(title="vLLM 0.32, async vs sync scheduling: steps on the same requests (ratio > 1: async slower)")
    for c in ("trace", "batches", "preempt.", "first token mean", "finish mean", "finish P99"):
        t.add_column(c, justify="left" if c == "trace" else "right")
    for r in rows:
        ft = f"{r['first_token_mean_ratio']:.3f}" if "first_token_mean_ratio" in r else "-"
        t.add_row(r["trace"], f"{r['batches_async']}/{r['batches_sync']}",
                  f"{r['preemptions_async']}/{r['preemptions_sync']}", ft, f"{r['finish_mean_ratio']:.3f}",
                  f"{r['finish_p99_ratio']:.3f}")
    Console(width=100).print(t)
    out = ROOT / "bench/results/vllm_async_effect.json"
    out.write_text(json.dumps({"vllm": "0.32.0", "rows": rows}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
