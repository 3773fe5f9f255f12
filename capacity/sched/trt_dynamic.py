"""TensorRT-LLM's dynamic batch size tuning (the C++ executor, its TensorRT engine backend), as `trtllm-serve`
turns it on (`DynamicBatchConfig(enable_batch_size_tuning=True, dynamic_batch_moving_average_window=128)`,
tensorrt_llm/commands/serve.py `get_llm_args`).

Before each step (`Executor::Impl::forwardAsync`, cpp/tensorrt_llm/executor/executorImpl.cpp) the executor takes
the moving averages of the prompt length and of the requested output length (`mMaxNewTokens`, i.e. max_tokens) of
the last 128 samples (`DynamicBatchTuner::updateStats`), asks the KV cache how many such sequences it holds
(`KVCacheManager::getMaxCapacityBatchSize`: primary blocks // ceil((input + output) / tokens_per_block)) and sets
the runtime batch size to `DynamicBatchTuner::getRuntimeBatchSize` of it (cpp/tensorrt_llm/executor/
dynamicBatchTuner.cpp): the first entry of the table {144: 128, 336: 256, 672: 512, 832: 768, 1280: 1024,
1664: 1536} whose limit is above the capacity, else the capacity rounded down to a multiple of 512 when within
128 of it, else the capacity; the engine's max_batch_size caps it (`setRuntimeBatchSize`).

Modelled approximation: the executor pushes every active request into the window at every iteration; here the
window holds the last 128 requests added (their prompt and output), the same averages for a steady workload.
"""
from __future__ import annotations

from collections import deque

from capacity.sched.base import Seq, Step
from capacity.sched.continuous import ContinuousConfig, ContinuousScheduler
from capacity.workload import Request

# DynamicBatchConfig::kDefaultBatchSizeTable (cpp/tensorrt_llm/executor/dynamicBatchConfig.cpp)
BATCH_SIZE_TABLE: tuple[tuple[int, int], ...] = ((144, 128), (336, 256), (672, 512), (832, 768), (1280, 1024),
                                                  (1664, 1536))
FALLBACK_GRANULARITY = 512  # DynamicBatchTuner::kBatchSizeFallbackGranularity
FALLBACK_THRESHOLD = 128  # DynamicBatchTuner::kBatchSizeFallbackThreshold
WINDOW = 128  # DynamicBatchConfig::kDefaultDynamicBatchMovingAverageWindow


def runtime_batch_size(max_capacity: int) -> int:
    """DynamicBatchTuner::getRuntimeBatchSize."""
    for limit, size in BATCH_SIZE_TABLE:
        if max_capacity < limit:
            return size
    threshold = max_capacity // FALLBACK_GRANULARITY * FALLBACK_GRANULARITY
    return threshold if max_capacity < threshold + FALLBACK_THRESHOLD else max_capacity


def max_capacity_batch_size(num_blocks: int, block_size: int, avg_input: int, avg_output: int) -> int:
    """KVCacheManager::getMaxCapacityBatchSize (no beam search, no sink tokens, window = max length)."""
    per_seq = max(1, -(-(avg_input + avg_output) // block_size))
    return num_blocks // per_seq


class TrtDynamicBatchScheduler(ContinuousScheduler):
    """The continuous scheduler (GUARANTEED_NO_EVICT via reserve_output) with the engine backend's runtime batch
    size: max_num_seqs is re-set before every step from the moving averages (see the module docstring)."""

    def __init__(self, cfg: ContinuousConfig) -> None:
        super().__init__(cfg)
        self.built_max_batch_size = cfg.max_num_seqs  # the engine's max_batch_size (fixed when it was built)
        self.window: deque[tuple[int, int]] = deque(maxlen=WINDOW)
        self.in_sum = 0
        self.out_sum = 0

    def add(self, req: Request) -> Seq:
        if len(self.window) == WINDOW:
            old_in, old_out = self.window[0]
            self.in_sum -= old_in
            self.out_sum -= old_out
        self.window.append((req.prompt_tokens, req.output_tokens))
        self.in_sum += req.prompt_tokens
        self.out_sum += req.output_tokens
        return super().add(req)

    def runtime_max_batch(self) -> int:
        n = len(self.window)
        if not n:
            return self.built_max_batch_size
        cap = max_capacity_batch_size(self.cfg.num_blocks, self.cfg.block_size, self.in_sum // n, self.out_sum // n)
        return max(1, min(self.built_max_batch_size, runtime_batch_size(cap)))

    def schedule(self, now: float = 0.0) -> Step:
        self.cfg.max_num_seqs = self.runtime_max_batch()
        return super().schedule(now)


__all__ = ["BATCH_SIZE_TABLE", "TrtDynamicBatchScheduler", "max_capacity_batch_size", "runtime_batch_size"]
