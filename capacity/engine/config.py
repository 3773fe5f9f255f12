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

from capacity.engine.speculative import SpeculativeConfig
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.units import GiB

PosInt = Annotated[int, Field(gt=0, le=10**9)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
KVDtype = Literal["auto", "fp8", "int8"]


class MemoryModelParams(BaseModel):
    """Overrides for the estimated terms of the VRAM budget. `None` (the default) takes the engine release's
    own estimate (`capacity.engine.vllm`, with the logs each was checked on); a number replaces it.

    Every field can be set in a scenario, and `capacity memory` says which terms are estimates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Non-torch memory counted by the release's profiler at tp=1 (cuBLAS/attention workspaces; the CUDA
    # context too where the profiler measures device-wide). None: the release's logged value.
    non_torch_bytes: NonNegFloat | None = None
    # Extra at tp > 1 (NCCL and custom all-reduce buffers; NVLS buffers on NVSwitch boards). None: by board.
    non_torch_multi_gpu_bytes: NonNegFloat | None = None
    # ... growing with the number of peers.
    non_torch_per_peer_bytes: NonNegFloat | None = None
    # Bytes per logit of the profiling run's dummy sampler (None: derived from the release's sampler code).
    sampler_bytes_per_logit: NonNegFloat | None = None
    # vLLM's fused MoE kernel processes at most this many tokens at once (VLLM_FUSED_MOE_CHUNK_SIZE).
    fused_moe_chunk_tokens: Annotated[int, Field(gt=0)] = 32768
    # CUDA context + kernels loaded before vLLM's snapshot: outside the budget, but must physically fit.
    cuda_context_bytes: NonNegFloat = 0.5 * GiB
    # CUDA-graph memory per captured piece (one per layer + 1, per capture size). None: from the logs.
    cuda_graph_bytes_per_segment: NonNegFloat | None = None


class EngineConfig(BaseModel):
    """Serving knobs (vLLM's names). `None` means "let the engine choose" (the engine model resolves it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Which engine model resolves defaults, memory and scheduling: `vllm` (the current release), `vllm@0.11` (the
    # last patch of a release), `vllm@0.9.2:v0` (the V0 engine of a release that has both).
    engine: str = "vllm"
    tensor_parallel_size: PosInt = 1  # GPUs per replica (heads must divide it, as vLLM requires)
    # vLLM's --pipeline-parallel-size: the layers split into this many stages (VLLM_PP_LAYER_PARTITION as
    # pp_layer_partition), each on tensor_parallel_size GPUs; the engine keeps the blocks of its tightest stage.
    pipeline_parallel_size: Annotated[int, Field(gt=0, le=64)] = 1
    pp_layer_partition: Annotated[list[Annotated[int, Field(gt=0, le=10**4)]], Field(max_length=64)] | None = None
    # vLLM's --data-parallel-size (engines of their own, attention replicated) and --enable-expert-parallel
    # (experts split whole over tensor x data parallel ranks instead of sharded by TP)
    data_parallel_size: Annotated[int, Field(gt=0, le=1024)] = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.9  # share of the GPU's memory vLLM may use for weights, activations and KV
    max_model_len: PosInt | None = None  # longest request (prompt + output) accepted; None: the model's max_position_embeddings
    max_num_seqs: PosInt | None = None  # batch cap; None: the release's default (see large_gpu_defaults)
    max_num_batched_tokens: PosInt | None = None  # token budget per step; None: the release's default
    # Split long prompts across steps. None: the release's default (V1: on; V0: on by itself above 32k tokens).
    enable_chunked_prefill: bool | None = None
    # Off unless asked (vLLM's own default is on): the launch command spells the choice out, so the engine runs
    # what was simulated. On: vLLM's block-level cache, shared prefixes and a preempted request's own blocks.
    enable_prefix_caching: bool = False
    # The engine schedules the next step while the last one runs (vLLM's async scheduling, SGLang's overlap
    # scheduler), so a finished request keeps its blocks and its batch slot one step longer (vLLM: sliding-window
    # groups also reserve two batches in flight). None: the engine's default (vLLM: on from 0.32's code, where
    # the CPU build turns it off; SGLang: on).
    async_scheduling: bool | None = None
    block_size: Literal[1, 8, 16, 32, 64, 128, 256] | None = None  # tokens per KV block; None: 16 (64 for MLA models)
    kv_cache_dtype: KVDtype = "auto"  # auto: the model's dtype; fp8/int8 halve KV memory and the bytes attention reads
    enforce_eager: bool = False  # no CUDA graphs (no graph memory; steps are not replays)
    # continuous = vLLM's fcfs; priority = vLLM's --scheduling-policy priority; sjf = continuous batching that
    # serves the shortest prompt first (not a vLLM policy: a what-if); static = collect-a-batch serving.
    policy: str = "continuous"  # one of capacity.sched.POLICIES
    static_max_batch: PosInt | None = None  # static policy: batch size (default: max_num_seqs)
    static_max_wait_s: NonNegFloat = 0.0  # static policy: how long the first request may wait for a batch
    # KV reserved when a request is admitted. prompt: its input (vLLM; outputs take blocks as they grow, and a
    # full cache preempts); prompt_and_output: input and every output token up front, so nothing is ever
    # preempted (TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler, its default). None: the engine's own.
    kv_reservation: Literal["prompt", "prompt_and_output"] | None = None
    # CPU time per engine step that the GPU waits for (scheduling, input preparation, output processing), ms.
    # None: the engine model's figure (2 ms for vLLM, not yet checked against a measured run); a measured run
    # fits it (see docs/fidelity.md). Applies to the roofline; a calibrated profile keeps its fitted overhead.
    step_overhead_ms: Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)] | None = None
    # CPU time the server spends per output token beside the engine (detokenising, streaming: vLLM's API server
    # process, SGLang's detokenizer), overlapped with the GPU: a step lasts at least this x the tokens it emits,
    # which caps output at 1/this tokens/s (capacity/cost/overlap.py), us. None: not modelled (the server's figure
    # on its CPU is not known in advance; measure it).
    output_cpu_us_per_token: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    usage_context: Literal["serve", "llm"] = "serve"  # `vllm serve` or the offline LLM class (different defaults)
    # vLLM's larger batching defaults (1024 sequences; 8192 tokens for serve). None: the release's own test on
    # the GPU (memory >= 70 GiB and, from 0.9, not an A100 by device name); True/False forces it.
    large_gpu_defaults: bool | None = None
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: subtract the CUDA-graph estimate from the KV budget. None: the
    # release's default (on from vLLM 0.20; before, graphs are captured outside gpu_memory_utilization).
    cuda_graphs_in_budget: bool | None = None
    # Which end of the predicted KV range the planner and the simulator use: conservative (the default: the
    # blocks the engine will have even if every estimated term is at the high end of its range) or middle.
    kv_estimate: Literal["conservative", "middle"] = "conservative"
    paged_kv: bool = True  # False: contiguous per-sequence reservation of max_model_len slots
    num_gpu_blocks_override: PosInt | None = None  # vLLM's --num-gpu-blocks-override: KV blocks as given
    # LoRA adapters served beside the model (vLLM's --enable-lora --max-loras N --max-lora-rank R): their stacked
    # A/B buffers are allocated while the model loads. 0: LoRA off.
    max_loras: Annotated[int, Field(ge=0, le=256)] = 0
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16
    # Measured overrides for the estimated terms (bytes); None = use the estimate.
    activation_bytes: NonNegFloat | None = None
    non_torch_bytes: NonNegFloat | None = None  # measured non-torch memory, bytes
    cuda_graph_bytes: NonNegFloat | None = None  # measured CUDA-graph memory, bytes
    memory_params: MemoryModelParams = MemoryModelParams()  # the estimated terms' parameters (below)
    # Speculative decoding (vLLM's --speculative-config, SGLang's --speculative-algorithm ...): method, drafts per
    # step, the acceptance assumed; None: off. See capacity/engine/speculative.py and docs/speculative.md.
    speculative: SpeculativeConfig | None = None
    # KV offloading to host memory (vLLM's --kv-offloading-size, native backend: GiB, summed over the TP ranks): a
    # write-through LRU tier under the prefix cache (capacity/sched/offload.py, docs/kv-offload.md). None: off.
    kv_offloading_size: Annotated[float, Field(gt=0, le=1 << 20, allow_inf_nan=False)] | None = None
    # GB/s from one GPU to host memory for those loads; None: the GPU's host link at its nominal x16 rate
    host_link_gbps: Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)] | None = None

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
        from capacity.engine.registry import get_engine

        try:
            get_engine(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
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
    chunked_prefill: bool = True  # as resolved (the release's default where the config says None)
    cuda_graphs_in_budget: bool = False
    large_gpu_defaults: bool = False  # whether the large-GPU batching defaults applied
    release: str = "vllm"  # the engine release that resolved it


def resolve_max_model_len(cfg: EngineConfig, card: ModelCard, used: list[str]) -> int:
    """max_model_len as every engine fills it in: the configured one (at most the model's
    max_position_embeddings), else the model's whole context (recorded in `used`)."""
    if cfg.max_model_len is None:
        used.append("max_model_len")
        return card.max_position_embeddings
    if cfg.max_model_len > card.max_position_embeddings:
        raise ConfigError(f"max_model_len {cfg.max_model_len} exceeds the model's max_position_embeddings "
                          f"{card.max_position_embeddings} ({card.name})")
    return cfg.max_model_len
