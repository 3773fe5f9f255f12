"""DeepSeek-V3.2's sparse attention (DSA, "NSA" in SGLang's code) in SGLang's KV pool: the lightning indexer's key
cache beside the MLA latent, the page size and KV dtype SGLang forces for it, per release line.

Read in the PyPI wheels of 0.5.2 (no NSA code), 0.5.3, 0.5.4, 0.5.6, 0.5.9, 0.5.12, 0.5.15, 0.5.17, 0.5.18 and 0.5.23:

- the pool (`mem_cache/memory_pool.py` `NSATokenToKVPool.__init__`, `DSATokenToKVPool` from 0.5.18): beside the MLA
  buffer, one `index_k_with_scale_buffer` per layer of (size + page_size + 1) // 64 pages x 64 x (index_head_dim +
  index_head_dim // 128 x 4) uint8: fp8 keys and an fp32 scale per 128, 132 bytes per token and layer for
  index_head_dim 128 (the family's `INDEXER_CACHE_BYTES`); `assert page_size == 64`;
- the MLA buffer of a DSA model with an fp8 KV cache (`MLATokenToKVPool.__init__`, `nsa_kv_cache_store_fp8`) is
  kv_lora_rank + kv_lora_rank // 128 x 4 + qk_rope_head_dim x 2 = 656 bytes a token and layer (fp8 latent, fp32
  scales, bf16 rope), not 576; bf16: 576 x 2. On ROCm the raw 576 fp8 layout is kept (not modelled separately);
- the cell the pool is sized with (`model_runner.py` `profile_max_num_token`; 0.5.9 `model_runner_kv_cache_mixin.py`;
  0.5.12 `pool_configurator.py`): 0.5.3 counts the MLA latent only ((kv_lora_rank + qk_rope_head_dim) x dtype
  bytes), so the indexer buffers are allocated on top, out of SGLang's reserve T0 x (1 - F); from 0.5.4 the cell adds
  the indexer's 132 bytes a layer; from 0.5.17 (`calculate_mla_kv_cache_dim`, pool_configurator.py) the fp8 MLA part
  is the 656-byte layout above (0.5.4-0.5.15: 576 x 1, the 80 bytes a layer more then coming out of the reserve);
- server_args.py (`__post_init__` 0.5.3-0.5.4, `_handle_model_specific_adjustments` later): on CUDA the page size
  is set to 64 and an `auto` KV dtype becomes fp8_e4m3 on SM >= 100 (Blackwell; bfloat16 before it); 0.5.3 also
  sets --mem-fraction-static 0.8, and 0.5.3-0.5.4 turn DP attention on with dp_size = tp_size (0.5.6 sets
  enable_dp_attention with dp_size left at 1, from 0.5.9 only for prefill context parallelism).

Checked on sglang#14700 (tests/data/startup_v3, dev group: B300, fp8 KV, DP attention 8): 'KV Cache is allocated.
#tokens: 3627136, KV size: 162.38 GB' is 3,627,136 x 61 x (656 + 132) bytes = 162.375 GiB (tests/test_sglang_dsa.py).

Release lines (`releases.RELEASES`) join 0.5.3 and 0.5.4, and 0.5.15-0.5.17: a line takes its newest release's
sizing cell as its middle and the larger cell as its conservative end (fewer tokens: never more than the engine's).
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.families.registry import traits

Line = tuple[int, int, int, int]
FIRST_DSA: Line = (0, 5, 3, 0)  # NSATokenToKVPool arrives (absent in 0.5.2)
FP8_LAYOUT_IN_CELL: Line = (0, 5, 17, 0)  # calculate_mla_kv_cache_dim: the 656-byte fp8 layout in the cell
FORCED_F_LINE: Line = (0, 5, 3, 0)  # 0.5.3 sets --mem-fraction-static 0.8 (not 0.5.4)
DP_FORCED_BEFORE: Line = (0, 5, 5, 0)  # 0.5.3-0.5.4 set enable_dp_attention and dp_size = tp_size for DSA
DSA_PAGE = 64  # server_args: page_size 64 on CUDA (NSATokenToKVPool asserts it)
QUANT_BLOCK = 128  # NSATokenToKVPool.quant_block_size
FORCED_F = 0.8


def is_dsa(card: ModelCard) -> bool:
    """Whether SGLang loads this model with the NSA / DSA pool (DeepSeek-V3.2: the family with an indexer cache)."""
    return card.mla is not None and traits(card.architecture).side_cache_bytes > 0


def check_dsa(card: ModelCard, line: Line, amd: bool) -> None:
    """A DSA model on a release without NSA code, or on ROCm (page size 1 there, not read), is refused."""
    if line < FIRST_DSA:
        raise ConfigError(f"model {card.name}: DeepSeek-V3.2's sparse attention arrived in SGLang 0.5.3 (no NSA pool "
                          "in 0.5.2); use sglang@0.5.3 or later")
    if amd:
        raise ConfigError(f"model {card.name}: DeepSeek-V3.2 on ROCm (page size 1, the raw fp8 layout) is not modelled "
                          "for SGLang")


def dsa_kv_dtype(kv_cache_dtype: str, blackwell: bool) -> str:
    """SGLang's KV dtype for a DSA model: `auto` becomes fp8 on SM >= 100 (Blackwell), else stays the model's."""
    return "fp8" if kv_cache_dtype == "auto" and blackwell else kv_cache_dtype


def mla_pool_bytes(card: ModelCard, kv_bytes: int) -> int:
    """Bytes of one token and layer in the MLA buffer of a DSA model: 656 with fp8 (latent, scales, bf16 rope)."""
    m = card.mla
    assert m is not None
    if kv_bytes == 1:
        return m.kv_lora_rank + m.kv_lora_rank // QUANT_BLOCK * 4 + m.qk_rope_head_dim * 2
    return (m.kv_lora_rank + m.qk_rope_head_dim) * kv_bytes


def indexer_bytes(card: ModelCard) -> int:
    """The indexer key cache of one token and layer (uint8: index_head_dim fp8 + one fp32 scale per 128)."""
    return traits(card.architecture).side_cache_bytes


def dsa_cells(card: ModelCard, line: Line, kv_bytes: int) -> tuple[int, int, int]:
    """(the sizing cell, its conservative end, the bytes the pool allocates) per token on one rank, all layers."""
    m, layers, idx = card.mla, card.num_kv_layers, indexer_bytes(card)
    assert m is not None
    latent = (m.kv_lora_rank + m.qk_rope_head_dim) * kv_bytes
    full = mla_pool_bytes(card, kv_bytes)
    if line >= FP8_LAYOUT_IN_CELL:
        mid = low = full + idx
    elif line >= (0, 5, 15, 0):  # the 0.5.15 line covers 0.5.15-0.5.17: 0.5.17 counts the fp8 layout
        mid, low = full + idx, latent + idx
        mid, low = min(mid, low), max(mid, low)
    else:  # 0.5.3 line (0.5.3-0.5.4): 0.5.4 adds the indexer (middle and conservative end); 0.5.3 does not
        mid = low = latent + idx
    return mid * layers, low * layers, (full + idx) * layers


def dsa_notes(card: ModelCard, line: Line, kv_dtype: str, forced_dtype: bool, page: int, tokens: int,
              cell: int, pool_cell: int, dp_attention: int, mem_fraction_set: bool) -> list[str]:
    """What SGLang does by itself for DeepSeek-V3.2, and the pool's bytes beyond what it sized (from the reserve)."""
    layers = card.num_kv_layers
    notes = [f"DeepSeek-V3.2: the indexer's key cache ({indexer_bytes(card)} B a token and layer, fp8 + scales) sits "
             f"beside the MLA latent; page size {page} (SGLang sets 64 for DSA on CUDA)"]
    if forced_dtype:
        notes.append(f"DeepSeek-V3.2 on Blackwell: SGLang turns an auto KV cache into {kv_dtype} (SM >= 100)")
    extra = tokens * (pool_cell - cell)
    if extra > 0:
        notes.append(f"the pool allocates {extra / 2**30:.2f} GiB more than it sized ({pool_cell // layers} B a token "
                     f"and layer, sized at {cell // layers}): it comes out of the reserve T0 x (1 - F)")
    if line < (0, 5, 5, 0):  # the 0.5.3 line: 0.5.3 and 0.5.4
        notes.append("SGLang 0.5.3 sizes the pool without the indexer (more tokens, the indexer out of the reserve) and "
                     f"sets F to {FORCED_F}" + ("" if mem_fraction_set else " by itself") + "; 0.5.4's cell counts it: "
                     "the figures are 0.5.4's")
    if line < DP_FORCED_BEFORE and dp_attention == 1:
        notes.append("SGLang 0.5.3-0.5.4 turn DP attention on (dp = tp) for DeepSeek-V3.2 by themselves: set "
                     "enable_dp_attention with data_parallel_size = tensor_parallel_size to model that run")
    return notes


__all__ = ["DSA_PAGE", "FIRST_DSA", "check_dsa", "dsa_cells", "dsa_kv_dtype", "dsa_notes", "indexer_bytes", "is_dsa",
           "mla_pool_bytes"]
