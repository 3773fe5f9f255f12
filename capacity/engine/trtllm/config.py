"""TensorRT-LLM's configuration: `TrtllmConfig`, the engine configuration of a `trtllm[@X.Y][:backend]` scenario.
TensorRT-LLM's own settings are declared here with `setting(...)` (capacity/engine/settings.py), as `trtllm-serve`
(tensorrt_llm/commands/serve.py) names them; the shared ones are `capacity.engine.config.EngineConfig`'s, and another
engine's (vLLM's `max_loras`, `data_parallel_size` ...) are refused when the configuration is read, as this one's
`trtllm_backend` is under another engine."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from capacity.engine.config import EngineConfig
from capacity.engine.settings import setting


class TrtllmConfig(EngineConfig):
    """TensorRT-LLM's own settings, beside those every engine shares: the backend that serves. (Its flags for the
    shared ones: `trtllm=` in each declaration.)"""

    ENGINE: ClassVar[str] = "trtllm"

    trtllm_backend: Literal["pytorch", "engine"] | None = setting(
        None, description="TensorRT-LLM only: the backend that serves (trtllm-serve --backend): pytorch (the PyTorch "
        "backend's profiled start-up) or engine (the TensorRT engine (C++) backend: the engine's activation memory "
        "fixed at build, runtime and decoder buffers, then free_gpu_memory_fraction of what is free; "
        "capacity/engine/trtllm/cpp_memory.py). None: the release's default (trtllm@X.Y:pytorch|tensorrt names one).",
        flag="--trtllm-backend", help="TensorRT-LLM backend: pytorch or engine (default: the release's)")
    moe_expert_parallel_size: Annotated[int, Field(gt=0, le=1024)] | None = setting(
        None, description="TensorRT-LLM only: trtllm-serve --ep_size (LlmArgs.moe_expert_parallel_size): the MoE "
        "experts split whole over this many of the tensor_parallel_size ranks, each expert's intermediate "
        "dimension over the other tensor_parallel_size / ep (Mapping: moe_tp x moe_ep x moe_cluster = tp); "
        "attention stays tensor parallel. None: 1 (Mapping's default, the experts TP-sharded). PyTorch backend "
        "only; must divide tensor_parallel_size and the model's expert count (capacity/engine/trtllm/parallel.py)",
        flag="--trtllm-ep-size", help="TensorRT-LLM expert parallelism (trtllm-serve --ep_size): experts whole over "
        "this many of the --tp ranks", trtllm="--ep_size")
    trtllm_vswa: bool = setting(
        False, description="TensorRT-LLM only: write kv_cache_config.max_attention_window with the model's windows "
        "(sliding_window for its sliding layers, max_seq_len for the rest): a KV pool per window size (variable "
        "sliding-window attention, VSWA) instead of one pool at full attention over every layer, TensorRT-LLM's "
        "default. PyTorch backend 1.0-1.2 only (capacity/engine/trtllm/vswa.py)", flag="--trtllm-vswa", set_to=True,
        help="TensorRT-LLM: a KV pool per attention window (kv_cache_config.max_attention_window)")
    trtllm_attention_dp: bool = setting(
        False, description="TensorRT-LLM only: enable_attention_dp (LlmArgs): attention, dense MLPs, embeddings and "
        "the LM head whole on every one of the tensor_parallel_size ranks, the MoE experts split over them, a KV "
        "pool (KV heads unsplit) and a batch per rank; simulate and plan step the ranks in lock step "
        "(capacity/engine/lockstep.py). PyTorch backend, MoE models (capacity/engine/trtllm/parallel.py)",
        flag="--trtllm-attention-dp", set_to=True,
        help="TensorRT-LLM attention data parallelism (enable_attention_dp)")
    trtllm_host_us_per_request: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = setting(
        None, description="TensorRT-LLM only: the PyTorch executor's host (CPU) time per scheduled request per "
        "iteration, us (scheduling, input preparation, token update, responses: capacity/engine/trtllm_host.py), on "
        "top of the fixed step_overhead_ms; overlapped with the GPU under the overlap scheduler (a step lasts the "
        "longer), added without it. None: the release's measured figure (none yet: off). Read it from a "
        "print_iter_log log: host_step_time over num_scheduled_requests where the host is slower than the GPU",
        flag="--trtllm-host-us", help="TensorRT-LLM PyTorch executor host us per scheduled request per step "
        "(default: the release's measured figure; none yet)", commands=("simulate", "plan"))


def trtllm_backend(cfg: EngineConfig) -> Literal["pytorch", "engine"] | None:
    """The backend `cfg` names (None: the release's; a probe built as another engine's configuration names none)."""
    return cfg.trtllm_backend if isinstance(cfg, TrtllmConfig) else None


def trtllm_ep_size(cfg: EngineConfig) -> int:
    """The expert-parallel size `cfg` names (1: none, or a probe built as another engine's configuration)."""
    ep = cfg.moe_expert_parallel_size if isinstance(cfg, TrtllmConfig) else None
    return 1 if ep is None else ep


def trtllm_vswa(cfg: EngineConfig) -> bool:
    """Whether `cfg` asks for a KV pool per attention window (False: none, or another engine's configuration)."""
    return cfg.trtllm_vswa if isinstance(cfg, TrtllmConfig) else False


def trtllm_attention_dp(cfg: EngineConfig) -> bool:
    """Whether `cfg` turns on attention data parallelism (False: off, or another engine's configuration)."""
    return cfg.trtllm_attention_dp if isinstance(cfg, TrtllmConfig) else False


__all__ = ["TrtllmConfig", "trtllm_attention_dp", "trtllm_backend", "trtllm_ep_size", "trtllm_vswa"]
