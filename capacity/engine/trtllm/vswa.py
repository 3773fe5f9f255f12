"""TensorRT-LLM's KV pools for models with sliding-window layers (gpt-oss, Gemma-2/3, Mistral with a window):
docs/trtllm.md, "Sliding-window layers", has each term's file and function and the hand checks.

- **By default, one pool at full attention.** `KVCacheManager.__init__` (`_torch/pyexecutor/resource_manager.py`):
  `if kv_cache_config.max_attention_window is None: self.max_attention_window_vec = [max_seq_len]`; nothing in the
  PyTorch backend fills it in from the model's `sliding_window` / `layer_types` for the families here (the one
  exception found, a later main, is Gemma-4 in `_util.py`). So every layer keeps every token: bytes per token over
  all layers, the model's sliding layers included. The 1.1.0rc3 gpt-oss-120b log (tests/data/trtllm_startup) shows
  it: "kv size is 73728" = 2 x 36 layers x 8 x 64 x 2 B, and one pool of 86,720 tokens.
- **VSWA (variable sliding-window attention) when `kv_cache_config.max_attention_window` is given** (the
  `trtllm_vswa` setting writes it: `sliding_window` for the sliding layers, max_seq_len for the rest, clamped to
  max_seq_len). `is_vswa = len(set(max_attention_window_vec)) > 1`; layers are grouped by window
  (`groupLayersByWindowSize`), one `WindowBlockManager` and pool per window, and the memory (1.1+:
  `max_gpu_total_bytes`, the KvCacheCreator's estimate) is split between them by one of two rules:
  - "weighted": `BlockManager::calculateWindowSizeToShare` (`cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp`,
    NVIDIA/TensorRT-LLM PR 3028, bytes-per-token weighting PR 4667): share(w) proportional to (bytes a token takes
    in w's layers / all layers' bytes) x w; `BaseKVCacheManager::calculateMaxNumBlocks`: tokens =
    uint64(memory x share / bytes per token of w's layers), at most max_tokens, blocks = ceilDiv(tokens, block);
  - "equal": `KVCacheManager.calculate_max_num_blocks_for_vswa` (resource_manager.py, after PR 7923, reviewed
    2025-09-24; the default with `TRTLLM_WINDOW_SIZE_SHARES` unset): share 1 / number of windows, blocks =
    int(memory x share / bytes per token // block), max_tokens ignored ("we are operating on VSWA scheme").
  Which rule a 1.1 build has could not be settled (1.1.0rc3 was cut before PR 7923, the 1.1 line's later
  candidates maybe not): both are computed and the planner takes the fewer blocks of either. 1.0: "weighted";
  1.2: "equal". Before 1.0 (PyTorch VSWA came with PR 5151, June 2025, near the 0.21 branch) and on the engine
  backend, VSWA is refused in one line (not read).
- **Scheduling**: a sequence takes blocks from every window's pool (`KVCacheManager::getMaxCapacityBatchSize`: the
  window with the smallest batch is the limit; `calculateMaxBlockRequirementsPerBeam`: ceil(min(length, w) /
  block) blocks in w's pool). capacity's scheduler holds the full-attention pool's blocks; the window pools cap the
  batch: max_num_seqs <= the window pool's blocks // (ceil(w / block) + 1) (a window that straddles a block
  boundary holds one more), the conservative end over the rules.
"""
from __future__ import annotations

from capacity.engine.budget import MemoryBudget
from capacity.engine.config import EngineConfig, ResolvedEngine
from capacity.engine.trtllm.config import trtllm_vswa
from capacity.engine.trtllm.release import TrtllmRelease
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.units import DTYPE_BYTES, GiB

RULES = {"1.0": ("weighted",), "1.1": ("weighted", "equal"), "1.2": ("equal",)}


def check(card: ModelCard, cfg: EngineConfig, rel: TrtllmRelease) -> None:
    """Refuse, in one line, `trtllm_vswa` where it is not modelled (no sliding layers, the engine backend, a
    PyTorch backend before 1.0)."""
    if not trtllm_vswa(cfg):
        return
    if not card.num_sliding_layers or card.num_sliding_layers >= card.num_kv_layers:
        raise ConfigError(f"trtllm_vswa true: model {card.name} has no mix of sliding-window and full-attention "
                          "layers")
    if rel.engine_backend or rel.version not in RULES:
        raise ConfigError("trtllm_vswa true: per-window KV pools are modelled for the PyTorch "
                          f"backend of 1.0-1.2 only ({rel.label}); leave kv_cache_config.max_attention_window unset")


def windows(card: ModelCard, max_seq_len: int) -> dict[int, int]:
    """Layers per attention window, TensorRT-LLM's windowSizeToLayers (windows clamped to max_seq_len)."""
    sliding = min(card.sliding_window or max_seq_len, max_seq_len)
    full = card.num_kv_layers - card.num_sliding_layers
    if sliding == max_seq_len:
        return {max_seq_len: card.num_kv_layers}
    return {sliding: card.num_sliding_layers, max_seq_len: full}


def shares(rule: str, layers: dict[int, int]) -> dict[int, float]:
    """Each window's share of the memory (every layer the same bytes per token here)."""
    if len(layers) == 1:
        return {w: 1.0 for w in layers}
    if rule == "equal":
        return {w: 1.0 / len(layers) for w in layers}
    total = sum(layers.values())
    contrib = {w: n / total * w for w, n in layers.items()}
    s = sum(contrib.values())
    return {w: c / s for w, c in contrib.items()}


