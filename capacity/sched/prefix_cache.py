"""vLLM's prefix cache block by block (vLLM 0.32's `BlockPool` with `enable_caching`, full attention).

Every full block of every request is cached under a key standing for its hash, not only the shared prefixes:
block i of a request is its prefix group's block i while the group's shared tokens fill it ((i + 1) x block
<= prefix_tokens), or, for a replayed trace with prefix ids (Mooncake's hash_ids: one per 512-token chunk,
equal ids meaning an equal prompt up to that chunk's end), the block under its chunk's id while it lies wholly
inside that chunk and the prompt (a multi-turn session's, capacity.sessions: inside the prompt and output, which
the next turn's prompt holds), else the request's own. A block is cached when it is allocated for the tokens that fill it
(`allocate_slots` caches up to min(computed + new, tokens known), before the step runs), so a request admitted
later in the same step already hits it. Freed blocks stay cached until the free queue hands them out again:

- the free queue pops from its head; blocks without a hash are put back at the head (reused first), cached
  blocks at the tail (least recently used is evicted first), a request's blocks in reverse order (its tail
  goes first);
- a hit removes a free cached block from the queue (`touch`), only once the request is admitted; an admission
  check counts those blocks as taken;
- a request (re)admitted with nothing computed hits its longest run of cached blocks, at most
  (tokens - 1) // block of them (the last token is always computed again). A preempted request therefore finds
  its own blocks if nothing reused them meanwhile.

Checked step by step against vLLM's own scheduler and allocator (tests/test_vllm_scheduler_trace.py,
prefix_groups). Blocks are anonymous but for their key, so the fast path's k decode slots at once (blocks taken
in another order than k single steps take them) evict the same keys.

The free queue costs what is in use, not the pool's size (a small model on a large GPU has millions of blocks):
it is always [uncached blocks freed, head first] + [blocks never used yet, in block order] + [blocks freed
cached, least recently used first], because uncached blocks only ever go back to its head and cached ones to
its tail. So the head part is a stack (`head`, its top at the end), the never-used blocks a counter
(`fresh`: blocks fresh .. num_blocks - 1) and the tail an ordered dict (`tail`); the per-block `key` and `ref`
lists grow as blocks are first used. Blocks are taken from the head, then the never-used ones, then the tail.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from capacity.sched.kv import KVCacheManager

if TYPE_CHECKING:
    from capacity.sched.seq import Seq


@mypyc_attr(allow_interpreted_subclasses=True)  # the trace tests change one rule in a subclass
class PrefixCachingKVCacheManager(KVCacheManager):
    """The KV cache manager with vLLM's block-level prefix cache (see the module docstring). A sequence's
    `blocks` counts the blocks in its table, `shared_blocks` those it hit on admission; `kv_capacity` stays 0
    so that the scheduler asks for slots at every step, where blocks get cached."""

    tracks_inflight = True

    __slots__ = ("head", "fresh", "tail", "key", "ref", "cache", "tables", "ncached", "pending", "hashed_free")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size, True)
        # the free queue, head first: head[::-1], then blocks fresh .. num_blocks - 1, then tail (module docstring)
        self.head: list[int] = []  # uncached blocks freed (the last one is the queue's head)
        self.fresh = 0  # blocks from here on were never used
        self.tail: OrderedDict[int, None] = OrderedDict()  # blocks freed cached, least recently used first
        self.key: list[tuple[int, int, int] | None] = []  # per block used so far (block b < fresh)
        self.ref: list[int] = []
        # key -> the block holding it, or blocks in the order they got it (first: hits) when several do; one
        # block is the rule, and a dict per key would cost ~200 bytes for each of millions of cached blocks
        self.cache: dict[tuple[int, int, int], int | dict[int, None]] = {}
        self.tables: dict[Seq, list[int]] = {}
        self.ncached: dict[Seq, int] = {}  # leading blocks of the table already cached
        self.pending: dict[Seq, list[int]] = {}  # hits found, not yet touched (admission may still fail)
        self.hashed_free = 0  # free blocks that hold a key (evictable)

    # ---- what the scheduler and the simulator may read --------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._queue_len() - self.hashed_free

    def _queue_len(self) -> int:
        return len(self.head) + self.pool.num_blocks - self.fresh + len(self.tail)

    def free_queue(self) -> list[int]:
        """The free queue's blocks, head first (for tests; it lists the never-used blocks too)."""
        return self.head[::-1] + list(range(self.fresh, self.pool.num_blocks)) + list(self.tail)

    def key_of(self, b: int) -> tuple[int, int, int] | None:
        return self.key[b] if b < self.fresh else None

    @property
    def num_evictable_blocks(self) -> int:
        return self.hashed_free

    def cached_prefix_blocks(self, group: int) -> int:
        n = 0
        while (group, -1, n) in self.cache:
            n += 1
        return n

    def _key(self, seq: Seq, i: int) -> tuple[int, int, int]:
        req = seq.req
        if req.prefix_group >= 0 and (i + 1) * self.block_size <= req.prefix_tokens:
            return (req.prefix_group, -1, i)
        if req.block_keys:  # a trace's prefix ids: block i inside chunk c whose id says the prompt up to it
            bs, kt = self.block_size, req.block_key_tokens
            c = i * bs // kt
            # a session's keys cover its output too (the next turn's prompt holds it); a trace's only its prompt
            known = req.prompt_tokens + req.output_tokens if req.session >= 0 else req.prompt_tokens
            if c < len(req.block_keys) and (i + 1) * bs <= min((c + 1) * kt, known):
                return (req.block_keys[c], -2, i)
        return (-1, req.id, i)

    # ---- the block pool ---------------------------------------------------------------------------------------
    def _pending_evictable(self, seq: Seq) -> int:
        hits = self.pending.get(seq)
        return sum(1 for b in hits if self.ref[b] == 0) if hits else 0

    def _touch(self, seq: Seq) -> None:
        hits = self.pending.pop(seq, None)
        if not hits:
            return
        ref, tail = self.ref, self.tail
        for b in hits:
            if ref[b] == 0:  # a free block with a key: in the tail
                del tail[b]
                self.hashed_free -= 1
            ref[b] += 1
        self.tables[seq] = hits
        self.ncached[seq] = len(hits)
        if not seq.preemptions:  # a prefix hit; a preempted request finding its own blocks is not one
            seq.cached_tokens = len(hits) * self.block_size

    def _take(self, seq: Seq, n: int) -> None:
        head, key, ref, cache = self.head, self.key, self.ref, self.cache
        table = self.tables.setdefault(seq, [])
        while n and head:
            b = head.pop()
            ref[b] = 1
            table.append(b)
            n -= 1
        m = min(n, self.pool.num_blocks - self.fresh)
        if m:  # never-used blocks, in block order
            table.extend(range(self.fresh, self.fresh + m))
            key.extend([None] * m)
            ref.extend([1] * m)
            self.fresh += m
            n -= m
        tail = self.tail
        for _ in range(n):
            b = tail.popitem(last=False)[0]
            k = key[b]
            if k is not None:  # evict: the block leaves the cache
                holders = cache[k]
                if isinstance(holders, int):
                    del cache[k]
                else:
                    del holders[b]
                    if not holders:
                        del cache[k]
                key[b] = None
                self.hashed_free -= 1
            ref[b] = 1
            table.append(b)

    def _cache_upto(self, seq: Seq, tokens: int) -> None:
        full = tokens // self.block_size
        done = self.ncached.get(seq, 0)
        if full <= done:
            return
        table, key, cache = self.tables[seq], self.key, self.cache
        for i in range(done, full):
            b = table[i]
            if key[b] is None:
                k = key[b] = self._key(seq, i)
                holders = cache.get(k)
                if holders is None:
                    cache[k] = b
                elif isinstance(holders, int):
                    cache[k] = {holders: None, b: None}
                else:
                    holders[b] = None
        self.ncached[seq] = full

    def _grow(self, seq: Seq, tokens: int, cache_upto: int) -> bool:
        """Slots for `tokens` tokens in all (nothing taken if the free queue is short), then cache the full
        blocks of the first `cache_upto`."""
        held = self.tables.get(seq)
        if held and -(-tokens // self.block_size) <= len(held) and seq not in self.pending:
            # the common decode step: its blocks are there, nothing to take or touch (the steps below would do
            # nothing else), only full blocks to cache
            seq.blocks = len(held)
            self._cache_upto(seq, cache_upto)
            return True
        have = len(self.tables.get(seq, ())) or len(self.pending.get(seq, ()))
        need = -(-tokens // self.block_size) - have
        if max(need, 0) + self._pending_evictable(seq) > self._queue_len():
            return False
        self._touch(seq)
        if need > 0:
            self._take(seq, need)
        table = self.tables.get(seq, ())
        seq.blocks = len(table)
        if table:
            self._cache_upto(seq, cache_upto)
        return True

    # ---- allocation (the scheduler's interface) ------------------------------------------------------------
    def allocate_slots(self, seq: Seq, num_new: int) -> bool:
        """Caches up to the tokens known: with async scheduling the token a step in flight samples is not yet."""
        end = seq.computed + num_new
        known = seq.prompt + seq.generated
        if seq.inflight and known - seq.computed == 1 and seq.generated:
            known -= 1
        return self._grow(seq, end, min(end, known))

    def decode_slots(self, seq: Seq, k: int) -> bool:
        """k decode steps at once: each caches the block its token fills, so all of them up to computed + k
        (with async scheduling one token behind)."""
        return self._grow(seq, seq.computed + k, seq.computed + k - self.lag)

    def cache_processed(self, seq: Seq) -> None:
        """Async scheduling: the last step's output processed caches every computed token (update_from_output)."""
        if seq in self.tables:
            self._cache_upto(seq, seq.computed)

    def can_fit(self, seq: Seq, num_new: int) -> bool:
        have = len(self.tables.get(seq, ())) or len(self.pending.get(seq, ()))
        need = -(-(seq.computed + num_new) // self.block_size) - have
        return max(need, 0) + self._pending_evictable(seq) <= self._queue_len()

    def reserve(self, seq: Seq, tokens: int) -> bool:
        return self._grow(seq, tokens, seq.computed)

    def detach(self, seq: Seq) -> Seq:
        h = super().detach(seq)
        self.pending.pop(seq, None)
        if seq in self.tables:
            self.tables[h] = self.tables.pop(seq)
            self.ncached[h] = self.ncached.pop(seq, 0)
        return h

    def free(self, seq: Seq) -> None:
        """Back to the free queue in reverse order: uncached blocks at its head, cached ones at its tail."""
        self.pending.pop(seq, None)
        self.ncached.pop(seq, None)
        table = self.tables.pop(seq, None)
        seq.blocks = seq.shared_blocks = seq.kv_capacity = 0
        if not table:
            return
        head, tail, key, ref = self.head, self.tail, self.key, self.ref
        for b in reversed(table):
            ref[b] -= 1
            if ref[b] == 0:
                if key[b] is None:
                    head.append(b)
                else:
                    tail[b] = None
                    self.hashed_free += 1

    # ---- prefix cache ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: Seq) -> None:
        """On (re)admission with nothing computed: the longest run of cached blocks, up to (tokens - 1) //
        block; they count as computed and are touched once the request is admitted."""
        if seq.computed or seq in self.tables:
            return
        cache, hits = self.cache, []
        for i in range((seq.prompt + seq.generated - 1) // self.block_size):
            holders = cache.get(self._key(seq, i))
            if holders is None or (not isinstance(holders, int) and not holders):
                break
            hits.append(holders if isinstance(holders, int) else next(iter(holders)))
        if hits:
            self.pending[seq] = hits
            seq.shared_blocks = len(hits)
            seq.computed = len(hits) * self.block_size

    def drop_computed_blocks(self, seq: Seq) -> None:
        if self.pending.pop(seq, None) is not None:
            seq.shared_blocks = seq.computed = 0

    # ---- decode stretches (the simulator's fast path) ----------------------------------------------------
    def stretch_blocks(self, running: list[Seq], k: int) -> int:
        bs, need, tables = self.block_size, 0, self.tables
        for s in running:
            n = -(-(s.computed + k) // bs) - len(tables.get(s, ()))
            if n > 0:
                need += n
        return need

    def stretch_capacity(self) -> int:
        return self._queue_len()
