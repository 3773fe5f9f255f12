"""SGLang's configuration: `SglangConfig`, the engine configuration of an `sglang[@X.Y]` scenario. SGLang's own
settings are declared here with `setting(...)` (capacity/engine/settings.py), as SGLang's `ServerArgs`
(python/sglang/srt/server_args.py) names them; the shared ones are `capacity.engine.config.EngineConfig`'s (and
`data_parallel_size`, `DataParallelConfig`'s, which vLLM has too), and another engine's (vLLM's `max_loras`,
`pipeline_parallel_size` ...) are refused when the configuration is read."""
from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from capacity.engine.config import DataParallelConfig, EngineConfig
from capacity.engine.settings import setting


class SglangConfig(DataParallelConfig):
    """SGLang's own settings, beside those every engine shares and data parallelism: DP attention. (SGLang's flags
    for the shared ones: `sglang=` in each declaration.)"""

    ENGINE: ClassVar[str] = "sglang"

    enable_dp_attention: bool = setting(
        False, description="SGLang's --enable-dp-attention with --dp data_parallel_size: attention runs data-parallel "
        "inside the tensor_parallel_size GPUs (attention TP = tp / dp, each attention rank its own scheduler and KV "
        "pool; MLP and experts stay TP over tp). SGLang only (capacity/engine/sglang/dpattn.py).",
        flag="--enable-dp-attention", set_to=True, help="SGLang DP attention over --dp ranks inside the --tp GPUs "
        "(--engine sglang)", commands=("memory",), sglang="--enable-dp-attention")

    @model_validator(mode="after")
    def _dp_attention(self) -> SglangConfig:  # enable_dp_attention's own checks (SGLang's _handle_data_parallelism)
        if self.enable_dp_attention:
            dp, tp = self.data_parallel_size, self.tensor_parallel_size
            if dp < 2 or tp % dp:
                raise ValueError(f"enable_dp_attention: data_parallel_size {dp} must be > 1 and divide "
                                 f"tensor_parallel_size {tp} (SGLang asserts tp_size % dp_size == 0)")
        return self


def dp_attention(cfg: EngineConfig) -> int:
    """DP attention's dp size (`--dp N --enable-dp-attention`; sglang/dpattn.py), 1 when off (or not SGLang's)."""
    return cfg.data_parallel_size if isinstance(cfg, SglangConfig) and cfg.enable_dp_attention else 1


__all__ = ["SglangConfig", "dp_attention"]
