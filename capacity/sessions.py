"""Multi-turn sessions: chat conversations and agentic loops whose every turn resends the whole context so far.

A workload with `sessions` (WorkloadSpec.sessions) sends sessions, not independent requests. Sessions start at
the workload's arrivals (poisson, gamma or constant: `arrivals.rate_per_s` is then new sessions/s); each has a
number of turns drawn from `turns`. Turn 1's prompt is drawn from the workload's (or its class's) `input_len`;
turn k+1's prompt is turn k's prompt + turn k's output + `new_tokens` (the next user message or tool result),
so the prompt of turn k is the first prompt plus the outputs and new tokens of every turn before it. Each
turn's output is drawn from `output_len`. Turn k+1 is sent a think time after turn k's answer completes (a
closed loop per session; `capacity.sim.sources.SessionUsers` releases it), drawn from a Gamma with mean
`think_s` and coefficient of variation `think_cv` (1: exponential, 0: always think_s). `num_requests` counts
turns: sessions stop starting, and sessions stop early, once that many turns are issued. A rejected turn (a
context past max_model_len) ends its session.

Prefix identity: every turn of session s carries `block_keys=(s,)` with one chunk longer than any context
(`KEY_TOKENS`), and `Request.session = s`, so the prefix cache keys block i of every turn's tokens, output
included, as (s, -2, i) (capacity.sched.prefix_cache): turn k+1 finds turn k's prompt and output blocks, up to
the last full block of the tokens turn k computed (its last output token is sampled, never computed). A shared
system prompt (`prefix` groups) keeps its group's keys for its blocks, shared across sessions.

With an uncongested server, turns arrive at sessions/s x mean turns (each session sends all its turns); the
think time sets how far apart a session's turns are, not how many there are.
"""
from __future__ import annotations

from typing import Annotated, Protocol

import numpy as np
from pydantic import Field

from capacity.draws import (
    Lengths,
    NonNegFloat,
    Request,
    SpecView,
    _Strict,
    draw_attributes,
    fixed,
    interarrival_gaps,
)
from capacity.errors import ConfigError
from capacity.limits import MAX_CV

KEY_TOKENS = 1 << 40  # a session's one prefix-key chunk: longer than any context, so every block lies inside it
SESSION_ARRIVALS = ("poisson", "gamma", "constant")


class Sessions(_Strict):
    """Multi-turn sessions (capacity.sessions): turns per session, tokens each later turn adds, the think
    time between an answer and the next turn."""

    turns: Lengths = fixed(4)  # turns per session (a count: fixed, uniform, lognormal or empirical)
    new_tokens: Lengths = fixed(128)  # tokens each turn after the first adds to the context (user message, tool output)
    think_s: NonNegFloat = 10.0  # mean time from a turn's last token to the next turn's send, s
    think_cv: Annotated[float, Field(ge=0, le=MAX_CV, allow_inf_nan=False)] = 1.0  # think time's CV: 1 exponential, 0 fixed

    def check(self, spec: SessionSpec) -> None:
        """The workload around it: sessions start at an open-loop process with a rate (ValueError otherwise)."""
        arr = spec.arrivals
        if arr.kind not in SESSION_ARRIVALS:
            raise ValueError(f"sessions: start at {', '.join(SESSION_ARRIVALS)} arrivals (arrivals.kind is "
                             f"{arr.kind}; a session is its own closed loop)")
        if arr.max_concurrency is not None:
            raise ValueError("sessions: arrivals.max_concurrency is not modelled with sessions")
        if spec.trace:
            raise ValueError("sessions: a trace brings its own requests (leave out sessions or trace)")

    @property
    def mean_turns(self) -> float:
        return self.turns.expected

    def think(self, rng: np.random.Generator) -> float:
        """One think time, s."""
        if self.think_s == 0 or self.think_cv == 0:
            return self.think_s
        shape = 1.0 / self.think_cv ** 2
        return float(rng.gamma(shape, self.think_s / shape))


class SessionSpec(SpecView, Protocol):
    """The workload spec as the session draws read it (`capacity.workload.WorkloadSpec`, which imports this module)."""

    @property
    def sessions(self) -> Sessions | None: ...


def session_starts(spec: SessionSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """The start times of up to `n` sessions (there are never more sessions than turns)."""
    if spec.arrivals.rate_per_s is None:
        raise ConfigError("arrivals.rate_per_s: sessions need a rate of new sessions/s")
    return np.cumsum(interarrival_gaps(spec.arrivals, rng, n))


def first_turn(spec: SessionSpec, rng: np.random.Generator, session: int, rid: int) -> tuple[Request, int]:
    """A session's first request (class, lengths and prefix group drawn as for any request) and its turns."""
    sess = spec.sessions
    assert sess is not None
    req = draw_attributes(spec, rng, 1, start_id=rid)[0]
    req.session, req.block_keys, req.block_key_tokens = session, (session,), KEY_TOKENS
    return req, int(sess.turns.draw(rng, 1)[0])


def next_turn(spec: SessionSpec, rng: np.random.Generator, prev: Request, rid: int, now_s: float) -> Request:
    """The turn after `prev`: its whole context (prompt + output) plus new tokens; output drawn for its class."""
    sess = spec.sessions
    assert sess is not None
    new = int(sess.new_tokens.draw(rng, 1)[0])
    out = int(spec.class_lengths(prev.cls)[1].draw(rng, 1)[0])
    return Request(rid, now_s, prev.prompt_tokens + prev.output_tokens + new, out, prev.cls, prev.priority,
                   prev.prefix_group, prev.prefix_tokens, prev.service, prev.block_keys, prev.block_key_tokens,
                   prev.session)


def expected_prompt_tokens(spec: SessionSpec, turn: int) -> float:
    """The mean prompt of turn `turn` (1-based), one class: the first prompt plus (turn - 1) outputs and new
    tokens, E[I] + (k - 1)(E[O] + E[N]). The prefix cache can hold all but the new tokens and the last output
    token's KV, rounded down to a block."""
    sess = spec.sessions
    assert sess is not None
    li, lo = spec.class_lengths(0)
    return li.expected + (turn - 1) * (lo.expected + sess.new_tokens.expected)


def session_note(spec: SessionSpec) -> str:
    """What a session workload offers, by hand (the closed forms above), for a run's notes."""
    sess, rate = spec.sessions, spec.arrivals.rate_per_s
    assert sess is not None and rate is not None
    growth = expected_prompt_tokens(spec, 2) - expected_prompt_tokens(spec, 1)
    return (f"sessions: {rate:g} new/s x {sess.mean_turns:g} turns = {rate * sess.mean_turns:.3g} turns/s offered "
            f"once sessions overlap (the run's own rate includes its ramp-up and drain); turn k's prompt is "
            f"{expected_prompt_tokens(spec, 1):,.0f} + (k - 1) x {growth:,.0f} tokens on average, all but the new "
            f"tokens reusable by a prefix cache on the same replica (docs/sessions.md)")
