"""Ten named engine-step shapes: measured on the real decoder stack vs the calibrated profile vs the roofline.

    # on the GPU: measure (eager, then replayed as one CUDA graph where capture works)
    python bench/step_shapes.py measure --model llama-3.1-8b --device cuda:0 --out bench/results/step_shapes-llama-3.1-8b-h200.json
    # anywhere: compare a measurement file with a profile and the roofline of the measured GPU
    python bench/step_shapes.py report --measured bench/results/step_shapes-llama-3.1-8b-h200.json \
        --profile calibrate/profiles/llama-3.1-8b-h200.json
    # the same shapes with other kernels (--attention paged, --compile), side by side; ratios to the first file
    python bench/step_shapes.py compare bench/results/step_shapes-llama-3.1-8b-h200.json \
        bench/results/step_shapes-llama-3.1-8b-paged-h200.json
    # the same code end to end on a CPU
    python bench/step_shapes.py measure --model tiny --device cpu --out /tmp/shapes.json --small

Shapes (NEW+CACHED for a prefill chunk, DxB@C for B decodes at context C) are chosen to cover what a
serving engine runs: single-stream decode, mid and large decode batches, long-context decode, whole
prompts, a chunk with a cached prefix, and chunked-prefill mixes. The CUDA-graph column shows how much of
an eager step is CPU launch time that engines (vLLM's cudagraph capture) do not pay; the profile is
measured eagerly, so this is the size of that bias. The report prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (name, prefills [(new, cached)], decodes [(batch, context)])
SHAPES = [
    ("decode 1 @ 1k", [], [(1, 1024)]),
    ("decode 16 @ 2k", [], [(16, 2048)]),
    ("decode 64 @ 2k", [], [(64, 2048)]),
    ("decode 256 @ 1k", [], [(256, 1024)]),
    ("decode 128 @ 8k", [], [(128, 8192)]),
    ("prefill 512", [(512, 0)], []),
    ("prefill 2048", [(2048, 0)], []),
    ("prefill 8192", [(8192, 0)], []),
    ("chunk 2048 + 6144 cached", [(2048, 6144)], []),
    ("chunk 1024 + decode 128 @ 2k", [(1024, 0)], [(128, 2048)]),
]
SMALL = [(n, [(max(1, c // 32), k // 32) for c, k in p], [(max(1, b // 8), max(16, x // 32)) for b, x in d])
         for n, p, d in SHAPES]


def expand(decodes):
    return [x for b, x in decodes for _ in range(b)]


def measure_cmd(args) -> int:
    import torch

    from calibrate.stack import DecoderStack, resolve_device
    from calibrate.suite import device_info
    from calibrate.timing import cuda_graph, measure
    from capacity.model.card import load_model_card, resolve_model_path

    card = load_model_card(resolve_model_path(args.model))
    dev = resolve_device(args.device)
    shapes = SMALL if args.small else SHAPES
    max_ctx = max([c + k for _, p, _ in shapes for c, k in p] + [x + 1 for _, _, d in shapes for _, x in d])
    stack = DecoderStack(card, dev, max_context=max(max_ctx, 2), attention=args.attention)
    compile_why = None
    if args.compile:
        from calibrate.fusion import compile_layers

        compile_why = compile_layers(stack)
        print("torch.compile: " + (compile_why or "on"), flush=True)
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps({"model": card.name, "device": device_info(dev), "distinct_layers":
                                   stack.distinct_layers, "attention_kernel": stack.attn_kernel,
                                   "page": stack.page or None,
                                   "compiled": bool(args.compile and compile_why is None), "rows": rows}, indent=1) + "\n")

    with torch.inference_mode():
        for name, pf, dc in shapes:
            st = stack.prepare(pf, expand(dc))
            t = measure(lambda st=st: stack.forward(st), dev, min_time_s=0.05, min_repeats=5)
            rows.append({"shape": name, "prefills": pf, "decodes": dc,
                         "eager_s": t.median_s if t else None, "eager_spread": t.spread if t else None})
            print(f"{name:<32} eager {t.median_s * 1e3 if t else float('nan'):9.3f} ms", flush=True)
            del st
        save()
        if not stack.capturable:
            rows_note = "MoE routing reads expert counts on the host, which graph capture forbids: eager only"
            for row in rows:
                row["graph_error"] = rows_note
        elif dev.startswith("cuda") and not args.no_graphs:
            # Separate loop after the eager numbers are saved: a failed capture cannot cost them.
            for row in rows:
                st = stack.prepare(row["prefills"], expand(row["decodes"]))
                try:
                    replay = cuda_graph(lambda st=st: stack.forward(st), dev)  # the calibration suite's capture
                    t = measure(replay, dev, min_time_s=0.05, min_repeats=5)
                    row["graph_s"] = t.median_s if t else None
                    print(f"{row['shape']:<32} graph {row['graph_s'] * 1e3:9.3f} ms", flush=True)
                    del replay
                except Exception as exc:
                    row["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    print(f"{row['shape']:<32} graph capture failed: {row['graph_error']}", flush=True)
                del st
                torch.cuda.synchronize(dev)
                save()
    save()
    print(f"wrote {out}")
    return 0


def report_cmd(args) -> int:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from capacity.cost.calibrated import CalibratedCost
    from capacity.cost.profile import load_profile, to_plan
    from capacity.cost.roofline import RooflineCost
    from capacity.model.card import load_model_card, resolve_model_path
    from capacity.model.gpus import get_gpu

    m = json.loads(Path(args.measured).read_text())
    card = load_model_card(resolve_model_path(args.model or m["model"]))
    gpu_name = args.gpu or m["device"].get("gpu")
    if not gpu_name:
        raise SystemExit("the measurement has no recognised GPU; pass --gpu for the roofline")
    roof = RooflineCost(card, get_gpu(gpu_name), 1)
    prof = load_profile(args.profile) if args.profile else None
    cal = CalibratedCost(prof, card, tp=1, profile_path=args.profile) if prof else None
    # The reference is how the step was timed for the profile: graph replays for a CUDA-graph profile.
    ref_key = "graph_s" if prof is not None and prof.provenance.cuda_graphs else "eager_s"
    t = Table(title=f"{card.name} on {m['device'].get('device_name')} (attention: "
                    f"{m.get('attention_kernel') or 'sdpa'}): whole steps (ms); errors vs the "
                    f"{'CUDA graph' if ref_key == 'graph_s' else 'eager'} timing", title_justify="left")
    for c in ("shape", "measured eager", "CUDA graph", "profile", "roofline", "profile err", "roofline err"):
        t.add_column(c, justify="left" if c == "shape" else "right")
    rows = []

    def rel(x, ref):
        return x / ref - 1 if x and ref else None

    def pct(x):
        return f"{x:+.1%}" if x is not None else "-"

    def ms(x):
        return f"{x * 1e3:.3f}" if x else "-"

    for r in m["rows"]:
        plan = to_plan(r["prefills"], expand(r["decodes"]))
        ref = r.get(ref_key)
        pr = cal.step_s(plan) if cal else None
        rf = roof.step_s(plan)
        row = {**r, "reference": ref_key, "profile_s": pr, "roofline_s": rf, "profile_rel_err": rel(pr, ref),
               "roofline_rel_err": rel(rf, ref), "roofline_rel_err_vs_eager": rel(rf, r.get("eager_s")),
               "roofline_rel_err_vs_graph": rel(rf, r.get("graph_s"))}
        rows.append(row)
        t.add_row(r["shape"], ms(r.get("eager_s")), ms(r.get("graph_s")), ms(pr), ms(rf),
                  pct(row["profile_rel_err"]), pct(row["roofline_rel_err"]))
    con = Console(width=140)
    con.print(t)
    summary = {}
    for key in ("profile_rel_err", "roofline_rel_err", "roofline_rel_err_vs_eager", "roofline_rel_err_vs_graph"):
        v = [abs(r[key]) for r in rows if r[key] is not None]
        if v:
            summary[key] = {"median_abs": float(np.median(v)), "max_abs": float(np.max(v))}
            con.print(f"{key}: median |error| {summary[key]['median_abs']:.1%}, max {summary[key]['max_abs']:.1%}")
    dest = Path(args.out or str(Path(args.measured).with_suffix("")) + "-report.json")
    dest.write_text(json.dumps({"measured": args.measured, "profile": args.profile, "gpu": gpu_name,
                                "rows": rows, "summary": summary}, indent=1) + "\n")
    con.print(f"wrote {dest}")
    return 0


def label(m: dict) -> str:
    """A measurement's kernels in a few words: attention (sdpa / paged flash / paged reference), compiled."""
    kern = m.get("attention_kernel") or "sdpa"
    name = "sdpa" if kern == "sdpa" else f"paged {kern}"
    return name + (" + compile" if m.get("compiled") else "")


