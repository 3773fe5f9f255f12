"""Measured GEMM efficiency by GPU and dtype, from NVIDIA aiconfigurator's performance database.

    python bench/gemm_efficiency.py --aic /path/to/aiconfigurator            # a checkout (or a bare mirror)
    python bench/gemm_efficiency.py --from-csv                                # from the stored subset only

aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships GEMM latencies that NVIDIA measured with
TensorRT-LLM's own Linear layer (CUDA-graph replay, application clocks locked to their maximum, per its collector
README) for every (m, n, k) of a grid and every GEMM dtype, per GPU. This reads the TensorRT-LLM 1.3.0rc20 tables
of the H100 SXM, H200 and B200, keeps the compute-bound shapes a serving step's GEMMs have on one rank (n and k
from 4,096 to 16,384, m = 2,048, 4,096 and 8,192 tokens), and takes the median of 2 m n k / latency over the
GPU's datasheet peak for that dtype. The FP8 rows include the activations' dynamic quantisation, as a serving
engine runs it.

Writes:
- tests/data/published/aiconfigurator_gemm.csv: the rows used (with --aic), so the figures can be recomputed
  without the database (tests/test_gemm_efficiency.py does);
- capacity/data/gemm_efficiency.yaml: the medians, which the roofline reads (its GEMM efficiency for a dtype is
  never above the measured one: capacity.cost.roofline);
- bench/results/gemm_efficiency.json: the medians with their quartiles and the per-m medians;
- capacity/data/gemm_latency.json (with --aic): the measured latency of every (m, n, k) of a sub-grid (m = 1 to
  16,384 in powers of 2; n, k from 512 to 65,536), per GPU and dtype. The roofline never runs one of its dense GEMMs
  faster than the measured latency of that shape (capacity.model.compute.gemm_floor): the kernels' fixed costs at
  small shapes (FP8: the activations' quantisation, 8-10 us a GEMM) and their dip below the ridge (m = 128-512).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CSV = ROOT / "tests" / "data" / "published" / "aiconfigurator_gemm.csv"
DATA = ROOT / "capacity" / "data" / "gemm_efficiency.yaml"
OUT = ROOT / "bench" / "results" / "gemm_efficiency.json"
COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"  # the aiconfigurator snapshot read (2026-08-21)
VERSION = "1.3.0rc20"
PATH = "aic-core/src/aiconfigurator_core/systems/data/{system}/gemm/trtllm/{version}/gemm_perf.parquet"
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}  # aiconfigurator -> catalogue name
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}  # -> the roofline's names
M_USED = (2048, 4096, 8192)
NK_RANGE = (4096, 16384)
LATENCY = ROOT / "capacity" / "data" / "gemm_latency.json"
M_GRID = tuple(2 ** i for i in range(15))  # 1 .. 16384 tokens
NK_GRID = (512, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384, 51200, 65536)


def _table(aic: Path, system: str):
    import pandas as pd

    rel = PATH.format(system=system, version=VERSION)
    f = aic / rel
    if f.is_file():
        raw = f.read_bytes()
    else:  # a bare mirror: read the blob at the snapshot
        raw = subprocess.run(["git", f"--git-dir={aic}", "show", f"{COMMIT}:{rel}"], capture_output=True,
                             check=True).stdout
    return pd.read_parquet(io.BytesIO(raw))


def latency_grid(aic: Path) -> dict:
    """{gpu: {dtype: [m][n][k] latency in us (None where not measured)}} on M_GRID x NK_GRID x NK_GRID."""
    out: dict = {}
    for system, name in SYSTEMS.items():
        d = _table(aic, system)
        for dt, ours in DTYPES.items():
            x = d[(d.gemm_dtype == dt) & d.m.isin(M_GRID) & d.n.isin(NK_GRID) & d.k.isin(NK_GRID)]
            if x.empty:
                continue
            at = {(int(r.m), int(r.n), int(r.k)): float(r.latency) * 1e3 for r in x.itertuples()}
            out.setdefault(name, {})[ours] = [[[None if (m, n, k) not in at else float(f"{at[m, n, k]:.4g}")
                                                for k in NK_GRID] for n in NK_GRID] for m in M_GRID]
    return out


def read_database(aic: Path) -> list[dict]:
    """The rows used, from the parquet tables of a checkout or a bare git mirror of aiconfigurator."""
    rows = []
    for system in SYSTEMS:
        d = _table(aic, system)
        keep = d[d.gemm_dtype.isin(list(DTYPES)) & d.m.isin(M_USED) & d.n.between(*NK_RANGE) & d.k.between(*NK_RANGE)]
        for r in keep.itertuples():
            rows.append({"system": system, "device": r.device, "gemm_dtype": r.gemm_dtype, "m": int(r.m),
                         "n": int(r.n), "k": int(r.k), "latency_ms": float(r.latency)})
    return rows


def efficiencies(rows: list[dict]) -> dict:
    """Median (and quartiles) of achieved / datasheet FLOP/s, by catalogue GPU and roofline dtype."""
    from capacity.model.gpus import get_gpu

    out: dict = {}
    for system, name in SYSTEMS.items():
        gpu = get_gpu(name)
        for dt, ours in DTYPES.items():
            sel = [r for r in rows if r["system"] == system and r["gemm_dtype"] == dt]
            if not sel:
                continue
            peak = gpu.peak_flops("fp8" if ours == "fp8_block" else ours)
            eff = np.array([2 * r["m"] * r["n"] * r["k"] / (r["latency_ms"] * 1e-3) / peak for r in sel])
            by_m = {m: float(np.median([e for e, r in zip(eff, sel) if r["m"] == m])) for m in M_USED}
            out.setdefault(name, {})[ours] = {"median": float(np.median(eff)), "q1": float(np.percentile(eff, 25)),
                                              "q3": float(np.percentile(eff, 75)), "n": len(sel), "by_m": by_m}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--aic", type=Path, help="an aiconfigurator checkout or bare git mirror")
    src.add_argument("--from-csv", action="store_true", help="recompute from the stored subset")
    args = ap.parse_args()
    if args.aic:
        rows = read_database(args.aic)
        CSV.parent.mkdir(parents=True, exist_ok=True)
        with CSV.open("w", newline="") as fh:
            fh.write(f"# aiconfigurator {COMMIT}, {PATH.format(system='<system>', version=VERSION)}; Apache-2.0 "
                     "(github.com/ai-dynamo/aiconfigurator); rows with m in 2048/4096/8192 and n, k in 4096..16384\n")
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        grid = latency_grid(args.aic)
        LATENCY.write_text(json.dumps({
            "source": f"NVIDIA aiconfigurator (github.com/ai-dynamo/aiconfigurator@{COMMIT}, Apache-2.0), "
                      f"TensorRT-LLM {VERSION} GEMM tables (torch flow, CUDA-graph replay, clocks locked to maximum)",
            "written_by": "python bench/gemm_efficiency.py --aic PATH", "unit": "us", "layout": "[m][n][k]",
            "m": list(M_GRID), "nk": list(NK_GRID), "gpus": grid}, separators=(",", ":")) + "\n")
        print(f"wrote {LATENCY.relative_to(ROOT)}: " + ", ".join(f"{g} {'/'.join(by)}" for g, by in grid.items()))
    else:
        with CSV.open() as fh:
            rows = [{**r, "m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]), "latency_ms": float(r["latency_ms"])}
                    for r in csv.DictReader(line for line in fh if not line.startswith("#"))]
    eff = efficiencies(rows)
    print(f"GEMM efficiency (achieved / datasheet), TensorRT-LLM {VERSION} kernels at locked max clocks;\n"
          f"median over n, k in 4096..16384 and m in 2048/4096/8192 ({len(rows)} rows)")
    print(f"{'GPU':10s}{'dtype':11s}{'median':>8s}{'q1-q3':>12s}" + "".join(f"{'m=' + str(m):>9s}" for m in M_USED))
    for gpu, by in eff.items():
        for dt, e in by.items():
            print(f"{gpu:10s}{dt:11s}{e['median']:>8.2f}{e['q1']:>7.2f}-{e['q3']:.2f}"
                  + "".join(f"{e['by_m'][m]:>9.2f}" for m in M_USED))
    lines = ["# Measured GEMM efficiency (achieved / datasheet FLOP/s) by GPU and GEMM dtype: medians of NVIDIA",
             f"# aiconfigurator's TensorRT-LLM {VERSION} GEMM tables (commit {COMMIT[:12]}, Apache-2.0) over the",
             "# compute-bound shapes of a serving step (n, k 4096..16384; m 2048/4096/8192), at clocks locked to their",
             "# maximum. Written by `python bench/gemm_efficiency.py`; the roofline never runs a GEMM dtype faster.",
             "# A GPU not listed takes its architecture's (`architectures`); a dtype not listed, the roofline's default.",
             "gpus:"]
    for gpu, by in eff.items():
        lines.append(f"  {gpu}:")
        lines += [f"    {dt}: {round(e['median'], 2)}" for dt, e in by.items()]
    lines += ["architectures:  # the arch field's first word -> the measured GPU of that architecture",
              "  Hopper: h100-sxm", "  Blackwell: b200"]
    DATA.write_text("\n".join(lines) + "\n")
    OUT.write_text(json.dumps({"source": f"github.com/ai-dynamo/aiconfigurator@{COMMIT}", "version": VERSION,
                               "command": "python bench/gemm_efficiency.py --aic PATH", "rows": len(rows),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "efficiency": eff},
                              indent=1) + "\n")
    print(f"wrote {DATA.relative_to(ROOT)}, {OUT.relative_to(ROOT)}" + (f", {CSV.relative_to(ROOT)}" if args.aic else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
