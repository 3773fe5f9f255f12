"""Speculative decoding's step cost: the target's verify step plus the draft's forwards, around any step cost.

A step's decoding sequences are verified with k + 1 query tokens each (the last sampled token and k drafts, each
with its logits: `StepPlan.decode_queries`); prefill chunks are as they are. The draft runs in the same step, as
each engine schedules it:
- vLLM v1 (`EagleProposer.propose`, vllm/v1/spec_decode/eagle.py; the draft-model proposer in draft_model.py
  follows the same loop): one draft forward over every token the target ran this step (prefill chunks and the
  k + 1 positions of each decode), which proposes the first draft, then k - 1 forwards of one token per
  decoding sequence;
- SGLang (`EAGLEWorker.forward_batch_speculative_generation`, python/sglang/srt/speculative/eagle_worker.py): a
  decode batch runs `draft()` (speculative_num_steps forwards of one token per sequence at top-k 1), `verify()`,
  then `forward_draft_extend_after_decode` over the verified positions; a prefill batch runs the draft over its
  tokens (`forward_draft_extend`).
The draft's own cost is a step cost of its card (a draft model, or a one-layer head) with no engine overhead.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from capacity.cost.step import StepCost, StepPlan


@dataclass
class SpeculativeCost:
    """`base` (the target) verifying k drafts per decoding sequence, plus `draft`'s forwards (module docstring)."""

    base: StepCost
    draft: StepCost
    k: int
    engine: Literal["vllm", "sglang"] = "vllm"
    label: str = ""
    forward_overhead_s: float = 0.0  # engine time per draft forward beyond the draft cost's own (given, not derived)

    def __post_init__(self) -> None:
        self.source = f"{self.base.source}; speculative {self.label}, draft on {self.draft.source}"

    def verify_plan(self, plan: StepPlan) -> StepPlan:
        return dataclasses.replace(plan, decode_queries=self.k + 1) if plan.decode_contexts else plan

    def draft_s(self, plan: StepPlan) -> float:
        """The draft's forwards in a step whose target plan is `plan` (verify queries already set)."""
        d, o = self.draft, self.forward_overhead_s
        ctx = plan.decode_contexts
        t = 0.0
        if self.engine == "vllm":
            if plan.num_tokens:
                t += d.step_s(plan) + o  # the first forward: every token the target ran
            for j in range(1, self.k if ctx else 0):
                t += d.step_s(StepPlan(decode_contexts=tuple(c + j for c in ctx))) + o
            return t
        if not ctx:
            return d.step_s(plan) + o if plan.num_tokens else 0.0  # draft extend over a prefill batch
        for j in range(self.k):  # draft(): one token per sequence per step
            t += d.step_s(StepPlan(decode_contexts=tuple(c + j for c in ctx))) + o
        return t + d.step_s(plan) + o  # the draft extend over the verified positions

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        v = self.verify_plan(plan)
        out = dict(self.base.breakdown(v))
        out["draft"] = self.draft_s(v)
        return out

    def step_s(self, plan: StepPlan) -> float:
        v = self.verify_plan(plan)
        return math.fsum((self.base.step_s(v), self.draft_s(v)))
