"""The sequence state every batching policy and the KV cache managers share (`Seq`): one request as the engine
sees it. The lowest module of `capacity.sched`: the KV cache managers (`kv.py`, `prefix_cache.py`) and the queues
import it, and `capacity.sched.base` (which re-exports it) imports them.
"""
from __future__ import annotations

from dataclasses import dataclass

from capacity.workload import Request

NAN = float("nan")


@dataclass(slots=True, eq=False)
class Seq:
    """One request as the engine sees it: `computed` tokens have KV in the cache, `generated` outputs are out."""

    req: Request
    computed: int = 0  # tokens whose KV is in the cache (own blocks + shared prefix blocks)
    generated: int = 0  # output tokens emitted so far
    blocks: int = 0  # own KV blocks held (managed by the KV cache manager only)
    shared_blocks: int = 0  # prefix-cache blocks referenced, not owned (KV cache manager only)
    kv_capacity: int = 0  # tokens its blocks hold (set by the KV cache manager; read by schedulers)
    first_scheduled_s: float = NAN
    first_token_s: float = NAN
    last_token_s: float = NAN
    finish_s: float = NAN
    preemptions: int = 0
    replica: int = 0
    prompt: int = 0  # copies of req.prompt_tokens / output_tokens: read in the hot loops
    output: int = 0
    phase: int = 0  # disaggregated serving: 1 in the prefill pool (one output token), 2 in the decode pool
    inflight: int = 0  # async scheduling: tokens of its last step whose output the engine has not processed yet
    loading: int = 0  # disaggregated decode pool: 1 its prompt's KV is to be loaded on admission, 2 it is loading
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission
    spec_credit: float = 0.0  # speculative decoding: accepted draft tokens owed (the fraction of the mean not yet given)

    def __post_init__(self) -> None:
        self.prompt, self.output = self.req.prompt_tokens, self.req.output_tokens

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output

    @property
    def is_decode(self) -> bool:
        return self.generated > 0 and self.prompt + self.generated - self.computed == 1
