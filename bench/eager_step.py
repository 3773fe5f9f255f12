"""One eager decoder layer and torch's dispatch costs, measured: the figures capacity's eager step assumes (issue 47).

    python bench/eager_step.py --device cuda:0 --out bench/results/eager_step-h100-sxm.json
    python bench/eager_step.py --device cpu --model tiny --quick --out /tmp/eager_step.json   # rehearsal (seconds)

capacity/cost/piecewise.py costs a layer run without a graph as vLLM's kernel-launching calls at `eager_call_s`
(from `EAGER_OP_S`, 14.37 us: calibrate/stack.py's eager layer over its 42 ops, the H200 host) plus 25 dispatches
that launch nothing (views, `torch.empty`, `nn.Module` calls) at `VIEW_S`, whose range 0-5 us is an assumption: an
eager step takes its high end (`EAGER_VIEW_S`, docs/fidelity.md "One eager step"). This script measures both:

- "dispatch": per-call CPU time of the ops vLLM's eager `LlamaDecoderLayer.forward` dispatches without a kernel
  (`.view`, `.reshape`, a slice, `split`, `unbind`, `torch.empty`, an identity `nn.Module` call) and of one small
  kernel-launching op (`add_` on the layer's batch-1 hidden state), under `torch.inference_mode` as engines run:
  `--calls` back-to-back calls timed on the host clock, `--repeats` times, median and spread ((p90 - p10) / median).
- "layer": calibrate/stack.py's `DecoderStack` (the layer bench/step_shapes.py and the calibration time; padded
  SDPA, the 42 ops of `STACK_OPS`) with `--model`'s shapes, a decode of batch 1 at `--context`, run with 1 and with
  `--layers` layers: the difference / (layers - 1) is one layer, eagerly and replayed from a CUDA graph (its
  kernels alone). bench/step_shapes.py's "decode 1 @ 1k" row (the shapes stage) times the whole 32-layer stack
  the same two ways; this is the per-layer figure and the dispatch costs beside it, at batch 1.

The JSON ends with what capacity would charge with the measured figures (`layer_eager_s` at the measured per-op
cost and view cost, vLLM's Llama count) beside what it charges now. On a CPU the numbers check the script only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))



def summarise(times: list[float]) -> dict:
    med = statistics.median(times)
    p10, p90 = (float(x) for x in np.percentile(times, [10, 90]))  # linear interpolation
    return {"median_s": med, "p10_s": p10, "p90_s": p90, "spread": (p90 - p10) / med if med > 0 else 0.0,
            "repeats": len(times)}


def dispatch_costs(torch, device: str, hidden: int, heads: int, kv_heads: int, hd: int, calls: int,
                   repeats: int) -> dict:
    """Per-call host time of the ops vLLM's eager layer dispatches (module docstring)."""
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    x = torch.zeros(1, hidden, device=device, dtype=dt)
    qkv = torch.zeros(1, (heads + 2 * kv_heads) * hd, device=device, dtype=dt)
    kv = torch.zeros(2, 4, 16, kv_heads, hd, device=device, dtype=dt)

    class Identity(torch.nn.Module):
        def forward(self, t):
            return t

    mod = Identity()
    ops = {
        "view": lambda: x.view(1, -1, 8),
        "reshape": lambda: x.reshape(-1, 8),
        "slice": lambda: x[:1],
        "split": lambda: qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1),
        "unbind": lambda: kv.unbind(0),
        "empty": lambda: torch.empty((1, hidden), dtype=dt, device=device),
        "module_call": lambda: mod(x),
        "launch_add_": lambda: x.add_(0),
    }
    out = {}
    cuda = device.startswith("cuda")
    with torch.inference_mode():
        for name, fn in ops.items():
            for _ in range(min(calls, 200)):  # warm-up
                fn()
            times = []
            for _ in range(repeats):
                if cuda:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times.append((time.perf_counter() - t0) / calls)  # host time: what the dispatch costs the CPU
            if cuda:
                torch.cuda.synchronize(device)
            out[name] = summarise(times)
            print(f"{name:<12} {out[name]['median_s'] * 1e6:8.3f} us/call (spread {out[name]['spread']:.2f})",
                  flush=True)
    return out


