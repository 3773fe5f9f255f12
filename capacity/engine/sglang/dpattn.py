"""SGLang's data-parallel attention (`--tp T --dp D --enable-dp-attention`), as it lays out one rank's memory.
Read in the PyPI wheels of 0.4.8.post1, 0.5.5 and 0.5.23 (`python/sglang/srt/...`):

- `layers/dp_attention.py` `compute_dp_attention_world_info`: attention TP = T / D; rank r is attention-DP rank
  r // (T / D). The T GPUs run D attention groups, each with its own scheduler, requests and KV pool
  (`managers/data_parallel_controller.py` sends each request to one of them).
- Attention weights (`models/deepseek_v2.py` DeepseekV2AttentionMLA, `qwen3_moe.py`, `gpt_oss.py`, ...: their
  linears take `tp_rank=get_attention_tp_rank(), tp_size=get_attention_tp_size()`) are sharded over T / D ranks,
  i.e. each is held D times in the group. Dense MLPs, the experts (TP over T; `--ep-size` splits them whole,
  sglang/ep.py) and the LM head (vocab over T unless --enable-dp-lm-head) stay over T; the input embedding
  is replicated (`VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled())`) in every model below
  but PhiMoE.
- KV: `model_runner.py` `profile_max_num_token` sizes the cell with `get_num_kv_heads(get_attention_tp_size())`
  (MLA's latent is never sharded), on every rank from that rank's free memory: one pool per attention group.
- `server_args.py`: `_handle_data_parallelism` asserts tp % dp == 0 and divides chunked_prefill_size by dp (after
  the default F was set from the undivided one); up to 0.4.4 (0.4.3, 0.4.3.post2/post4, 0.4.4 read) `__post_init__`
  set dp_size = tp_size (attention TP 1) and halved the chunk instead, from 0.4.4.post1 the rule above; the default F reserves graph_bs x dp x 3 MiB more (+ x 1.5 over
  a graph_bs of 300) from 0.5.3, 4 GiB more from 0.4.7.post1 to the 0.5.3 rules, and nothing before (memory.py
  `default_mem_fraction_static`); `managers/tp_worker.py`: --max-running-requests is divided by dp.
- CUDA graphs capture the batch sizes of the list that are multiples of the attention TP size
  (`cuda_graph_runner.py` `get_batch_sizes_to_capture`, with the gathered buffer); each forward also takes a
  gathered buffer of (tokens x dp) x hidden (`get_global_dp_buffer`, `global_dp_buffer_len`). Both live in the
  reserve T0 x (1 - F): SGLang does not subtract them at start-up, and neither does capacity.

Only models whose SGLang code shards attention by the attention-TP group are accepted: the others (Llama, Qwen2,
Mistral, Gemma...) shard it over the whole TP group, so their DP attention is not a layout SGLang has.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.weights import weight_bytes_per_rank

# card.architecture of the SGLang models (0.5.5 models/*.py) whose attention uses get_attention_tp_size()
DP_ATTENTION_ARCHS = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "qwen2_moe", "qwen3_moe", "qwen3", "qwen3_next",
                                "gpt_oss", "glm4_moe", "llama4", "bailing_moe", "phimoe", "falcon_h1",
                                "longcat_flash", "step3_vl",
                                # DeepseekV2AttentionMLA (attention-TP sharded) in glm4_moe.py GlmMoeDsaForCausalLM,
                                # kimi_k25.py (a DeepseekV3ForCausalLM), glm4_moe_lite.py: 0.5.8-0.5.23 (sglang/mla.py)
                                "glm_moe_dsa", "kimi_k25", "glm4_moe_lite"})
EMBED_SHARDED = frozenset({"phimoe"})  # the one among them whose embedding stays vocab-parallel over T
# the tensor groups (capacity.model.weights) that SGLang's attention modules hold, sharded over tp / dp
ATTENTION_GROUPS = frozenset({"q_proj", "kv_proj", "o_proj", "q_bias", "kv_bias", "sinks", "q_a_proj", "q_b_proj",
                              "kv_a_proj", "kv_b_proj"})


def check_dp_attention(card: ModelCard, tp: int, dp: int, line: tuple[int, int, int, int] = (9, 0, 0, 0)) -> int:
    """The attention TP size (tp / dp) of this layout under the release `line`, or a one-line error naming the
    field."""
    if line < (0, 4, 4, 1) and dp != tp:
        raise ConfigError(f"enable_dp_attention: data_parallel_size {dp}: SGLang up to 0.4.4 sets dp_size = tp_size "
                          f"({tp}) with DP attention (server_args.py)")
    if dp < 2 or tp % dp:
        raise ConfigError(f"enable_dp_attention: data_parallel_size {dp} must be > 1 and divide tensor_parallel_size "
                          f"{tp} (SGLang asserts tp_size % dp_size == 0)")
    if card.architecture not in DP_ATTENTION_ARCHS:
        raise ConfigError(f"enable_dp_attention: SGLang's {card.architecture} model shards attention over the whole "
                          f"TP group (no attention-TP group in its code); DP attention is for {', '.join(sorted(DP_ATTENTION_ARCHS))}")
    return tp // dp


def dp_attention_weights(card: ModelCard, tp: int, dp: int) -> dict[str, float]:
    """Bytes of every tensor group on one rank under DP attention: attention over tp / dp ranks, the input
    embedding replicated (but PhiMoE's), everything else as at TP tp."""
    out = weight_bytes_per_rank(card, tp)
    attn = weight_bytes_per_rank(card, tp // dp)
    for k in ATTENTION_GROUPS & out.keys():
        out[k] = attn[k]
    if "embed_tokens" in out and card.architecture not in EMBED_SHARDED:
        out["embed_tokens"] = weight_bytes_per_rank(card, 1)["embed_tokens"]
    return out


def chunk_divisor(dp: int, line: tuple[int, int, int, int]) -> int:
    """What SGLang divides chunked_prefill_size by under DP attention: dp from 0.4.4.post1, 2 before."""
    return 2 if line < (0, 4, 4, 1) else dp


def dp_chunk(chunk: int, dp: int, line: tuple[int, int, int, int]) -> int:
    """chunked_prefill_size per attention group (see chunk_divisor)."""
    return chunk // chunk_divisor(dp, line)


def dp_attention_note(tp: int, dp: int, chunk: int) -> str:
    return (f"DP attention: {dp} attention groups of TP {tp // dp} on the {tp} GPUs, each with its own scheduler and "
            f"KV pool (the figures are one rank's, i.e. one group's pool); attention weights held {dp} times, the "
            f"embedding replicated; chunked_prefill_size {chunk} per group (SGLang divides it by dp); CUDA graphs and "
            "the gathered DP buffer live in the reserve")


__all__ = ["ATTENTION_GROUPS", "DP_ATTENTION_ARCHS", "check_dp_attention", "dp_attention_note", "dp_attention_weights",
           "chunk_divisor", "dp_chunk"]
