"""A trace of capacity's own form (JSONL or CSV: `timestamp` s, `input_tokens`, `output_tokens`, optional `class`
and Mooncake's `hash_ids`), read as a stream of `Request`s: one line in memory at a time, each row checked as it
comes (time order, whole positive counts, a known class; an error names the row and field), times shifted so the
first arrival is at 0. `capacity.workload.load_trace` is its list; the simulator's open-loop source pulls from it
as the clock reaches each arrival (`capacity.sim.simulator.Simulation.run`), so replaying a million-request trace
holds only the requests in flight, not the million (docs/traces.md, "Memory").
"""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path

from capacity.draws import Request, SpecView
from capacity.errors import ConfigError
from capacity.files import short
from capacity.traces import MAX_TRACE_ROWS, block_keys, trace_count, trace_line, trace_number


def _dicts(p: Path, want: int) -> Iterator[dict]:
    """The first `want` rows as dicts (JSON objects or CSV rows), each line bounded."""
    try:
        with p.open("rb") as fb:
            if p.suffix == ".csv":
                text = (trace_line(raw, p, i) for i, raw in enumerate(fb, 1))
                for n, row in enumerate(csv.DictReader(text)):
                    if n >= want:
                        return
                    yield row
                return
            n = 0
            for i, raw in enumerate(fb, 1):
                if n >= want:
                    return
                line = trace_line(raw, p, i)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as exc:
                    raise ConfigError(f"trace {p}: line {i}: not valid JSON ({getattr(exc, 'msg', 'too deep')})") from None
                if not isinstance(row, dict):
                    raise ConfigError(f"trace {p}: line {i}: expected a JSON object, got {type(row).__name__}")
                n += 1
                yield row
    except OSError as exc:
        raise ConfigError(f"trace {p}: cannot read it ({exc.strerror or exc})") from None
    except csv.Error as exc:
        raise ConfigError(f"trace {p}: not valid CSV ({exc})") from None


def iter_trace(path: str | Path, spec: SpecView | None = None, max_rows: int | None = None) -> Iterator[Request]:
    """The trace's first `max_rows` requests (default: the spec's `num_requests`, else `MAX_TRACE_ROWS`), lazily."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"trace {p}: file not found")
    want = max_rows if max_rows is not None else (spec.num_requests if spec is not None else MAX_TRACE_ROWS)
    names = {k.name: i for i, k in enumerate(spec.classes)} if spec else {"default": 0}
    prev = -math.inf
    t0 = 0.0
    i = 0
    for i, r in enumerate(_dicts(p, want), 1):
        try:
            t = trace_number(r["timestamp"], p, i, "timestamp")
            a = trace_count(r["input_tokens"], p, i, "input_tokens")
            b = trace_count(r["output_tokens"], p, i, "output_tokens")
        except KeyError as exc:
            raise ConfigError(f"trace {p}: row {i}: needs numeric timestamp, input_tokens, output_tokens ({exc})") from None
        if a <= 0 or b <= 0 or not math.isfinite(t):
            raise ConfigError(f"trace {p}: row {i}: token counts must be > 0 and time finite (got {a}, {b}, {t})")
        if t < 0:
            raise ConfigError(f"trace {p}: row {i}: timestamp {t} is negative")
        if t < prev:
            raise ConfigError(f"trace {p}: row {i}: timestamp {t} is before the previous row's {prev} "
                              "(a trace must be in time order)")
        prev = t
        if i == 1:
            t0 = t
        cls = r.get("class", "default")
        c = names.get(cls, None) if isinstance(cls, str) else None
        if c is None:
            raise ConfigError(f"trace {p}: row {i}: class {short(cls)} is not one of {sorted(names)}")
        prio = spec.classes[c].priority if spec else 0
        keys, key_tokens = block_keys(r, p, i, a)
        yield Request(i - 1, t - t0, a, b, c, prio, block_keys=keys, block_key_tokens=key_tokens)
    if i == 0:
        raise ConfigError(f"trace {p}: no rows")
