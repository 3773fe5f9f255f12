"""The dtype each family of linear layers multiplies in, on a given GPU: what serving engines run for a weight format.

The storage format (`ModelCard.weight_dtype`, `weight_formats`) sets the bytes a GEMM reads; the compute dtype sets
the tensor-core rate it can reach. They differ: an FP8 checkpoint on an H100 runs FP8 x FP8 GEMMs (activations
quantised per token on the fly) at twice the bf16 rate, while the same checkpoint on an A100, which has no FP8 tensor
cores, runs weight-only (vLLM's Marlin kernels dequantise to bf16 in registers) at the bf16 rate. Read from vLLM's
quantisation methods (model_executor/layers/quantization):

| weight format | GPU has the rate      | GPU lacks it          | vLLM path                                       |
| ------------- | --------------------- | --------------------- | ----------------------------------------------- |
| fp8           | fp8 (W8A8, sm89+)     | bf16 (Marlin W8A16)   | Fp8LinearMethod: cutlass_scaled_mm, else Marlin  |
| int8 W8A8     | int8                  | bf16                  | compressed-tensors W8A8Int8 (cutlass)           |
| int4 (GPTQ/AWQ) | bf16 (W4A16)        | bf16                  | Marlin, always weight-only                      |
| nvfp4         | fp4 (W4A4, sm100)     | bf16 (Marlin W4A16)   | ModelOpt/compressed-tensors NVFP4                |
| mxfp4         | bf16 (W4A16)          | bf16                  | gpt-oss experts: Marlin/Triton with bf16 inputs |

Checkpoints that quantise weights only (GPTQ int8, compressed-tensors W8A16/W4A16/NVFP4A16) say so in their
config and set `ModelCard.gemm_dtype` to the activation dtype; `gemm_dtype` may also force a dtype (`--compute-dtype`),
which the GPU must have. The LM head and the MoE router stay at the activation dtype (engines do not quantise them).
Where an engine's choice is uncertain (MXFP4 on Blackwell can run MXFP8 inputs), the slower rate is taken: errors
on the safe side.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import yaml

from capacity.errors import ConfigError
from capacity.model.gpus import GPU, get_gpu
from capacity.model.schema import ModelCard

# weight storage format -> the dtype engines multiply in when the GPU has that rate ("act": the activation dtype)
NATIVE = {"bf16": "act", "fp16": "act", "fp8": "fp8", "int8": "int8", "int4": "act", "nvfp4": "fp4", "mxfp4": "act", "nf4": "act"}
GEMM_FAMILIES = ("attention", "dense_mlp", "experts", "shared_experts")


def _rate(gpu: GPU, dtype: str) -> float | None:
    return {"bf16": gpu.bf16_flops, "fp16": gpu.fp16_flops, "fp8": gpu.fp8_flops, "fp4": gpu.fp4_flops,
            "int8": gpu.int8_ops}.get(dtype)


def gemm_dtype(card: ModelCard, family: str, gpu: GPU) -> str:
    """The dtype one family's GEMMs run in on `gpu` (see the module docstring)."""
    if card.gemm_dtype != "auto":
        if _rate(gpu, card.gemm_dtype) is None:
            raise ConfigError(f"compute_dtype {card.gemm_dtype}: gpu {gpu.name} has no dense {card.gemm_dtype} "
                              "tensor rate in the catalogue")
        if card.gemm_dtype in ("bf16", "fp16"):
            return card.gemm_dtype
        fmt = card.format_of(family)
        # a low-precision compute dtype applies to quantised families only (an unquantised family stays bf16)
        return card.gemm_dtype if fmt not in ("bf16", "fp16") else card.dtype
    want = NATIVE[card.format_of(family)]
    if want == "act" or _rate(gpu, want) is None:
        return card.dtype
    return want


def gemm_dtypes(card: ModelCard, gpu: GPU) -> dict[str, str]:
    """The compute dtype of every GEMM family the card has, on `gpu`."""
    return {f: gemm_dtype(card, f, gpu) for f in GEMM_FAMILIES}


def describe(card: ModelCard, gpu: GPU) -> str:
    """One phrase for tables and sources: 'fp8 GEMMs', 'bf16 GEMMs', 'fp8 attention/MLP, bf16 experts'."""
    d = gemm_dtypes(card, gpu)
    used = {f: d[f] for f in GEMM_FAMILIES if f == "attention" or (f == "dense_mlp" and card.num_dense_layers)
            or (f == "experts" and card.moe) or (f == "shared_experts" and card.moe and card.moe.shared_intermediate)}
    kinds = sorted(set(used.values()))
    if len(kinds) == 1:
        return f"{kinds[0]} GEMMs"
    return ", ".join(f"{f} {v}" for f, v in used.items()) + " GEMMs"


