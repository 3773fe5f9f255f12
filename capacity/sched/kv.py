"""The KV cache manager: the one place that owns KV blocks, as vLLM v1 splits it (`KVCacheManager` over a
`BlockPool`). Schedulers ask it for slots and hand sequences back; they never count blocks themselves.

Blocks are paged: a sequence with `computed + new` tokens needs ceil((computed + new) / block_size) blocks.
`capacity.sched.kv_factory.make_kv_manager` picks the manager: this plain one; `capacity.sched.prefix_cache`'s
with vLLM's block-level prefix cache (enable_prefix_caching); or the hybrid one below for models with
sliding-window layers.
"""
from __future__ import annotations

from mypy_extensions import mypyc_attr

from capacity.errors import ConfigError
from capacity.sched.seq import Seq


class BlockPool:
    """The free-block count (the block-level prefix cache is `capacity.sched.prefix_cache`)."""

    __slots__ = ("num_blocks", "free")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free = num_blocks

    def available(self) -> int:
        return self.free

    def take(self, n: int) -> bool:
        if n <= self.free:
            self.free -= n
            return True
        return False


@mypyc_attr(allow_interpreted_subclasses=True)  # the trace tests subclass its subclasses
class KVCacheManager:
    """Allocation of KV slots for new tokens and their release, without a prefix cache (see the module
    docstring; `capacity.sched.prefix_cache` adds vLLM's)."""

    __slots__ = ("pool", "block_size", "prefix_caching", "lag")
    frees_while_decoding = False  # a running sequence's blocks never go back to the pool before it ends

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ConfigError(f"num_blocks and block_size must be > 0 (got {num_blocks}, {block_size})")
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.lag = 0  # async scheduling: 1 (a decode's last token is in flight when the next step is scheduled)

    # ---- what the scheduler and the simulator may read --------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks not free: held by sequences or kept by the prefix cache."""
        return self.pool.num_blocks - self.num_free_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.free

    @property
    def num_evictable_blocks(self) -> int:
        """Free blocks that still hold cached KV (reused by a prefix hit, or evicted when taken)."""
        return 0

    def cached_prefix_blocks(self, group: int) -> int:
        return 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # ---- allocation ---------------------------------------------------------------------------------------
    def allocate_slots(self, seq: Seq, num_new: int) -> bool:
        """Give `seq` the blocks it needs to hold `num_new` more tokens; False (nothing taken) if they are not
        there."""
        need = -(-(seq.computed + num_new) // self.block_size) - seq.blocks
        if need <= 0:
            return True
        if self.pool.take(need):
            seq.blocks += need
            seq.kv_capacity = seq.blocks * self.block_size
            return True
        return False

    def decode_slots(self, seq: Seq, k: int) -> bool:
        """Slots for k single-token (decode) steps at once."""
        return self.allocate_slots(seq, k)

    def extend_decodes(self, running: list[Seq], k: int) -> None:
        """Slots for k decode steps of every running sequence (the fast path's decode stretch, which checked
        that they fit: running out is a bug). The plain pool in one pass and one take; managers that place or
        free blocks per sequence (`decode_slots` overridden) go through it one by one."""
        if type(self).decode_slots is not KVCacheManager.decode_slots:
            for s in running:
                if s.computed + k > s.kv_capacity and not self.decode_slots(s, k):
                    raise AssertionError("decode stretch ran out of blocks")
            return
        bs, taken = self.block_size, 0
        for s in running:
            c = s.computed + k
            if c > s.kv_capacity:
                b = -(-c // bs)
                taken += b - s.blocks
                s.blocks, s.kv_capacity = b, b * bs
        if not self.pool.take(taken):
            raise AssertionError("decode stretch ran out of blocks")

    def admission_blocks(self, tokens: int) -> int:
        """Free blocks a new request of `tokens` tokens needs to be admitted (the full-input reserve)."""
        return self.blocks_for(tokens)

    def can_fit(self, seq: Seq, num_new: int) -> bool:
        """Whether `num_new` more tokens of `seq` would find blocks now (free or evictable), taking nothing."""
        need = -(-(seq.computed + num_new) // self.block_size) - seq.blocks
        return need <= 0 or need <= self.pool.available()

    def reserve(self, seq: Seq, tokens: int) -> bool:
        """Take blocks for `tokens` tokens of `seq` at once (a static batch reserves prompt + output)."""
        need = self.blocks_for(tokens) - seq.blocks
        if need <= 0:
            return True
        if self.pool.take(need):
            seq.blocks += need
            seq.kv_capacity = seq.blocks * self.block_size
            return True
        return False

    def free(self, seq: Seq) -> None:
        """Release the sequence's blocks."""
        self.pool.free += seq.blocks
        seq.blocks = 0
        seq.kv_capacity = 0

    def detach(self, seq: Seq) -> Seq:
        """Move the sequence's blocks to a stand-in that holds them until `free(stand-in)`, leaving the sequence
        with none: a finished prefill whose KV waits to be read by a decode replica (the sequence goes on there)."""
        h = Seq(seq.req)
        h.blocks, h.shared_blocks, h.kv_capacity = seq.blocks, seq.shared_blocks, seq.kv_capacity
        seq.blocks = seq.shared_blocks = seq.kv_capacity = 0
        return h

    # ---- prefix cache (none here) ---------------------------------------------------------------------------
    def get_computed_blocks(self, seq: Seq) -> None:
        """On (re)admission: cached blocks that count as computed (none without a prefix cache)."""

    def drop_computed_blocks(self, seq: Seq) -> None:
        """Undo `get_computed_blocks` for a sequence that could not be admitted after all."""

    def take_load_s(self) -> float:
        """Seconds of KV loads from host memory admitted since the last call (capacity.sched.offload; none here)."""
        return 0.0

    tracks_inflight = False  # whether allocation reads `Seq.inflight` (async scheduling's unprocessed tokens)

    def cache_processed(self, seq: Seq) -> None:
        """Async scheduling: the output of the sequence's last step was processed (none without a prefix cache)."""

    # ---- decode stretches (the simulator's fast path) ----------------------------------------------------
    def stretch_blocks(self, running: list[Seq], k: int) -> int:
        """Blocks the running sequences need to decode k more tokens each."""
        bs, need = self.block_size, 0
        for s in running:
            n = -(-(s.computed + k) // bs) - s.blocks
            if n > 0:
                need += n
        return need

    def stretch_capacity(self) -> int:
        return self.pool.free


@mypyc_attr(allow_interpreted_subclasses=True)  # the trace tests change one rule in a subclass
class HybridKVCacheManager(KVCacheManager):
    """vLLM's hybrid allocator for models with sliding-window layers (vLLM 0.32's `SlidingWindowManager` under a
    `HybridKVCacheCoordinator`): one pool of blocks serves every group of layers; a full-attention group holds
    a block per block_size tokens; a sliding-window group of window W frees, at each allocation, its blocks
    wholly below the window of the first token being computed (`get_num_skipped_tokens(num_computed)` =
    max(0, computed - W + 1)) and allocates up to the last, so a prefill chunk of n tokens holds the window
    plus the chunk until the next step frees it; a decode holds cdiv(W - 1, block_size) + 1 blocks. A new
    request is admitted (the full-input reserve) only if min(cdiv(T), cdiv(W - 1 + budget, block_size) + 1)
    blocks per sliding group are free (`max_admission_blocks_per_request`, budget = max_num_batched_tokens).
    A sequence's `blocks` count the pool blocks it holds; `kv_capacity` stays 0, so the scheduler asks for
    slots at every step, as vLLM frees at every step. Checked step by step against vLLM's own allocator
    (tests/test_vllm_scheduler_trace.py)."""

    tracks_inflight = True

    __slots__ = ("full", "sliding", "window_blocks", "window", "cap", "state")
    frees_while_decoding = True  # the window frees a sliding block every block_size tokens

    def __init__(self, num_blocks: int, block_size: int, groups: tuple[int, ...], budget: int | None = None) -> None:
        super().__init__(num_blocks, block_size, False)
        if len(groups) not in (3, 4):
            raise ConfigError(f"kv_groups {groups}: expected (full, sliding, window_blocks[, window_tokens])")
        self.full, self.sliding, self.window_blocks = groups[:3]
        if self.full < 0 or self.sliding <= 0 or self.window_blocks <= 0:
            raise ConfigError(f"kv_groups {groups}: expected (full >= 0, sliding > 0, window_blocks > 0)")
        # the window in tokens (a 3-tuple: the largest window with that many blocks)
        self.window = groups[3] if len(groups) == 4 else (self.window_blocks - 1) * block_size + 1
        if self.window <= 0 or -(-(self.window - 1) // block_size) + 1 != self.window_blocks:
            raise ConfigError(f"kv_groups {groups}: window_blocks must be cdiv(window - 1, block_size) + 1")
        self.cap = -(-(self.window - 1 + budget) // block_size) + 1 if budget else self.window_blocks
        self.state: dict[Seq, tuple[int, int]] = {}  # per sequence: (tokens allocated, sliding blocks freed)

    def blocks_for(self, tokens: int) -> int:
        """Blocks a sequence of `tokens` holds while it decodes (every full-group block, the window's)."""
        b = -(-tokens // self.block_size)
        return self.full * b + self.sliding * min(b, self.window_blocks)

    def admission_blocks(self, tokens: int) -> int:
        """Free blocks a new request of `tokens` tokens needs to be admitted (the full-input reserve)."""
        b = -(-tokens // self.block_size)
        return self.full * b + self.sliding * min(b, self.cap)

    def _skip(self, computed: int) -> int:
        return max(0, computed - self.window + 1) // self.block_size

    def _slide(self, seq: Seq, computed: int) -> tuple[int, int]:
        """Free the sliding blocks below the window of the token after `computed`; returns (allocated, freed)."""
        end, skip = self.state.get(seq, (0, 0))
        sk = min(max(skip, self._skip(computed)), -(-end // self.block_size))
        if sk > skip:
            n = self.sliding * (sk - skip)
            self.pool.free += n
            seq.blocks -= n
        return end, sk

    def _grow(self, seq: Seq, end: int, skip: int, new_end: int) -> bool:
        need = (self.full + self.sliding) * max(0, -(-new_end // self.block_size) - -(-end // self.block_size))
        if need > 0 and not self.pool.take(need):
            self.state[seq] = (end, skip)
            return False
        seq.blocks += need
        self.state[seq] = (max(end, new_end), skip)
        return True

    def allocate_slots(self, seq: Seq, num_new: int) -> bool:
        """Frees on the processed tokens (with async scheduling, those of the step in flight are not)."""
        end, skip = self._slide(seq, seq.computed - seq.inflight)
        return self._grow(seq, end, skip, seq.computed + num_new)

    def decode_slots(self, seq: Seq, k: int) -> bool:
        """k single-token steps at once: the frees of the last of them, the blocks of all."""
        end, skip = self._slide(seq, seq.computed + k - 1 - self.lag)
        return self._grow(seq, end, skip, seq.computed + k)

    def can_fit(self, seq: Seq, num_new: int) -> bool:
        need = self.admission_blocks(seq.computed + num_new) - seq.blocks
        return need <= 0 or need <= self.pool.available()

    def reserve(self, seq: Seq, tokens: int) -> bool:
        """Prompt and output at once (TensorRT-LLM's no-evict admission, static batching): the steady-state
        blocks, kept until the sequence finishes."""
        need = self.blocks_for(tokens) - seq.blocks
        if need > 0 and not self.pool.take(need):
            return False
        b = -(-tokens // self.block_size)
        seq.blocks += max(0, need)
        self.state[seq] = (tokens, b - min(b, self.window_blocks))
        return True

    def free(self, seq: Seq) -> None:
        super().free(seq)
        self.state.pop(seq, None)

    def detach(self, seq: Seq) -> Seq:
        h = super().detach(seq)
        if seq in self.state:
            self.state[h] = self.state.pop(seq)
        return h

    def stretch_blocks(self, running: list[Seq], k: int) -> int:
        """Blocks k decode steps take, ignoring what the window frees meanwhile (an upper bound: a stretch that
        fits it never runs short)."""
        bs, per, need = self.block_size, self.full + self.sliding, 0
        for s in running:
            end = self.state.get(s, (0, 0))[0]
            need += per * max(0, -(-(s.computed + k) // bs) - -(-end // bs))
        return need


def longest_stretch(kv: KVCacheManager, running: list[Seq], k: int, avail: int) -> int:
    """The largest number of decode steps, at most k, whose blocks (`kv.stretch_blocks`, which grow with the
    steps) fit in `avail`: k itself, or the bisection's answer."""
    if kv.stretch_blocks(running, k) <= avail:
        return k
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv.stretch_blocks(running, mid) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return lo
