"""Which KV cache manager a configuration gets: the plain one (`capacity.sched.kv`), vLLM's block-level prefix
cache (`capacity.sched.prefix_cache`, enable_prefix_caching) or the hybrid one for sliding-window layers. It sits
above both modules, so neither imports the other's manager."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.sched.kv import HybridKVCacheManager, KVCacheManager
from capacity.sched.prefix_cache import PrefixCachingKVCacheManager


def make_kv_manager(num_blocks: int, block_size: int, prefix_caching: bool = False,
                    groups: tuple[int, ...] | None = None, budget: int | None = None) -> KVCacheManager:
    """The plain manager, or the hybrid one for a sliding-window layout (prefix caching is not modelled there)."""
    if groups is None and prefix_caching:
        if num_blocks <= 0 or block_size <= 0:
            raise ConfigError(f"num_blocks and block_size must be > 0 (got {num_blocks}, {block_size})")
        return PrefixCachingKVCacheManager(num_blocks, block_size)
    if groups is None:
        return KVCacheManager(num_blocks, block_size)
    if prefix_caching:
        raise ConfigError("prefix caching with sliding-window layers (vLLM's hybrid KV allocator) is not modelled: "
                          "set enable_prefix_caching false for this model")
    if num_blocks <= 0 or block_size <= 0:
        raise ConfigError(f"num_blocks and block_size must be > 0 (got {num_blocks}, {block_size})")
    return HybridKVCacheManager(num_blocks, block_size, groups, budget)
