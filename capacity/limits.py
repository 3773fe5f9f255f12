"""Upper bounds on the work one command may ask for. A value past its bound is refused up front, in one
line that names the value, the limit and the environment variable that raises it: never hours of work, a
machine's memory, or a grid of a million simulations started by a typo (`--requests 1e8`).

The defaults are far beyond what a capacity question needs (a simulation of 2 million requests, a thousand
replicas); raise one with its variable, e.g. `CAPACITY_MAX_REQUESTS=10000000`.
"""
from __future__ import annotations

import os

from capacity.errors import ConfigError

LIMITS: dict[str, tuple[int, str, str]] = {
    # name: (default, environment variable, what it bounds)
    "requests": (2_000_000, "CAPACITY_MAX_REQUESTS", "requests in one simulation"),
    "replicas": (1024, "CAPACITY_MAX_REPLICAS", "replicas in one simulation"),
    "users": (100_000, "CAPACITY_MAX_USERS", "closed-loop users"),
    "sweep_points": (10_000, "CAPACITY_MAX_SWEEP_POINTS", "points in one sweep grid"),
    "step_sequences": (1_000_000, "CAPACITY_MAX_STEP_SEQUENCES", "sequences in one step"),
    "step_tokens": (100_000_000, "CAPACITY_MAX_STEP_TOKENS", "tokens in one step (new or cached)"),
    "loadtest_requests": (1_000_000, "CAPACITY_MAX_LOADTEST_REQUESTS", "requests in one load test"),
    "loadtest_concurrency": (10_000, "CAPACITY_MAX_LOADTEST_CONCURRENCY", "concurrent load-test requests"),
    # a load test builds each prompt as text (about 6 bytes a token) and reads each answer: 2 M tokens is past
    # every served context but the rarest; 999999999999 was a hang growing past 1 GB
    "loadtest_tokens": (2_000_000, "CAPACITY_MAX_LOADTEST_TOKENS", "tokens in one load-test request (prompt or output)"),
    "loadtest_seconds": (7 * 86400, "CAPACITY_MAX_LOADTEST_SECONDS", "seconds (a week) of a load test's timeouts and waits"),
}


# Bounds on rates and burstiness, so that simulated time, replica counts and gap draws stay finite and bounded: a
# rate of 1e-9 req/s put zero replicas in a plan (a division by zero), one of 1e30 a 27-digit GPU count; a gamma
# cv of 1e-300 has no finite shape (1 / cv^2), one of 1e300 overflows. Real services lie far inside them.
MIN_RATE_PER_S = 1e-6  # requests/s: one request in about 11.6 days
MAX_RATE_PER_S = 1e6  # requests/s, all replicas together
MIN_CV, MAX_CV = 0.01, 100.0  # gamma arrivals' coefficient of variation (shape 1/cv^2 from 1e4 to 1e-4)
MAX_CLOCK_S = 1e9  # simulated seconds (about 32 years): the expected span of the arrivals, num_requests / rate


def limit(name: str) -> int:
    default, env, _ = LIMITS[name]
    raw = os.environ.get(env)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{env}={raw[:40]!r}: expected a positive integer") from None
    if value <= 0:
        raise ConfigError(f"{env}={value}: expected a positive integer")
    return value


def check(name: str, value: int | float, what: str) -> None:
    """ConfigError when `value` exceeds the limit `name` (see LIMITS)."""
    lim = limit(name)
    if value > lim:
        env, bounds = LIMITS[name][1], LIMITS[name][2]
        raise ConfigError(f"{what} {number(value)} exceeds the limit of {lim:,} {bounds} (raise it with {env}=N)")


def number(value: int | float) -> str:
    """A count for a message: 2,000,000 as is, an absurd one to 4 significant digits (1e+100, not 101 digits)."""
    if isinstance(value, int) and abs(value) < 10**15:
        return f"{value:,}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    from decimal import Decimal

    return format(Decimal(value), ".4g") if isinstance(value, int) else f"{value:.4g}"


def check_lengths(name: str, spec, what: str) -> None:
    """A length distribution (capacity.workload.Lengths) whose largest possible value is past the limit
    `name`; a lognormal without a cap is checked on what it drew (check_drawn)."""
    top = {"fixed": spec.value, "uniform": spec.high, "lognormal": spec.high,
           "empirical": max(spec.values or [0])}[spec.kind]
    if top is not None:
        check(name, top, what)
    if spec.kind == "lognormal" and spec.mean is not None:
        check(name, spec.mean, f"{what} mean")
