"""Achieved fraction of datasheet (and of measured ceilings) FLOP/s and bandwidth, read off a profile's tables.

    python bench/gpu_efficiency.py --profile calibrate/profiles/llama-3.1-8b-h200.json \
        --peaks bench/results/gpu_peaks-h200.json

For each table the point where the roofline says the work is most clearly compute- or memory-bound:
  layer body, 1 token        weight bytes / time           vs HBM bandwidth  (decode-like, memory-bound)
  layer body, largest n      2 x n x active params / time  vs bf16 FLOP/s    (prefill-like, compute-bound)
  decode attention, largest  K+V bytes read / time         vs HBM bandwidth
  prefill attention, largest 4 x chunk x (cached + chunk/2) x heads x head_dim / time   vs bf16 FLOP/s
  lm_head, largest n         2 x n x hidden x vocab / time vs bf16 FLOP/s
Counts are the roofline's own (weights and KV bytes in the card's dtype; no activation traffic), so a
fraction near 1 means the table runs at the datasheet, and "of measured" compares with `gpu_peaks.py`'s
matrix product and copy on the same machine. Prints a table and writes JSON next to the profile's name.
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
    ap.add_argument("--profile", required=True)
    ap.add_argument("--peaks", help="gpu_peaks.py JSON from the same machine")
    ap.add_argument("--out")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from calibrate.stack import RankShapes
    from capacity.cost.profile import load_profile
    from capacity.model.card import load_model_card, resolve_model_path
    from capacity.model.gpus import get_gpu

    prof = load_profile(args.profile)
    if not prof.provenance.gpu:
        raise SystemExit(f"{args.profile}: not measured on a catalogue GPU")
    gpu = get_gpu(prof.provenance.gpu)
    card = load_model_card(resolve_model_path(prof.model.name))
    s = RankShapes.of(card, prof.tp)
    peaks = json.loads(Path(args.peaks).read_text()) if args.peaks else {}
    b = 2  # bf16 bytes
    attn_params = s.hidden * (s.q_heads + 2 * s.kv_heads) * s.head_dim + s.q_heads * s.head_dim * s.hidden
    if card.moe is not None:
        fam = "layer_moe"
        active = attn_params + s.top_k * 3 * s.hidden * s.expert_intermediate + 3 * s.hidden * s.shared_intermediate \
            + s.hidden * s.experts
        read_1 = active  # one token touches top_k experts
    else:
        fam = "layer"
        active = read_1 = attn_params + 3 * s.hidden * s.intermediate

    def last(xs, vals):
        pts = [(x, v) for x, v in zip(xs, vals) if v is not None]
        return pts[-1]

    rows = []

    def add(name, kind, work, t, detail):
        peak_ds = gpu.bf16_flops if kind == "flops" else gpu.mem_bw_bytes_per_s
        peak_me = peaks.get("bf16_flops" if kind == "flops" else "copy_bytes_per_s")
        rate = work / t
        rows.append({"table": name, "point": detail, "kind": kind, "time_s": t, "rate": rate,
                     "fraction_of_datasheet": rate / peak_ds,
                     "fraction_of_measured": rate / peak_me if peak_me else None})

    lay = prof.linear[fam]
    n1, t1 = prof.tokens[0], lay[0]
    add(f"{fam} (1 token)", "bytes", read_1 * b, t1, f"n={n1}")
    n, t = last(prof.tokens, lay)
    add(f"{fam} (largest n)", "flops", 2 * n * active, t, f"n={n}")
    # decode attention: the largest measured batch x context
    best = max(((bi, cj, v) for i, bi in enumerate(prof.decode_batch) for j, cj in enumerate(prof.decode_context)
                for v in [prof.decode_attn[i][j]] if v is not None), key=lambda x: x[0] * x[1])
    bb, cc, tt = best
    add("decode attention", "bytes", 2 * bb * (cc + 1) * s.kv_heads * s.head_dim * b, tt, f"batch={bb} ctx={cc}")
    bestp = max(((c, k, v) for i, c in enumerate(prof.prefill_chunk) for j, k in enumerate(prof.prefill_cached)
                 for v in [prof.prefill_attn[i][j]] if v is not None), key=lambda x: x[0] * (x[1] + x[0] / 2))
    c, k, tp_ = bestp
    add("prefill attention", "flops", 4 * c * (k + c / 2) * s.q_heads * s.head_dim, tp_, f"chunk={c} cached={k}")
    n, t = last(prof.tokens, prof.lm_head)
    add("lm_head (largest n)", "flops", 2 * n * s.hidden * s.vocab, t, f"n={n}")

    tab = Table(title=f"{card.name} on {prof.provenance.device_name} "
                      f"({'CUDA graphs' if prof.provenance.cuda_graphs else 'eager'}): achieved vs peak",
                title_justify="left")
    for col in ("table", "point", "time ms", "achieved", "of datasheet", "of measured peak"):
        tab.add_column(col, justify="left" if col in ("table", "point") else "right")
    for r in rows:
        unit = f"{r['rate'] / 1e12:.0f} TFLOP/s" if r["kind"] == "flops" else f"{r['rate'] / 1e12:.2f} TB/s"
        tab.add_row(r["table"], r["point"], f"{r['time_s'] * 1e3:.3f}", unit, f"{r['fraction_of_datasheet']:.0%}",
                    f"{r['fraction_of_measured']:.0%}" if r["fraction_of_measured"] else "-")
    con = Console(width=140)
    con.print(tab)
    if peaks:
        con.print(f"measured ceilings: bf16 matmul {peaks['bf16_flops'] / 1e12:.0f} TFLOP/s "
                  f"({peaks['bf16_flops'] / gpu.bf16_flops:.0%} of {gpu.bf16_flops / 1e12:.0f}), copy "
                  f"{peaks['copy_bytes_per_s'] / 1e12:.2f} TB/s ({peaks['copy_bytes_per_s'] / gpu.mem_bw_bytes_per_s:.0%} "
                  f"of {gpu.mem_bw_bytes_per_s / 1e12:.2f})")
    out = Path(args.out or ROOT / "bench/results" / f"gpu_efficiency-{Path(args.profile).stem}.json")
    out.write_text(json.dumps({"profile": args.profile, "peaks": args.peaks, "gpu": gpu.name, "rows": rows}, indent=1) + "\n")
    con.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
