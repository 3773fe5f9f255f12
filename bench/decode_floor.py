"""Decode at small batch (issue 47): what each candidate mechanism adds to capacity's batch-1 decode step, case by
case, from vLLM's code rules and the project's own H200 measurements. (b), (c) and (e) are in the step cost now
(capacity/cost/kernels.py, capacity/cost/piecewise.py): the table shows capacity's step before them (their switches
off) and each as the cost code charges it; (a) and (d) stay analyses. It prints the table in docs/fidelity.md
("Decode at small batch").

    python bench/decode_floor.py            # the table (about 2 s)
    python bench/decode_floor.py --json     # the same as JSON

The two measured figures it uses are read from files this repository keeps (no constant is fitted to a serving run):

- T_SMALL: one small kernel inside a replayed CUDA graph on an H200. calibrate/profiles/llama-3.1-8b-h200.json,
  linear.elementwise at 1 token (timed as a graph replay), over the 32 kernels `Layer.elementwise` launches
  (calibrate/stack.py: two unfused RMSNorms of 9 kernels each, rope on q and on k of 5 each, two adds, SiLU and
  the multiply).
- T_EAGER: one eagerly dispatched PyTorch op on the same H200 host (CPU-bound at batch 1).
  bench/results/step_shapes-llama-3.1-8b-h200.json, "decode 1 @ 1k" eager, over the step's ops: 32 layers x 42
  kernel-launching ops (pre: RMSNorm 9 + qkv 1 + rope 10; decode attention: arange, two index_put, SDPA about 3;
  post: o 1, add 1, RMSNorm 9, gate_up 1, SiLU 1, mul 1, down 1, add 1), the LM head's few ignored.

Kernel lists per layer are counted from vLLM's model and kernel code (docs/fidelity.md names each file).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.cli.common import load_card  # noqa: E402
from capacity.cost.kernels import attention_kernels, mlp_kernels  # noqa: E402
from capacity.cost.piecewise import VIEW_RANGE_S, VIEW_S, PiecewiseGraphCost, layer_dispatch_s  # noqa: E402
from capacity.cost.roofline import RooflineCost  # noqa: E402
from capacity.cost.roofline_params import RooflineParams  # noqa: E402
from capacity.cost.step import StepPlan  # noqa: E402
from capacity.model.gpus import get_gpu  # noqa: E402

ELEMENTWISE_KERNELS = 32  # calibrate/stack.py Layer.elementwise, counted (module docstring)
EAGER_OPS_PER_LAYER = 42  # calibrate/stack.py decode step, counted (module docstring)
# (its 12 view/slice ops a layer and the view-cost range: capacity/cost/piecewise.py, STACK_VIEWS, VIEW_RANGE_S)

# Kernels of one decoder layer in a batch-1 decode step, from vLLM's code. "eager" marks the ops that vLLM < 0.11
# runs outside the CUDA graph (CompilationConfig.set_splitting_ops_for_v1: the attention custom ops split the
# graph into pieces and run eagerly; 0.11 made FULL_AND_PIECEWISE the default: a decode-only step replays one
# full graph, attention included).
DSV3_LAYER = {  # vllm 0.9: models/deepseek_v2.py DeepseekV2MLAAttention / DeepseekV2MoE, AWQ -> awq_marlin
    "graph": ["fused_add_rms_norm", "q_a_proj", "kv_a_proj_with_mqa", "q_a_layernorm", "kv_a_layernorm", "q_b_proj",
              "rotary_emb", "o_proj", "all_reduce", "fused_add_rms_norm", "gate", "grouped_topk x4",
              "moe_align_block_size", "marlin_moe w13", "silu_and_mul", "marlin_moe w2", "moe_sum",
              "shared gate_up", "silu_and_mul", "shared down", "add", "all_reduce"],
    # v1/attention/backends/mla/common.py MLACommonImpl.forward + flashmla.py _forward_decode / _v_up_proj
    "eager": ["concat_and_cache_mla", "bmm W_UK_T", "cat(q_nope, q_pe)", "flash_mla_with_kvcache", "combine",
              "bmm W_UV", "reshape copy", "copy to output"],
    # Python calls that launch them (the combine comes with flash_mla's call) and the view/slice ops around them:
    # forward's 8 slices of output/q/k_c_normed/k_pe, k_pe.squeeze, slot_mapping.flatten, split, 2 transposes,
    # output[:n]; _forward_decode's 2 unsqueezes; _v_up_proj's view and 2 transposes
    "eager_calls": 7, "eager_views": 19,
}
QWEN3_DENSE_LAYER = {  # vllm 0.11: models/qwen3.py, FlashAttention backend, full decode graph
    "graph": ["fused_add_rms_norm", "qkv_proj", "q_norm", "k_norm", "rotary_emb", "reshape_and_cache_flash",
              "flash_attn decode", "o_proj", "fused_add_rms_norm", "gate_up", "silu_and_mul", "down"],
    "eager": ["reshape_and_cache_flash", "flash_attn decode"],  # the attention op, were the graph piecewise
    # FlashAttentionImpl.forward: kv_cache.unbind, query[:n], output[:n]
    "eager_calls": 2, "eager_views": 3,
}
QWEN3_MOE_LAYER = {  # models/qwen3_moe.py: FusedMoE with topk_softmax, the Triton fused_moe kernel
    "graph": ["fused_add_rms_norm", "qkv_proj", "q_norm", "k_norm", "rotary_emb", "reshape_and_cache_flash",
              "flash_attn decode", "o_proj", "fused_add_rms_norm", "gate", "topk_softmax", "moe_align_block_size",
              "fused_moe w13", "silu_and_mul", "fused_moe w2", "moe_sum"],
    "eager": ["reshape_and_cache_flash", "flash_attn decode"],
    "eager_calls": 2, "eager_views": 3,
}

# (label, model, weight dtype, gpu, tp, kv dtype, engine, piecewise graphs, kernels, published TPOT ms, its source)
CASES = [
    ("DeepSeek-R1-0528-AWQ, 8 x H100, vLLM 0.9", "deepseek-v3", "int4", "h100-sxm", 8, None, "vllm@0.9", True,
     DSV3_LAYER, (16.1, 16.4), "dev: tt-inference-server issue 356"),
    ("Qwen3-4B, RTX 4090, vLLM 0.11", "tests/data/hf/qwen3-4b.json", None, "rtx-4090", 1, None, "vllm@0.11", False,
     QWEN3_DENSE_LAYER, (10.3, 10.9), "dev: tt-inference-server issue 394"),
    ("Qwen3-30B-A3B, A100, full decode graph", "tests/data/hf/qwen3-30b-a3b.json", None, "a100-80gb", 1, None,
     "vllm@0.11", False, QWEN3_MOE_LAYER, None, "issue 47: about -29% at 1 user"),
    ("Qwen3-30B-A3B, A100, piecewise graphs", "tests/data/hf/qwen3-30b-a3b.json", None, "a100-80gb", 1, None,
     "vllm@0.10", True, QWEN3_MOE_LAYER, None, "issue 47: about -29% at 1 user"),
]
CONTEXT = 1100  # keys per sequence: a 1,024-token prompt part-way through its output
AR_LATENCY_RANGE_S = (8e-6, 20e-6)  # one-shot custom all-reduce of a few KiB on 8 NVLink GPUs (a range, assumed)


def measured_figures() -> tuple[float, float]:
    """(T_SMALL, T_EAGER): T_EAGER is the eager step per kernel-launching op, the views' time folded in."""
    prof = json.loads((ROOT / "calibrate/profiles/llama-3.1-8b-h200.json").read_text())
    assert prof["tokens"][0] == 1 and "graph" in " ".join(prof["provenance"]["notes"]).lower()
    t_small = prof["linear"]["elementwise"][0] / ELEMENTWISE_KERNELS
    shapes = json.loads((ROOT / "bench/results/step_shapes-llama-3.1-8b-h200.json").read_text())
    row = next(r for r in shapes["rows"] if r["shape"] == "decode 1 @ 1k")
    t_eager = row["eager_s"] / (shapes["distinct_layers"] * EAGER_OPS_PER_LAYER)
    return t_small, t_eager


