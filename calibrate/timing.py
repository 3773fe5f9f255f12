"""Timers for microbenchmarks: warm-up, then repeats until a minimum measured time; median and spread.

CUDA: one pair of CUDA events around each repeat, synchronise, read elapsed times after the loop (so the
timer does not stall the launch queue). CPU: `time.perf_counter` around each call; the thread count is fixed
by the caller and recorded in the profile. Out-of-memory is caught and reported as `None`, never a crash.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: 0 for a perfectly steady op."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else 0.0


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    i = q * (len(s) - 1)
    lo = int(i)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def cuda_graph(fn: Callable[[], object], device: str, warmup: int = 3) -> Callable[[], object]:
    """Capture one call of `fn` into a CUDA graph and return its replay (what engines such as vLLM run for
    decode steps: no per-kernel CPU launch cost). Warm-up runs on a side stream first, as capture requires
    (allocator and library handles settle outside the graph). Raises whatever capture raises, e.g. for
    code that synchronises with the host (MoE routing that reads expert counts)."""
    import torch

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay  # the bound method keeps the graph (and its memory pool) alive


def maybe_graph(fn: Callable[[], object], device: str, enabled: bool,
                capture: Callable | None = None) -> tuple[Callable[[], object], bool]:
    """(`fn` as a graph replay, False) when enabled and capture works; (`fn`, True) when capture failed and
    the eager call is timed instead; (`fn`, False) when not enabled. Out-of-memory is re-raised."""
    if not enabled:
        return fn, False
    try:
        return (capture or cuda_graph)(fn, device), False
    except Exception as exc:
        if is_oom(exc):
            raise
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(device)
        return fn, True


def measure(fn: Callable[[], object], device: str, *, warmup: int = 2, min_repeats: int = 5,
            max_repeats: int = 200, min_time_s: float = 0.02) -> Timing | None:
    """Time `fn()`; None if it runs out of device memory."""
    import torch

    cuda = device.startswith("cuda")
    try:
        for _ in range(warmup):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        times: list[float] = []
        if cuda:
            pairs = []
            spent = 0.0
            while len(pairs) < max_repeats and (len(pairs) < min_repeats or spent < min_time_s):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
                if len(pairs) in (min_repeats, 2 * min_repeats) or len(pairs) % 16 == 0:
                    end.synchronize()
                    spent = sum(s.elapsed_time(e) for s, e in pairs) / 1e3
            torch.cuda.synchronize(device)
            times = [s.elapsed_time(e) / 1e3 for s, e in pairs]
        else:
            spent = 0.0
            while len(times) < max_repeats and (len(times) < min_repeats or spent < min_time_s):
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                times.append(dt)
                spent += dt
    except (RuntimeError, MemoryError) as exc:
        if isinstance(exc, MemoryError) or is_oom(exc):
            if cuda:
                torch.cuda.empty_cache()
            return None
        raise
    return Timing(statistics.median(times), _quantile(times, 0.1), _quantile(times, 0.9), len(times))
