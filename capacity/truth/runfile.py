"""Run files (`capacity loadtest --out`, or simulated runs in the same format) checked before anything is fitted or
compared: the one place that says what a measurement must look like. A run is an object with a `requests` list
of objects; every successful request (`status: ok`) carries its times as finite numbers of seconds since the run
began, in order (0 <= sent_s <= first_token_s <= finish_s, token_times non-decreasing within them), and its
token counts as whole numbers. An error names the request (its index and id), the field and the value.

`capacity calibrate --from-run` (capacity.truth.fit) also needs what it replays: the request's id, prompt and
output budget, and its schedule (`FIT_FIELDS`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from capacity.errors import CapacityError
from capacity.files import read_json

TIMES = ("sent_s", "first_token_s", "finish_s")  # in this order, each >= the one before
COUNTS = ("output_tokens",)
FIT_FIELDS = ("id", "prompt_tokens", "max_tokens")  # whole numbers a replay needs (and its schedule, below)


def _show(v: Any) -> str:
    return repr(v)[:80]


def _number(r: dict, key: str, who: str) -> float:
    if key not in r:
        raise CapacityError(f"{who}: {key} is missing")
    v = r[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CapacityError(f"{who}: {key} {_show(v)} is not a number of seconds")
    if not math.isfinite(v):
        raise CapacityError(f"{who}: {key} {v} is not a finite number of seconds")
    if v < 0:
        raise CapacityError(f"{who}: {key} {v} is negative (seconds since the run began)")
    return float(v)


def _whole(r: dict, key: str, who: str, least: int = 0) -> int:
    if key not in r:
        raise CapacityError(f"{who}: {key} is missing")
    v = r[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise CapacityError(f"{who}: {key} {_show(v)} is not a whole number")
    if v < least:
        raise CapacityError(f"{who}: {key} {v} is below {least}")
    return v


def check_request(r: Any, i: int, fit: bool = False, schedule: str = "scheduled_s") -> None:
    """A CapacityError naming request `i` when it is not an object, or is a successful request that is impossible."""
    if not isinstance(r, dict):
        raise CapacityError(f"requests[{i}]: not an object (got {_show(r)})")
    if r.get("status") != "ok":
        return
    rid = r.get("id")
    who = f"requests[{i}]" + (f" (id {_show(rid)})" if rid is not None else "")
    sent, first, finish = (_number(r, k, who) for k in TIMES)
    if first < sent:
        raise CapacityError(f"{who}: first_token_s {first} is before sent_s {sent}")
    if finish < first:
        raise CapacityError(f"{who}: finish_s {finish} is before first_token_s {first}")
    for k in COUNTS:
        _whole(r, k, who, 1)
    times = r.get("token_times")
    if times is not None:
        if not isinstance(times, list):
            raise CapacityError(f"{who}: token_times {_show(times)} is not a list")
        prev = first
        for j, t in enumerate(times):
            t = _number({f"token_times[{j}]": t}, f"token_times[{j}]", who)
            if t < prev:
                raise CapacityError(f"{who}: token_times[{j}] {t} is before "
                                    + (f"token_times[{j - 1}] {prev}" if j else f"first_token_s {first}"))
            if t > finish:
                raise CapacityError(f"{who}: token_times[{j}] {t} is after finish_s {finish}")
            prev = t
    if fit:
        _whole(r, "id", who)
        _whole(r, "prompt_tokens", who, 1)
        _whole(r, "max_tokens", who, 1)
        _number(r, schedule, who)


def check_run(run: Any, where: str, fit: bool = False) -> dict:
    """The run, once every request is shaped right (see the module docstring); `fit`: also what a replay needs."""
    if not isinstance(run, dict) or not isinstance(run.get("requests"), list):
        raise CapacityError(f"{where}: not a load-test run (no requests list): write one with `capacity loadtest`")
    meta = run.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise CapacityError(f"{where}: meta {_show(meta)} is not an object")
    schedule = "sent_s" if (meta or {}).get("max_concurrency") else "scheduled_s"
    try:
        for i, r in enumerate(run["requests"]):
            check_request(r, i, fit, schedule)
    except CapacityError as exc:
        raise CapacityError(f"{where}: {exc}") from None
    if not any(r.get("status") == "ok" for r in run["requests"]):
        raise CapacityError(f"{where}: no successful request in this run: nothing to compare")
    return run


def load_run(path: str | Path, fit: bool = False) -> dict:
    """A run file, read (bounded) and checked."""
    p = Path(path)
    return check_run(read_json(p, "run file"), str(p), fit)
