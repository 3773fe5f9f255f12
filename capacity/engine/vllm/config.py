"""vLLM's own settings: the fields of `VllmConfig`, the engine configuration of a `vllm[@X.Y[:v0]]` scenario, on top
of the settings every engine shares (`capacity.engine.config.EngineConfig`). Each is declared once with `setting(...)`
(capacity/engine/settings.py), as vLLM's `EngineArgs` (vllm/engine/arg_utils.py) names it; another engine's scenario
that sets one is refused when it is read (`max_loras 2: vLLM only (engine sglang does not have this setting)`).
`data_parallel_size`, which SGLang has too, is declared once on `DataParallelConfig`, which this class derives from."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from capacity.engine.config import DataParallelConfig, EngineConfig
from capacity.engine.settings import setting
from capacity.errors import ConfigError


class VllmConfig(DataParallelConfig):
    """vLLM's own settings, beside those every engine shares and data parallelism: pipeline and expert parallelism,
    LoRA, the large-GPU defaults, CUDA graphs in the budget, contiguous KV, KV offloading to host memory."""

    ENGINE: ClassVar[str] = "vllm"

    pipeline_parallel_size: Annotated[int, Field(gt=0, le=64)] = setting(
        1, description="vLLM's --pipeline-parallel-size: the layers split into this many stages "
        "(VLLM_PP_LAYER_PARTITION as pp_layer_partition), each on tensor_parallel_size GPUs; the engine keeps the "
        "blocks of its tightest stage.", flag="--pp", help="Pipeline-parallel stages (vLLM --pipeline-parallel-size)",
        cli_default=1, commands=("memory",), vllm="--pipeline-parallel-size")
    pp_layer_partition: Annotated[list[Annotated[int, Field(gt=0, le=10**4)]], Field(max_length=64)] | None = setting(
        None, description="Layers per pipeline stage, first to last (vLLM's VLLM_PP_LAYER_PARTITION); None: as "
        "vLLM's get_pp_indices splits them (even, the remainder one layer each to the stages before the last)")
    enable_expert_parallel: bool = setting(
        False, description="MoE experts split whole over tensor x data parallel ranks (vLLM's "
        "--enable-expert-parallel) instead of sharded by TP", flag="--enable-expert-parallel", set_to=True,
        help="MoE experts split whole over tp x dp ranks (vLLM --enable-expert-parallel)",
        vllm="--enable-expert-parallel")
    large_gpu_defaults: bool | None = setting(
        None, description="vLLM's larger batching defaults (1024 sequences; 8192 tokens for serve). None: the "
        "release's own test on the GPU (memory >= 70 GiB and, from 0.9, not an A100 by device name); True/False forces "
        "it.", flag="--large-gpu-defaults/--small-gpu-defaults", help="Force vLLM's large-GPU batching defaults on/off "
        "(default: the release's rule on memory and name)")
    cuda_graphs_in_budget: bool | None = setting(
        None, description="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: subtract the CUDA-graph estimate from the KV "
        "budget. None: the release's default (on from vLLM 0.20; before, graphs are captured outside "
        "gpu_memory_utilization).", flag="--cuda-graphs-in-budget/--cuda-graphs-outside-budget",
        help="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1/0 (default: the release's; on from vLLM 0.20)",
        commands=("memory",))
    paged_kv: bool = setting(
        True, description="False: contiguous per-sequence reservation of max_model_len slots", flag="--contiguous",
        set_to=False, help="Contiguous (non-paged) KV reservation", commands=("memory",))
    max_loras: Annotated[int, Field(ge=0, le=256)] = setting(
        0, description="LoRA adapters served beside the model (vLLM's --enable-lora --max-loras N --max-lora-rank R): "
        "their stacked A/B buffers are allocated while the model loads. 0: LoRA off.", flag="--max-loras",
        help="LoRA adapter slots (vLLM --enable-lora --max-loras); 0: LoRA off", cli_default=0, commands=("memory",),
        vllm="--max-loras")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = setting(
        16, description="the largest LoRA rank served (vLLM's --max-lora-rank); sizes the adapters' buffers",
        flag="--max-lora-rank", help="vLLM --max-lora-rank (with --max-loras)", cli_default=16, commands=("memory",),
        vllm="--max-lora-rank")
    kv_offloading_size: Annotated[float, Field(gt=0, le=1 << 20, allow_inf_nan=False)] | None = setting(
        None, description="KV offloading to host memory (vLLM's --kv-offloading-size, native backend: GiB, summed "
        "over the TP ranks): a write-through LRU tier under the prefix cache (capacity/sched/offload.py, "
        "docs/kv-offload.md). None: off.", flag="--kv-offload-gb", help="KV offloading to host memory, GiB summed "
        "over the TP ranks (vLLM's --kv-offloading-size; needs --prefix-caching; docs/kv-offload.md)",
        commands=("simulate",), vllm="--kv-offloading-size")
    host_link_gbps: Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)] | None = setting(
        None, description="GB/s from one GPU to host memory for those loads; None: the GPU's host link at its "
        "nominal x16 rate", flag="--host-link-gbps", help="--kv-offload-gb: GB/s from one GPU to host memory "
        "(default: its PCIe x16 rate)", commands=("simulate",))

    cpu_offload_gb: Annotated[float, Field(ge=0, le=1 << 20, allow_inf_nan=False)] = setting(
        0.0, description="vLLM's --cpu-offload-gb: GiB of weights per GPU kept in host memory (from vLLM 0.5.3): "
        "the decoder layers' parameters, first layer first, until at least this much is offloaded "
        "(capacity/engine/vllm/host_weights.py, docs/memory.md). 0: off.", flag="--cpu-offload-gb",
        help="GiB of weights per GPU kept in host memory (vLLM --cpu-offload-gb)", commands=("memory",),
        vllm="--cpu-offload-gb")
    kv_cache_memory_bytes: Annotated[int, Field(gt=0, le=1 << 50)] | None = setting(
        None, description="vLLM's --kv-cache-memory-bytes (V1 from vLLM 0.11): the KV cache of each GPU set by "
        "hand; the worker returns it instead of profiling, and gpu_memory_utilization is not applied to it. None: "
        "profiled.", flag="--kv-cache-memory-bytes", help="KV cache bytes per GPU set by hand (vLLM "
        "--kv-cache-memory-bytes, 0.11+; gpu_memory_utilization then does not size the KV cache)",
        commands=("memory",), vllm="--kv-cache-memory-bytes")

    def pp_size(self) -> int:
        return self.pipeline_parallel_size

    def expert_parallel(self) -> bool:
        return self.enable_expert_parallel


def vllm_config(cfg: EngineConfig) -> VllmConfig:
    """`cfg` as vLLM's configuration (the engine model's own settings typed); another engine's is an error."""
    if not isinstance(cfg, VllmConfig):
        raise ConfigError(f"engine {cfg.engine}: not a vLLM configuration ({type(cfg).__name__})")
    return cfg


__all__ = ["VllmConfig", "vllm_config"]
