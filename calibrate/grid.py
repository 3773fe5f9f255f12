"""What the calibration suite measures: the grids of op-table points per device and the random mixed step
shapes (fit and held-out sets) for whole-step timings."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from capacity.errors import ConfigError


@dataclass(frozen=True)
class Grid:
    tokens: list[int]
    prefill_chunk: list[int]
    prefill_cached: list[int]
    decode_batch: list[int]
    decode_context: list[int]
    fit_steps: int
    holdout_steps: int
    min_time_s: float
    max_step_tokens: int | None = None  # whole random steps stay at or below this (default: tokens[-1])
    max_kv_tokens: int | None = None  # decode points/steps with batch x (context + 1) above this are not run


def _pow2(lo: int, hi: int) -> list[int]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= 2
    return out


def _dense_grid(lo: int, hi: int) -> list[int]:
    """Powers of two and the midpoints 1.5 x 2^k: kernels change tiling at non-power-of-two sizes."""
    xs = set(_pow2(lo, hi)) | {3 * x // 2 for x in _pow2(max(2, lo), hi) if 3 * x // 2 <= hi}
    return sorted(xs)


def default_grid(device: str, quick: bool, max_context: int) -> Grid:
    cuda = device.startswith("cuda")
    if quick:
        g = Grid(tokens=[1, 4, 16, 64, 256], prefill_chunk=[4, 32, 256], prefill_cached=[0, 256],
                 decode_batch=[1, 4, 16], decode_context=[16, 256], fit_steps=6, holdout_steps=4, min_time_s=0.005)
    elif cuda:
        g = Grid(tokens=_dense_grid(1, 16384), prefill_chunk=[1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
                 prefill_cached=[0, 512, 1024, 2048, 4096, 8192, 16384, 32768], decode_batch=_pow2(1, 1024),
                 decode_context=[16, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768], fit_steps=40,
                 holdout_steps=40, min_time_s=0.01, max_step_tokens=8192,
                 max_kv_tokens=4_000_000)
        # Tables reach 16k tokens and 1024 decodes (vLLM's `serve` defaults on H100/H200 are 8192 batched
        # tokens and 1024 sequences); whole steps stop at 8192 tokens, the budget engines run with. Decode
        # batches stop at 4M KV tokens (padded): an 8B model on a 141 GB GPU holds under 1M; the corners
        # past that (1024 x 32k would be 137 GB of KV) are filled from their neighbours by KV bytes read.
    else:
        g = Grid(tokens=_dense_grid(1, 2048), prefill_chunk=_dense_grid(1, 2048),
                 prefill_cached=[0, 32, 64, 128, 256, 512, 1024, 2048, 3072], decode_batch=_pow2(1, 256),
                 decode_context=[16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072], fit_steps=40,
                 holdout_steps=40, min_time_s=0.03)
    # Never measure past the context the model (or the user) allows.
    cached = [k for k in g.prefill_cached if k + g.prefill_chunk[0] <= max_context]
    chunks = [c for c in g.prefill_chunk if c <= max_context]
    ctx = [x for x in g.decode_context if x + 1 <= max_context]
    if not (cached and chunks and ctx):
        raise ConfigError(f"max context {max_context} is too small for a calibration grid")
    return Grid(g.tokens, chunks, cached, g.decode_batch, ctx, g.fit_steps, g.holdout_steps, g.min_time_s,
                g.max_step_tokens, g.max_kv_tokens)


def random_steps(grid: Grid, count: int, seed: int, max_context: int) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Mixed step shapes inside the grid: 0-3 prefill chunks (sizes and cached lengths log-uniform) and
    0..max-batch decodes with log-uniform contexts; every step has at least one token."""
    rng = np.random.default_rng(seed)
    max_tokens, max_chunk = grid.max_step_tokens or grid.tokens[-1], grid.prefill_chunk[-1]
    max_cached, max_ctx = grid.prefill_cached[-1], grid.decode_context[-1]
    out = []
    while len(out) < count:
        kind = rng.choice(["decode", "prefill", "mixed"], p=[0.35, 0.25, 0.4])
        prefills: list[tuple[int, int]] = []
        decodes: list[int] = []
        if kind in ("prefill", "mixed"):
            for _ in range(int(rng.integers(1, 4))):
                c = int(round(math.exp(rng.uniform(math.log(grid.prefill_chunk[0]), math.log(max_chunk)))))
                k = 0 if rng.random() < 0.4 else int(round(math.exp(rng.uniform(math.log(16), math.log(max_cached)))))
                k = min(k, max_context - c)
                prefills.append((c, max(0, k)))
        if kind in ("decode", "mixed"):
            b = int(round(math.exp(rng.uniform(0, math.log(grid.decode_batch[-1])))))
            lo = math.log(grid.decode_context[0])
            decodes = [int(round(math.exp(rng.uniform(lo, math.log(max_ctx))))) for _ in range(b)]
        n = sum(c for c, _ in prefills) + len(decodes)
        kv = len(decodes) * (max(decodes) + 1) if decodes else 0
        if 0 < n <= max_tokens and (grid.max_kv_tokens is None or kv <= grid.max_kv_tokens):
            out.append((prefills, decodes))
    return out
