"""Non-torch memory as each vLLM release's profiler counts it (`Est`: an estimated term with its range): at TP 1 the
logs' values (lazily loaded kernel modules, cuBLAS handles, allocator slack: vLLM's code does not size them), at
TP > 1 the communicators each release's profiler counts, read in its code (`worker.py`/`gpu_worker.py`
`init_device`, `parallel_state.py`, `pynccl.py`, `custom_all_reduce.py`), with the logs' figures where the code
cannot size them. docs/memory.md has the table. It changes when a release moves its baseline or its
communicators, or a new log moves an empirical term."""
from __future__ import annotations

from dataclasses import dataclass

from capacity.engine.config import ResolvedEngine
from capacity.engine.vllm.release import Release
from capacity.model.gpus import GPU
from capacity.units import GiB


@dataclass(frozen=True)
class Est:
    """An estimated term: the middle and its [lo, hi] range, bytes."""

    mid: float
    lo: float
    hi: float

    @classmethod
    def exact(cls, v: float) -> Est:
        return cls(v, v, v)

    def __add__(self, o: Est) -> Est:
        return Est(self.mid + o.mid, self.lo + o.lo, self.hi + o.hi)


# Non-torch memory at tp=1 as each profiler counts it, GiB: (middle, low, high) over the logs of that family.
NON_TORCH_TP1 = {
    # device-wide used - torch allocated (the CUDA context is in it): 0.35 on an RTX 3090 (0.6.4)
    "absolute": (0.35, 0.25, 0.60),
    # free at init - free after profiling, context excluded; no log seen: the snapshot family's spread, widened
    "free-delta": (0.15, 0.05, 0.40),
    # V0 0.7-0.10 snapshot: 0.03-0.09 over T4, RTX 4060/4090, A100 (six logs)
    "v0-snapshot": (0.06, 0.03, 0.10),
    # V0 0.6.5-0.6.6 (utils.py memory_profiling): non-torch growth since the baseline (lazily loaded kernel
    # modules, cuBLAS handles) plus what torch keeps reserved but unallocated after empty_cache and torch buffers
    # alive before the profile that are not weights: read from the released code, nothing near 1.8 GiB at TP 1
    # (the 1.79 of vllm#10511 came from an intermediate commit whose log format no release has)
    "v0-0.6.5": (0.15, 0.05, 0.45),
    # V1 0.9.1-0.16: 0.02 (L4), 0.13-0.14 (H100, four logs)
    "v1-snapshot": (0.14, 0.02, 0.20),
    # V1 0.17-0.26: 0.25-0.27 on H100 (vLLM 0.19, nine logs)
    "v1-0.17": (0.25, 0.20, 0.30),
    # V1 0.27+: free memory consumed (non-torch and allocator slack); not yet seen in a log
    "consumed": (0.30, 0.20, 0.50),
}
# Extra non-torch memory at tp > 1, GiB, as the logs show it where the profiler counts the communicators (V1
# 0.9.1-0.10, whose snapshot precedes the distributed init, and 0.17+, which adds FlashInfer's all-reduce fusion
# workspace on Hopper/Blackwell): 1.79-1.96 at tp 2-4 on NVSwitch H100 boards (the 0.10 Qwen3-235B tp4 log,
# eight 0.19 logs); other links hold NCCL's ring buffers and the custom all-reduce's IPC buffers. The middle is
# the median of the logs after taking off the per-peer growth.
NON_TORCH_MULTI = {"nvls": (1.82, 1.78, 1.90), "nvlink": (0.50, 0.20, 1.00), "pcie": (0.17, 0.05, 0.40)}
NON_TORCH_PER_PEER_GIB = 0.04  # growth per extra rank (tp 2 -> 4: +0.06 to +0.11 in the 0.19 logs)
# One NCCL communicator's buffers per rank, GiB, where the code says which communicators a profiler counts:
# channels x (4 MiB SIMPLE + 4.7 MiB LL128 + 0.5 MiB LL) x (ring, tree): 2-4 channels over PCIe, 8-32 over
# NVLink. An estimate from NCCL's defaults, not measured: the range is wide.
NCCL_COMM_GIB = {"nvls": (0.30, 0.10, 0.60), "nvlink": (0.25, 0.08, 0.60), "pcie": (0.06, 0.02, 0.15)}
CUSTOM_AR_GIB = 0.026  # the custom all-reduce's 8 MiB meta + 8 MiB buffer + 8 MiB rank data (every release)
# The first NCCL communicator a process creates, without peers (its kernels loaded, its device structures), GiB:
# NVIDIA/nccl#2366 measured a single-rank communicator's initialisation on an RTX 3090 (sm86) at 484 MiB, and
# 996 MiB where the 512 MiB NET shared buffer is set up (NCCL_RUNTIME_CONNECT=0; NCCL before 2.22, which
# torch 2.2-2.4 ship, connects eagerly). The low end allows the 484 MiB to hold a CUDA context's share.
NCCL_FIRST_COMM_GIB = (484 / 1024, 0.25, 996 / 1024)
# The last release whose world group runs a warm-up all_reduce after `Worker.init_device` reads init_gpu_memory,
# at every world size: worker.py `init_worker_distributed_environment` (0.4.0-0.4.2), parallel_state.py
# `init_distributed_environment` (0.4.3-0.5.0). From 0.5.1 nothing creates an NCCL communicator at TP 1.
WORLD_WARMUP_UNTIL = (0, 5, 0)


