"""The step-cost interface: what one engine step processes (`StepPlan`), the `StepCost` protocol every cost
model implements (`step_s`, `breakdown`, optionally an exact vectorised `decode_run_s`), and `LinearCost`, a
transparent cost for hand-traced tests and the engine fit of `capacity calibrate --from-run`.

A step processes prefill chunks (new tokens on top of tokens already cached) and decode sequences (one new
token each, at their context length), possibly mixed (chunked prefill).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class PrefillChunk:
    new_tokens: int
    cached_tokens: int = 0
    emits_token: bool = True  # the chunk that completes the prompt samples the first output token


@dataclass(frozen=True)
class StepPlan:
    prefills: tuple[PrefillChunk, ...] = ()
    decode_contexts: tuple[int, ...] = ()  # context length of each decoding sequence (tokens already cached)
    # query tokens per decoding sequence: 1, or k + 1 in a speculative verify step (the last token and k drafts,
    # each with its logits; capacity.cost.speculative)
    decode_queries: int = 1
    encoder_s: float = 0.0  # the vision encoder's time in this step (images it encodes: capacity.cost.encoder)

    @property
    def num_tokens(self) -> int:
        return sum(p.new_tokens for p in self.prefills) + len(self.decode_contexts) * self.decode_queries

    @property
    def num_sampled(self) -> int:
        return sum(p.emits_token for p in self.prefills) + len(self.decode_contexts) * self.decode_queries


class StepCost(Protocol):
    source: str

    def step_s(self, plan: StepPlan) -> float: ...

    def breakdown(self, plan: StepPlan) -> dict[str, float]: ...


def decode_run_s(cost, contexts, k: int):
    """Durations (s, numpy array of k) of k consecutive decode-only steps of the same sequences, every
    context growing by one token per step. Uses the cost's exact vectorised `decode_run_s` when it has one,
    else evaluates every step."""
    import numpy as np

    fast = getattr(cost, "decode_run_s", None)
    if fast is not None:
        return fast(contexts, k)
    return np.array([cost.step_s(StepPlan(decode_contexts=tuple(c + j for c in contexts))) for j in range(k)])


def first_step_ending_at(f0: float, g: float, x: float, hi: int) -> int:
    """The first of k decode steps lasting f0 + g j (j = 0..) whose end, f0 m + g m (m - 1) / 2 after the first
    starts, is at or after x (at most hi): the root of the quadratic, corrected for rounding (the fast path's
    stop in a stretch of `decode_line` steps)."""
    m = math.ceil(x / f0) if g == 0.0 else math.ceil((math.sqrt((f0 - g / 2) ** 2 + 2 * g * x) - (f0 - g / 2)) / g)
    m = min(max(m, 1), hi)
    while m > 1 and f0 * (m - 1) + g * ((m - 1) * (m - 2) // 2) >= x:
        m -= 1
    while m < hi and f0 * m + g * (m * (m - 1) // 2) < x:
        m += 1
    return m


@dataclass
class LinearCost:
    """step = fixed_s + per_token_s x new tokens + per_seq_s x sequences in the step + per_key_s x keys
    attended (decode: context + 1; prefill: cached + new) + per_pair_s x attention pairs. Pairs depend on the
    attention kernel: "packed" is one dense masked attention over the whole packed step (query tokens x
    keys: what transformers' continuous batching runs on a CPU); "per_sequence" is causal attention per
    prefill chunk, new x (cached + (new + 1) / 2) (paged/varlen kernels: vLLM, SGLang), with decodes
    counted by their keys. per_seq_s is work per scheduled sequence (sampling, output processing,
    streaming), which separates a decode token's cost from a prefill token's. Transparent: hand-checked
    scheduler traces, queueing-theory tests, and the engine model `capacity calibrate --from-run` fits to
    measured runs."""

    fixed_s: float = 0.0
    per_token_s: float = 0.0
    per_key_s: float = 0.0
    per_pair_s: float = 0.0
    source: str = "linear test cost"
    per_seq_s: float = 0.0
    attention: Literal["packed", "per_sequence"] = "packed"

    def __post_init__(self) -> None:
        if self.attention not in ("packed", "per_sequence"):
            raise ValueError(f"attention: must be packed or per_sequence (got {self.attention!r})")

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        if plan.num_tokens == 0:
            return {"overhead": 0.0}
        keys = sum(p.cached_tokens + p.new_tokens for p in plan.prefills) + sum(d + 1 for d in plan.decode_contexts)
        pairs: float
        if self.attention == "packed":
            pairs = float(plan.num_tokens * keys)  # mypyc: an int is not a float (same value as float * int)
        else:
            pairs = 0.0  # a loop, not sum(): sum() of floats is compensated from Python 3.12 on, a compiled loop not
            for p in plan.prefills:
                pairs += p.new_tokens * (p.cached_tokens + (p.new_tokens + 1) / 2)
        seqs = len(plan.prefills) + len(plan.decode_contexts)
        return {"overhead": self.fixed_s + self.per_seq_s * seqs, "gemm": self.per_token_s * plan.num_tokens,
                "attention": self.per_key_s * keys + self.per_pair_s * pairs}

    def step_s(self, plan: StepPlan) -> float:
        return math.fsum(self.breakdown(plan).values())

    def decode_run_s(self, contexts, k: int):
        """Exact: keys grow by the batch size per step, so every term is linear in the step index."""
        import numpy as np

        b = len(contexts)
        f0 = self.step_s(StepPlan(decode_contexts=tuple(contexts)))
        pair_growth = self.per_pair_s * b * b if self.attention == "packed" else 0.0
        return f0 + (self.per_key_s * b + pair_growth) * np.arange(k)
