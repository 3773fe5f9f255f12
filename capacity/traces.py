"""Public LLM-serving traces as they are published (issue 51): Mooncake (FAST'25; JSONL, `timestamp` in ms
since the first request, `input_length`, `output_length`, `hash_ids`: remapped prefix blocks of 512 tokens, equal
ids being reusable KV), the Azure LLM inference traces (2023/2024 CSV: `TIMESTAMP` as a date and time,
`ContextTokens`, `GeneratedTokens`) and BurstGPT (CSV: `Timestamp` in s, `Model`, `Request tokens`, `Response
tokens`, `Total tokens`, `Log Type`), and this project's own trace (`timestamp` in s, `input_tokens`,
`output_tokens`).

Everything streams: a trace is read a line at a time (each line bounded), rows are checked as they come (time
order, whole positive token counts, naming the row and field), and a window and time scale apply on the way, so
a trace of millions of rows costs the memory of one. `convert` writes the project's JSONL (atomically);
`stats` summarises a trace (rate over time, its peak window, lengths, and for Mooncake the share of prompt
tokens in blocks an earlier request already had: the hit rate of an unbounded prefix cache).

Rows with zero tokens are requests that failed (BurstGPT logs them with `Response tokens` 0; Azure has a few
zero-length contexts): they are dropped and counted, never silently turned into 1-token requests.
"""
from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from capacity.errors import ConfigError
from capacity.files import check_writable, short

FORMATS = ("capacity", "mooncake", "azure", "burstgpt")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's README: "The block size is 512 tokens"
MAX_LINE = 1 << 20  # bytes in one line; a Mooncake row of a 200k-token prompt is ~2.5 kB
MAX_BLOCK_IDS = 1 << 16  # hash ids in one row (32M tokens at 512 per block)
MAX_SEEN_BLOCKS = 5_000_000  # distinct block ids `stats` remembers (~0.3 GB): 2.5G prompt tokens of reuse


@dataclass(frozen=True)
class Row:
    """One request of a trace: arrival (s, from the trace's first row, after the window and time scale), the
    token counts, and (Mooncake) its prefix block ids."""

    t: float
    input_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...] = ()


@dataclass
class Counts:
    read: int = 0
    kept: int = 0
    dropped_zero: int = 0  # failed requests (0 tokens)
    outside_window: int = 0
    notes: list[str] = field(default_factory=list)


