"""The roofline's efficiencies and fixed costs (`RooflineParams`), apart from the compiled step cost.

A pydantic model cannot live in a module mypyc compiles: pip builds in isolation, without pydantic, so mypyc
sees `BaseModel` as an unknown base and makes the class a native one, which fails at import ("mypyc classes
can't have a metaclass"). tests/test_compiled_build.py keeps such bases out of the compiled modules.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Eff = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Secs = Annotated[float, Field(ge=0, allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class RooflineParams(BaseModel):
    """Achievable fractions of datasheet peaks and fixed costs. Defaults are typical of H100-class
    serving engines (dense GEMM ~70% of peak, attention ~50%, streaming ~80% of HBM bandwidth)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_flops_eff: Eff = 0.70
    attn_flops_eff: Eff = 0.50
    mem_bw_eff: Eff = 0.80
    comm_bw_eff: Eff = 0.70
    kernel_launch_s: Secs = 4e-6  # per kernel, paid once per op per layer
    allreduce_latency_s: Secs = 8e-6  # per all-reduce, on top of the bandwidth term
    step_overhead_s: Secs = 2e-3  # scheduler, input preparation, detokenisation per step
    sampler_bytes_per_logit: NonNeg = 12.0  # fp32 logits, softmax, noise: read+write passes per logit
    # A hybrid's chunked state-space / linear-attention scans (Triton SSD and FLA kernels; capacity/cost/state_space.py):
    # an assumption, not measured (plausible 0.15-0.6); decode's state update is bandwidth-bound and ignores it
    state_scan_flops_eff: Eff = 0.30
    # ... and never faster than NVIDIA measured those kernels (conv + scan, conv + state update) for that GPU, engine
    # and per-rank shape (capacity/data/state_space_latency.json, aiconfigurator's tables; capacity/cost/
    # state_space_floor.py). GPUs and engines without a table keep the model alone. False: the model alone.
    measured_state_floor: bool = True
    attention: Literal["ideal", "dense_packed"] = "ideal"
    # FP8 KV on Hopper/Blackwell: attention multiplies in FP8 (FlashAttention-3 and TRT-LLM's FMHA quantise q too)
    fp8_attention: bool = True
    # A GEMM dtype never runs above the efficiency measured for it on that GPU in a serving engine's kernels
    # (capacity/data/gemm_efficiency.yaml, from NVIDIA aiconfigurator's TensorRT-LLM tables: FP8 0.59-0.61 on
    # Hopper, FP4 0.38 on a B200, where gemm_flops_eff is 0.70); False: gemm_flops_eff for every dtype.
    measured_gemm_eff: bool = True
    # A dense GEMM (attention projections, dense and shared-expert MLP) never runs faster than NVIDIA measured that
    # shape on that GPU in TensorRT-LLM's kernels (capacity/data/gemm_latency.json, from the same tables): the
    # kernels' fixed costs at small shapes and their dip below the ridge. MoE experts (grouped GEMMs: the next
    # switch) and the LM head are not bounded by it. False: the roofline alone.
    measured_gemm_floor: bool = True
    # A MoE layer's routed experts never run faster than NVIDIA measured that shape (or carried from the nearest
    # measured one) on that GPU in the engine's fused MoE kernels (capacity/data/moe_latency.json, from
    # aiconfigurator's moe_perf tables; capacity/cost/moe_floor.py). No table for the GPU, engine or expert dtype:
    # the roofline alone. False: the roofline alone everywhere.
    measured_moe_floor: bool = True
    # (b) of capacity/cost/kernels.py: a step's fixed kernel time is at least vLLM's kernels per layer (counted per
    # family from its model code) x kernel_floor_s, one small kernel inside a replayed CUDA graph: 1.68 us on the
    # project's H200 (calibrate/profiles/llama-3.1-8b-h200.json, linear.elementwise at 1 token / 32 kernels).
    # False: the roofline's kernel_launch_s per op alone.
    kernel_count_floor: bool = True
    kernel_floor_s: Secs = 5.3632e-05 / 32
    # (c): the TP all-reduce vLLM runs (custom one-shot / two-shot on NVLink or 2 GPUs, else NCCL, whose ring latency
    # is NCCL's own tuning model); False: allreduce_latency_s + the ring's bytes for every call.
    allreduce_algorithms: bool = True
    # Whose all-reduce rules (c) follows (capacity/cost/kernels.py allreduce_plan): vLLM's and SGLang's CustomAllreduce,
    # TensorRT-LLM's AUTO strategy (PyTorch backend) or its engine backend's AllReduce plugin.
    allreduce_engine: Literal["vllm", "sglang", "trtllm", "trtllm-engine"] = "vllm"
