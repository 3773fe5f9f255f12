"""The measured floor under a MoE layer's routed experts: NVIDIA's kernel latencies per GPU, engine and dtype (issue 47).

The roofline prices the routed experts of a step as the bytes of the experts its tokens touch and the FLOPs of
their top-k rows at a generic efficiency (capacity/cost/roofline.py `_mlp_s`). The engines' fused MoE kernels
(vLLM's and SGLang's Triton `fused_moe`, Marlin for W4A16, TensorRT-LLM's CUTLASS MoE) run well below that at
the small per-expert row counts a serving step gives them, so the roofline promised rates the engines do not have.
NVIDIA aiconfigurator measured those kernels: capacity/data/moe_latency.json (bench/moe_latency.py documents the
columns kept) holds one MoE layer's routed-expert latency per (GPU, engine, expert dtype, shape) at 27 token
counts from 1 to 16,384; what was timed is the engine's `FusedMoE` forward given the router logits (top-k, the
expert GEMMs, the activation, the weighted sum), not the router GEMM, which the roofline costs on its own.

`moe_floor` returns, for a card on a GPU at a TP size and an engine, a `MoEFloor` whose `floor_s(tokens)` the
roofline takes as the least time of the experts of one layer. Its curve follows aiconfigurator's own resolution
(aic-core/rust/aiconfigurator-core/src/perf_database/moe.rs `MoeTable::query`, operators/moe.rs
`empirical_latency` / `reference_grid`, operators/util_empirical.rs `nearest_candidate_index`):

- the table: the GPU's own, else the closest of the same architecture that is no slower in bandwidth and in the
  dtype's tensor rate (so its latencies are a lower bound here too); the engine's (vLLM, SGLang, TensorRT-LLM);
  the expert dtype as the engine multiplies it (bf16; fp8 per tensor or in 128-blocks, each standing in for the
  other where one was not measured: the same Triton kernel with other scales; int4 W4A16; mxfp4 W4A16; nvfp4 on
  Blackwell). No table for the GPU, engine or dtype: None, and the roofline alone prices the experts;
- the shape: the measured (topk, experts, hidden, intermediate per rank) nearest to the card's in log space,
  each axis scaled by the span of the measured ones (aiconfigurator's `nearest_candidate_index`), among the
  shapes of the same gating (SwiGLU: 3 GEMMs, ReLU^2: 2) where there are any (TensorRT-LLM's rows record it;
  vLLM's and SGLang's collectors run each shape as its model does, so theirs are taken as the card's);
- the tokens: the measured latency interpolated linearly between the two measured token counts around the
  query (aiconfigurator's RAW lerp), and past the largest (16,384) held at the last one's utilisation; first
  lowered to its envelope from above (each point no higher than any larger token count's), so a kernel's
  badly tuned small batch does not raise the floor over a larger one;
- another shape than the card's: the reference's utilisation, SOL(ref) / latency(ref), carried to the card's
  shape: floor = SOL(card) / utilisation (aiconfigurator's empirical transfer), where SOL is the speed of light
  of the layer on the table's GPU: max(2 x rows x G x hidden x inter FLOPs / tensor rate, bytes / bandwidth),
  rows = tokens x topk, G = 3 gated or 2, bytes = the weights of min(experts, rows) experts at the dtype's width
  + the rows' activations in and out and their intermediate at 2 bytes.
"""
from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

from capacity.model.card import ModelCard
from capacity.model.gpus import GPU, get_gpu

DATA = Path(__file__).resolve().parent.parent / "data" / "moe_latency.json"
# weight bytes per element and the tensor rate each expert dtype multiplies at (W4A16 and mxfp4: bf16 inputs)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4": 0.5, "mxfp4": 0.5, "fp4": 0.5}
RATE = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "int4": "bf16", "mxfp4": "bf16", "fp4": "fp4"}
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "trtllm-engine": "trtllm"}


@cache
def _data() -> dict:
    return json.loads(DATA.read_text(encoding="utf-8"))


