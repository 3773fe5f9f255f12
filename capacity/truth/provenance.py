"""Where a run was measured, and with which engine settings: recorded in every load-test run, carried into fits,
checked when a fit is applied to another run.

- `host()`: the load generator's machine: CPU model, the CPU flags that change a CPU engine's speed by integer
  factors (a vLLM CPU build ran bf16 10x slower on a CPU without avx512_bf16), logical CPUs, and the NVIDIA GPUs
  NVML sees. For a server on 127.0.0.1 (how engines are calibrated) this is the engine's machine.
- `server_info(url)`: what the server says of itself (`/version`, `/v1/models`: engine version, model id,
  max_model_len), each read bounded in size and time, absent when the server does not expose it.
- `engine config`: the scheduler limits a fit needs (KV blocks, block size, token budget, batch cap). A run
  records them (`capacity loadtest --engine-config`); a fit takes them from its runs and refuses to guess.
- `mismatches(a, b)`: what differs between two provenance records, for a warning.
"""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from capacity.errors import CapacityError

ENGINE_KEYS = ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs")
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "fma")
MAX_INFO_BYTES = 64 * 1024


def host() -> dict:
    name, flags = None, []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name is None:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                flags = [f for f in SPEED_FLAGS if f in have]
                break
    except OSError:
        pass
    cpu = name or platform.processor() or platform.machine()
    out = {"cpu": cpu, "cpu_flags": flags, "logical_cpus": os.cpu_count() or 0, "os": platform.platform()}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out["gpus"] = [str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                           for i in range(min(64, pynvml.nvmlDeviceGetCount()))]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py, no driver, no GPU: no GPU list
        pass
    return out


def server_info(url: str, timeout_s: float = 2.0) -> dict:
    """The server's own account of itself, where it exposes one (vLLM: /version; OpenAI servers: /v1/models)."""
    import json
    import time

    import httpx

    out: dict = {}
    deadline = time.monotonic() + 2 * timeout_s  # both reads, however slowly a server drips its answer
    with httpx.Client(timeout=timeout_s) as client:
        for path, key in (("/version", "version"), ("/v1/models", "models")):
            try:
                with client.stream("GET", url + path) as r:
                    if r.status_code != 200:
                        continue
                    body = b""
                    for chunk in r.iter_bytes():
                        body += chunk
                        if len(body) > MAX_INFO_BYTES:
                            raise ValueError("too large")
                        if time.monotonic() > deadline:
                            raise ValueError("too slow")
                data = json.loads(body)
            except (httpx.HTTPError, ValueError, UnicodeDecodeError):
                continue
            if key == "version" and isinstance(data, dict) and isinstance(data.get("version"), str):
                out["engine_version"] = data["version"][:100]
            elif key == "models" and isinstance(data, dict) and isinstance(data.get("data"), list):
                models = [m for m in data["data"][:16] if isinstance(m, dict)]
                out["models"] = [{k: m[k] for k in ("id", "max_model_len", "owned_by") if k in m
                                  and isinstance(m[k], (str, int)) and not isinstance(m[k], bool)} for m in models]
    return out


def parse_engine_config(spec: str) -> dict:
    """'num_blocks=256,block_size=16,max_num_batched_tokens=256,max_num_seqs=256' -> a checked dict."""
    out = {}
    for part in spec.split(","):
        m = re.fullmatch(r"\s*([a-z_]+)\s*=\s*(\d{1,9})\s*", part)
        if not m or m.group(1) not in ENGINE_KEYS or int(m.group(2)) <= 0:
            raise CapacityError(f"--engine-config {part.strip()[:80]!r}: expected KEY=N with N > 0 and KEY one of "
                                f"{', '.join(ENGINE_KEYS)}")
        out[m.group(1)] = int(m.group(2))
    missing = [k for k in ENGINE_KEYS if k not in out]
    if missing:
        raise CapacityError(f"--engine-config: missing {', '.join(missing)} (the simulator needs all four)")
    return out


def run_engine(run: dict, given: dict | None, label: str) -> dict:
    """The scheduler limits to simulate `run` with: the ones given on the command line, else the run's own
    (recorded by `loadtest --engine-config`); never a silent default."""
    if given:
        return given
    rec = (run.get("meta") or {}).get("engine")
    if isinstance(rec, dict) and all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool)
                                     and rec[k] > 0 for k in ENGINE_KEYS):
        return {k: rec[k] for k in ENGINE_KEYS}
    raise CapacityError(f"{label}: the run does not record the engine's limits (KV blocks, block size, token budget, "
                        "batch cap): measure with `capacity loadtest --engine-config num_blocks=N,block_size=N,"
                        "max_num_batched_tokens=N,max_num_seqs=N`, or give --num-blocks, --block-size, "
                        "--max-batch-tokens and --max-seqs")


def mismatches(a: dict | None, b: dict | None) -> list[str]:
    """What differs between two provenance records ({host, server}): CPU model and speed flags, GPUs, engine
    version. Unknown on either side is not a mismatch."""
    if not a or not b:
        return []
    out = []
    ha, hb = a.get("host") or {}, b.get("host") or {}
    for key, what in (("cpu", "CPU"), ("cpu_flags", "CPU flags"), ("gpus", "GPUs")):
        if ha.get(key) and hb.get(key) and ha[key] != hb[key]:
            out.append(f"{what}: {ha[key]} vs {hb[key]}")
    va, vb = (a.get("server") or {}).get("engine_version"), (b.get("server") or {}).get("engine_version")
    if va and vb and va != vb:
        out.append(f"engine version: {va} vs {vb}")
    return out