def detect(path: Path) -> str:
    """The format from the file's first line: a JSON object with `input_length` (Mooncake) or `input_tokens`
    (this project's); a CSV header with `ContextTokens` (Azure), `Request tokens` (BurstGPT) or
    `input_tokens` (this project's)."""
    first = next(_lines(path), (0, ""))[1].strip().lstrip("\ufeff")
    if first.startswith("{"):
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            raise ConfigError(f"trace {path}: line 1: not valid JSON") from None
        if isinstance(row, dict) and "input_length" in row:
            return "mooncake"
        if isinstance(row, dict) and "input_tokens" in row:
            return "capacity"
    else:
        head = [h.strip() for h in next(csv.reader([first]), [])]
        if "ContextTokens" in head:
            return "azure"
        if "Request tokens" in head:
            return "burstgpt"
        if "input_tokens" in head:
            return "capacity"
    raise ConfigError(f"trace {path}: format not recognised from its first line {short(first, 80)}; give "
                      f"--format ({', '.join(FORMATS)})")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open("rb") as f:
            for i, raw in enumerate(f, 1):
                if len(raw) > MAX_LINE:
                    raise ConfigError(f"trace {path}: line {i} is longer than {MAX_LINE:,} bytes")
                try:
                    yield i, raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise ConfigError(f"trace {path}: line {i}: not UTF-8 text") from None
    except FileNotFoundError:
        raise ConfigError(f"trace {path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"trace {path}: a folder, not a trace file") from None
    except OSError as exc:
        raise ConfigError(f"trace {path}: cannot read it ({exc.strerror or exc})") from None


def _whole(v, where: str, name: str) -> int:
    """A token count: a whole number >= 0 (10.7 or `true` is refused, naming the row and field)."""
    if isinstance(v, bool) or v is None:
        raise ConfigError(f"{where}: {name} {short(v)} is not a whole number of tokens")
    if isinstance(v, str):
        v = v.strip()
        if not v.isdigit():
            raise ConfigError(f"{where}: {name} {short(v)} is not a whole number of tokens")
        return int(v)
    if isinstance(v, float):
        if not v.is_integer():
            raise ConfigError(f"{where}: {name} {short(v)} is not a whole number of tokens")
        v = int(v)
    if not isinstance(v, int):
        raise ConfigError(f"{where}: {name} {short(v)} is not a whole number of tokens")
    if v < 0:
        raise ConfigError(f"{where}: {name} {v} is negative (a token count is a whole number >= 0)")
    return v


def _seconds(v, where: str, name: str, scale: float = 1.0) -> float:
    try:
        t = float(v) * scale if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        t = math.nan
    if not math.isfinite(t) or t < 0:
        raise ConfigError(f"{where}: {name} {short(v)} is not a time >= 0")
    return t


def _azure_time(v: str, where: str) -> float:
    """'2023-11-16 18:15:46.6805900' (seven fractional digits: more than datetime parses) -> POSIX seconds."""
    base, _, frac = (v or "").strip().partition(".")
    try:
        t = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ConfigError(f"{where}: TIMESTAMP {short(v)} is not a date and time like 2023-11-16 18:15:46.68") from None
    if frac and not frac.isdigit():
        raise ConfigError(f"{where}: TIMESTAMP {short(v)} is not a date and time like 2023-11-16 18:15:46.68")
    return t + (float("0." + frac) if frac else 0.0)


def _raw(path: Path, fmt: str) -> Iterator[tuple[str, float, int, int, tuple[int, ...]]]:
    """(where, time s, input, output, block ids) per data row, time as the file gives it."""
    if fmt in ("mooncake", "capacity") and not path.suffix.lower() == ".csv":
        for i, line in _lines(path):
            if not line.strip():
                continue
            where = f"trace {path}: line {i}"
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise ConfigError(f"{where}: not valid JSON") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
            if fmt == "mooncake":
                ids = row.get("hash_ids", [])
                if not isinstance(ids, list) or len(ids) > MAX_BLOCK_IDS or not all(
                        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ids):
                    raise ConfigError(f"{where}: hash_ids must be a list of at most {MAX_BLOCK_IDS:,} whole "
                                      "numbers >= 0")
                yield (where, _seconds(row.get("timestamp"), where, "timestamp", 1e-3),
                       _whole(row.get("input_length"), where, "input_length"),
                       _whole(row.get("output_length"), where, "output_length"), tuple(ids))
            else:
                yield (where, _seconds(row.get("timestamp"), where, "timestamp"),
                       _whole(row.get("input_tokens"), where, "input_tokens"),
                       _whole(row.get("output_tokens"), where, "output_tokens"), ())
        return
    lines = _lines(path)
    text = (line for _, line in lines)
    try:
        reader = csv.DictReader(text)
        cols = {"azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
                "capacity": ("timestamp", "input_tokens", "output_tokens"),
                "mooncake": ("timestamp", "input_length", "output_length")}[fmt]
        head = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in cols if c not in head]
        if missing:
            raise ConfigError(f"trace {path}: a {fmt} trace needs the columns {', '.join(cols)}; missing "
                              f"{', '.join(missing)} (its header: {short(','.join(head), 120)})")
        reader.fieldnames = head
        for n, r in enumerate(reader, 2):
            where = f"trace {path}: row {n}"
            t = (_azure_time(r[cols[0]], where) if fmt == "azure"
                 else _seconds(r[cols[0]], where, cols[0], 1e-3 if fmt == "mooncake" else 1.0))
            yield where, t, _whole(r[cols[1]], where, cols[1]), _whole(r[cols[2]], where, cols[2]), ()
    except csv.Error as exc:
        raise ConfigError(f"trace {path}: not valid CSV ({exc})") from None


def parse_window(spec: str | None) -> tuple[float, float] | None:
    """'START:END' seconds from the trace's first row (either side may be empty: '600:', ':1200')."""
    if spec is None:
        return None
    a, sep, b = spec.partition(":")
    try:
        lo = float(a) if a.strip() else 0.0
        hi = float(b) if b.strip() else math.inf
    except ValueError:
        lo = hi = math.nan
    if not sep or not (math.isfinite(lo) and lo >= 0 and hi > lo):
        raise ConfigError(f"--window {short(spec)}: expected START:END seconds from the trace's start, "
                          "0 <= START < END (e.g. 600:1200)")
    return lo, hi


