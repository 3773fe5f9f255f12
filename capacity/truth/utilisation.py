"""Host and GPU utilisation sampled during a load test, beside the engine's own /metrics.

Every `interval_s`, one row: host CPU (% of all cores) and memory used (psutil), and for each NVIDIA GPU its SM
utilisation, memory used, power and SM clock (NVML through `nvidia-ml-py`). Both are optional: without psutil or
without NVML (no NVIDIA driver, no GPU, package not installed) those columns are absent and a note says so once.
A sample never raises: a failing reading ends that source's sampling with a note. At most MAX_SAMPLES rows.
"""
from __future__ import annotations

import math

import numpy as np

MAX_SAMPLES = 100_000
GiB = 1024 ** 3


class Sampler:
    def __init__(self) -> None:
        self.notes: list[str] = []
        self.samples: list[dict[str, float]] = []
        self._psutil = None
        self._nvml = None
        self._gpus: list = []
        try:
            import psutil

            psutil.cpu_percent(interval=None)  # the first call only starts the measurement
            self._psutil = psutil
        except ImportError:
            self.notes.append("psutil is not installed: host CPU and memory not sampled "
                              "(pip install 'capacity[loadtest]')")
        try:
            import pynvml

            pynvml.nvmlInit()
            self._gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(min(64, pynvml.nvmlDeviceGetCount()))]
            self._nvml = pynvml
            if not self._gpus:
                self.notes.append("NVML found no GPU: GPU utilisation not sampled")
        except ImportError:
            self.notes.append("nvidia-ml-py is not installed: GPU utilisation not sampled (pip install nvidia-ml-py)")
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA driver here
            self.notes.append(f"no NVML ({type(exc).__name__}): GPU utilisation not sampled")

    def sample(self, t: float) -> None:
        if len(self.samples) >= MAX_SAMPLES:
            return
        row: dict[str, float] = {"t": round(t, 3)}
        if self._psutil is not None:
            try:
                row["host_cpu_pct"] = float(self._psutil.cpu_percent(interval=None))
                row["host_mem_used_gib"] = self._psutil.virtual_memory().used / GiB
            except Exception as exc:  # a sandbox that hides /proc: stop asking
                self.notes.append(f"host sampling stopped: {type(exc).__name__}")
                self._psutil = None
        if self._nvml is not None:
            nv = self._nvml
            try:
                for i, h in enumerate(self._gpus):
                    row[f"gpu{i}_util_pct"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                    row[f"gpu{i}_mem_used_gib"] = nv.nvmlDeviceGetMemoryInfo(h).used / GiB
                    row[f"gpu{i}_power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1e3
                    row[f"gpu{i}_sm_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            except Exception as exc:
                self.notes.append(f"GPU sampling stopped: {type(exc).__name__}")
                self._nvml = None
        self.samples.append(row)

    def close(self) -> dict:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down a library that is going away anyway
                pass
        return {"samples": self.samples, "notes": self.notes, "summary": summarize(self.samples)}


def summarize(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean, P95 and maximum of every sampled column."""
    cols = sorted({k for s in samples for k in s} - {"t"})
    out = {}
    for c in cols:
        v = np.array([s[c] for s in samples if c in s and math.isfinite(s[c])], dtype=float)
        if len(v):
            out[c] = {"mean": float(v.mean()), "p95": float(np.percentile(v, 95)), "max": float(v.max())}
    return out


def describe(u: dict) -> list[str]:
    """Lines for the console: host CPU and memory, each GPU's utilisation, memory, power; then the notes."""
    s = u.get("summary", {})
    lines = []
    if "host_cpu_pct" in s:
        lines.append(f"host: CPU mean {s['host_cpu_pct']['mean']:.0f}% (P95 {s['host_cpu_pct']['p95']:.0f}%), "
                     f"memory peak {s['host_mem_used_gib']['max']:.1f} GiB")
    i = 0
    while f"gpu{i}_util_pct" in s:
        g = lambda k, i=i: s[f"gpu{i}_{k}"]
        lines.append(f"GPU {i}: SM utilisation mean {g('util_pct')['mean']:.0f}% (P95 {g('util_pct')['p95']:.0f}%), "
                     f"memory peak {g('mem_used_gib')['max']:.1f} GiB, power mean {g('power_w')['mean']:.0f} W")
        i += 1
    return lines + [f"note: {n}" for n in u.get("notes", [])]
