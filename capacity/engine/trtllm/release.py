"""What changes between TensorRT-LLM releases for `trtllm-serve MODEL` with no flags: which backend runs (the
TensorRT engine backend or the PyTorch backend), its batch and token limits, the KV block size, and whether the
engine backend's dynamic batch size tuning is on. docs/trtllm.md ("Defaults by release") has each term's file,
function and where it was read.

An engine string is `trtllm` (the current release, 1.1, its default PyTorch backend), `trtllm@0.20` (that
release with the backend `trtllm-serve` picks by default) or `trtllm@VERSION:tensorrt` / `:pytorch` (the other
backend, `--backend`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from capacity.errors import ConfigError

Backend = Literal["pytorch", "tensorrt"]
KvProfile = Literal["forward", "executor", "creator"]

# Release lines modelled, oldest first, with the backend `trtllm-serve` runs when `--backend` is not given:
# 0.17-0.20: `--backend` is click.Choice(["pytorch"]), default None, "Set to 'pytorch' for pytorch path. Default is
#   cpp path." (tensorrt_llm/commands/serve.py; the 0.18.2 docs page commands/trtllm-serve.html prints it) -> the
#   TensorRT engine backend; the PyTorch backend exists from 0.17 ("available in version 0.17 and later", torch.md).
# 0.21: the engine backend still: PyTorch became the LLM API's default in NVIDIA/TensorRT-LLM PR 5312 ("promote
#   PyTorch to be the default LLM backend", 2025-06-18), landed on main after "we have already branch out 0.21
#   branch" (its review); issue 8223: "v0.21.0 ... Backend: TRT Engine (default)", 1.0.0 "PyTorch (default)".
# 1.0, 1.1, 1.2: `--backend` is Choice(["pytorch", "tensorrt", ...]), default "pytorch" (serve.py `get_llm_args(...,
#   backend: str = "pytorch", ...)` at commit 00209af, a 1.2-era main with the gRPC server).
# 0.13: the engine backend only (an engine from trtllm-build, served by the C++ executor: Triton's tensorrtllm
#   backend or the executor API; no PyTorch backend, no trtllm-serve), with trtllm-build's defaults.
DEFAULT_BACKEND: dict[str, Backend] = {"0.13": "tensorrt", "0.17": "tensorrt", "0.18": "tensorrt", "0.19": "tensorrt",
                                       "0.20": "tensorrt", "0.21": "tensorrt", "1.0": "pytorch", "1.1": "pytorch",
                                       "1.2": "pytorch"}
CURRENT = "1.1"
# BuildConfig.max_batch_size / max_num_tokens: trtllm-serve's `--max_batch_size` / `--max_num_tokens` defaults are
# BuildConfig's (`default=BuildConfig.max_batch_size`, later `BuildConfig.model_fields["max_batch_size"].default`),
# 2048 and 8192 in every release line modelled (2048 from 0.14; 256 before, docs/trtllm.md)
MAX_BATCH_SIZE = 2048
MAX_NUM_TOKENS = 8192
MAX_BATCH_SIZE_BEFORE_0_14 = 256  # trtllm-build's --max_batch_size default through 0.13 (docs/trtllm.md)
ENGINE_ONLY = ("0.13",)  # release lines before the PyTorch backend (0.17)


@dataclass(frozen=True)
class TrtllmRelease:
    """One release line and the backend it runs."""

    version: str
    backend: Backend

    @property
    def label(self) -> str:
        base = f"trtllm@{self.version}"
        return base if self.backend == DEFAULT_BACKEND[self.version] else f"{base}:{self.backend}"

    @property
    def engine_backend(self) -> bool:
        return self.backend == "tensorrt"

    @property
    def max_batch_size(self) -> int:
        return MAX_BATCH_SIZE_BEFORE_0_14 if self.version in ENGINE_ONLY else MAX_BATCH_SIZE

    @property
    def max_num_tokens(self) -> int:
        return MAX_NUM_TOKENS

    @property
    def tokens_per_block(self) -> int:
        """PluginConfig.tokens_per_block, the engine build's default: 64 through 0.18 and 32 from 0.19 (paged
        context FMHA; docs/trtllm.md, the TensorRT engine backend). The PyTorch backend of 0.17-0.18 takes the same
        (`_torch/pyexecutor/config.py` `update_executor_config`: `executor_config.tokens_per_block =
        build_config.plugin_config.tokens_per_block`, the PyTorchConfig copies with `enable_overlap_scheduler:
        bool = False`); 1.x's KvCacheConfig.tokens_per_block is 32."""
        return 64 if self.version in ("0.13", "0.17", "0.18") else 32

    @property
    def _early(self) -> bool:
        """0.17-0.18: trtllm-serve's `main` builds the LLM from LlmArgs.from_kwargs(build_config, kv_cache_config,
        ...) with no SchedulerConfig and no PyTorchConfig (the LLM API's defaults)."""
        return self.version in ("0.13", "0.17", "0.18")

    def with_backend(self, setting: str | None) -> TrtllmRelease:
        """This release line with the backend the `trtllm_backend` setting names (`engine`: the TensorRT engine
        backend, `pytorch`; None: this one). A release line without the PyTorch backend refuses it in one line."""
        if setting is None:
            return self
        backend: Backend = "tensorrt" if setting == "engine" else "pytorch"
        if backend == "pytorch" and self.version in ENGINE_ONLY:
            raise ConfigError(f"trtllm_backend {setting}: TensorRT-LLM {self.version} has only the engine backend "
                              "(the PyTorch backend is from 0.17)")
        return TrtllmRelease(self.version, backend)

    @property
    def kv_profile(self) -> KvProfile:
        """How the PyTorch backend measures the peak its KV pool is sized from (`_torch/pyexecutor/_util.py`;
        docs/trtllm.md, "The PyTorch backend's KV estimate by release"):

        - "forward" (0.17): `estimate_max_kv_cache_tokens(model_engine, executor_config, mapping)` runs one
          `model_engine.forward` of dummy context requests of max_num_tokens in all, with no KV manager at all;
          peak = torch's peak allocated + (device used - torch allocated); tokens = int((total - peak) x fraction
          // bytes per token). CUDA graphs (PyTorchConfig.use_cuda_graph, off by default) are not captured yet.
        - "executor" (0.18-0.21): `estimate_max_kv_cache_tokens(py_executor, ...)` (earlier
          `..._maybe_update_executor`) enqueues the dummy requests into a started PyExecutor whose temporary KV
          pool holds `get_token_num_for_estimation` = max(max_batch_size, max_num_tokens, max_seq_len) tokens
          (later + ceil(max_num_tokens / max_seq_len) x tokens_per_block, capped at 0.9 of what is free);
          `cal_max_tokens` adds that pool back: (total - peak + pool) x fraction (the first copy adds back its
          unused blocks only: (max_num_blocks - used_num_blocks) x tokens_per_block, the used ones freed when the
          dummy requests finish).
        - "creator" (1.0+): `KvCacheCreator.estimate_max_tokens` / `_cal_max_memory`, the same formula with the
          temporary pool's allocated bytes added back, after the warm-up that captures the CUDA graphs and runs
          the autotuner."""
        if self.version == "0.17":
            return "forward"
        return "creator" if self.version.startswith("1.") else "executor"

    @property
    def cuda_graphs_default(self) -> tuple[bool, bool]:
        """Whether the PyTorch backend captures decode CUDA graphs with no options (low end, high end):
        PyTorchConfig.use_cuda_graph / TorchLlmArgs.use_cuda_graph default False through 0.21; from 1.0
        TorchLlmArgs.cuda_graph_config has default_factory=CudaGraphConfig (on): NVIDIA/TensorRT-LLM PR 5480
        ("Enable cuda graph by default", opened 2025-06-25, after the 0.21 branch). A pair, so that a release
        read less surely can say (False, True): a range."""
        return (True, True) if self.version.startswith("1.") else (False, False)

    @property
    def dynamic_batch_tuning(self) -> bool:
        """From 0.19 trtllm-serve's `get_llm_args` passes SchedulerConfig(GUARANTEED_NO_EVICT, DynamicBatchConfig(
        enable_batch_size_tuning=True, ...)); the tuner runs in the C++ executor (executorImpl.cpp forwardAsync),
        i.e. the engine backend only."""
        return self.engine_backend and not self._early

    @property
    def overlap_scheduler_default(self) -> bool:
        """The PyTorch backend's overlap scheduler: off by default in 0.17-0.18 (PyTorchConfig's
        enable_overlap_scheduler, which trtllm-serve does not set), set on by trtllm-serve from 0.19
        (`PyTorchConfig(enable_overlap_scheduler=True) if backend == "pytorch"`), on by default in 1.x
        (disable_overlap_scheduler False); the engine backend has none."""
        return not self.engine_backend and not self._early