def rows(path: str | Path, fmt: str | None = None, *, time_scale: float = 1.0,
         window: tuple[float, float] | None = None, max_rows: int | None = None,
         counts: Counts | None = None) -> Iterator[Row]:
    """The trace's requests in time order, from 0 at the window's start, times multiplied by `time_scale`
    (0.5: twice the rate). Out-of-order rows are refused (naming the row); zero-token rows dropped and counted."""
    p = Path(path)
    fmt = fmt or detect(p)
    if fmt not in FORMATS:
        raise ConfigError(f"--format {short(fmt)}: one of {', '.join(FORMATS)}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ConfigError(f"--time-scale {short(time_scale)}: expected a number > 0")
    c = counts if counts is not None else Counts()
    t0: float | None = None
    prev = -math.inf
    lo, hi = window or (0.0, math.inf)
    for where, t, a, b, ids in _raw(p, fmt):
        c.read += 1
        if t0 is not None and t < prev:
            raise ConfigError(f"{where}: timestamp goes back in time ({t - t0:.3f} s after the first row, before "
                              f"the previous row's {prev - t0:.3f} s): a trace must be in time order")
        prev = t
        t0 = t if t0 is None else t0
        rel = t - t0
        if rel < lo:
            c.outside_window += 1
            continue
        if rel >= hi:
            c.outside_window += 1
            break  # in time order: nothing later is inside
        if a == 0 or b == 0:
            c.dropped_zero += 1
            continue
        c.kept += 1
        yield Row((rel - lo) * time_scale, a, b, ids)
        if max_rows is not None and c.kept >= max_rows:
            break


def convert(src: str | Path, dest: str | Path, fmt: str | None = None, *, time_scale: float = 1.0,
            window: tuple[float, float] | None = None, max_rows: int | None = None, force: bool = False) -> Counts:
    """Write the trace as this project's JSONL (`timestamp` s, `input_tokens`, `output_tokens`, and Mooncake's
    `hash_ids` with `hash_block_tokens`), to a temporary file renamed into place when complete."""
    d = check_writable(dest, force, "converted trace")
    c = Counts()
    fd, tmp = tempfile.mkstemp(prefix=f".{d.name}.", dir=d.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for r in rows(src, fmt, time_scale=time_scale, window=window, max_rows=max_rows, counts=c):
                row: dict = {"timestamp": round(r.t, 6), "input_tokens": r.input_tokens,
                             "output_tokens": r.output_tokens}
                if r.block_ids:
                    row |= {"hash_ids": list(r.block_ids), "hash_block_tokens": MOONCAKE_BLOCK_TOKENS}
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
        if c.kept == 0:
            raise ConfigError(f"trace {src}: no request left to write (read {c.read:,}, {c.dropped_zero:,} with 0 "
                              f"tokens, {c.outside_window:,} outside the window)")
        os.replace(tmp, d)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return c


@dataclass
class Stats:
    counts: Counts
    format: str
    duration_s: float = 0.0
    mean_rate: float = 0.0
    peak_rate: float = 0.0  # requests/s in the busiest window of `peak_window_s`
    peak_at_s: float = 0.0
    peak_window_s: float = 60.0
    mean_input: float = 0.0
    mean_output: float = 0.0
    p99_input: float = 0.0
    p99_output: float = 0.0
    reused_prompt_share: float | None = None  # Mooncake: prompt tokens in blocks an earlier request had
    sample_input: list[int] = field(default_factory=list)  # a uniform sample of the rows' lengths (<= 100,000)
    sample_output: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("counts", "sample_input", "sample_output")}
        d["rows"] = {k: v for k, v in self.counts.__dict__.items() if k != "notes"}
        return d


def stats(path: str | Path, fmt: str | None = None, *, time_scale: float = 1.0,
          window: tuple[float, float] | None = None, peak_window_s: float = 60.0,
          max_rows: int | None = None) -> Stats:
    """One pass: rate over the trace and its busiest `peak_window_s`, lengths (mean, P99 by a bounded
    reservoir), and for Mooncake the prompt tokens whose 512-token block an earlier request already had (the
    hit rate of a prefix cache that never evicts: an upper bound on what a real one saves)."""
    import numpy as np

    p = Path(path)
    fmt = fmt or detect(p)
    c = Counts()
    st = Stats(c, fmt, peak_window_s=peak_window_s)
    from collections import deque

    recent: deque[float] = deque()
    rng = np.random.default_rng(0)
    keep = 100_000
    ins: list[int] = []
    outs: list[int] = []
    seen: set[int] = set()
    reused = total_prompt = 0
    n = 0
    sum_in = sum_out = 0
    last = 0.0
    for r in rows(p, fmt, time_scale=time_scale, window=window, max_rows=max_rows, counts=c):
        n += 1
        sum_in += r.input_tokens
        sum_out += r.output_tokens
        last = r.t
        recent.append(r.t)
        while recent[0] <= r.t - peak_window_s:
            recent.popleft()
        if len(recent) / peak_window_s > st.peak_rate:
            st.peak_rate, st.peak_at_s = len(recent) / peak_window_s, max(0.0, r.t - peak_window_s)
        if len(ins) < keep:  # a uniform reservoir of the lengths: P99 in bounded memory
            ins.append(r.input_tokens)
            outs.append(r.output_tokens)
        else:
            j = int(rng.integers(0, n))
            if j < keep:
                ins[j], outs[j] = r.input_tokens, r.output_tokens
        if r.block_ids:
            total_prompt += r.input_tokens
            for k, b in enumerate(r.block_ids):
                if b in seen:
                    reused += min(MOONCAKE_BLOCK_TOKENS, r.input_tokens - k * MOONCAKE_BLOCK_TOKENS)
                elif len(seen) < MAX_SEEN_BLOCKS:  # beyond it, reuse of later blocks goes uncounted (low side)
                    seen.add(b)
    if n == 0:
        raise ConfigError(f"trace {p}: no request (read {c.read:,}, {c.dropped_zero:,} with 0 tokens, "
                          f"{c.outside_window:,} outside the window)")
    st.duration_s = last
    st.mean_rate = n / last if last > 0 else math.inf
    if last < peak_window_s:  # a trace shorter than the window: its busiest window is all of it
        st.peak_rate, st.peak_at_s = st.mean_rate, 0.0
    st.mean_input, st.mean_output = sum_in / n, sum_out / n
    st.p99_input, st.p99_output = float(np.percentile(ins, 99)), float(np.percentile(outs, 99))
    if total_prompt:
        st.reused_prompt_share = reused / total_prompt
    st.sample_input, st.sample_output = ins, outs
    return st


def sizing(trace: str | Path, rate: float | None) -> tuple[float, dict, str]:
    """`plan --trace`: the busiest 60 s as the target rate (unless `rate` is given), the lengths as empirical
    distributions (a uniform sample of 5,000 rows; prompt and output drawn independently), and a line saying so."""
    st = stats(trace)
    k = min(5000, len(st.sample_input))
    wl = {"input_len": {"kind": "empirical", "values": st.sample_input[:k]},
          "output_len": {"kind": "empirical", "values": st.sample_output[:k]}}
    target = rate if rate is not None else float(f"{st.peak_rate:.3g}")
    said = (f"trace {trace} ({st.format}, {st.counts.kept:,} requests): sized for "
            + (f"its busiest 60 s, {target:,.3g} req/s" if rate is None else f"--target-rate {rate:g}")
            + f"; lengths drawn from its rows (prompt mean {st.mean_input:,.0f}, output mean {st.mean_output:,.0f})")
    return target, wl, said


# ---- capacity's own trace rows (capacity.workload.load_trace) -------------------------------------------------
MAX_TRACE_ROWS = 10_000_000  # rows read when no spec says how many requests a simulation takes


def trace_line(raw: bytes, p: Path, i: int) -> str:
    if len(raw) > MAX_LINE:
        raise ConfigError(f"trace {p}: line {i} is longer than {MAX_LINE:,} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"trace {p}: line {i}: not UTF-8 text") from None


def block_keys(r: dict, p: Path, i: int, prompt: int) -> tuple[tuple[int, ...], int]:
    """A row's `hash_ids` (a list of ids >= 0, one per `hash_block_tokens` chunk of the prompt, 512 by default
    as Mooncake's) and the chunk size; none: ((), 0)."""
    ids = r.get("hash_ids")
    if ids is None:
        return (), 0
    kt = r.get("hash_block_tokens", 512)
    if isinstance(kt, str) and kt.strip().isdigit():  # a CSV cell
        kt = int(kt)
    if isinstance(ids, str):  # a CSV cell: ids separated by spaces or semicolons
        ids = [int(x) if x.isdigit() else x for x in ids.replace(";", " ").split()]
    if isinstance(kt, bool) or not isinstance(kt, int) or not 1 <= kt <= 1 << 20:
        raise ConfigError(f"trace {p}: row {i}: hash_block_tokens {short(kt)} is not a whole number of tokens")
    if (not isinstance(ids, list) or len(ids) > prompt // kt + 1
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ids)):
        raise ConfigError(f"trace {p}: row {i}: hash_ids must be a list of whole numbers >= 0, at most one per "
                          f"{kt} prompt tokens")
    return tuple(ids), kt


MAX_TRACE_TOKENS = 2**31 - 1  # a count past it is no request's (and would overflow the int64 records)


def trace_number(v: object, p: Path, i: int, field: str) -> float:
    """A trace cell as a number: a JSON number or a CSV string; `true` is not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"trace {p}: row {i}: {field} {short(v)} is not a number")
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"trace {p}: row {i}: {field} {short(v)} is not a number") from None


def trace_count(v: object, p: Path, i: int, field: str) -> int:
    """A token count: a whole number (10, 10.0, or "10" in a CSV); 10.7 is not cut to 10, `true` is not 1 token."""
    x = trace_number(v, p, i, field)
    if not math.isfinite(x) or x != int(x):
        raise ConfigError(f"trace {p}: row {i}: {field} {short(v)} is not a whole number of tokens")
    if abs(x) > MAX_TRACE_TOKENS:
        raise ConfigError(f"trace {p}: row {i}: {field} {short(v)} is more than {MAX_TRACE_TOKENS:,} tokens")
    return int(x)
