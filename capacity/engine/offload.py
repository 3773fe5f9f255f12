"""KV offloading to host memory for a deployment (docs/kv-offload.md): how many blocks the host tier holds and
what loading one costs, from the engine settings, and the scheduler builder that puts the tier
(`capacity.sched.offload.OffloadingKVCacheManager`) under each replica's prefix cache.

Sizes (vLLM's `CacheConfig.kv_offloading_size`, vllm/config/cache.py: "Size of the KV cache offloading buffer in
GiB. When TP > 1, this is the total buffer size summed across all TP ranks"): each rank holds size / TP GiB, so
the tier holds floor(size x 2**30 / TP / (block_size x one rank's KV bytes per token)) blocks of the GPU's size.

Load time per block: one rank's share of the block, block_size x KV bytes per token / TP, over that GPU's own host
link (each rank copies its shard from pinned host memory in parallel): `host_link_gbps` if given, else the
nominal one-direction rate of the GPU's PCIe x16 link by generation (Gen5 64 GB/s: H100/H200/H20/H800/B200 and
the other PCIe 5 parts below; Gen3 16 GB/s: V100, T4; GH200's NVLink-C2C 450 GB/s; Gen4 32 GB/s otherwise).
Achieved rates from pinned memory are lower (vLLM's offloading blog post measures its transfers); measure yours
and give --host-link-gbps.
"""
from __future__ import annotations

from typing import Any

from capacity.engine.budget import MemoryBudget, SchedulerFactory, kv_bytes_per_token
from capacity.engine.vllm.config import VllmConfig
from capacity.engine.vllm.release import Version, fmt, parse_engine, release
from capacity.errors import ConfigError
from capacity.sched.base import Scheduler
from capacity.sched.offload import OffloadingKVCacheManager

GEN5 = ("h100", "h200", "h20", "h800", "b200", "gb10", "rtx-5090", "rtx-5080", "rtx-pro-6000", "mi300x", "mi325x")
GEN3 = ("v100", "t4")
LINK_GBPS = {"gen5": 64.0, "gen4": 32.0, "gen3": 16.0, "gh200": 450.0}

# The release whose CLI has --kv-offloading-size / --kv-offloading-backend (vllm-project/vllm pull request 24498;
# the vLLM blog's "Inside vLLM's New KV Offloading Connector", 2026-01-08, expects it in 0.14.0; 0.11.0 brought the
# OffloadingConnector itself, configured through --kv-transfer-config).
KV_OFFLOADING_SIZE_SINCE: Version = (0, 14, 0)


def host_link_gbps(gpu_name: str) -> tuple[float, str]:
    """(GB/s, where from) of a GPU's link to host memory, one direction, nominal."""
    n = gpu_name.lower()
    if n.startswith("gh200"):
        return LINK_GBPS["gh200"], "NVLink-C2C"
    if n.startswith(GEN5):
        return LINK_GBPS["gen5"], "PCIe 5.0 x16"
    if n.startswith(GEN3):
        return LINK_GBPS["gen3"], "PCIe 3.0 x16"
    return LINK_GBPS["gen4"], "PCIe 4.0 x16"


