"""How long the default plan takes, and how it scales with grid size and worker processes.

    python bench/plan_speed.py

Runs `make_plan` for the bundled Llama-3.1-8B card on an H100 (the README's main job) with the cache off:
the default grid with 1 and with all cores, then grids of 2x and 0.5x the max_num_seqs values. Target: the
default plan under 10 s on this 2-core machine (issue 20). Prints a table and writes bench/results/plan_speed.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sim_speed import host_cpu  # noqa: E402
from capacity.model.card import load_model_card  # noqa: E402
from capacity.plan.executors import PoolExecutor  # noqa: E402
from capacity.plan.planner import Scenario, SearchSpec, make_plan  # noqa: E402

TARGET_S = 10  # issue 20: the default plan in under 10 s on this 2-core machine


def build() -> str:
    from capacity import compiled

    return "compiled (mypyc, scripts/compile.sh)" if compiled() else "pure Python"


def timed(search: SearchSpec, workers: int) -> tuple[float, int, int]:
    card = load_model_card(ROOT / "models/llama-3.1-8b.yaml")
    ex = PoolExecutor(workers, progress=False, cache=False)
    t0 = time.perf_counter()
    try:
        p = make_plan(Scenario(model="llama-3.1-8b", search=search), card, ex)
    finally:
        ex.close()
    return time.perf_counter() - t0, ex.misses, p.gpus


def main() -> int:
    cores = os.cpu_count() or 1
    d = SearchSpec()
    runs = [("default grid", d, cores), ("default grid", d, 1),
            ("half the max_num_seqs values", d.model_copy(update={"max_num_seqs": d.max_num_seqs[::2]}), cores),
            ("2x max_num_seqs values", d.model_copy(update={"max_num_seqs": sorted(
                set(d.max_num_seqs) | {24, 48, 96, 192, 384, 768, 1536})}), cores)]
    rows = []
    for name, search, workers in runs:
        wall, sims, gpus = timed(search, workers)
        rows.append({"run": name, "grid_max_num_seqs": len(search.max_num_seqs), "workers": workers,
                     "wall_s": wall, "simulations": sims, "gpus": gpus})
    from rich.console import Console
    from rich.table import Table

    t = Table(title="capacity plan (llama-3.1-8b, h100-sxm, defaults, cache off)", title_justify="left")
    for c in ("run", "max_num_seqs values", "workers", "simulations", "wall s", "GPUs planned"):
        t.add_column(c, justify="left" if c == "run" else "right")
    for r in rows:
        t.add_row(r["run"], str(r["grid_max_num_seqs"]), str(r["workers"]), str(r["simulations"]), f"{r['wall_s']:.1f}",
                  str(r["gpus"]))
    con = Console()
    con.print(t)
    ok = rows[0]["wall_s"] < TARGET_S
    con.print(f"default plan on {cores} cores ({host_cpu()}): {rows[0]['wall_s']:.1f} s (target < {TARGET_S} s: "
              f"{'met' if ok else 'MISSED'}); "
              f"1 worker / {cores} workers = {rows[1]['wall_s'] / rows[0]['wall_s']:.2f}x")
    out = ROOT / "bench/results/plan_speed.json"
    out.write_text(json.dumps({"cores": cores, "cpu": host_cpu(), "build": build(), "date": time.strftime("%Y-%m-%d"),
                               "rows": rows, "target_s": TARGET_S, "met": ok}, indent=1) + "\n")
    con.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
