"""How long a new vLLM replica takes from its start to taking requests, as a range (issue 52): the autoscaler's
start-up delay, estimated from the model's size, the storage bandwidth and the engine's start-up steps.

    start-up = process and CUDA init + weights / storage bandwidth + memory profiling + torch.compile
               + CUDA-graph capture (capture sizes x seconds per size)

Each term is a (low, high) pair. Where the numbers come from:

- weights: the bytes one rank loads (capacity.model.weights, the same count as the memory budget), every rank
  reading its shard in parallel from storage of `storage_gbps` GB/s each; low at the nominal bandwidth, high at
  half of it (an assumption: safetensors reads achieved 4.4 GB/s from a warm page cache in the 0.8.4 log below,
  0.07 GB/s when the weights were downloaded first). A download from a hub is the storage bandwidth to give.
- capture sizes: vLLM's default list for the engine's max_num_seqs (capacity.engine.vllm.memory.
  cudagraph_capture_sizes, read from vLLM's config code: V1 1, 2, 4, then steps of 8 to 256, then 16, up to
  min(2 x max_num_seqs, 512); V0 to 256); none with enforce_eager.
- seconds per capture size, memory profiling, torch.compile: the real start-up logs in
  tests/data/vllm_startup/logs.yaml ("Graph capturing finished in N secs"): V1 6 s (0.9.2), 14 s (0.11.2), 21 s
  (0.10.2 with LoRA), each for the default 51 sizes of max_num_seqs 256: 0.12-0.41 s per size; V0 22-59 s for its
  35 sizes: 0.63-1.7 s per size. Memory profiling took 1.1-15 s in those logs (61.7 s once, on a loaded host;
  not the range). torch.compile (V1 only): 6.4 s with vLLM's compile cache warm (0.8.4 log); the cold end, 40 s,
  is an assumption (the logs hold no cold compile of a large model).
- process and CUDA init (imports, CUDA context, NCCL at TP > 1, the API server): 10-30 s, an assumption; the
  logs' timestamps do not isolate it.

Not counted: pulling the container image, scheduling the pod, a node that must be provisioned first.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from capacity.engine.registry import engine_for
from capacity.engine.vllm.memory import cudagraph_capture_sizes
from capacity.errors import ConfigError
from capacity.model.weights import weight_bytes_per_rank

if TYPE_CHECKING:
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard
    from capacity.model.gpus import GPU

STORAGE_GBPS = (0.01, 100.0)  # the accepted range of --storage-gbps: a slow download to a RAM disk
CAPTURE_S_PER_SIZE = {"v1": (0.12, 0.41), "v0": (0.63, 1.7)}  # from the logs, see the module docstring
PROFILE_S = (1.1, 15.0)
COMPILE_S = (6.4, 40.0)  # V1 only
INIT_S = (10.0, 30.0)  # an assumption
LOAD_EFFICIENCY = (1.0, 0.5)  # share of the storage bandwidth achieved (low end, high end of the time)


def estimate_startup(card: ModelCard, gpu: GPU, engine: EngineConfig, storage_gbps: float) -> dict[str, Any]:
    """The start-up terms and their total, each (low, high) seconds, with what they assume."""
    if not (math.isfinite(storage_gbps) and STORAGE_GBPS[0] <= storage_gbps <= STORAGE_GBPS[1]):
        raise ConfigError(f"--storage-gbps {storage_gbps:g}: expected {STORAGE_GBPS[0]:g} to {STORAGE_GBPS[1]:g} "
                          "GB/s (a download from a hub ~0.1-1, network storage ~1, local NVMe ~2-7)")
    model = engine_for(engine.engine, card)  # the release's engine and graph mode for the model
    if not hasattr(model, "release"):
        raise ConfigError(f"engine {engine.engine}: the start-up estimate models vLLM's steps only")
    rel = model.release
    res = model.resolve(engine, card, gpu)
    runner = rel.runner
    tp = engine.tensor_parallel_size
    weights = float(sum(weight_bytes_per_rank(card, tp).values()))
    load = tuple(weights / (storage_gbps * 1e9 * eff) for eff in LOAD_EFFICIENCY)
    eager = engine.enforce_eager or getattr(model, "forced_eager", False)
    sizes = 0 if eager else len(cudagraph_capture_sizes(res.max_num_seqs, rel))
    capture = tuple(sizes * s for s in CAPTURE_S_PER_SIZE[runner])
    compile_ = COMPILE_S if runner == "v1" and not eager else (0.0, 0.0)
    terms = {"init_s": INIT_S, "load_s": load, "profile_s": PROFILE_S, "compile_s": compile_, "capture_s": capture}
    total = (sum(v[0] for v in terms.values()), sum(v[1] for v in terms.values()))
    return {"engine": rel.label, "weights_bytes_per_rank": weights, "storage_gbps": storage_gbps,
            "capture_sizes": sizes, "max_num_seqs": res.max_num_seqs,
            "terms": {k: list(v) for k, v in terms.items()}, "total_s": list(total),
            "assumes": "process/CUDA init 10-30 s and a cold torch.compile of 40 s are assumptions; weights load at "
                       "50-100% of the storage bandwidth; no image pull or node provisioning"}