def measured_gemm_efficiency(gpu: GPU, dtype: str, block_scaled: bool = False) -> float | None:
    """The GEMM efficiency (achieved / datasheet FLOP/s) measured for this GPU and compute dtype in the kernels
    of a serving engine (capacity/data/gemm_efficiency.yaml: NVIDIA aiconfigurator's TensorRT-LLM tables, written
    by bench/gemm_efficiency.py), or None where nothing was measured. A GPU not listed takes its architecture's
    (Hopper: the H100 SXM's, Blackwell: the B200's) only where its compute capability is the measured part's: a
    consumer or workstation Blackwell (sm120) does not inherit the B200's (sm100) figures. FP8 with block scales
    has its own figure."""
    data = _gemm_efficiency_data()
    key = gpu.name if gpu.name in data["gpus"] else data["architectures"].get((gpu.arch or "").split(" ")[0])
    if key and key != gpu.name:
        sm = [re.search(r"\bsm_?(\d{2,3})\b", g.arch or "") for g in (gpu, get_gpu(key))]
        if not (sm[0] and sm[1] and sm[0][1] == sm[1][1]):
            key = None
    by = data["gpus"].get(key or "", {})
    if dtype == "fp8" and block_scaled and "fp8_block" in by:
        return float(by["fp8_block"])
    v = by.get("bf16" if dtype == "fp16" else dtype)
    return None if v is None else float(v)


_GEMM_EFF: dict = {}


def _gemm_efficiency_data() -> dict:
    if not _GEMM_EFF:
        _GEMM_EFF.update(yaml.safe_load((Path(__file__).resolve().parent.parent / "data" /
                                         "gemm_efficiency.yaml").read_text(encoding="utf-8")))
    return _GEMM_EFF



# Measured GEMM latencies (capacity/data/gemm_latency.json, from the same aiconfigurator tables): a floor under the
# roofline's dense GEMMs. A table is used for a GPU whose own name it carries, or for a GPU of the same
# architecture that is no faster in bandwidth or in that dtype's rate (then the table is a lower bound there too);
# otherwise none applies.
_GEMM_LAT: dict = {}
LATENCY_DTYPES = ("bf16", "fp8", "fp8_block", "fp4")


def _gemm_latency_data() -> dict:
    if not _GEMM_LAT:
        _GEMM_LAT.update(json.loads((Path(__file__).resolve().parent.parent / "data" / "gemm_latency.json")
                                    .read_text(encoding="utf-8")))
    return _GEMM_LAT


def gemm_latency_table(gpu: GPU, dtype: str) -> list | None:
    """The measured [m][n][k] latency table (us) that bounds `gpu`'s GEMMs in `dtype` from below, or None."""
    data = _gemm_latency_data()
    if dtype not in LATENCY_DTYPES:
        return None
    own = data["gpus"].get(gpu.name, {})
    if dtype in own:
        return own[dtype]
    rate = gpu.peak_flops("fp8" if dtype == "fp8_block" else dtype)
    best: tuple[float, list] | None = None
    for name, by in data["gpus"].items():
        ref = get_gpu(name)
        if dtype not in by or (ref.arch or "").split(" ")[0] != (gpu.arch or "").split(" ")[0]:
            continue
        ref_rate = ref.peak_flops("fp8" if dtype == "fp8_block" else dtype)
        if ref.mem_bw_bytes_per_s >= gpu.mem_bw_bytes_per_s and ref_rate >= rate:
            if best is None or ref.mem_bw_bytes_per_s < best[0]:  # the closest of the faster ones
                best = (ref.mem_bw_bytes_per_s, by[dtype])
    return None if best is None else best[1]


def gemm_floor_curve(table: list, n: int, k: int) -> list[float] | None:
    """Measured latency (seconds) of an (m x k) @ (k x n) GEMM at each m of the grid, for this n and k:
    interpolated bilinearly in (log n, log k) on log latency; n or k past the grid's largest scales the edge's
    latency in proportion; None where n or k is below the grid or a corner was not measured."""
    data = _gemm_latency_data()
    nk = data["nk"]
    if n < nk[0] or k < nk[0]:
        return None

    def bracket(v: int) -> tuple[int, int, float, float]:
        if v >= nk[-1]:
            return len(nk) - 1, len(nk) - 1, 0.0, v / nk[-1]
        j = 0
        while nk[j + 1] < v:
            j += 1
        f = (math.log(v) - math.log(nk[j])) / (math.log(nk[j + 1]) - math.log(nk[j]))
        return j, j + 1, f, 1.0

    n0, n1, fn, sn = bracket(n)
    k0, k1, fk, sk = bracket(k)
    out = []
    for row in table:
        corners = (row[n0][k0], row[n0][k1], row[n1][k0], row[n1][k1])
        if any(c is None for c in corners):
            return None
        a, b, c, d = (math.log(x) for x in corners)
        lg = (1 - fn) * ((1 - fk) * a + fk * b) + fn * ((1 - fk) * c + fk * d)
        out.append(math.exp(lg) * sn * sk * 1e-6)
    return out


def gemm_floor_s(curve: list[float], m: int) -> float:
    """The curve of gemm_floor_curve at m tokens: log-log interpolation between the grid's powers of 2, and in
    proportion to m past its largest (compute-bound there)."""
    if m <= 0:
        return 0.0
    top = len(curve) - 1
    if m >= 2 ** top:
        return curve[top] * m / 2 ** top
    x = math.log2(m)
    i = int(x)
    f = x - i
    return math.exp((1 - f) * math.log(curve[i]) + f * math.log(curve[i + 1]))
