"""Engine knobs (vLLM's names) and the defaults vLLM v1 derives when a knob is left unset.

Defaults mirror vLLM's `EngineArgs` (v0.10+ V1 engine): on a GPU that reports >= 70 GiB and is not an
A100, `vllm serve` uses max_num_batched_tokens 8192 and max_num_seqs 1024 (the LLM class: 16384/1024);
elsewhere 2048/256 (LLM class 8192/256). With chunked prefill off, max_num_batched_tokens is
max(max_model_len, 2048). Block size is 16 (64 for MLA, which FlashMLA needs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from capacity.errors import ConfigError
from capacity.gpus import GPU
from capacity.model_card import ModelCard
from capacity.units import GiB

PosInt = Annotated[int, Field(gt=0, le=10**9)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
KVDtype = Literal["auto", "fp8", "int8"]

LARGE_GPU_BYTES = 70 * GiB  # vLLM's threshold for its larger batching defaults


class MemoryModelParams(BaseModel):
    """Terms of the VRAM budget that are estimates, with the reasoning behind each default.

    Every field can be overridden in a scenario, and `capacity memory` says which terms are estimates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Non-torch memory that appears between vLLM's start-up snapshot and the end of its profiling run
    # (cuBLAS/cuBLASLt workspaces, attention-backend buffers). vLLM logs show 0.05-0.20 GiB at tp=1.
    non_torch_bytes: NonNegFloat = 0.12 * GiB
    # Extra at tp > 1: NCCL channel buffers and custom all-reduce staging created on the first
    # collective of the profiling run. Logged values range 0.3-1.8 GiB across versions; 0.5 is a middle.
    non_torch_multi_gpu_bytes: NonNegFloat = 0.5 * GiB
    # ... growing with the number of peers (per-peer NCCL connection buffers, IPC handles).
    non_torch_per_peer_bytes: NonNegFloat = 32 * 1024**2
    # vLLM V1's dummy sampler run over min(max_num_seqs, max_num_batched_tokens) rows of full-vocabulary
    # logits: the fp32 copy of the logits, softmax probabilities and the exponential noise tensor of the
    # random sampler = 3 x 4 B per logit, plus ~2 B of temporaries (top-k/top-p are skipped at profile).
    sampler_bytes_per_logit: NonNegFloat = 14.0
    # vLLM's fused MoE kernel processes at most this many tokens at once (VLLM_FUSED_MOE_CHUNK_SIZE).
    fused_moe_chunk_tokens: Annotated[int, Field(gt=0)] = 32768
    # CUDA context + kernels loaded before vLLM's snapshot: outside the budget, but must physically fit.
    cuda_context_bytes: NonNegFloat = 0.5 * GiB
    # CUDA-graph pool: activations of the largest captured batch plus per-graph bookkeeping for each
    # piecewise segment (one per layer + 1) and each full decode graph. vLLM logs 0.3-1 GiB for 7-70B.
    cuda_graph_bytes_per_segment: NonNegFloat = 128 * 1024


class EngineConfig(BaseModel):
    """vLLM serving knobs. `None` means "let the engine choose" (see resolve())."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel_size: PosInt = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.9
    max_model_len: PosInt | None = None
    max_num_seqs: PosInt | None = None
    max_num_batched_tokens: PosInt | None = None
    enable_chunked_prefill: bool = True
    block_size: Literal[1, 8, 16, 32, 64, 128, 256] | None = None
    kv_cache_dtype: KVDtype = "auto"
    enforce_eager: bool = False
    usage_context: Literal["serve", "llm"] = "serve"  # `vllm serve` or the offline LLM class
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 subtracts CUDA-graph memory from the KV budget; by
    # default (0) graphs are captured after the KV cache is allocated, outside gpu_memory_utilization.
    cuda_graphs_in_budget: bool = False
    paged_kv: bool = True  # False: contiguous per-sequence reservation of max_model_len slots
    # Measured overrides for the estimated terms (bytes); None = use the estimate.
    activation_bytes: NonNegFloat | None = None
    non_torch_bytes: NonNegFloat | None = None
    cuda_graph_bytes: NonNegFloat | None = None
    memory_params: MemoryModelParams = MemoryModelParams()


@dataclass(frozen=True)
class ResolvedEngine:
    """EngineConfig with every default filled in for one model on one GPU."""

    cfg: EngineConfig
    tp: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_dtype: str  # bf16/fp16/fp8/int8
    defaults_used: tuple[str, ...]  # which knobs took an engine default


def resolve(cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
    tp = cfg.tensor_parallel_size
    check_tp(card, tp)
    used: list[str] = []
    large = gpu.usable_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower()

    max_model_len = cfg.max_model_len
    if max_model_len is None:
        max_model_len = card.max_position_embeddings
        used.append("max_model_len")
    elif max_model_len > card.max_position_embeddings:
        raise ConfigError(
            f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
            f"{card.max_position_embeddings} ({card.name})"
        )

    max_num_seqs = cfg.max_num_seqs
    if max_num_seqs is None:
        max_num_seqs = 1024 if large else 256
        used.append("max_num_seqs")

    mnbt = cfg.max_num_batched_tokens
    if mnbt is None:
        used.append("max_num_batched_tokens")
        if cfg.enable_chunked_prefill:
            mnbt = {("serve", True): 8192, ("llm", True): 16384, ("serve", False): 2048, ("llm", False): 8192}[
                (cfg.usage_context, large)
            ]
        else:
            mnbt = max(max_model_len, 2048)
    if not cfg.enable_chunked_prefill and mnbt < max_model_len:
        raise ConfigError(
            f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({max_model_len}) with chunked "
            "prefill off: a full-length prompt could never be scheduled; raise it or enable chunked prefill"
        )
    if mnbt < max_num_seqs:
        raise ConfigError(
            f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({max_num_seqs}), as vLLM requires"
        )

    block_size = cfg.block_size
    if block_size is None:
        block_size = 64 if card.mla is not None else 16
        used.append("block_size")
    kv_dtype = card.dtype if cfg.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
    return ResolvedEngine(cfg, tp, max_model_len, max_num_seqs, mnbt, block_size, kv_dtype, tuple(used))


def check_tp(card: ModelCard, tp: int) -> None:
    """vLLM needs attention heads divisible by tp, and KV heads either divisible by tp or dividing it."""
    if card.num_attention_heads % tp:
        raise ConfigError(
            f"tensor_parallel_size {tp}: num_attention_heads ({card.num_attention_heads}) of {card.name} "
            f"is not divisible by {tp}"
        )
    if card.mla is None and card.num_kv_heads % tp and tp % card.num_kv_heads:
        raise ConfigError(
            f"tensor_parallel_size {tp}: num_kv_heads ({card.num_kv_heads}) of {card.name} neither divides "
            f"nor is divisible by {tp}"
        )


def cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then steps of 8 to 256, then steps of 16, up to
    min(2 x max_num_seqs, 512)."""
    top = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return [s for s in sizes if s <= top]
