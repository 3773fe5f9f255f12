"""The PyTorch backend's KV estimate where it differs from the pool it builds: the estimator's bytes per token.

`KvCacheCreator._get_kv_size_per_token` -> `KVCacheManager.get_cache_size_per_token` (1.x;
`get_cache_size_per_token` in `_torch/pyexecutor/_util.py` from 0.19) counts, per layer, `head_dim x
num_key_value_heads // tp_size` elements of K (and as many of V): at tp_size > num_key_value_heads that is a
fraction of a head per rank. The pool itself (`KVCacheManager.__init__`, `num_kv_heads_per_layer =
(num_kv_heads + tp_size - 1) // tp_size`) keeps a whole head per rank. So the estimate's
`max_tokens = int(kv_cache_max_memory // bytes per token)` is ceil(kv / tp) x tp / kv times the tokens the
memory holds (Qwen3-235B-A22B, 4 KV heads, at tp 8: twice).

What the pool then asks for, by release (docs/trtllm.md, "The PyTorch backend's KV estimate by release"):

- 1.0: the final KV manager is built from that max_tokens; the executor's creation fails ("The following
  component could not be created: KV cache") when max_tokens x the pool's bytes per token is more than is free
  (NVIDIA/TensorRT-LLM issue 5872: Qwen3-235B-A22B-FP8, tp 8, ep 8, 1.0.0rc1/rc3, 108.86 GiB free; the same at
  tp 4, where the two agree, starts).
- 0.19-0.21: `KVCacheManager.calculate_max_num_blocks` takes min(max_tokens, free_gpu_memory_fraction x free /
  the pool's bytes per token) ("Both free_gpu_memory_fraction and max_tokens are set ... The smaller value will
  be used", the 0.20 log in tests/data/trtllm_startup): the pool is bounded by what is free, no failure.
- 1.1, 1.2: `configure_kv_cache_capacity` also sets `max_gpu_total_bytes` = the estimated memory (the 1.2-era
  copy read): the pool is bounded by bytes, no failure. 1.1's copy was not read at its tag: taken as 1.2's.
"""
from __future__ import annotations

from capacity.model.card import ModelCard
from capacity.units import DTYPE_BYTES


def estimator_bytes_per_token(card: ModelCard, kv_dtype: str, tp: int) -> float:
    """get_cache_size_per_token's bytes: 2 x layers x (head_dim x kv_heads // tp) x dtype bytes (MLA: the latent
    and rope dims, not split)."""
    if card.mla is not None:
        per_layer = card.mla.kv_lora_rank + card.mla.qk_rope_head_dim
        return card.num_kv_layers * per_layer * DTYPE_BYTES[kv_dtype]
    return 2 * card.num_kv_layers * (card.head_dim_ * card.num_kv_heads // tp) * DTYPE_BYTES[kv_dtype]


def inflation(card: ModelCard, kv_dtype: str, tp: int, pool_bytes_per_token: float) -> float:
    """How many times the tokens the estimate's max_tokens are of what its memory holds in the pool (1: none)."""
    est = estimator_bytes_per_token(card, kv_dtype, tp)
    return pool_bytes_per_token / est if 0 < est < pool_bytes_per_token else 1.0


def pool_request_fails(version: str, kv_memory: float, free_at_creation: float, factor: float) -> bool:
    """Whether the final KV manager asks for more than is free (1.0 at tp > KV heads; see the module docstring)."""
    return version == "1.0" and factor > 1.0 and kv_memory * factor > free_at_creation


__all__ = ["estimator_bytes_per_token", "inflation", "pool_request_fails"]