def count(names: list[str]) -> int:
    """Kernels in a list of names, "name xN" counting N (grouped_topk's torch ops, fused by Inductor into about 4)."""
    return sum(int(n.rsplit(" x", 1)[1]) if " x" in n else 1 for n in names)


def gpu_name(g: str) -> str:
    from capacity.model.gpus import get_gpu

    try:
        return get_gpu(g).name
    except Exception:
        return g


def _cost(card, g: str, tp: int, kv, kernels: bool, allreduce: bool) -> RooflineCost:
    p = RooflineParams(kernel_count_floor=kernels, allreduce_algorithms=allreduce)
    return RooflineCost(card, get_gpu(g), tp, kv_dtype=kv, params=p)


def analyse(t_small: float, t_eager: float) -> list[dict]:
    """Per case: capacity's batch-1 decode step before the terms (b), (c), (e) went into the cost (their switches
    off), each term as the cost code now charges it, and (a), (d), which stay analyses (nothing to add)."""
    out = []
    for label, model, wd, g, tp, kv, engine, piecewise, _kernels, published, source in CASES:
        card = load_card(model, wd)
        plan = StepPlan(decode_contexts=(CONTEXT,))
        base = _cost(card, g, tp, kv, False, False)
        with_b = _cost(card, g, tp, kv, True, False)
        now = _cost(card, g, tp, kv, True, True)
        p = base.params
        bd = base.breakdown(plan)
        L = card.num_layers
        moe = card.moe is not None
        # ops the roofline charges kernel_launch_s for, per layer: attention GEMMs, attention, two norms, and the
        # MLP (dense: 1; MoE: experts, router, shared experts if any)
        roof_ops = 4 + (1 if not moe else 2 + (1 if card.moe.shared_intermediate else 0))
        n_kernels = attention_kernels(card) + mlp_kernels(card, moe)
        # (a) padding of each active expert's rows to BLOCK_SIZE_M: FLOPs only; bytes are the k experts' weights,
        # which the roofline already reads (touched = e(1 - (1 - k/e)^1) = k)
        a_extra = 0.0
        a_note = "dense"
        if moe:
            k = card.moe.experts_per_token
            block_m = 8 if wd == "int4" else 16  # fused_marlin_moe's smallest block_size_m; Triton M <= E: 16
            exp_w = base._expert_w
            elems = base._elems(exp_w, "experts")
            flops_s = 2.0 * k * block_m * elems / (base._fam_peak["experts"] * base._fam_eff["experts"])
            bytes_s = k * exp_w / (base.gpu.mem_bw_bytes_per_s * p.mem_bw_eff)
            a_extra = L * max(0.0, flops_s - bytes_s)
            a_note = f"padded FLOPs {flops_s * 1e6:.1f} us vs bytes {bytes_s * 1e6:.1f} us a layer"
        before = base.step_s(plan)
        b_extra = with_b.step_s(plan) - before
        c_extra = now.step_s(plan) - with_b.step_s(plan)
        c_hi = 2 * L * (AR_LATENCY_RANGE_S[1] - p.allreduce_latency_s) if tp > 1 else 0.0  # top of the range
        # (d) the logits gather over TP (one collective) and about 8 sampler kernels, beyond the roofline's sampler
        d_extra = (p.allreduce_latency_s if tp > 1 else 0.0) + 8 * t_small
        gpu_s = now.step_s(plan) - p.step_overhead_s
        after = now.step_s(plan)
        e = {}
        for name, view_s in (("lo", VIEW_RANGE_S[0]), ("mid", VIEW_S), ("hi", VIEW_RANGE_S[1])):
            cpu = card.num_kv_layers * layer_dispatch_s(card, t_eager, view_s)
            w = PiecewiseGraphCost(now, cpu, p.step_overhead_s, piecewise)
            e[name] = (cpu, w.step_s(plan) - after)
        row = {"case": label, "engine": engine, "gpu": gpu_name(g), "tp": tp, "layers": L,
               "published_tpot_ms": published, "source": source, "before_ms": before * 1e3,
               "roofline_gpu_ms": (before - p.step_overhead_s) * 1e3, "overhead_ms": bd["overhead"] * 1e3,
               "kernels_per_layer": n_kernels, "roofline_ops_per_layer": roof_ops,
               "a_moe_padding_ms": a_extra * 1e3, "a_note": a_note, "b_kernel_floors_ms": b_extra * 1e3,
               "c_allreduce_ms": c_extra * 1e3, "c_allreduce_top_of_range_ms": c_hi * 1e3,
               "d_logits_sampler_ms": d_extra * 1e3,
               "e_piecewise_cpu_ms": tuple(e[k][0] * 1e3 for k in ("lo", "mid", "hi")),
               "e_piecewise_extra_ms": tuple(e[k][1] * 1e3 for k in ("lo", "mid", "hi")),
               "gpu_with_floors_ms": gpu_s * 1e3}
        row["now_ms"] = (after + e["mid"][1]) * 1e3  # what capacity charges now (the views at the middle)
        row["now_range_ms"] = ((after + e["lo"][1]) * 1e3, (after + e["hi"][1]) * 1e3)
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t_small, t_eager = measured_figures()
    rows = analyse(t_small, t_eager)
    if args.json:
        print(json.dumps({"t_small_us": t_small * 1e6, "t_eager_us": t_eager * 1e6, "rows": rows}, indent=1))
        return 0
    print(f"T_SMALL {t_small * 1e6:.2f} us (H200 graph replay), T_EAGER {t_eager * 1e6:.1f} us (H200 host, eager)")
    for r in rows:
        pub = "-" if r["published_tpot_ms"] is None else "{:.1f}-{:.1f}".format(*r["published_tpot_ms"])
        print(f"\n{r['case']} ({r['source']}): published TPOT {pub} ms, capacity before {r['before_ms']:.2f} ms "
              f"(GPU terms {r['roofline_gpu_ms']:.2f} + overhead {r['overhead_ms']:.2f}), now {r['now_ms']:.2f} ms "
              "({:.2f}-{:.2f} over the view-cost range)".format(*r["now_range_ms"]))
        print(f"  (a) MoE padding to BLOCK_SIZE_M   {r['a_moe_padding_ms']:+.2f} ms  ({r['a_note']}; not in the cost)")
        print(f"  (b) kernel floors {r['kernels_per_layer']} kernels vs {r['roofline_ops_per_layer']} ops a layer"
              f"  {r['b_kernel_floors_ms']:+.2f} ms  (in the cost)")
        print(f"  (c) all-reduce algorithm          {r['c_allreduce_ms']:+.2f} ms  (in the cost; a 20 us one-shot: "
              f"{r['c_allreduce_top_of_range_ms']:+.2f})")
        print(f"  (d) logits gather + sampler       {r['d_logits_sampler_ms']:+.2f} ms  (not in the cost)")
        e, cpu = r["e_piecewise_extra_ms"], r["e_piecewise_cpu_ms"]
        print(f"  (e) piecewise graphs, eager attn  {e[1]:+.2f} ms ({e[0]:+.2f} to {e[2]:+.2f})  (CPU {cpu[1]:.2f} "
              f"({cpu[0]:.2f}-{cpu[2]:.2f}) ms for the layers against {r['gpu_with_floors_ms']:.2f} ms of GPU; "
              "in the cost)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