def layer_costs(card, device: str, layers: int, context: int, attention: str, repeats: int = 10) -> dict:
    """One layer of calibrate/stack.py at a batch-1 decode: eager and graph, from 1 and `layers` layers."""
    import torch

    from calibrate.stack import DecoderStack
    from calibrate.timing import cuda_graph, measure

    got: dict = {}
    for n in (1, layers):
        stack = DecoderStack(card.model_copy(update={"num_layers": n}), device, max_context=context + 2,
                             attention=attention)
        st = stack.prepare([], [context])
        with torch.inference_mode():
            t = measure(lambda st=st, stack=stack: stack.forward(st), device, min_time_s=0.1 if repeats >= 10 else 0.0,
                        min_repeats=repeats, warmup=min(2, repeats))
            got[f"eager_{n}"] = t.median_s if t else None
            got[f"eager_{n}_spread"] = t.spread if t else None
            if device.startswith("cuda") and stack.capturable:
                try:
                    replay = cuda_graph(lambda st=st, stack=stack: stack.forward(st), device)
                    t = measure(replay, device, min_time_s=0.1, min_repeats=repeats)
                    got[f"graph_{n}"] = t.median_s if t else None
                    got[f"graph_{n}_spread"] = t.spread if t else None
                    del replay
                except Exception as exc:
                    got["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        print(f"{n} layer(s): eager {got[f'eager_{n}'] * 1e3:.3f} ms"
              + (f", graph {got[f'graph_{n}'] * 1e3:.3f} ms" if got.get(f"graph_{n}") else ""), flush=True)
        del stack, st
    for kind in ("eager", "graph"):
        a, b = got.get(f"{kind}_1"), got.get(f"{kind}_{layers}")
        got[f"{kind}_layer_s"] = (b - a) / (layers - 1) if a and b and b > a else None
        if a and b and b <= a:  # noise larger than a layer (a loaded host): no per-layer figure, said so
            got[f"{kind}_note"] = f"{layers} layers not slower than 1 ({b:.3g} vs {a:.3g} s): no per-layer figure"
    return {"layers_timed": [1, layers], "context": context, "attention": attention, **got}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=5, help="the larger stack (>= 2); one layer = the difference")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=20000, help="back-to-back calls per dispatch timing")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="fewer calls and layers, short context (a rehearsal)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.quick:
        a.layers, a.context, a.calls, a.repeats = 2, min(a.context, 64), min(a.calls, 2000), min(a.repeats, 3)
    for field in ("layers", "context", "calls", "repeats"):
        low = 2 if field == "layers" else 1
        if getattr(a, field) < low:
            print(f"--{field}: must be >= {low}, got {getattr(a, field)}")
            return 1
    import torch

    from calibrate.stack import resolve_device
    from capacity.cost.piecewise import EAGER_OP_S, EAGER_VIEW_S, STACK_OPS, VIEW_RANGE_S, layer_eager_s
    from capacity.errors import CapacityError
    from capacity.model.card import load_model_card, resolve_model_path
    from capacity.model.gpus import match_gpu

    try:
        card = load_model_card(resolve_model_path(a.model))
        dev = resolve_device(a.device)
    except CapacityError as exc:
        print(f"--model/--device: {exc}")
        return 1
    cuda = dev.startswith("cuda")
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    gpu = match_gpu(name, torch.cuda.get_device_properties(dev).total_memory) if cuda else None
    result: dict = {"device": name, "gpu": gpu, "torch": torch.__version__, "model": card.name,
                    "dispatch": dispatch_costs(torch, dev, card.hidden_size, card.num_attention_heads,
                                               card.num_kv_heads, card.head_dim or card.hidden_size //
                                               card.num_attention_heads, a.calls, a.repeats)}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")  # the dispatch figures survive a failed layer
    result["layer"] = layer_costs(card, dev, a.layers, a.context, "sdpa", 3 if a.quick else 10)
    d, lay = result["dispatch"], result["layer"]
    nothing = [d[k]["median_s"] for k in ("view", "reshape", "slice", "split", "unbind", "empty", "module_call")]
    view_s = statistics.median(nothing)
    per_op = lay["eager_layer_s"] / STACK_OPS if lay.get("eager_layer_s") else None
    result["capacity"] = {
        "view_range_s": list(VIEW_RANGE_S), "eager_view_s": EAGER_VIEW_S, "eager_op_s": EAGER_OP_S,
        "measured_view_s": view_s, "view_within_range": VIEW_RANGE_S[0] <= view_s <= VIEW_RANGE_S[1],
        "measured_op_s": per_op,
        "layer_eager_s_now": layer_eager_s(card, 1),
        "layer_eager_s_measured": layer_eager_s(card, 1, per_op, view_s) if per_op else None,
        "note": "measured_view_s: median of the no-kernel dispatches; measured_op_s: the stack's eager layer / "
                "STACK_OPS (42); layer_eager_s_*: capacity/cost/piecewise.py layer_eager_s at tp 1 for this card, "
                "now (EAGER_OP_S, EAGER_VIEW_S) and with the measured figures",
    }
    c = result["capacity"]
    print(f"view-like dispatch {view_s * 1e6:.2f} us (capacity assumes {VIEW_RANGE_S[0] * 1e6:g}-"
          f"{VIEW_RANGE_S[1] * 1e6:g} us, an eager step {EAGER_VIEW_S * 1e6:g}); "
          + (f"eager op {per_op * 1e6:.2f} us (capacity {EAGER_OP_S * 1e6:.2f}); vLLM layer eager "
             f"{c['layer_eager_s_measured'] * 1e6:.1f} us measured-figures vs {c['layer_eager_s_now'] * 1e6:.1f} now"
             if per_op else "no per-layer eager time"), flush=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
