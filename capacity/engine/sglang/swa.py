"""SGLang's hybrid SWA pool: a model with sliding-window and full-attention layers gets two token pools, one for
its full layers and a smaller one for its sliding layers (`mem_cache/swa_memory_pool.py` SWAKVPool), read in the
PyPI wheels of 0.5.5, 0.5.7, 0.5.8, 0.5.9, 0.5.10, 0.5.20 and 0.5.23.

When it is on (`model_runner.py` `is_hybrid_swa`: the model is in `configs/model_config.py`
`is_hybrid_swa_model` and --disable-hybrid-swa-memory is not set by the user or by `server_args.py`):
- 0.5.5-0.5.7: Gemma-2/3/3n, Olmo2 and gpt-oss all set disable_hybrid_swa_memory (`_handle_model_specific_
  adjustments`): every sliding-window model the families describe is sized with one cell over every layer.
- 0.5.8-0.5.9: gpt-oss is a hybrid SWA model unless its attention backend is trtllm_mha, the default on SM100
  (B200/GB200: "Disable hybrid SWA memory for GPT-OSS model with trtllm_mha attention backend"); in 0.5.8 also
  off with speculative decoding (not modelled). 0.5.10-0.5.23: gpt-oss always (the trtllm_mha exception is gone).
  Gemma-2/3 stay off in every release read (`arg_groups/model_overrides/gemma2_gemma3.py` in 0.5.20+).
  Mistral-7B v0.1 and Phi-3 ignore the window in SGLang; Llama-4's chunked attention is not modelled.
- The split (`model_runner_kv_cache_mixin.py` `set_num_tokens_hybrid_swa` in 0.5.8, `_solve_pool_sizes` of
  `pool_configurator.py` HybridSWAPoolConfigurator in 0.5.23; the same equations): profile_max_num_token's count
  over every layer, N = rest // (cell x layers), is the memory; full x n_full + swa x n_swa = N x layers and
  swa = full x r, with r = --swa-full-tokens-ratio (0.8 by default in every release read), so
  full = int(N x layers / (n_full + r x n_swa)), swa = int(full x r), each rounded down to a page.
  max_total_num_tokens (what SGLang logs and schedules by) is the full pool.
- The scheduler admits against the smaller of the two pools' free tokens (`schedule_policy.py` PrefillAdder
  `rem_total_tokens`, 0.5.10), and the SWA pool frees a request's tokens once they leave the window. capacity's
  schedulers hold one pool, so the planner's (conservative) end is the SWA pool: it is never exceeded even when
  nothing has left the window; the middle is the full pool.
"""
from __future__ import annotations

import math

from capacity.model.card import ModelCard

SWA_FULL_TOKENS_RATIO = 0.8  # server_args.py swa_full_tokens_ratio, 0.5.5 to 0.5.23
HYBRID_SWA_ARCHS = frozenset({"gpt_oss"})  # of the families with sliding layers, the ones SGLang splits (0.5.8+)


def hybrid_swa_layers(card: ModelCard, line: tuple[int, int, int, int], arch: str) -> tuple[int, int] | None:
    """(full layers, sliding layers) where this release splits the model's pool on a GPU of this architecture
    (GPU.arch; see the module docstring); None where it sizes one cell over every layer."""
    if not card.num_sliding_layers or card.architecture not in HYBRID_SWA_ARCHS or line < (0, 5, 8, 0):
        return None
    if line < (0, 5, 10, 0) and "sm100" in arch.lower():  # trtllm_mha, gpt-oss's default there
        return None
    return card.num_kv_layers - card.num_sliding_layers, card.num_sliding_layers


def split_pool(tokens: int, full_layers: int, swa_layers: int, page_size: int = 1,
               ratio: float = SWA_FULL_TOKENS_RATIO) -> tuple[int, int]:
    """(full pool, SWA pool) in tokens from profile_max_num_token's count over every layer (`tokens`)."""
    full = int(tokens * (full_layers + swa_layers) / (full_layers + ratio * swa_layers))
    full = full // page_size * page_size
    return full, int(full * ratio) // page_size * page_size


def swa_pin(swa_tokens: int, full_layers: int, swa_layers: int, page_size: int = 1,
             ratio: float = SWA_FULL_TOKENS_RATIO) -> int:
    """The smallest --max-total-tokens (a whole number of pages) whose split gives an SWA pool of at least
    `swa_tokens`: SGLang clamps the count over every layer before it splits it (0.5.8's init_memory_pool)."""
    n = math.floor(swa_tokens / ratio * (full_layers + ratio * swa_layers) / (full_layers + swa_layers))
    n = max(n // page_size - 2, 1) * page_size  # from a little below, so the first that holds is the smallest
    while split_pool(n, full_layers, swa_layers, page_size, ratio)[1] < swa_tokens:
        n += page_size
    return n


def swa_note(split: tuple[int, int] | None, card: ModelCard, full: int = 0, swa: int = 0) -> str:
    if split is None:
        return ("sliding-window layers: SGLang sizes this model's pool as if every layer kept every token (its "
                "hybrid SWA pool is off for Gemma-2/3 in every release read, for gpt-oss before 0.5.8 and with "
                "0.5.8-0.5.9's default trtllm_mha backend on SM100; Mistral/Phi-3 ignore the window)")
    return (f"hybrid SWA pool ({split[0]} full, {split[1]} sliding layers, swa_full_tokens_ratio "
            f"{SWA_FULL_TOKENS_RATIO}): full pool {full:,} tokens (max_total_num_tokens), SWA pool {swa:,}; the "
            "conservative end plans on the SWA pool (SGLang admits by the smaller free count)")


__all__ = ["HYBRID_SWA_ARCHS", "SWA_FULL_TOKENS_RATIO", "hybrid_swa_layers", "split_pool", "swa_note", "swa_pin"]