def pool_blocks(rule: str, memory: float, layers: dict[int, int], layer_bytes: float, block: int,
                max_tokens: int | None = None) -> dict[int, int]:
    """Blocks of each window's pool from the memory split by `rule` (see the module docstring)."""
    out = {}
    for w, share in shares(rule, layers).items():
        bpt = layers[w] * layer_bytes
        if rule == "equal":  # calculate_max_num_blocks_for_vswa; max_tokens is ignored under VSWA
            out[w] = int(memory * share / bpt // block)
        else:  # calculateMaxNumBlocks: uint64 tokens, at most max_tokens, ceilDiv to blocks
            tokens = int(memory * share / bpt)
            if max_tokens is not None:
                tokens = min(tokens, max_tokens)
            out[w] = -(-tokens // block)
    return out


def window_seqs(blocks: int, window: int, block: int) -> int:
    """Sequences a window's pool holds whatever their length: ceil(w / block) + 1 blocks each."""
    return blocks // (-(-window // block) + 1)


def launch_vector(card: ModelCard, max_seq_len: int) -> list[int]:
    """kv_cache_config.max_attention_window for the launch command: the shortest repeating pattern (TensorRT-LLM
    cycles the vector over the layers) of p - 1 sliding layers then a full one whose cycle gives the card's count of
    full-attention layers (gpt-oss, Gemma-2: [w, L]; Gemma-3: [w] x 5 + [L])."""
    n, full = card.num_kv_layers, card.num_kv_layers - card.num_sliding_layers
    w = min(card.sliding_window or max_seq_len, max_seq_len)
    p = next((p for p in range(2, n + 1) if n // p == full), None)
    if p is None:
        raise ConfigError(f"trtllm_vswa: model {card.name}'s {full} full-attention layers of {n} are not a repeating "
                          "pattern; write kv_cache_config.max_attention_window by hand")
    return [w] * (p - 1) + [max_seq_len]


def one_pool_note(card: ModelCard) -> str:
    return (f"sliding-window layers ({card.num_sliding_layers} of {card.num_kv_layers}, window {card.sliding_window}): "
            "TensorRT-LLM keeps one KV pool at full attention (kv_cache_config.max_attention_window unset), every "
            "layer every token; trtllm_vswa sets it (a pool per window)")


def apply(b: MemoryBudget, card: ModelCard, cfg: EngineConfig, eng: ResolvedEngine, rel: TrtllmRelease,
          memory: dict[str, float], cap: int | None) -> None:
    """Lay the budget out as TensorRT-LLM's pools: one at full attention (the default; a note) or, with
    `trtllm_vswa`, a pool per window: the blocks are the full-attention pool's, the batch capped by the windows'."""
    if not card.num_sliding_layers:
        return
    if not trtllm_vswa(cfg):
        b.warnings.append(one_pool_note(card))
        return
    ctx, block = eng.max_model_len, eng.block_size
    layers = windows(card, ctx)
    if len(layers) == 1:
        return
    w = min(layers)
    layer_bytes = card.kv_elements_per_token_per_layer(eng.tp) * DTYPE_BYTES[eng.kv_dtype]
    ends = {end: {r: pool_blocks(r, memory[end], layers, layer_bytes, block, cap) for r in RULES[rel.version]}
            for end in ("mid", "lo", "hi")}
    first = RULES[rel.version][0]
    mid = ends["mid"][first]
    full_lo = min(p[ctx] for p in ends["lo"].values())
    full_hi = max(p[ctx] for p in ends["hi"].values())
    seqs = min(window_seqs(p[w], w, block) for p in ends["lo"].values())
    full_bpt = layers[ctx] * layer_bytes
    b.num_blocks, b.kv_tokens, b.kv_bytes_per_token = mid[ctx], mid[ctx] * block, full_bpt
    b.block_bytes, b.num_blocks_range = block * full_bpt, [full_lo, full_hi]
    b.planning_blocks = full_lo if cfg.kv_estimate == "conservative" else mid[ctx]
    b.max_concurrency, b.contiguous_max_seqs = b.kv_tokens / ctx, b.kv_tokens // ctx
    if b.max_num_seqs > seqs:
        b.max_num_seqs = max(1, seqs)
    if 0 < b.planning_blocks * block < b.max_model_len:  # _validate_and_adjust_attention_windows lowers max_seq_len
        b.max_model_len = b.planning_blocks * block
        b.warnings.append(f"the full-attention pool holds {b.max_model_len:,} tokens: TensorRT-LLM lowers max_seq_len")
    pools = "; ".join(f"{r}: window {w}: {p[w]:,} blocks, full {ctx}: {p[ctx]:,}" for r, p in ends["mid"].items())
    b.warnings.append(f"VSWA (trtllm_vswa, TensorRT-LLM {rel.version}): a pool per window of "
                      f"{memory['mid'] / GiB:.2f} GiB ({pools}; rule {'/'.join(RULES[rel.version])}); the "
                      f"{w}-token window's pool holds {seqs:,} sequences at the conservative end, the batch cap")


__all__ = ["RULES", "apply", "check", "launch_vector", "one_pool_note", "pool_blocks", "shares", "window_seqs", "windows"]
