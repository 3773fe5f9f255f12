"""Predicted SGLang KV pool (max_total_num_tokens) against every real SGLang start-up log in tests/data that names
its model (a card here) and its GPU, from what a user knows: the model card, the catalogue GPU, TP, the release
and the flags the log shows (`sglang_budget`, the call `capacity memory --engine sglang@X` makes).

    PYTHONPATH=. python bench/sglang_logs.py          # the table (docs/sglang.md, "Before / after per log")

"mid" is the middle estimate, "low" the conservative end (what plans use: it must not be above the log).
The startup_v3 development case sglang4895 (did not start) is scored by bench/memory_unseen.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (log id, card, GPU, tp, release, F given (None: the release's default), what the release is inferred from)
CASES = [
    ("docs-send-request-llama31-8b", "models/llama-3.1-8b.yaml", "h100-sxm", 1, "0.4.1", None, "server_args fields of 0.4.1"),
    ("pr4760-llama31-8b-fa3", "models/llama-3.1-8b.yaml", "h100-sxm", 1, "0.4.6", None, "PR of 2025-03 (0.4.4-0.4.6)"),
    ("jerryzsj-r1-distill-qwen7b-3090", "models/qwen2.5-7b.yaml", "rtx-3090", 1, "0.4.2", 0.88, "0.4.1/0.4.2 era"),
    ("maxuhl98-llama31-8b-24gb", "models/llama-3.1-8b.yaml", "rtx-4090", 1, "0.4.9", None, "0.4.9 by date; a 24 GiB card"),
    ("mi300x-llama3-8b-bench-latency", "tests/data/hf/llama-3-8b.json", "mi300x", 1, "0.3.0", None, "0.3.x by date"),
    ("pr11716-llama33-70b-tp8-141g", "tests/data/hf/llama-3.3-70b.json", "h200", 8, "0.5.5", None, "PR of 2025-10"),
    ("vllm21348-qwen3-235b-fp8-4xh100", "tests/data/hf/qwen3-235b-a22b-fp8.json", "h100-sxm", 4, "0.4.9", 0.93,
     "mid-2025 (0.4.7-0.4.10)"),
]


def rows() -> list[dict]:
    from capacity.engine.sglang.memory import sglang_budget
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu

    out = []
    for name, card, gpu, tp, rel, f, why in CASES:
        log = yaml.safe_load((ROOT / "tests/data/sglang_startup" / f"{name}.yaml").read_text())
        logged = log["figures"]["kv_tokens"]
        b = sglang_budget(load_model_card(ROOT / card), get_gpu(gpu), tp, release=rel, mem_fraction_static=f)
        out.append({"log": name, "release": rel, "gpu": gpu, "tp": tp, "F": round(b.mem_fraction_static, 4),
                    "mid": b.kv_tokens, "low": b.kv_tokens_low, "logged": logged,
                    "mid_err_pct": round(100 * (b.kv_tokens / logged - 1), 2),
                    "low_err_pct": round(100 * (b.kv_tokens_low / logged - 1), 2),
                    "kv_gib_mid": round(b.kv_tokens * b.kv_bytes_per_token / 2**30, 2),
                    "kv_gib_logged": round(logged * b.kv_bytes_per_token / 2**30, 2), "why": why})
    return out


def main() -> None:
    print(f"{'log':34} {'release':8} {'F':>6} {'mid':>10} {'low':>10} {'logged':>10} {'mid%':>7} {'low%':>7} "
          f"{'KV GiB mid/log':>15}")
    for r in rows():
        print(f"{r['log']:34} {r['release']:8} {r['F']:>6} {r['mid']:>10,} {r['low']:>10,} {r['logged']:>10,} "
              f"{r['mid_err_pct']:>+7.2f} {r['low_err_pct']:>+7.2f} {r['kv_gib_mid']:>7}/{r['kv_gib_logged']}")


if __name__ == "__main__":
    main()
