"""Reasoning models seen through a benchmark client: the workload's `reasoning:` section.

A reasoning model (gpt-oss, Qwen3 / Nemotron with thinking on, DeepSeek-R1) generates hidden reasoning tokens and
then the answer. With a reasoning parser on the server (`--reasoning-parser`, or gpt-oss's harmony channels) the
OpenAI chat endpoint streams the reasoning in `delta.reasoning_content` (or `reasoning`) and the answer in
`delta.content`. The engine's work is every generated token (the workload's `output_len` is that total, as
ever); what a benchmark prints depends on which chunks its client times and which tokens it counts:

- `first_token: any` (default): the client's TTFT ends at the first chunk that has `choices`, a reasoning delta
  included, and every later chunk is an ITL sample. That is `vllm bench serve --backend openai-chat`
  (`async_request_openai_chat_completions`, vllm/benchmarks/lib/endpoint_request_func.py: the first chunk with
  `choices` sets `ttft` whatever its delta holds, every later one appends to `itl`, and the latency ends at the
  last such chunk; the server's first chunk is the role chunk sent with the first generated token,
  `chat_completion_stream_generator` in vllm/entrypoints/openai/serving_chat.py). `content`: the clock stops at the
  first non-empty `delta.content` and only such chunks are ITL samples, the reasoning timed as waiting: that is
  `python -m sglang.bench_serving --backend openai-chat` (`async_request_openai_chat_completions` in
  python/sglang/bench_serving.py, stored copy at sgl-project/sglang 0033168f: `if content:` guards the timing;
  its count is `usage.completion_tokens`, or the request's max_tokens when the server sends no usage).
- `counted: all` (default): the client divides by every generated token (`usage.completion_tokens`, which counts
  the reasoning). `content`: by the answer's tokens only (the client tokenises the `delta.content` text it
  gathered, `generated_text`, when the server sends no usage count). `vllm bench serve` then prints
  TPOT = (E2E - TTFT) / (counted - 1) and output tokens/s = counted tokens / duration
  (`calculate_metrics`, vllm/benchmarks/serve.py).

How many of a request's generated tokens are reasoning: `share` of each (rounded down, at least one token of
content left) or `content_tokens` (the answer's length, a mean: the rest of the output is reasoning). Defaults
change nothing: without the section, or with `counted: all` and `first_token: any`, every metric is as before.
The client's view is made in `capacity.sim.metrics.client_view`; docs/fidelity.md, "Reasoning models".
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from capacity.draws import _Strict

# An answer longer than any served context (10 M tokens) is a typo, not a workload: refused in one line
MAX_CONTENT_TOKENS = 10_000_000


class Reasoning(_Strict):
    """Hidden reasoning tokens per request and how the benchmark client times and counts them (capacity.reasoning)."""

    share: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = None  # share of each request's generated tokens that are reasoning (rounded down)
    content_tokens: Annotated[float, Field(ge=1, le=MAX_CONTENT_TOKENS, allow_inf_nan=False)] | None = None  # answer tokens per request (a mean); the rest of its output is reasoning
    counted: Literal["all", "content"] = "all"  # tokens the client divides by: all (usage.completion_tokens, reasoning included) or content (the answer text tokenised)
    first_token: Literal["any", "content"] = "any"  # chunk that ends the client's TTFT: any (vllm bench serve openai-chat) or the first content delta (sglang.bench_serving openai-chat)

    @model_validator(mode="after")
    def _check(self) -> Reasoning:
        if (self.share is None) == (self.content_tokens is None):
            raise ValueError("reasoning: give one of share (of each output) or content_tokens (per request)")
        return self

    def content(self, output_tokens: np.ndarray) -> np.ndarray:
        """The answer's tokens of requests that generated `output_tokens` each (float: `content_tokens` is a mean)."""
        out = np.asarray(output_tokens, dtype=float)
        if self.content_tokens is not None:
            return np.minimum(self.content_tokens, out)
        return np.maximum(out - np.floor(self.share * out), np.minimum(out, 1.0))


def reasoning_flags(share: float | None, content_tokens: float | None, counted: str | None,
                    first_token: str | None) -> dict[str, Any] | None:
    """The `reasoning:` mapping from the CLI's --reasoning-share, --reasoning-content-tokens, --reasoning-counted
    and --reasoning-ttft (None: none given)."""
    d = {"share": share, "content_tokens": content_tokens, "counted": counted, "first_token": first_token}
    d = {k: v for k, v in d.items() if v is not None}
    return d or None