def expert_dtype(card: ModelCard, gpu: GPU) -> str | None:
    """The table dtype of the card's routed experts as engines run them on `gpu` (capacity.model.compute), or None
    where no table measures that kernel (W8A16 Marlin, int8, nf4)."""
    from capacity.model.compute import gemm_dtype

    fmt, gd = card.format_of("experts"), gemm_dtype(card, "experts", gpu)
    if fmt in ("bf16", "fp16") and gd in ("bf16", "fp16"):
        return "bf16"
    if fmt == "fp8" and gd == "fp8":
        return "fp8_block" if card.quant_group_size is not None else "fp8"
    if fmt in ("int4", "mxfp4") and gd in ("bf16", "fp16"):
        return fmt
    if fmt == "nvfp4" and gd == "fp4":
        return "fp4"
    return None


def _rate(gpu: GPU, dtype: str) -> float:
    return gpu.peak_flops(RATE[dtype])


def find_table(gpu: GPU, engine: str, dtype: str) -> tuple[str, dict] | None:
    """(the GPU whose table it is, the table) for `gpu`, `engine` and `dtype`, or None (module docstring)."""
    data = _data()["gpus"]
    eng = ENGINES.get(engine, engine)
    own = data.get(gpu.name, {}).get(eng, {})
    if dtype in own:
        return gpu.name, own[dtype]
    best: tuple[float, str, dict] | None = None
    for name, by in data.items():
        ref = get_gpu(name)
        t = by.get(eng, {}).get(dtype)
        if t is None or (ref.arch or "").split(" ")[0] != (gpu.arch or "").split(" ")[0]:
            continue
        if ref.mem_bw_bytes_per_s >= gpu.mem_bw_bytes_per_s and _rate(ref, dtype) >= _rate(gpu, dtype):
            if best is None or ref.mem_bw_bytes_per_s < best[0]:  # the closest of the faster ones
                best = (ref.mem_bw_bytes_per_s, name, t)
    return None if best is None else (best[1], best[2])


def _alt(dtype: str) -> str | None:
    return {"fp8": "fp8_block", "fp8_block": "fp8"}.get(dtype)


def nearest_shape(shapes: list[list], query: tuple[int, int, int, int], gated: bool) -> int:
    """Index of the measured shape [topk, experts, hidden, inter_per_rank, gated] nearest to `query` (module
    docstring: log features scaled by the candidates' span, the first of equals)."""
    idx = [i for i, s in enumerate(shapes) if s[4] is None or bool(s[4]) == gated] or list(range(len(shapes)))
    feats = [[math.log(max(float(shapes[i][a]), 1.0)) for a in range(4)] for i in idx]
    lo = [min(f[a] for f in feats) for a in range(4)]
    span = [(max(f[a] for f in feats) - lo[a]) or 1.0 for a in range(4)]
    q = [(math.log(max(float(query[a]), 1.0)) - lo[a]) / span[a] for a in range(4)]
    best, best_d = idx[0], math.inf
    for i, f in zip(idx, feats):
        d = sum(((f[a] - lo[a]) / span[a] - q[a]) ** 2 for a in range(4))
        if d < best_d:
            best, best_d = i, d
    return best


def sol_s(tokens: float, topk: int, experts: int, hidden: int, inter: int, gated: bool, dtype: str, gpu: GPU) -> float:
    """The layer's speed of light on `gpu` (module docstring)."""
    g = 3 if gated else 2
    rows = tokens * topk
    flops = 2.0 * rows * g * hidden * inter
    bytes_ = (min(float(experts), rows) * g * hidden * inter * WEIGHT_BYTES[dtype]
              + rows * (2 * hidden + g * inter) * 2.0)
    return max(flops / _rate(gpu, dtype), bytes_ / gpu.mem_bw_bytes_per_s)


