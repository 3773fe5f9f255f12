"""A host-memory tier under vLLM's prefix cache: KV offloading to CPU (vLLM's `--kv-offloading-size` with the
native `OffloadingConnector`; docs/kv-offload.md has the engine files and functions each rule comes from).

- Write-through: every block the GPU cache keys (a full block, `_cache_upto`) is stored in host memory as well,
  unless it is there already, in which case it becomes the most recently used (vLLM: `OffloadingConnectorScheduler.
  _get_reqs_to_store` stores each scheduled request's newly full blocks every step; `LRUOffloadingManager.
  prepare_store` skips blocks already stored and evicts the least recently used to make room). A block a request
  hit in the GPU cache is stored (or refreshed) when that request is admitted, as vLLM's store pass starts from a
  request's first block.
- Host capacity: `host_blocks` GPU-sized blocks, least recently used evicted first (vLLM's default LRU policy).
  Stores cost no step time: they run on their own CUDA stream after the step (the worker's
  `prepare_store_kv`/`start_kv_transfers`), overlapped with the next steps.
- Lookup on admission: after the GPU prefix hit (blocks 0 .. g-1), the blocks that follow are looked up in host
  memory, the run of consecutive hits counting as computed (`get_num_new_matched_tokens`: `manager.lookup` from the
  first block past the GPU hit, stopping at the first miss), up to the same cap as a GPU hit ((tokens - 1) // block:
  the last token is computed again). The request allocates GPU blocks for them as for new tokens; once admitted
  they are loaded and cached in the GPU (`update_state_after_alloc` -> a load job) and refreshed in host memory.
- Load time: each loaded block costs `load_block_s` (one TP rank's share of a block over its GPU's host link),
  added to the step in which the request is admitted (`take_load_s`). vLLM loads asynchronously (the request waits
  in WAITING_FOR_REMOTE_KVS while other requests' steps go on), so this charges the load to every request of that
  step: the loading request's TTFT is about right, the others' ITL is the pessimistic side.

Counters (`host_hit_blocks`, `gpu_hit_blocks`, `loaded_blocks`, `stored_blocks`, `evicted_blocks`) say what the
tier did; a request's `cached_tokens` counts both tiers' hits (tokens it did not compute).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from capacity.errors import ConfigError
from capacity.sched.prefix_cache import PrefixCachingKVCacheManager

if TYPE_CHECKING:
    from capacity.sched.seq import Seq


class OffloadingKVCacheManager(PrefixCachingKVCacheManager):
    """vLLM's prefix cache with a write-through LRU tier of `host_blocks` blocks in host memory (module docstring)."""

    __slots__ = ("host", "host_blocks", "load_block_s", "host_pending", "load_due", "host_hit_blocks",
                 "gpu_hit_blocks", "loaded_blocks", "stored_blocks", "evicted_blocks")

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int, load_block_s: float) -> None:
        super().__init__(num_blocks, block_size)
        if host_blocks < 0 or not load_block_s >= 0:
            raise ConfigError(f"KV offload: host blocks must be >= 0 and the load time per block >= 0 (got "
                              f"{host_blocks}, {load_block_s})")
        self.host: OrderedDict[tuple[int, int, int], None] = OrderedDict()  # least recently used first
        self.host_blocks = host_blocks
        self.load_block_s = load_block_s
        self.host_pending: dict[Seq, int] = {}  # host hits found on admission, not yet admitted
        self.load_due = 0  # blocks admitted for loading since the last `take_load_s`
        self.host_hit_blocks = 0
        self.gpu_hit_blocks = 0
        self.loaded_blocks = 0
        self.stored_blocks = 0
        self.evicted_blocks = 0

    def _store(self, k: tuple[int, int, int]) -> None:
        host = self.host
        if k in host:
            host.move_to_end(k)
            return
        if self.host_blocks <= 0:
            return
        if len(host) >= self.host_blocks:
            host.popitem(last=False)
            self.evicted_blocks += 1
        host[k] = None
        self.stored_blocks += 1

    def _cache_upto(self, seq: Seq, tokens: int) -> None:
        done = self.ncached.get(seq, 0)
        super()._cache_upto(seq, tokens)
        full = self.ncached.get(seq, 0)
        if full > done:  # write-through: the blocks just keyed go to host memory too
            table, key = self.tables[seq], self.key
            for i in range(done, full):
                k = key[table[i]]
                if k is not None:
                    self._store(k)

    def get_computed_blocks(self, seq: Seq) -> None:
        if seq.computed or seq in self.tables:
            return
        super().get_computed_blocks(seq)
        g = seq.shared_blocks if seq in self.pending else 0
        cap = (seq.prompt + seq.generated - 1) // self.block_size
        n, host = 0, self.host
        while g + n < cap and self._key(seq, g + n) in host:
            n += 1
        if n:
            self.host_pending[seq] = n
            seq.computed = (g + n) * self.block_size

    def drop_computed_blocks(self, seq: Seq) -> None:
        n = self.host_pending.pop(seq, 0)
        super().drop_computed_blocks(seq)
        if n:
            seq.computed = seq.shared_blocks = 0

    def _grow(self, seq: Seq, tokens: int, cache_upto: int) -> bool:
        n = self.host_pending.get(seq, 0) if self.host_pending else 0
        g = len(self.pending.get(seq, ())) if self.pending else 0
        if not super()._grow(seq, tokens, cache_upto):
            return False
        if g or n:  # admitted: its GPU hits are refreshed (or stored) in host memory, its host hits loaded
            for i in range(g):
                self._store(self._key(seq, i))
            self.gpu_hit_blocks += g
        if n:
            del self.host_pending[seq]
            self.host_hit_blocks += n
            self.loaded_blocks += n
            self.load_due += n
            if not seq.preemptions:
                seq.cached_tokens = (g + n) * self.block_size
        return True

    def take_load_s(self) -> float:
        """Seconds of host-to-GPU loads admitted since the last call (the step being scheduled waits for them)."""
        due, self.load_due = self.load_due, 0
        return due * self.load_block_s

    def free(self, seq: Seq) -> None:
        self.host_pending.pop(seq, None)
        super().free(seq)