def parse_trtllm(spec: str) -> TrtllmRelease:
    """'trtllm', 'trtllm@0.20', 'trtllm@0.20.0', 'trtllm@1.1.0rc3', 'trtllm@1.0:tensorrt' -> a TrtllmRelease;
    anything else is a one-line ConfigError naming it."""
    m = re.fullmatch(r"trtllm(?:@(?P<ver>[^:]+))?(?::(?P<backend>[a-z_]+))?", spec.strip().lower())
    if not m:
        raise ConfigError(f"engine {spec!r}: expected trtllm, trtllm@X.Y or trtllm@X.Y:pytorch|tensorrt")
    ver = m["ver"]
    if ver in (None, "current", "latest"):
        line = CURRENT
    else:
        v = re.fullmatch(r"v?(\d{1,3})\.(\d{1,3})(?:\.\d{1,3})?(?:rc\d+|\.post\d+)?", ver)
        line = f"{int(v[1])}.{int(v[2])}" if v else ver
        if line not in DEFAULT_BACKEND:
            raise ConfigError(f"engine trtllm@{ver}: not modelled; known releases are "
                              f"{', '.join(DEFAULT_BACKEND)} (use e.g. trtllm@0.20, or trtllm for {CURRENT})")
    backend = m["backend"] or DEFAULT_BACKEND[line]
    if backend == "trt":
        backend = "tensorrt"
    if backend not in ("pytorch", "tensorrt"):
        raise ConfigError(f"engine {spec!r}: backend {backend!r}: use pytorch or tensorrt")
    if backend == "pytorch" and line in ENGINE_ONLY:
        raise ConfigError(f"engine {spec!r}: TensorRT-LLM {line} has only the engine backend (PyTorch from 0.17)")
    return TrtllmRelease(line, backend)  # type: ignore[arg-type]


RELEASES = tuple(DEFAULT_BACKEND)

__all__ = ["CURRENT", "DEFAULT_BACKEND", "RELEASES", "TrtllmRelease", "parse_trtllm"]
