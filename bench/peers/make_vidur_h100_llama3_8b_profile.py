"""Synthesize Vidur profiling CSVs (mlp.csv, attention.csv) for meta-llama/Meta-Llama-3-8B on H100, TP=1,
from a per-operator roofline with the same datasheet figures and efficiencies as capacity's RooflineCost
defaults (H100 SXM: 989.5 dense BF16 TFLOP/s, 3.35 TB/s; GEMM 70% of peak, attention 50%, HBM 80%, 4 us per
kernel launch). Needed because the fetched microsoft/vidur snapshot has no H100 Llama-3-8B data and its
attention.csv blobs are absent. Times are milliseconds per layer, as Vidur's profiler writes them."""
import csv
import itertools
import sys
from pathlib import Path

PEAK, BW = 989.5e12, 3.35e12
GEMM_EFF, ATTN_EFF, MEM_EFF, LAUNCH = 0.70, 0.50, 0.80, 4e-6
H, QH, KVH, HD, FF, VOCAB, B = 4096, 32, 8, 128, 14336, 128256, 2  # bf16
KVD = KVH * HD

def op(flops, nbytes, peak=PEAK, eff=GEMM_EFF):
    return (max(flops / (peak * eff), nbytes / (BW * MEM_EFF)) + LAUNCH) * 1e3  # ms

def gemm(n, k, m):  # n tokens x (k -> m)
    return op(2 * n * k * m, B * (k * m + n * k + n * m))

def stream(nbytes):
    return op(0, nbytes)

def mlp_row(n):
    t = {"emb": stream(n * H * B), "input_layernorm": stream(2 * n * H * B),
         "attn_pre_proj": gemm(n, H, H + 2 * KVD), "attn_rope": stream(2 * n * (H + KVD) * B),
         "attn_post_proj": gemm(n, H, H), "post_attention_layernorm": stream(2 * n * H * B),
         "mlp_up_proj": gemm(n, H, 2 * FF), "mlp_act": stream(3 * n * FF * B),
         "mlp_down_proj": gemm(n, FF, H), "add": stream(3 * n * H * B)}
    row = {}
    for k, v in t.items():
        for s in ("min", "max", "mean", "median"):
            row[f"time_stats.{k}.{s}"] = v
        row[f"time_stats.{k}.std"] = 0.0
    row.update(n_head=QH, n_kv_head=KVH, n_embd=H, n_expanded_embd=FF, vocab_size=VOCAB, use_gated_mlp=True,
               num_tokens=n, num_tensor_parallel_workers=1)
    return row

def attn_row(batch, kv, chunk):
    ntok = max(chunk, batch)
    if chunk:  # one prefill chunk of `chunk` new tokens on `kv` cached (causal)
        pf = op(4 * chunk * (kv + chunk / 2) * QH * HD, B * ((kv + chunk) * 2 * KVD + 2 * chunk * H), eff=ATTN_EFF)
        dc = 0.0
    else:  # `batch` decode sequences with `kv` context each
        pf = 0.0
        dc = op(4 * batch * kv * QH * HD, B * (batch * kv * 2 * KVD + 2 * batch * H), eff=ATTN_EFF)
    save = stream(2 * ntok * 2 * KVD * B)
    row = {}
    for k, v in (("attn_prefill", pf), ("attn_decode", dc), ("attn_kv_cache_save", save)):
        for s in ("min", "max", "mean", "median"):
            row[f"time_stats.{k}.{s}"] = v
        row[f"time_stats.{k}.std"] = 0.0
    row.update(n_embd=H, n_q_head=QH, n_kv_head=KVH, block_size=16, num_tensor_parallel_workers=1,
               batch_size=batch, kv_cache_size=kv, prefill_chunk_size=chunk, is_prefill=bool(chunk))
    return row

def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

if __name__ == "__main__":
    out = Path(sys.argv[1])  # .../data/profiling/compute/h100/meta-llama/Meta-Llama-3-8B
    ns = sorted({1, 2, 4} | set(range(8, 32769, 8)) if False else {1, 2, 4, *range(8, 1025, 8), *range(1024, 32769, 128)})
    write(out / "mlp.csv", [mlp_row(n) for n in ns])
    kvs = [0, *range(64, 4097, 64)]
    chunks = [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    rows = [attn_row(1, kv, c) for kv, c in itertools.product(kvs, chunks)]
    rows += [attn_row(b, kv, 0) for b, kv in itertools.product([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128], kvs)]
    write(out / "attention.csv", rows)
    print(len(ns), "mlp rows,", len(rows), "attention rows ->", out)