class MoEFloor:
    """The least time of one MoE layer's routed experts at a token count (module docstring)."""

    def __init__(self, tokens: list[int], us: list[float | None], ref: list, query: tuple[int, int, int, int],
                 gated: bool, dtype: str, gpu: GPU, source: str) -> None:
        pts = [(t, u) for t, u in zip(tokens, us) if u is not None]
        self.tokens = [float(t) for t, _ in pts]
        # the lower envelope from above: a token count is never floored above what more tokens were measured at
        # (some kernels' tuned configs give a slower small batch than a larger one)
        lat = [u * 1e-6 for _, u in pts]
        for j in range(len(lat) - 2, -1, -1):
            lat[j] = min(lat[j], lat[j + 1])
        self.lat_s = lat
        # a row that does not record its gating was measured as its model runs: taken as the card's
        self.ref = (int(ref[0]), int(ref[1]), int(ref[2]), int(ref[3]), gated if ref[4] is None else bool(ref[4]))
        self.query, self.gated, self.dtype, self.gpu, self.source = query, gated, dtype, gpu, source
        self.exact = self.ref[:4] == query and self.ref[4] == gated

    def _sol_ratio(self, t: float) -> float:
        if self.exact:
            return 1.0
        k, e, h, i = self.query
        rk, re_, rh, ri, rg = self.ref
        return (sol_s(t, k, e, h, i, self.gated, self.dtype, self.gpu)
                / sol_s(t, rk, re_, rh, ri, rg, self.dtype, self.gpu))

    def floor_s(self, tokens: int) -> float:
        """Seconds of the routed experts of one layer at `tokens` tokens (0 for none)."""
        if tokens <= 0 or not self.tokens:
            return 0.0
        ts, ls = self.tokens, self.lat_s
        t = float(tokens)
        if t <= ts[0]:  # below the grid: the first point held (fixed costs, not the SOL, set it there)
            return ls[0] * self._sol_ratio(t)
        if t >= ts[-1]:  # past the grid: the last point's utilisation, the SOL carries the growth
            ref = self.ref
            grow = (sol_s(t, ref[0], ref[1], ref[2], ref[3], ref[4], self.dtype, self.gpu)
                    / sol_s(ts[-1], ref[0], ref[1], ref[2], ref[3], ref[4], self.dtype, self.gpu))
            return ls[-1] * grow * self._sol_ratio(t)
        j = 0
        while ts[j + 1] < t:
            j += 1
        f = (t - ts[j]) / (ts[j + 1] - ts[j])
        return ((1 - f) * ls[j] + f * ls[j + 1]) * self._sol_ratio(t)


def moe_floor(card: ModelCard, gpu: GPU, tp: int, engine: str) -> MoEFloor | None:
    """The measured floor under `card`'s routed experts on `gpu` at `tp` in `engine`'s kernels, or None where no
    table covers the GPU, the engine or the expert dtype (module docstring)."""
    moe = card.moe
    if moe is None:
        return None
    dtype = expert_dtype(card, gpu)
    if dtype is None:
        return None
    eng = ENGINES.get(engine, engine)
    got = find_table(gpu, eng, dtype)
    if got is None and dtype == "mxfp4" and eng == "sglang":  # SGLang runs vLLM's triton_kernels path there
        eng = "vllm"
        got = find_table(gpu, eng, dtype)
    alt = _alt(dtype)
    if got is None and alt is not None:
        got = find_table(gpu, eng, alt)
        dtype = alt if got is not None else dtype
    if got is None:
        return None
    ref_gpu, table = got
    query = (moe.experts_per_token, moe.num_experts, moe.latent_size or card.hidden_size,
             max(1, moe.moe_intermediate_size // tp))
    i = nearest_shape(table["shapes"], query, card.gated_mlp)
    shape = table["shapes"][i]
    src = (f"aiconfigurator {eng} {'/'.join(table['releases'])} {ref_gpu} {dtype} MoE "
           f"(topk {shape[0]}, {shape[1]} experts, hidden {shape[2]}, inter/rank {shape[3]})")
    return MoEFloor(_data()["tokens"], table["us"][i], shape, query, card.gated_mlp, dtype, get_gpu(ref_gpu), src)
