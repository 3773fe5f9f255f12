"""Measured MoE expert latencies by GPU, engine and dtype, from NVIDIA aiconfigurator's performance database.

    python bench/moe_latency.py --aic /path/to/aiconfigurator       # a checkout or a bare git mirror

aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU and engine release, the latency
of one MoE layer's routed experts (the fused/grouped expert GEMMs with their activation, top-k gather and sum:
`collector/{vllm,sglang,trtllm}/collect_moe.py`) for a grid of shapes and 27 token counts (1 .. 16,384), in
`systems/data/<gpu>/moe/<engine>/<version>/moe_perf.parquet`. Columns (its loader,
aic-core/rust/aiconfigurator-core/src/perf_database/moe.rs `load_moe_parquet`): moe_dtype, num_tokens,
hidden_size, inter_size (the expert's full intermediate width), topk, num_experts, moe_tp_size (the intermediate
is split over these ranks), moe_ep_size, distribution (token routing: balanced or power-law), latency (ms),
kernel_source. This keeps:

- expert parallelism 1 (capacity models tensor parallelism: every rank holds every expert's slice);
- the `balanced` routing (every expert gets its share: random-weight and real routers are near it; the
  power-law rows are slower, so the balanced one is the floor);
- per (GPU, engine, dtype, gated, topk, experts, hidden, intermediate per rank) and token count, the fastest row
  over the engine's releases (RELEASES: kernels and their tuned configs change from one release to the next, by up
  to 2x; the fastest is a kernel the engine ran), its kernel sources, duplicate rows and the (inter, tp) pairs of
  the same per-rank width: a lower bound on what that shape costs in that engine on that GPU.

Writes capacity/data/moe_latency.json: {"gpus": {gpu: {engine: {dtype: {"releases", "sources", "shapes":
[[topk, experts, hidden, inter_per_rank, gated]], "us": [[latency at each of "tokens"]]}}}}}, which
capacity/cost/moe_floor.py reads (the roofline's routed experts are never faster than it).
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "capacity" / "data" / "moe_latency.json"
COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"  # the aiconfigurator snapshot read (2026-08-21, as gemm_latency)
PATH = "aic-core/src/aiconfigurator_core/systems/data/{system}/moe/{engine}/{version}/moe_perf.parquet"
# the datacenter parts (another GPU of the same architecture that is no faster takes the closest faster one's table)
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
# per engine, every release measured on some GPU: a shape's floor is the fastest of them (a kernel the engine ran)
RELEASES = {"vllm": ("0.14.0", "0.18.0", "0.19.0", "0.22.0", "0.24.0"), "sglang": ("0.5.6.post2", "0.5.9", "0.5.10", "0.5.14"),
            "trtllm": ("1.2.0rc5", "1.3.0rc10", "1.3.0rc20")}
# SGLang runs gpt-oss's MXFP4 experts on OpenAI's triton_kernels off Blackwell (server_args.py
# `_handle_model_specific_adjustments`, GptOssForCausalLM: moe_runner_backend "triton_kernel" at ep_size 1), not the
# kernels aiconfigurator measured for w4a16_mxfp4 there (`sglang_fused_moe_triton`, Marlin): SGLang's w4a16_mxfp4
# rows off Blackwell are left out, and capacity/cost/moe_floor.py takes vLLM's table (whose rows include that
# triton_kernels path: `vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic`) instead
SKIP = {("sglang", "w4a16_mxfp4")}
BLACKWELL = {"b200_sxm"}
# aiconfigurator moe_dtype -> capacity's expert dtype name
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "int4", "w4a16_mxfp4": "mxfp4",
          "nvfp4": "fp4"}
# kernels aiconfigurator files under another quant (perf_database/moe.rs `moe_kernel_quant_rewrite`) or another
# table (`moe_torch_flow_min_latency`: TensorRT-LLM's NVFP4 low-latency twin, used <= 128 tokens: kept, it is
# measured and faster, so it lowers the floor where it runs)
OTHER_QUANT = {("w4a16_mxfp4", "sglang_flashinfer_cutlass_moe"), ("w4a8_mxfp4_mxfp8", "sglang_mxfp4_flashinfer_trtllm_moe")}
TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
          6144, 8192, 12288, 16384)


def _read(aic: Path, rel: str):
    import pandas as pd

    f = aic / rel
    if f.is_file():
        raw = f.read_bytes()
    else:  # a bare mirror: the blob at the snapshot
        got = subprocess.run(["git", f"--git-dir={aic}", "show", f"{COMMIT}:{rel}"], capture_output=True)
        if got.returncode:
            return None
        raw = got.stdout
    return pd.read_parquet(io.BytesIO(raw))


def add(best: dict, d, dtype: str, engine: str, system: str) -> int:
    """Fold one moe_dtype of one parquet into best {shape: {tokens: fastest us}} (module docstring): rows used."""
    if (engine, dtype) in SKIP and system not in BLACKWELL:
        return 0
    x = d[(d.moe_dtype == dtype) & (d.moe_ep_size == 1) & (d.distribution == "balanced") & d.num_tokens.isin(TOKENS)]
    used = 0
    for r in x.itertuples():
        if (dtype, r.kernel_source) in OTHER_QUANT:
            continue
        if r.inter_size % r.moe_tp_size:
            continue
        # gated (SwiGLU) or not (ReLU^2): TensorRT-LLM's kernel source says (moe_torch_flow_nongated); vLLM's and
        # SGLang's collectors run each shape as its model does and do not record it: None
        gated = (not str(r.kernel_source).endswith("nongated")) if str(r.kernel_source).startswith("moe_torch") else None
        key = (int(r.topk), int(r.num_experts), int(r.hidden_size), int(r.inter_size) // int(r.moe_tp_size), gated)
        us = float(r.latency) * 1e3
        by = best.setdefault(key, {})
        by[int(r.num_tokens)] = min(us, by.get(int(r.num_tokens), us))
        used += 1
    return used


def build(aic: Path) -> dict:
    gpus: dict = {}
    for system, name in SYSTEMS.items():
        for engine, releases in RELEASES.items():
            got: dict[str, tuple[dict, list[str], list[str]]] = {}
            for version in releases:
                rel = PATH.format(system=system, engine=engine, version=version)
                d = _read(aic, rel)
                if d is None:
                    continue
                for dt, ours in DTYPES.items():
                    best, versions, files = got.setdefault(ours, ({}, [], []))
                    if add(best, d, dt, engine, system):
                        versions.append(version)
                        files.append(f"github.com/ai-dynamo/aiconfigurator/blob/{COMMIT}/{rel}")
            for ours, (best, versions, files) in got.items():
                if not best:
                    continue
                shapes = sorted(best, key=lambda k: (*k[:4], k[4] is None, bool(k[4])))
                gpus.setdefault(name, {}).setdefault(engine, {})[ours] = {
                    "releases": versions, "sources": files, "shapes": [list(s) for s in shapes],
                    "us": [[float(f"{best[s][t]:.4g}") if t in best[s] else None for t in TOKENS] for s in shapes]}
    return gpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aic", type=Path, required=True, help="an aiconfigurator checkout or bare git mirror")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    gpus = build(args.aic)
    args.out.write_text(json.dumps({
        "source": f"NVIDIA aiconfigurator (github.com/ai-dynamo/aiconfigurator@{COMMIT}, Apache-2.0), moe_perf "
                  "tables: one MoE layer's routed experts, balanced routing, expert parallelism 1, fastest kernel",
        "written_by": "python bench/moe_latency.py --aic PATH", "unit": "us",
        "shape": ["topk", "num_experts", "hidden_size", "inter_per_rank", "gated"], "tokens": list(TOKENS),
        "gpus": gpus}, separators=(",", ":")) + "\n")
    for g, by in gpus.items():
        print(g, "; ".join(f"{e}: " + ", ".join(f"{dt}@{'/'.join(t['releases'])} ({len(t['shapes'])})" for dt, t in d.items())
                           for e, d in by.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