def tier_size(size_gib: float, tp: int, block_size: int, kv_bytes_per_token_rank: float,
              link_gbps: float) -> tuple[int, float]:
    """(host blocks, seconds to load one block) for `size_gib` GiB summed over `tp` ranks."""
    block_bytes = block_size * kv_bytes_per_token_rank  # one rank's share of a block
    return int(size_gib * 2**30 / tp // block_bytes), block_bytes / (link_gbps * 1e9)


class Offloading:
    """A scheduler builder whose KV manager has the host tier; `managers` keeps each replica's (for the report)."""

    def __init__(self, factory: SchedulerFactory, host_blocks: int, load_block_s: float, link: str) -> None:
        self.factory, self.host_blocks, self.load_block_s, self.link = factory, host_blocks, load_block_s, link
        self.managers: list[Any] = []

    def __call__(self) -> Scheduler:
        s: Any = self.factory()  # a scheduler with a paged KV manager (`kv`): the continuous one
        old = s.kv
        kv = OffloadingKVCacheManager(old.num_blocks, old.block_size, self.host_blocks, self.load_block_s)
        kv.lag = old.lag
        s.kv = kv
        self.managers.append(kv)
        return s

    def report(self, replicas: int) -> dict[str, Any]:
        """What the tier did over a run, its first `replicas` managers together (the run's, built first; a
        capacity check's loop builds more after it)."""
        m = self.managers[:replicas]
        tot = {k: sum(getattr(x, k) for x in m) for k in ("gpu_hit_blocks", "host_hit_blocks", "loaded_blocks",
                                                           "stored_blocks", "evicted_blocks")}
        bs = m[0].block_size if m else 0
        return {"host_blocks_per_replica": self.host_blocks, "load_s_per_block": self.load_block_s,
                "host_link": self.link, "block_size": bs, **tot,
                "host_hit_tokens": tot["host_hit_blocks"] * bs, "load_s_total": tot["loaded_blocks"] * self.load_block_s}


def offloading(factory: SchedulerFactory, dep: Any, b: MemoryBudget) -> SchedulerFactory:
    """`factory` itself without `kv_offloading_size`; else an `Offloading` builder (one-line errors where the tier
    is not modelled). `dep`: a capacity.pipeline.Deployment (a layer above this one)."""
    e = dep.engine
    if not isinstance(e, VllmConfig):  # another engine's configuration has no host tier to set
        return factory
    if e.kv_offloading_size is None:
        if e.host_link_gbps is not None:
            raise ConfigError("host_link_gbps: applies to KV offloading (kv_offloading_size / --kv-offload-gb)")
        return factory
    what = f"kv_offloading_size {e.kv_offloading_size:g}"
    name, version, runner = parse_engine(e.engine)
    if name != "vllm":
        raise ConfigError(f"{what}: modelled for vLLM's OffloadingConnector only (engine {e.engine}; SGLang's "
                          "HiCache sits on its radix cache, whose prefix reuse the simulation does not model)")
    if release(version, runner).version < KV_OFFLOADING_SIZE_SINCE:
        raise ConfigError(f"{what}: engine {e.engine} has no --kv-offloading-size (vLLM {fmt(KV_OFFLOADING_SIZE_SINCE)}"
                          " added it; 0.11-0.13 set the OffloadingConnector through --kv-transfer-config)")
    if not e.enable_prefix_caching:
        raise ConfigError(f"{what}: needs the prefix cache on (--prefix-caching): the tier serves its lookups")
    if e.policy == "static" or b.kv_groups.as_tuple() is not None or e.speculative is not None:
        raise ConfigError(f"{what}: not modelled with static batching, sliding-window layers or speculative "
                          "decoding")
    gbps, link = (e.host_link_gbps, "given") if e.host_link_gbps is not None else host_link_gbps(dep.gpu.name)
    blocks, load_s = tier_size(e.kv_offloading_size, b.tp, b.block_size, kv_bytes_per_token(dep.card, b.kv_dtype, b.tp),
                               gbps)
    if blocks < 1:
        raise ConfigError(f"{what}: less than one KV block of host memory per TP rank")
    return Offloading(factory, blocks, load_s, f"{link}, {gbps:g} GB/s")


def offload_line(r: dict[str, Any]) -> str:
    """The tier's report as one line (the simulate table's)."""
    ms = r["load_s_per_block"] * 1e3
    return (f"KV offload: {r['host_blocks_per_replica']:,} host blocks per replica ({r['block_size']} tokens each), "
            f"{r['host_hit_blocks']:,} blocks loaded from host memory ({r['host_hit_tokens']:,} prompt tokens not "
            f"computed again, {ms:.3f} ms a block over {r['host_link']}) beside {r['gpu_hit_blocks']:,} GPU prefix-cache "
            f"hits; {r['stored_blocks']:,} blocks written through, {r['evicted_blocks']:,} evicted from host memory")
