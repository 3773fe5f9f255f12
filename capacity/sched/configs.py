"""The batching policies' settings: vLLM-style continuous batching's (`ContinuousConfig`, also TensorRT-LLM's) and
SGLang's (`SglangConfig`, with SGLang v0.5.5's defaults). Below the schedulers and the mixins they are built from
(`capacity.sched.stretch`, `capacity.sched.sglang_overlap`), which all read them; `capacity.sched.continuous` and
`capacity.sched.sglang` re-export them.
"""
from __future__ import annotations

from dataclasses import dataclass

from capacity.errors import ConfigError


@dataclass
class ContinuousConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int = 1 << 20
    chunked_prefill: bool = True
    prefix_caching: bool = False
    queue: str = "fcfs"  # fcfs | priority | sjf (capacity.sched.queues)
    max_model_len: int | None = None
    kv_groups: tuple[int, ...] | None = None  # sliding-window layout: (full groups, sliding groups, window blocks[, window])
    # Admit a waiting sequence only if its whole remaining input (prompt, plus outputs to recompute after a
    # preemption) fits in free blocks, not just this step's chunk: vLLM's `scheduler_reserve_full_isl`
    # (default on in vLLM 0.32), which keeps chunked prefill from over-admitting and thrashing the cache.
    reserve_full_input: bool = True
    # Reserve KV for the prompt and every output token at admission, so a running sequence never needs a block
    # and nothing is preempted: TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler (its default policy).
    reserve_output: bool = False
    # Tokens in flight that a sliding-window group reserves at admission on top of its window (vLLM's
    # max_in_flight_tokens; None: one batch, max_num_batched_tokens, as with async scheduling off)
    inflight_tokens: int | None = None
    # vLLM's async scheduling (its GPU default from 0.32's code): the next batch is scheduled before the last
    # one's output is processed, so a sequence that finished in a step keeps its blocks and its place in the
    # running batch (counted against max_num_seqs, never scheduled) until after the next schedule call
    async_scheduling: bool = False
    # Speculative decoding (capacity.engine.speculative): k draft tokens per decoding sequence, which then costs
    # 1 + k tokens of the step's budget (vLLM: num_tokens_with_spec - num_computed_tokens in schedule(),
    # vllm/v1/core/sched/scheduler.py), and E - 1 drafts accepted per verify step on average (`accept_drafts`)
    spec_tokens: int = 0
    spec_extra_mean: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0 (got {getattr(self, name)})")


# SGLang v0.5.5 defaults (srt/environ.py; srt/managers/schedule_policy.py; srt/server_args.py)
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens


@dataclass
class SglangConfig:
    max_total_tokens: int  # KV pool, token slots (a multiple of page_size)
    page_size: int = 1
    max_running_requests: int = 2048
    chunked_prefill_size: int | None = 8192  # None (SGLang's -1): no chunking
    max_prefill_tokens: int = MAX_PREFILL_TOKENS
    context_len: int | None = None  # None: no length limit but the pool's
    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = NEW_TOKEN_RATIO_DECAY_STEPS
    retract_decode_steps: int = RETRACT_DECODE_STEPS
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS
    # SGLang's overlap scheduler (its default; off: --disable-overlap-schedule): steps decided one step stale
    overlap_schedule: bool = False
    # Speculative decoding: k drafts per decode step, E - 1 accepted on average (capacity.sched.base.accept_drafts);
    # SGLang v0.5.5 runs it without the overlap scheduler (server_args.py turns it off for EAGLE/MTP)
    spec_tokens: int = 0
    spec_extra_mean: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_total_tokens", "page_size", "max_running_requests", "max_prefill_tokens",
                     "new_token_ratio_decay_steps", "clip_max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0 (got {getattr(self, name)})")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size <= 0:
            raise ConfigError(f"chunked_prefill_size: must be > 0 or None (got {self.chunked_prefill_size})")
        if self.max_total_tokens < self.page_size:
            raise ConfigError(f"max_total_tokens {self.max_total_tokens}: less than one page of {self.page_size}")
        if not self.schedule_conservativeness > 0:
            raise ConfigError(f"schedule_conservativeness: must be > 0 (got {self.schedule_conservativeness})")

    @property
    def max_req_len(self) -> int:
        """SGLang's longest request (tp_worker.py): min(context_len - 1, max_total_tokens - 1)."""
        pool = self.max_total_tokens // self.page_size * self.page_size
        return min(self.context_len - 1, pool - 1) if self.context_len is not None else pool - 1
