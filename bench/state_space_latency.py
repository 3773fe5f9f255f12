"""Measured latencies of a hybrid model's state-layer kernels, from NVIDIA aiconfigurator's performance database.

    python bench/state_space_latency.py --aic /path/to/aiconfigurator     # a checkout (or a bare git mirror)

aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships per-layer latencies of the gated DeltaNet
and Mamba-2 kernels that NVIDIA measured with each engine's own kernels (collector/{sglang,vllm,trtllm}/
collect_gdn.py, collector/trtllm/collect_mamba2.py: bf16 activations, fp32 recurrent state, CUDA-graph replay
by default in collector/helper.py `benchmark_with_power`), one table per GPU, engine and release
(aic-core/src/aiconfigurator_core/systems/data/<system>/linear_attention/<engine>/<version>/{gdn,mamba2}_perf.parquet;
latency in ms). Its own query (aic-core/rust/aiconfigurator-core/src/perf_database/state_space.rs `query_gdn`,
`query_mamba2`) keys a table by the kernel and the layer's shape on one rank, and interpolates context rows over
[batch][seq_len] and generation rows over [batch].

Kept here, per GPU of the project's catalogue that has a table (H100 SXM, H200, B200, L40S) and per engine (the
newest release with the prefill scan: SGLang 0.5.14, vLLM 0.24.0, TensorRT-LLM 1.3.0rc20):
- gated DeltaNet, per shape (num_k_heads, head_k_dim, num_v_heads, head_v_dim, d_conv) on one rank:
  "prefill" [batch][seq_len] = causal_conv1d_fn + the chunked scan (chunk_gated_delta_rule; vLLM 0.24's
  chunk_gated_delta_rule_flashinfer, or _triton where it runs that), "decode" [batch] = causal_conv1d_update +
  the recurrent update (fused_recurrent_gated_delta_rule, or its _packed_decode form).
- Mamba-2 (TensorRT-LLM only; the tables hold the conv kernels, not mamba_chunk_scan_combined nor
  selective_state_update), per conv width (nheads x head_dim + 2 n_groups d_state, at the shape measured):
  "prefill" = causal_conv1d_fn, "decode" = causal_conv1d_update.
The rows' d_model is the model the shape was collected for and plays no part in these kernels: where one key
was measured more than once (under several d_model; Mamba-2 shapes of one conv width), the median is kept. Latencies in microseconds, 4 significant digits; a grid
point the table lacks is null.

Writes capacity/data/state_space_latency.json (capacity/cost/state_space_floor.py reads it).
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "capacity" / "data" / "state_space_latency.json"
COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"  # the aiconfigurator snapshot read (2026-08-21)
PATH = "aic-core/src/aiconfigurator_core/systems/data/{system}/linear_attention/{engine}/{version}/{table}_perf.parquet"
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "l40s": "l40s"}  # -> catalogue name
VERSIONS = {"sglang": "0.5.14", "vllm": "0.24.0", "trtllm": "1.3.0rc20"}
BATCH_PREFILL = (1, 2, 4, 8, 16, 32, 64)
SEQ = tuple(2 ** i for i in range(16))  # 1 .. 32768 tokens per sequence
BATCH_DECODE = tuple(2 ** i for i in range(11))  # 1 .. 1024 sequences
GDN_PREFILL = ("causal_conv1d_fn", "chunk_gated_delta_rule", "chunk_gated_delta_rule_flashinfer",
               "chunk_gated_delta_rule_triton")
GDN_DECODE = ("causal_conv1d_update", "fused_recurrent_gated_delta_rule",
              "fused_recurrent_gated_delta_rule_packed_decode")


def _table(aic: Path, system: str, engine: str, table: str):
    import pandas as pd

    rel = PATH.format(system=system, engine=engine, version=VERSIONS[engine], table=table)
    f = aic / rel
    if f.exists():
        return pd.read_parquet(f)
    raw = subprocess.run(["git", f"--git-dir={aic}", "show", f"{COMMIT}:{rel}"], capture_output=True)
    if raw.returncode:
        return None
    return pd.read_parquet(io.BytesIO(raw.stdout))


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _point(med: dict, present: set, kernels, phase: str, b: int, s: int) -> float | None:
    """The sum over the phase's kernels (every one the table has for it) at (batch b, seq_len s), in us; None where
    one of them lacks the point."""
    want = [k for k in kernels if (k, phase) in present]
    got = [med.get((k, phase, b, s)) for k in want]
    if not want or any(g is None for g in got):
        return None
    return _sig(1000.0 * sum(got))  # ms -> us


def _curves(d, key_cols: list[str], key_fmt, prefill_kernels, decode_kernels) -> dict:
    """Per shape: the prefill grid (sum over its kernels of the median over d_model) and the decode curve."""
    out: dict = {}
    for key, rows in d.groupby(key_cols):
        med = rows.groupby(["kernel_source", "phase", "batch_size", "seq_len"]).latency.median().to_dict()
        present = {(k, ph) for k, ph, _, _ in med}

        pre = [[_point(med, present, prefill_kernels, "context", b, s) for s in SEQ] for b in BATCH_PREFILL]
        dec = [_point(med, present, decode_kernels, "generation", b, 1) for b in BATCH_DECODE]
        kernels = sorted({k for k, _ in present})
        out[key_fmt(key)] = {"kernels": kernels, "prefill": pre, "decode": dec}
    return out


def build(aic: Path) -> dict:
    gpus: dict = {}
    for system, name in SYSTEMS.items():
        for engine, version in VERSIONS.items():
            entry: dict = {}
            gdn = _table(aic, system, engine, "gdn")
            if gdn is not None:
                entry["gated_deltanet"] = _curves(
                    gdn, ["num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "d_conv"],
                    lambda k: "/".join(str(int(x)) for x in k), GDN_PREFILL, GDN_DECODE)
            m2 = _table(aic, system, engine, "mamba2") if engine == "trtllm" else None
            if m2 is not None:
                m2 = m2.assign(conv_dim=m2.nheads * m2.head_dim + 2 * m2.n_groups * m2.d_state)
                entry["mamba2"] = _curves(m2, ["conv_dim", "d_conv"], lambda k: "/".join(str(int(x)) for x in k),
                                          ("causal_conv1d_fn",), ("causal_conv1d_update",))
            if entry:
                gpus.setdefault(name, {})[engine] = {"version": version, **entry}
    return {
        "source": f"NVIDIA aiconfigurator (github.com/ai-dynamo/aiconfigurator@{COMMIT}, Apache-2.0), "
                  "linear_attention/<engine>/<version>/{gdn,mamba2}_perf.parquet",
        "written_by": "python bench/state_space_latency.py --aic PATH", "unit": "us",
        "keys": {"gated_deltanet": "num_k_heads/head_k_dim/num_v_heads/head_v_dim/d_conv on one rank",
                 "mamba2": "conv_dim/d_conv (nheads x head_dim + 2 n_groups d_state)"},
        "prefill": "[batch][seq_len]: causal_conv1d_fn + the chunked scan (Mamba-2: the conv only)",
        "decode": "[batch]: causal_conv1d_update + the recurrent update (Mamba-2: the conv only)",
        "batch_prefill": list(BATCH_PREFILL), "seq": list(SEQ), "batch_decode": list(BATCH_DECODE),
        "gpus": gpus,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aic", type=Path, required=True, help="an aiconfigurator checkout or bare git mirror")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    data = build(args.aic)
    args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    n = sum(len(s) for g in data["gpus"].values() for e in g.values() for k, s in e.items() if k != "version")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB, {n} shapes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
