"""SGLang's configuration: `SglangConfig`, the engine configuration of an `sglang[@X.Y]` scenario. SGLang's own
settings are declared here with `setting(...)` (capacity/engine/settings.py), as SGLang's `ServerArgs`
(python/sglang/srt/server_args.py) names them; the shared ones are `capacity.engine.config.EngineConfig`'s (and
`data_parallel_size`, `DataParallelConfig`'s, which vLLM has too), and another engine's (vLLM's `max_loras`,
`pipeline_parallel_size` ...) are refused when the configuration is read."""
from __future__ import annotations

from typing import Annotated, ClassVar

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


def dp_attention(cfg: EngineConfig) -> int:
    """DP attention's dp size (`--dp N --enable-dp-attention`; sglang/dpattn.py), 1 when off (or not SGLang's)."""
    return cfg.data_parallel_size if isinstance(cfg, SglangConfig) and cfg.enable_dp_attention else 1


__all__ = ["SglangConfig", "dp_attention", "ep_size", "mem_fraction"]
