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

DeepSeek-V3.2 (DSA: `DeepseekV32ForCausalLM`, added by NVIDIA/TensorRT-LLM PR 8405, merged 2025-10, after the 1.1
branch; listed in docs/source/models/supported-models.md by PR 9893): `_torch/attention_backend/sparse/dsa.py`
`DSACacheManager` (read at commit 00e3c1a) gives the indexer's key cache its own pool per layer, and both its
`get_cache_size_per_token` (the estimator) and `get_cache_bytes_per_token` (the pool) count it as a K factor of
(index_head_dim + index_head_dim // 128 x 4) / (kv_lora_rank + qk_rope_head_dim) in the KV cache's dtype: per
token and layer (576 + 132) x KV dtype bytes, 1,416 B in bf16 and 708 in fp8 (vLLM and SGLang keep the indexer in
uint8, 132 B). Releases before 1.2 have no DSA model: refused in one line.
"""
from __future__ import annotations

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.families.registry import traits
from capacity.units import DTYPE_BYTES

DSA_FIRST = (1, 2)  # the first release line with DeepseekV32ForCausalLM (PR 8405)


def dsa_elements(card: ModelCard) -> int:
    """The indexer's elements per token and layer that DSACacheManager counts in the KV dtype (0: not a DSA model)."""
    return traits(card.architecture).side_cache_bytes if card.mla is not None else 0


def pool_bytes_per_token(card: ModelCard, kv_dtype: str, tp: int, version: str) -> float:
    """The pool's KV bytes per token on one rank: the shared `kv_bytes_per_token`, except DeepSeek-V3.2, whose indexer
    DSACacheManager counts in the KV dtype (see the module docstring), refused before 1.2."""
    idx = dsa_elements(card)
    if not idx:
        return kv_bytes_per_token(card, kv_dtype, tp)
    if tuple(int(x) for x in version.split(".")[:2]) < DSA_FIRST:
        raise ConfigError(f"engine trtllm@{version}: DeepSeek-V3.2 (DeepseekV32ForCausalLM, DSA) arrived in "
                          "TensorRT-LLM 1.2; use trtllm@1.2")
    return estimator_bytes_per_token(card, kv_dtype, tp)


def estimator_bytes_per_token(card: ModelCard, kv_dtype: str, tp: int) -> float:
    """get_cache_size_per_token's bytes: 2 x layers x (head_dim x kv_heads // tp) x dtype bytes (MLA: the latent
    and rope dims, not split; DeepSeek-V3.2: its indexer's elements too, in the KV dtype)."""
    if card.mla is not None:
        per_layer = card.mla.kv_lora_rank + card.mla.qk_rope_head_dim + dsa_elements(card)
        return card.num_kv_layers * per_layer * DTYPE_BYTES[kv_dtype]
    return 2 * card.num_kv_layers * (card.head_dim_ * card.num_kv_heads // tp) * DTYPE_BYTES[kv_dtype]


def inflation(card: ModelCard, kv_dtype: str, tp: int, pool_bytes_per_token: float) -> float:
    """How many times the tokens the estimate's max_tokens are of what its memory holds in the pool (1: none)."""
    est = estimator_bytes_per_token(card, kv_dtype, tp)
    return pool_bytes_per_token / est if 0 < est < pool_bytes_per_token else 1.0


def pool_request_fails(version: str, kv_memory: float, free_at_creation: float, factor: float) -> bool:
    """Whether the final KV manager asks for more than is free (1.0 at tp > KV heads; see the module docstring)."""
    return version == "1.0" and factor > 1.0 and kv_memory * factor > free_at_creation


__all__ = ["DSA_FIRST", "dsa_elements", "estimator_bytes_per_token", "inflation", "pool_bytes_per_token",
           "pool_request_fails"]
