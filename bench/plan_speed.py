"""How long `capacity plan` takes: the four questions of issue 53 item 3, and how the default plan scales with
grid size and worker processes.

    python bench/plan_speed.py                 # the four questions, then the grid rows
    python bench/plan_speed.py --only questions
    python bench/plan_speed.py --only grid --out bench/results/plan_speed-grid.json

The questions run as a user runs them, each in a fresh process with the result cache off (`--no-cache --json`),
from this checkout (`PYTHONPATH` = its root, so the build is this tree's: compiled where its .so files sit next
to the sources, pure Python otherwise): the README's default plan, the README's 70B plan, a 3-GPU comparison and
a 3-engine comparison of the default question. Target (issue 53): a single plan under 5 s, a comparison under
30 s, on 2 idle cores. The machine may be shared: each row records the load average before and after it, and
the wall time is as measured (compare rows of one run, not runs on differently loaded machines); the CPU time
(the command and its pool workers) moves less with the load. Each row also
records the answer's digest (the `--json` output less its timing fields), so two runs, before and after a change,
show whether any answer moved.

The grid rows run `make_plan` in-process for the bundled Llama-3.1-8B on an H100: the default grid with 1 and
with all cores, then grids of 2x and 0.5x the max_num_seqs values.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sim_speed import host_cpu  # noqa: E402

SINGLE_S, COMPARE_S = 5, 30  # issue 53 item 3: a plan under 5 s, a GPU or engine comparison under 30 s
DEFAULT = ["--model", "models/llama-3.1-8b.yaml"]
QUESTIONS = [  # (row, `capacity plan` arguments, target): README.md's two plan commands, then two comparisons
    ("default plan (README)", DEFAULT, SINGLE_S),
    ("70B plan (README)", ["-m", "llama-3.1-70b", "-g", "h100-sxm", "--target-rate", "20", "--slo-ttft-ms", "2000",
                           "--slo-tpot-ms", "50", "--price-per-gpu-hour", "2.5"], SINGLE_S),
    ("3-GPU comparison", [*DEFAULT, "--gpu", "h100-sxm,a100-80gb,l40s"], COMPARE_S),
    ("3-engine comparison", [*DEFAULT, "--engine", "vllm,sglang,trtllm"], COMPARE_S),
]
TIMING = ("wall_s", "cache_hits")  # the fields of `plan --json` that are not the answer


def build() -> str:
    from capacity import compiled

    return "compiled (mypyc, scripts/compile.sh)" if compiled() else "pure Python"


def answer_digest(out: dict) -> str:
    """sha256 of the `--json` output without its timing fields: equal digests, the same answer figure for figure."""
    blob = json.dumps({k: v for k, v in out.items() if k not in TIMING}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def question(name: str, args: list[str], target: float) -> dict:
    cmd = [sys.executable, "-c", "from capacity.cli import main; main()", "plan", *args, "--no-cache", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its pool workers, once reaped
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if p.returncode:
        raise SystemExit(f"{name}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    out = json.loads(p.stdout)
    if "comparison" in out:
        best = out["comparison"][0]
        said = f"{best['gpus']} x {best['gpu']}" + (f" ({best['engine']})" if best.get("engine") else "")
    else:
        said = f"{out['gpus']} x {out['gpu']} (tp={out['tp']})"
    return {"run": name, "command": "capacity plan " + " ".join(args) + " --no-cache --json", "wall_s": wall, "cpu_s": cpu,
            "plan_wall_s": out["wall_s"], "simulations": out["simulations"], "answer": said,
            "answer_digest": answer_digest(out), "target_s": target, "met": wall < target,
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}


def timed(search, workers: int) -> tuple[float, int, int]:
    from capacity.model.card import load_model_card
    from capacity.plan.executors import PoolExecutor
    from capacity.plan.planner import Scenario, make_plan

    card = load_model_card(ROOT / "models/llama-3.1-8b.yaml")
    ex = PoolExecutor(workers, progress=False, cache=False)
    t0 = time.perf_counter()
    try:
        p = make_plan(Scenario(model="llama-3.1-8b", search=search), card, ex)
    finally:
        ex.close()
    return time.perf_counter() - t0, ex.misses, p.gpus


def grid_rows(cores: int) -> list[dict]:
    from capacity.plan.planner import SearchSpec

    d = SearchSpec()
    runs = [("default grid", d, cores), ("default grid", d, 1),
            ("half the max_num_seqs values", d.model_copy(update={"max_num_seqs": d.max_num_seqs[::2]}), cores),
            ("2x max_num_seqs values", d.model_copy(update={"max_num_seqs": sorted(
                set(d.max_num_seqs) | {24, 48, 96, 192, 384, 768, 1536})}), cores)]
    rows = []
    for name, search, workers in runs:
        load0 = os.getloadavg()[0]
        wall, sims, gpus = timed(search, workers)
        rows.append({"run": name, "grid_max_num_seqs": len(search.max_num_seqs), "workers": workers,
                     "wall_s": wall, "simulations": sims, "gpus": gpus, "load_before": round(load0, 2),
                     "load_after": round(os.getloadavg()[0], 2)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("questions", "grid"), help="run one part (default: both)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/plan_speed.json"))
    a = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(Console().width, 150))
    cores = os.cpu_count() or 1
    res: dict = {"cores": cores, "cpu": host_cpu(), "build": build(), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                 "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    if a.only != "grid":
        rows = [question(*q) for q in QUESTIONS]
        res["questions"] = rows
        t = Table(title=f"capacity plan, 4 questions ({res['build']}, {cores} cores, {res['cpu']}; fresh process, "
                        "cache off)", title_justify="left")
        for c in ("question", "simulations", "wall s", "CPU s", "target s", "load before/after", "answer",
                  "answer digest"):
            t.add_column(c, justify="left" if c in ("question", "answer") else "right")
        for r in rows:
            t.add_row(r["run"], str(r["simulations"]), f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}", f"< {r['target_s']}",
                      f"{r['load_before']:.1f}/{r['load_after']:.1f}", r["answer"], r["answer_digest"])
        con.print(t)
        res["met"] = all(r["met"] for r in rows)
    if a.only != "questions":
        rows = grid_rows(cores)
        res["grid"] = rows
        t = Table(title="capacity plan (llama-3.1-8b, h100-sxm, defaults, cache off), in-process", title_justify="left")
        for c in ("run", "max_num_seqs values", "workers", "simulations", "wall s", "GPUs planned", "load"):
            t.add_column(c, justify="left" if c == "run" else "right")
        for r in rows:
            t.add_row(r["run"], str(r["grid_max_num_seqs"]), str(r["workers"]), str(r["simulations"]),
                      f"{r['wall_s']:.1f}", str(r["gpus"]), f"{r['load_before']:.1f}")
        con.print(t)
        con.print(f"1 worker / {cores} workers = {rows[1]['wall_s'] / rows[0]['wall_s']:.2f}x")
    res["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(a.out)
    out.write_text(json.dumps(res, indent=1) + "\n")
    con.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
