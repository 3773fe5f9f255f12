"""The engine configuration: every serving knob the project models, in vLLM's names, one strict pydantic
model (`EngineConfig`) used by every command, the planner, the dashboard and validation. `None` means "let
the engine choose": the engine model (`capacity.engine.vllm`) resolves it the way that engine does.

Strict: a YAML `true` is not the integer 1, `8192.0` is not a token count, and an unknown knob (a typo such as
`max_num_seqz`) is an error naming the field, not a silently ignored setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.units import GiB

PosInt = Annotated[int, Field(gt=0, le=10**9)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
KVDtype = Literal["auto", "fp8", "int8"]


class MemoryModelParams(BaseModel):
    """Terms of the VRAM budget that are estimates, with the reasoning behind each default.

    Every field can be overridden in a scenario, and `capacity memory` says which terms are estimates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

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
    """Serving knobs (vLLM's names). `None` means "let the engine choose" (the engine model resolves it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    engine: str = "vllm"  # which engine model (capacity.engine.ENGINES) resolves defaults, memory and scheduling
    tensor_parallel_size: PosInt = 1  # GPUs per replica (heads must divide it, as vLLM requires)
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.9  # share of the GPU's memory vLLM may use for weights, activations and KV
    max_model_len: PosInt | None = None  # longest request (prompt + output) accepted; None: the model's max_position_embeddings
    max_num_seqs: PosInt | None = None  # batch cap; None: 1024 on GPUs >= 70 GiB (not A100), else 256
    max_num_batched_tokens: PosInt | None = None  # token budget per step; None: 8192 on GPUs >= 70 GiB (not A100), else 2048
    enable_chunked_prefill: bool = True  # split long prompts across steps (vLLM v1 always on); off: a prompt waits for a step of its own
    # Off unless asked: the simulator shares KV only between requests of a workload's prefix groups, so the
    # default changes nothing without them; the launch command spells the choice out either way.
    enable_prefix_caching: bool = False
    block_size: Literal[1, 8, 16, 32, 64, 128, 256] | None = None  # tokens per KV block; None: 16 (64 for MLA models)
    kv_cache_dtype: KVDtype = "auto"  # auto: the model's dtype; fp8/int8 halve KV memory and the bytes attention reads
    enforce_eager: bool = False  # no CUDA graphs (no graph memory; steps are not replays)
    # continuous = vLLM's fcfs; priority = vLLM's --scheduling-policy priority; sjf = continuous batching that
    # serves the shortest prompt first (not a vLLM policy: a what-if); static = collect-a-batch serving.
    policy: str = "continuous"  # one of capacity.sched.POLICIES
    static_max_batch: PosInt | None = None  # static policy: batch size (default: max_num_seqs)
    static_max_wait_s: NonNegFloat = 0.0  # static policy: how long the first request may wait for a batch
    usage_context: Literal["serve", "llm"] = "serve"  # `vllm serve` or the offline LLM class
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 subtracts CUDA-graph memory from the KV budget; by
    # default (0) graphs are captured after the KV cache is allocated, outside gpu_memory_utilization.
    cuda_graphs_in_budget: bool = False
    paged_kv: bool = True  # False: contiguous per-sequence reservation of max_model_len slots
    num_gpu_blocks_override: PosInt | None = None  # vLLM's --num-gpu-blocks-override: KV blocks as given
    # Measured overrides for the estimated terms (bytes); None = use the estimate.
    activation_bytes: NonNegFloat | None = None
    non_torch_bytes: NonNegFloat | None = None  # measured non-torch memory, bytes
    cuda_graph_bytes: NonNegFloat | None = None  # measured CUDA-graph memory, bytes
    memory_params: MemoryModelParams = MemoryModelParams()  # the estimated terms' parameters (below)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        from capacity.sched import POLICIES

        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}: use {', '.join(POLICIES)}")
        return v

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        from capacity.engine import ENGINES

        if v not in ENGINES:
            raise ValueError(f"unknown engine {v!r}: use {', '.join(ENGINES)}")
        return v


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
