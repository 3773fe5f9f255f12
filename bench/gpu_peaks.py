"""Achievable ceilings of this device, next to its datasheet: a large bf16 matrix product and a large copy.

    python bench/gpu_peaks.py --device cuda:0 --out bench/results/gpu_peaks-h200.json
    python bench/gpu_peaks.py --device cpu --size 1024 --copy-mib 64      # the same code on a CPU

The calibration tables say how fast the model's own kernels ran; this says how fast the device can go at
all, so the report can give both "fraction of datasheet" and "fraction of what is achievable". The matrix
product is n x n x n in bf16 on random data (n = 8192 on a GPU); the copy moves a buffer device-to-device
and counts bytes read plus bytes written. Both are timed with `calibrate.timing.measure` (CUDA events on a
GPU), median of the repeats.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--size", type=int, default=8192, help="n of the n x n x n bf16 matrix product")
    ap.add_argument("--copy-mib", type=int, default=4096, help="MiB copied device-to-device")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from calibrate.stack import resolve_device
    from calibrate.suite import device_info
    from calibrate.timing import measure
    from capacity.model.gpus import get_gpu

    dev = resolve_device(args.device)
    info = device_info(dev)
    n = args.size
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    t_mm = measure(lambda a=a, b=b: a @ b, dev, warmup=3, min_repeats=10, min_time_s=0.2)
    flops = 2.0 * n ** 3 / t_mm.median_s
    del a, b
    elems = args.copy_mib * 2**20 // 2
    src = torch.empty(elems, device=dev, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t_cp = measure(lambda: dst.copy_(src), dev, warmup=3, min_repeats=10, min_time_s=0.2)
    bw = 2.0 * src.numel() * src.element_size() / t_cp.median_s
    out = {"provenance": info, "matmul_n": n, "matmul_s": t_mm.median_s, "bf16_flops": flops,
           "copy_bytes_moved": 2 * src.numel() * src.element_size(), "copy_s": t_cp.median_s, "copy_bytes_per_s": bw}
    gpu = info.get("gpu")
    if gpu:
        g = get_gpu(gpu)
        out["gpu"] = gpu
        out["datasheet"] = {"bf16_flops": g.bf16_flops, "mem_bw_bytes_per_s": g.mem_bw_bytes_per_s}
        out["fraction_of_datasheet"] = {"bf16_flops": flops / g.bf16_flops, "mem_bw": bw / g.mem_bw_bytes_per_s}
    print(f"{info['device_name']}: bf16 {n}^3 matmul {flops / 1e12:.1f} TFLOP/s; copy {bw / 1e12:.3f} TB/s"
          + (f" ({out['fraction_of_datasheet']['bf16_flops']:.0%} and {out['fraction_of_datasheet']['mem_bw']:.0%} "
             f"of the {gpu} datasheet)" if gpu else ""))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
