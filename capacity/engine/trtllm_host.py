"""TensorRT-LLM's PyTorch executor: its host (CPU) time per iteration, a fixed part plus a part per scheduled request.

What the code does (NVIDIA/TensorRT-LLM, `tensorrt_llm/_torch/pyexecutor/`, the 1.x PyTorch backend; read in the
stored copy of `py_executor.py` whose `profile_step` prints `host_step_time` (1.0 on; its tag is not stated there; a
2026 main-branch copy has the same calls in the same order). One Python thread runs
`PyExecutor._executor_loop_overlap` (the overlap scheduler, on by default) or `_executor_loop`
(`disable_overlap_scheduler: true`). Each iteration, per scheduled request unless said:

- `_prepare_and_schedule_batch`: `_fetch_and_activate_new_requests` (new requests to `LlmRequest`s), `_schedule` (the
  capacity and micro-batch schedulers walk every active request);
- `resource_manager.prepare_resources(scheduled_batch)` (`resource_manager.py`: KV blocks, a token a request);
- `_forward_step` -> `model_engine.py` `PyTorchModelEngine._prepare_inputs` / `_prepare_tp_inputs` (Python lists of
  token ids, positions, sequence lengths and block offsets, an entry a request, copied to the GPU), then the forward
  (a CUDA-graph replay: enqueued, the GPU runs it);
- `_sample_async` (sampling enqueued on the GPU), `_update_request_states`;
- `_update_requests(previous_batch.sample_state)` (`sampler.py` `update_requests`: waits for the previous step's
  sampler event, then adds each request's new token and checks its stop criteria);
- `_process_previous_batch` -> `_handle_responses` (a response a request that emits a token; finished ones
  terminated, their blocks freed) and `_enqueue_responses` (to the LLM API's response queue);
- fixed, not per request: `profile_step`, `_handle_control_request`, the iteration statistics.

With the overlap scheduler the loop enqueues batch n's forward *before* it processes batch n-1's outputs
(`_update_requests` then `_process_previous_batch` come after `_forward_step`), so the GPU runs step n while the CPU
does the rest: a step lasts max(GPU step, host work). Without it, `_executor_loop` runs forward, sample,
`_update_requests`, `_handle_responses` in order: the host work adds to the step. The host work is
`fixed + per_request x scheduled requests` (capacity.cost.overlap: `CpuOverlapCost(per_step_s, per_request_s)`
overlapped, `HostSerialCost` added).

What the executor prints of it: with `print_iter_log: true`, `profile_step` (`PyExecutor._profiler`) logs once per
loop `iter = N, ..., host_step_time = X ms, prev_device_step_time = Y ms, ..., num_scheduled_requests: K, states =
{...}`: `host_step_time` is the wall time between two `profile_step` calls (one loop), `prev_device_step_time` the GPU
time between two CUDA events recorded at the same points. Under the overlap scheduler a loop waits for the previous
step's sampler event, so `host_step_time` is max(GPU step, host work): a row measures the host's work only where it is
longer than the GPU's (`host_bound`). `per_request_from_log` reads that from a log: the least-squares line of
`host_step_time` over `num_scheduled_requests` on the host-bound, decode-only rows (fixed = intercept, per request =
slope, with its range).

Not in this loop: detokenisation and the OpenAI server's per-response work (`tensorrt_llm/serve/openai_server.py`
and its post-processors, `tensorrt_llm/executor/result.py` `GenerationResult`) run in the LLM API's result handling,
outside the PyExecutor thread (in the server process or its `num_postprocess_workers`); their cost per token is
`output_cpu_us_per_token` (capacity/cost/overlap.py), measured per server.

Not the TensorRT engine (C++) backend: its executor loop is C++ (`cpp/tensorrt_llm/batch_manager/`
`trtGptModelInflightBatching.cpp`, `forwardAsync`/`forwardSync` under `executorImpl.cpp`'s loop), with no Python
per-request lists and no `host_step_time` log; nothing read here applies to it.

The per-request figure is a measurement of the engine's host (its release, CPU, Python): `PER_REQUEST_S` holds it per
release line where a development log gave one. No iteration log with `host_step_time` and `num_scheduled_requests`
from a real run was found in the stored corpora (tests/data/trtllm_iterlogs/README.md), so none holds a figure yet
and the term is off unless `trtllm_host_us_per_request` is set (e.g. from the user's own log: `per_request_from_log`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError

# Per release line (PyTorch backend): (low, high) seconds of host work per scheduled request per iteration, from
# development logs' host_step_time (tests/data/trtllm_iterlogs/dev.yaml). Empty: no log yet (module docstring).
PER_REQUEST_S: dict[str, tuple[float, float]] = {}

# The log line (`PyExecutor._profiler.profile_step`): 1.0+ prints host_step_time in ms; 0.19-0.21 printed
# `elapsed_time = X s` instead. `num_scheduled_requests` is printed with ':' after the times (1.0-1.2) or with ' ='
# before them (later lines): each field is read on its own.
_ITER = re.compile(r"\biter = (\d+),")
_HOST = re.compile(r"host_step_time = ([\d.]+) ?ms|elapsed_time = ([\d.]+) ?s\b")
_DEVICE = re.compile(r"prev_device_step_time = ([\d.]+) ?ms")
_SCHEDULED = re.compile(r"num_scheduled_requests(?::| =) (\d+)")
_CTX = re.compile(r"'num_ctx_requests': (\d+)")
HOST_BOUND = 1.05  # a row is host-bound when host_step_time > this x prev_device_step_time


@dataclass(frozen=True)
class IterRow:
    """One `print_iter_log` line: the loop's wall time and the GPU's (s; None when not printed), the requests."""

    iter: int
    host_s: float
    device_s: float | None
    scheduled: int
    ctx_requests: int

    @property
    def host_bound(self) -> bool:
        """Whether the loop waited on the host, not the GPU (its host_step_time then measures the host's work)."""
        return self.device_s is not None and self.host_s > HOST_BOUND * self.device_s


def parse_iterlog(text: str) -> list[IterRow]:
    """Every iteration line of a TensorRT-LLM log that prints the loop's time and the scheduled requests (other lines
    are skipped)."""
    rows = []
    for line in text.splitlines():
        it, host, n = _ITER.search(line), _HOST.search(line), _SCHEDULED.search(line)
        if it is None or host is None or n is None:
            continue
        dev, ctx = _DEVICE.search(line), _CTX.search(line)
        host_s = float(host[1]) / 1e3 if host[1] is not None else float(host[2])
        rows.append(IterRow(int(it[1]), host_s, float(dev[1]) / 1e3 if dev else None, int(n[1]),
                            int(ctx[1]) if ctx else 0))
    return rows


@dataclass(frozen=True)
class HostFit:
    """The host loop read from a log: fixed + per_request x scheduled requests (s), the slope's range (+-2 standard
    errors, at least 0) and the rows it used."""

    fixed_s: float
    per_request_s: float
    per_request_range_s: tuple[float, float]
    rows: int


def per_request_from_log(rows: list[IterRow]) -> HostFit:
    """The least-squares line of host_step_time over num_scheduled_requests on the host-bound, decode-only rows (a
    GPU-bound row's host_step_time is the GPU's step, not the host's: module docstring)."""
    use = [r for r in rows if r.host_bound and r.ctx_requests == 0 and r.scheduled > 0]
    ns = sorted({r.scheduled for r in use})
    if len(use) < 3 or len(ns) < 2:
        raise ConfigError(f"iteration log: {len(use)} host-bound decode-only rows at {len(ns)} batch size(s); the "
                          "per-request host time needs at least 3 rows at 2 or more num_scheduled_requests")
    n = len(use)
    mx = sum(r.scheduled for r in use) / n
    my = sum(r.host_s for r in use) / n
    sxx = sum((r.scheduled - mx) ** 2 for r in use)
    slope = sum((r.scheduled - mx) * (r.host_s - my) for r in use) / sxx
    fixed = my - slope * mx
    resid = sum((r.host_s - fixed - slope * r.scheduled) ** 2 for r in use)
    se = math.sqrt(resid / (n - 2) / sxx) if n > 2 else 0.0
    return HostFit(fixed, slope, (max(0.0, slope - 2 * se), max(0.0, slope + 2 * se)), n)


def applies(em: object, cfg: EngineConfig) -> bool:
    """Whether the engine is TensorRT-LLM's PyTorch backend (the loop read above)."""
    if getattr(em, "name", "") != "trtllm":
        return False
    return not em._rel(cfg).engine_backend  # type: ignore[attr-defined]


def host_per_request_s(em: object, cfg: EngineConfig, profile: str | None = None) -> float:
    """The engine's host time per scheduled request per iteration (s): the configured `trtllm_host_us_per_request`,
    else the release's measured figure at its slow end (the planner's side), else 0 (not measured). TensorRT-LLM's
    PyTorch backend only; a measured profile's fitted overhead already holds its run's host time."""
    given = getattr(cfg, "trtllm_host_us_per_request", None)
    if not applies(em, cfg):
        if given is not None:
            raise ConfigError(f"trtllm_host_us_per_request {given}: the PyTorch executor's host loop; "
                              f"{getattr(em, 'label', getattr(em, 'name', 'this engine'))} has none (TensorRT-LLM's "
                              "PyTorch backend only)")
        return 0.0
    if given is not None:
        return given / 1e6
    if profile is not None:
        return 0.0
    lo_hi = PER_REQUEST_S.get(em.rel.version)  # type: ignore[attr-defined]
    return lo_hi[1] if lo_hi else 0.0


__all__ = ["HOST_BOUND", "PER_REQUEST_S", "HostFit", "IterRow", "applies", "host_per_request_s", "parse_iterlog",
           "per_request_from_log"]