def compare_cmd(args) -> int:
    """The same shapes measured with different kernels (padded SDPA, paged attention, torch.compile): each file's
    step time (the CUDA graph replay where there is one, else eager) and its ratio to the first file's."""
    from rich.console import Console
    from rich.table import Table

    runs = [json.loads(Path(f).read_text()) for f in args.measured]
    names = [label(m) for m in runs]
    devices = {m["device"].get("device_name") for m in runs}
    if len(devices) > 1:
        print(f"warning: measured on different devices: {sorted(devices)}", file=sys.stderr)
    t = Table(title=f"{runs[0]['model']} on {runs[0]['device'].get('device_name')}: whole steps (ms), graph replay "
                    f"where captured; ratios to {names[0]}", title_justify="left")
    t.add_column("shape")
    for i, n in enumerate(names):
        t.add_column(n, justify="right")
        if i:
            t.add_column("ratio", justify="right")

    def best(r):
        return r.get("graph_s") or r.get("eager_s")

    rows = []
    by_shape = [{r["shape"]: r for r in m["rows"]} for m in runs]
    for r0 in runs[0]["rows"]:
        times = [best(b[r0["shape"]]) if r0["shape"] in b else None for b in by_shape]
        ratios = [times[i] / times[0] if times[i] and times[0] else None for i in range(len(times))]
        rows.append({"shape": r0["shape"], "step_s": dict(zip(names, times)), "ratio": dict(zip(names, ratios))})
        cells = [r0["shape"]]
        for i, x in enumerate(times):
            cells.append(f"{x * 1e3:.3f}" if x else "-")
            if i:
                cells.append(f"{ratios[i]:.2f}x" if ratios[i] else "-")
        t.add_row(*cells)
    Console(width=140).print(t)
    if args.out:
        Path(args.out).write_text(json.dumps({"measured": args.measured, "kernels": names, "rows": rows}, indent=1)
                                  + "\n")
        print(f"wrote {args.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--model", required=True)
    m.add_argument("--device", default="cuda:0")
    m.add_argument("--out", required=True)
    m.add_argument("--small", action="store_true", help="shapes scaled down (CPU smoke run)")
    m.add_argument("--no-graphs", action="store_true")
    m.add_argument("--compile", action="store_true", help="torch.compile each layer's halves (calibrate/fusion.py)")
    m.add_argument("--attention", default="auto", choices=["auto", "sdpa", "paged"],
                   help="paged: one FlashAttention call per layer over a paged KV pool (calibrate/paged.py)")
    c = sub.add_parser("compare", help="the same shapes measured with different kernels, side by side")
    c.add_argument("measured", nargs="+", help="step_shapes measurement files; ratios are to the first")
    c.add_argument("--out")
    r = sub.add_parser("report")
    r.add_argument("--measured", required=True)
    r.add_argument("--profile")
    r.add_argument("--model")
    r.add_argument("--gpu")
    r.add_argument("--out")
    args = ap.parse_args()
    return {"measure": measure_cmd, "compare": compare_cmd, "report": report_cmd}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