def first_comm(rel: Release, tp: int) -> Est:
    """The first NCCL communicator's fixed cost where the free-delta profiler (0.4.0-0.6.3) counts it: at TP 1
    only while the world group's warm-up all_reduce runs after the baseline (0.4.0-0.5.0: a single-rank
    communicator), at TP > 1 always (the world, pynccl and TP communicators are made after it)."""
    if rel.accounting != "free-delta" or (tp == 1 and rel.version > WORLD_WARMUP_UNTIL):
        return Est.exact(0.0)
    return Est(*(x * GiB for x in NCCL_FIRST_COMM_GIB))


def non_torch(rel: Release, eng: ResolvedEngine, gpu: GPU) -> Est:
    """Non-torch memory per rank as the release's profiler counts it (see the tables above)."""
    p = eng.cfg.memory_params
    acc = rel.accounting
    if acc == "snapshot" and rel.runner == "v0":
        key = "v0-0.6.5" if rel.version < (0, 7, 0) else "v0-snapshot"
    elif acc == "snapshot":
        key = "v1-snapshot" if rel.version < (0, 17, 0) else "v1-0.17"
    else:
        key = acc
    base = Est(*(x * GiB for x in NON_TORCH_TP1[key]))
    if p.non_torch_bytes is not None:
        base = Est.exact(p.non_torch_bytes)
    tp = eng.tp
    if tp == 1 and (eng.cfg.pp_size() > 1 or eng.cfg.dp_size() > 1):
        tp = 2  # one more communicator (the stages' send/recv, the data-parallel group): counted as at TP 2
    if tp == 1:
        return base if p.non_torch_bytes is not None else base + first_comm(rel, 1)
    link = "nvls" if gpu.nvls else ("nvlink" if gpu.interconnect.startswith("nvlink") else "pcie")
    if p.non_torch_multi_gpu_bytes is not None:
        multi = Est.exact(p.non_torch_multi_gpu_bytes)
    else:
        multi = multi_gpu_non_torch(rel, tp, link, p.cuda_context_bytes)
    if _multi_from_logs(rel):
        peer = NON_TORCH_PER_PEER_GIB * GiB if p.non_torch_per_peer_bytes is None else p.non_torch_per_peer_bytes
        multi = multi + Est.exact((tp - 2) * peer)
    return base + multi


def _multi_from_logs(rel: Release) -> bool:
    return rel.runner == "v1" and ((0, 9, 1) <= rel.version < (0, 11, 0) or rel.version >= (0, 17, 0))


def multi_gpu_non_torch(rel: Release, tp: int, link: str, context_bytes: float) -> Est:
    """What the profiler counts of the communicators at tp > 1 (read per release in worker.py/gpu_worker.py
    init_device, parallel_state.py, pynccl.py, custom_all_reduce.py):

    - V1 0.9.1-0.10 and 0.17+: the logs' figure (the snapshot precedes the distributed init; 0.17 adds
      FlashInfer's all-reduce fusion workspace).
    - V1 0.11-0.16: the distributed init precedes the snapshot, so only the torch device group's NCCL
      communicator, created lazily by the profile's logits all_gather, is counted: one communicator (the
      high end keeps the logs' figure: what NCCL connects lazily on a first large collective is unmeasured).
    - V0 0.6.4-0.10: pynccl, used eagerly from 0.6.5, and the lazy torch communicator of the input
      broadcast, plus the custom all-reduce's buffers.
    - V0 0.4.0-0.6.3 (free memory consumed since init): the first communicator's fixed cost (`first_comm`), the
      world group's, pynccl's and the TP group's buffers (two from 0.5.1: no world warm-up), and the CUDA
      contexts other ranks open on this GPU:
      tp - 1 in 0.4.0 (`_can_actually_p2p` copies to every peer), one in 0.4.1-0.4.2 (rank 0 builds the P2P
      cache in-process on a first run), none from 0.4.3 (a subprocess)."""
    comm = NCCL_COMM_GIB[link]
    if _multi_from_logs(rel):
        return Est(*(x * GiB for x in NON_TORCH_MULTI[link]))
    if rel.runner == "v1":  # 0.11-0.16
        mid, lo, _ = comm
        return Est(mid * GiB, lo * GiB, NON_TORCH_MULTI[link][2] * GiB)
    if rel.accounting == "free-delta":
        comms = 3 if rel.version <= WORLD_WARMUP_UNTIL else 2
        contexts = tp - 1 if rel.version < (0, 4, 1) else (1 if rel.version < (0, 4, 3) else 0)
        ctx = contexts * context_bytes
        return Est(comms * comm[0] * GiB + ctx + CUSTOM_AR_GIB * GiB, comms * comm[1] * GiB + 0.6 * ctx,
                   comms * comm[2] * GiB + 1.6 * ctx + CUSTOM_AR_GIB * GiB) + first_comm(rel, tp)
    return Est(*((2 * x + CUSTOM_AR_GIB) * GiB for x in comm))
