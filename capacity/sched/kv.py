"""The KV cache manager: the one place that owns KV blocks, their reference counts and the prefix cache, as
vLLM v1 splits it (`KVCacheManager` over a `BlockPool`). Schedulers ask it for slots and hand sequences
back; they never count blocks themselves.

Blocks are paged: a sequence with `computed + new` tokens needs ceil((computed + new) / block_size) blocks,
some of which may be shared prefix blocks. With prefix caching, a prefix group's full blocks, once computed,
are published to the cache (ref-counted while referenced, evictable least-recently-used when not) and a later
sequence of the same group starts with them as computed tokens.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from capacity.errors import ConfigError

if TYPE_CHECKING:
    from capacity.sched.base import Seq


class BlockPool:
    """Free-block count plus the prefix cache: group -> cached full blocks (LRU order), ref counts per group."""

    __slots__ = ("num_blocks", "free", "cached", "refs")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free = num_blocks
        self.cached: OrderedDict[int, int] = OrderedDict()
        self.refs: dict[int, int] = {}

    @property
    def evictable(self) -> int:
        return sum(b for g, b in self.cached.items() if not self.refs.get(g))

    def available(self) -> int:
        return self.free + self.evictable

    def take(self, n: int) -> bool:
        if n <= self.free:
            self.free -= n
            return True
        if n > self.available():
            return False
        for g in list(self.cached):  # evict least recently used unreferenced prefixes
            if self.free >= n:
                break
            if not self.refs.get(g):
                self.free += self.cached.pop(g)
        self.free -= n
        return True


class KVCacheManager:
    """Allocation of KV slots for new tokens, release, and the prefix cache (see module docstring)."""

    __slots__ = ("pool", "block_size", "prefix_caching")

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ConfigError(f"num_blocks and block_size must be > 0 (got {num_blocks}, {block_size})")
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.prefix_caching = prefix_caching

    # ---- what the scheduler and the simulator may read --------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks not free: held by sequences or kept by the prefix cache."""
        return self.pool.num_blocks - self.pool.free

    @property
    def num_free_blocks(self) -> int:
        return self.pool.free

    @property
    def num_evictable_blocks(self) -> int:
        return self.pool.evictable

    def cached_prefix_blocks(self, group: int) -> int:
        return self.pool.cached.get(group, 0)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # ---- allocation ---------------------------------------------------------------------------------------
    def allocate_slots(self, seq: Seq, num_new: int) -> bool:
        """Give `seq` the blocks it needs to hold `num_new` more tokens; False (nothing taken) if they are not
        there."""
        need = -(-(seq.computed + num_new) // self.block_size) - seq.blocks - seq.shared_blocks
        if need <= 0:
            return True
        if self.pool.take(need):
            seq.blocks += need
            seq.kv_capacity = (seq.blocks + seq.shared_blocks) * self.block_size
            return True
        return False

    def can_fit(self, seq: Seq, num_new: int) -> bool:
        """Whether `num_new` more tokens of `seq` would find blocks now (free or evictable), taking nothing."""
        need = -(-(seq.computed + num_new) // self.block_size) - seq.blocks - seq.shared_blocks
        return need <= 0 or need <= self.pool.available()

    def reserve(self, seq: Seq, tokens: int) -> bool:
        """Take blocks for `tokens` tokens of `seq` at once (a static batch reserves prompt + output)."""
        need = self.blocks_for(tokens) - seq.blocks
        if need <= 0:
            return True
        if self.pool.take(need):
            seq.blocks += need
            seq.kv_capacity = (seq.blocks + seq.shared_blocks) * self.block_size
            return True
        return False

    def free(self, seq: Seq) -> None:
        """Release the sequence's own blocks and its reference to a cached prefix."""
        self.pool.free += seq.blocks
        seq.blocks = 0
        seq.kv_capacity = 0
        if seq.shared_blocks:
            g = seq.req.prefix_group
            if g >= 0:
                self.pool.refs[g] -= 1
            seq.shared_blocks = 0

    # ---- prefix cache ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: Seq) -> None:
        """On (re)admission: reference the group's cached prefix blocks and count their tokens as computed."""
        g = seq.req.prefix_group
        if not self.prefix_caching or g < 0 or seq.computed:
            return
        pool = self.pool
        hit = min(pool.cached.get(g, 0), seq.req.prefix_tokens // self.block_size)
        if hit:
            pool.cached.move_to_end(g)
            pool.refs[g] = pool.refs.get(g, 0) + 1
            seq.shared_blocks = hit
            seq.computed = seq.kv_capacity = hit * self.block_size

    def drop_computed_blocks(self, seq: Seq) -> None:
        """Undo `get_computed_blocks` for a sequence that could not be admitted after all."""
        if seq.shared_blocks:
            self.free(seq)
            seq.computed = 0

    def cache_full_blocks(self, seq: Seq) -> None:
        """After a sequence computed past its shared prefix, its full prefix blocks join the group's cache."""
        g = seq.req.prefix_group
        if not self.prefix_caching or g < 0:
            return
        full = seq.req.prefix_tokens // self.block_size
        if seq.computed < full * self.block_size:
            return
        pool = self.pool
        have = pool.cached.get(g, 0)
        if full > have and seq.shared_blocks == have:
            moved = min(full - have, seq.blocks)  # hand over own blocks holding the rest of the prefix
            seq.blocks -= moved
            if not seq.shared_blocks:
                pool.refs[g] = pool.refs.get(g, 0) + 1
            seq.shared_blocks += moved
            pool.cached[g] = have + moved
            pool.cached.move_to_end(g)

    # ---- decode stretches (the simulator's fast path) ----------------------------------------------------
    def stretch_blocks(self, running: list[Seq], k: int) -> int:
        """Blocks the running sequences need to decode k more tokens each."""
        bs, need = self.block_size, 0
        for s in running:
            n = -(-(s.computed + k) // bs) - s.blocks - s.shared_blocks
            if n > 0:
                need += n
        return need

    def stretch_capacity(self) -> int:
        return self.pool.free if not self.pool.cached else self.pool.available()


class HybridKVCacheManager(KVCacheManager):
    """vLLM's hybrid allocator for models with sliding-window layers: one pool of blocks serves every group of
    layers; a full-attention group holds a block per block_size tokens, a sliding-window group only the
    `window_blocks` blocks covering its window. A sequence's `blocks` count pool blocks."""

    __slots__ = ("full", "sliding", "window_blocks")

    def __init__(self, num_blocks: int, block_size: int, groups: tuple[int, int, int]) -> None:
        super().__init__(num_blocks, block_size, False)
        self.full, self.sliding, self.window_blocks = groups
        if self.full < 0 or self.sliding <= 0 or self.window_blocks <= 0:
            raise ConfigError(f"kv_groups {groups}: expected (full >= 0, sliding > 0, window_blocks > 0)")

    def blocks_for(self, tokens: int) -> int:
        b = -(-tokens // self.block_size)
        return self.full * b + self.sliding * min(b, self.window_blocks)

    def _capacity(self, blocks: int) -> int:
        """Tokens `blocks` pool blocks hold for one sequence."""
        bs, w = self.block_size, self.window_blocks
        per = self.full + self.sliding
        if blocks < per * w:
            return blocks // per * bs
        return (w + (blocks - self.sliding * w - self.full * w) // max(1, self.full)) * bs if self.full else 1 << 60

    def allocate_slots(self, seq: Seq, num_new: int) -> bool:
        need = self.blocks_for(seq.computed + num_new) - seq.blocks
        if need <= 0:
            return True
        if self.pool.take(need):
            seq.blocks += need
            seq.kv_capacity = self._capacity(seq.blocks)
            return True
        return False

    def can_fit(self, seq: Seq, num_new: int) -> bool:
        need = self.blocks_for(seq.computed + num_new) - seq.blocks
        return need <= 0 or need <= self.pool.available()

    def reserve(self, seq: Seq, tokens: int) -> bool:
        need = self.blocks_for(tokens) - seq.blocks
        if need <= 0:
            return True
        if self.pool.take(need):
            seq.blocks += need
            seq.kv_capacity = self._capacity(seq.blocks)
            return True
        return False

    def stretch_blocks(self, running: list[Seq], k: int) -> int:
        need = 0
        for s in running:
            n = self.blocks_for(s.computed + k) - s.blocks
            if n > 0:
                need += n
        return need


def make_kv_manager(num_blocks: int, block_size: int, prefix_caching: bool = False,
                    groups: tuple[int, int, int] | None = None) -> KVCacheManager:
    """The plain manager, or the hybrid one for a sliding-window layout (prefix caching is not modelled there)."""
    if groups is None:
        return KVCacheManager(num_blocks, block_size, prefix_caching)
    if prefix_caching:
        raise ConfigError("prefix caching with sliding-window layers (vLLM's hybrid KV allocator) is not modelled: "
                          "set enable_prefix_caching false for this model")
    if num_blocks <= 0 or block_size <= 0:
        raise ConfigError(f"num_blocks and block_size must be > 0 (got {num_blocks}, {block_size})")
    return HybridKVCacheManager(num_blocks, block_size, groups)
