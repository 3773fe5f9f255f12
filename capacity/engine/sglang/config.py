"""SGLang's configuration: `SglangConfig`, the engine configuration of an `sglang[@X.Y]` scenario. SGLang's own
settings are declared here with `setting(...)` (capacity/engine/settings.py), as SGLang's `ServerArgs`
(python/sglang/srt/server_args.py) names them; the shared ones are `capacity.engine.config.EngineConfig`'s (and
`data_parallel_size`, `DataParallelConfig`'s, which vLLM has too), and another engine's (vLLM's `max_loras`,
`pipeline_parallel_size` ...) are refused when the configuration is read."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from capacity.engine.config import DataParallelConfig, EngineConfig
from capacity.engine.settings import setting


class SglangConfig(DataParallelConfig):
    """SGLang's own settings, beside those every engine shares and data parallelism: DP attention. (SGLang's flags
    for the shared ones: `sglang=` in each declaration.)"""

    ENGINE: ClassVar[str] = "sglang"

    enable_dp_attention: bool = setting(
        False, description="SGLang's --enable-dp-attention with --dp data_parallel_size: attention runs data-parallel "
        "inside the tensor_parallel_size GPUs (attention TP = tp / dp, each attention rank its own scheduler and KV "
        "pool; MLP and experts stay TP over tp; simulate and plan step the ranks in lock step). SGLang only "
        "(capacity/engine/sglang/dpattn.py, capacity/engine/lockstep.py).",
        flag="--enable-dp-attention", set_to=True, help="SGLang DP attention over --dp ranks inside the --tp GPUs "
        "(--engine sglang)", sglang="--enable-dp-attention")

    mem_fraction_static: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = setting(
        None, description="SGLang's --mem-fraction-static F: weights + KV pool as a share of the free memory at "
        "start-up (T0). None: the release's default rule (capacity/engine/sglang/releases.py). In an engine "
        "block; `capacity memory --engine sglang` takes it as --mem-fraction-static.", sglang="--mem-fraction-static")
    ep_size: Annotated[int, Field(gt=0, le=1024)] = setting(
        1, description="SGLang's --ep-size (0.5.x; 0.4.1-0.5.2's --enable-ep-moe sets it to tensor_parallel_size): "
        "MoE experts split whole over ep_size ranks of the tensor_parallel_size GPUs (each expert's intermediate "
        "over tp / ep_size), attention and dense layers still TP over tp. Must divide tensor_parallel_size; SGLang "
        "only (capacity/engine/sglang/ep.py).", flag="--ep-size", help="SGLang expert parallelism: experts split "
        "whole over this many of the --tp GPUs (--engine sglang)", cli_default=1, commands=("memory",),
        sglang="--ep-size")

    enable_lora: bool = setting(
        False, description="SGLang's --enable-lora: LoRA adapters served beside the model; LoRAMemoryPool's A/B "
        "buffers (max_loras_per_batch slots of lora_rank on lora_target_modules) are allocated after the weights, "
        "before the KV pool is sized (capacity/engine/sglang/lora.py). SGLang only; dense models, 0.5.2+ rules.",
        sglang="--enable-lora")
    max_loras_per_batch: Annotated[int, Field(gt=0, le=1024)] = setting(
        8, description="SGLang's --max-loras-per-batch (default 8): the adapter slots of the LoRA buffers",
        sglang="--max-loras-per-batch")
    lora_rank: Annotated[int, Field(gt=0, le=1024)] | None = setting(
        None, description="SGLang's --max-lora-rank (named apart from vLLM's max_lora_rank, another engine's field): "
        "the largest adapter rank, which sizes the LoRA buffers. Needed with enable_lora (SGLang infers it from "
        "--lora-paths, which capacity does not read)", sglang="--max-lora-rank")
    lora_target_modules: list[str] | None = setting(
        None, description="SGLang's --lora-target-modules (q_proj ... down_proj, qkv_proj, gate_up_proj, from 0.5.9 "
        "embed_tokens and lm_head, or all). None: all, the most memory (SGLang infers them from --lora-paths)")

    moe_a2a_backend: Literal["none", "deepep"] = setting(
        "none", description="SGLang's --moe-a2a-backend (0.5.x; 0.4.x --enable-deepep-moe): deepep runs the MoE "
        "all-to-all through DeepEP, whose buffers are made at the first forward, out of the reserve T0 x (1 - F), and "
        "sets ep_size = tensor_parallel_size (capacity/engine/sglang/deepep.py)", sglang="--moe-a2a-backend")
    deepep_mode: Literal["auto", "normal", "low_latency"] = setting(
        "auto", description="SGLang's --deepep-mode: which DeepEP buffers are made (auto: both the normal NVLink and "
        "the low-latency RDMA buffer)", sglang="--deepep-mode")
    deepep_max_dispatch_tokens_per_rank: Annotated[int, Field(gt=0, le=1024)] = setting(
        128, description="SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (an environment variable, 128 by default): "
        "sizes DeepEP's low-latency buffer")

    @model_validator(mode="after")
    def _ep_size(self) -> SglangConfig:  # ServerArgs: moe_tp_size = tp_size // ep_size
        if self.ep_size > 1 and self.tensor_parallel_size % self.ep_size:
            raise ValueError(f"ep_size: {self.ep_size} must divide tensor_parallel_size {self.tensor_parallel_size} "
                             "(SGLang splits the experts over ep_size of the tp ranks)")
        return self

    def expert_parallel(self) -> bool:
        return self.ep_size > 1 and self.ep_size == self.tensor_parallel_size

    def dp_size(self) -> int:
        """Data-parallel replicas of tp GPUs: 1 with DP attention, whose dp ranks share the tp GPUs of one replica
        (capacity/engine/lockstep.py steps them)."""
        return 1 if self.enable_dp_attention else self.data_parallel_size

    @model_validator(mode="after")
    def _dp_attention(self) -> SglangConfig:  # enable_dp_attention's own checks (SGLang's _handle_data_parallelism)
        if self.enable_dp_attention:
            dp, tp = self.data_parallel_size, self.tensor_parallel_size
            if dp < 2 or tp % dp:
                raise ValueError(f"enable_dp_attention: data_parallel_size {dp} must be > 1 and divide "
                                 f"tensor_parallel_size {tp} (SGLang asserts tp_size % dp_size == 0)")
        return self


def mem_fraction(cfg: EngineConfig) -> float | None:
    """SGLang's --mem-fraction-static when the configuration sets it (None: the release's default)."""
    return cfg.mem_fraction_static if isinstance(cfg, SglangConfig) else None


def ep_size(cfg: EngineConfig) -> int:
    """SGLang's --ep-size (sglang/ep.py), 1 when off (or not SGLang's configuration)."""
    return cfg.ep_size if isinstance(cfg, SglangConfig) else 1


def lora(cfg: EngineConfig) -> tuple[int, int | None, list[str] | None] | None:
    """(max_loras_per_batch, lora_rank, lora_target_modules) with --enable-lora (sglang/lora.py), else None."""
    if isinstance(cfg, SglangConfig) and cfg.enable_lora:
        return cfg.max_loras_per_batch, cfg.lora_rank, cfg.lora_target_modules
    return None


def deepep(cfg: EngineConfig) -> tuple[str, int] | None:
    """(deepep_mode, max dispatch tokens per rank) with --moe-a2a-backend deepep (sglang/deepep.py), else None."""
    if isinstance(cfg, SglangConfig) and cfg.moe_a2a_backend == "deepep":
        return cfg.deepep_mode, cfg.deepep_max_dispatch_tokens_per_rank
    return None


def dp_attention(cfg: EngineConfig) -> int:
    """DP attention's dp size (`--dp N --enable-dp-attention`; sglang/dpattn.py), 1 when off (or not SGLang's)."""
    return cfg.data_parallel_size if isinstance(cfg, SglangConfig) and cfg.enable_dp_attention else 1


__all__ = ["SglangConfig", "deepep", "dp_attention", "ep_size", "lora", "mem_fraction"]
