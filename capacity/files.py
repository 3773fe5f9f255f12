"""Safe loading of user files (YAML/JSON) into pydantic models, with one-line errors.

Every user-supplied file goes through here: YAML is parsed with `yaml.safe_load` only, and a
pydantic ValidationError becomes a ConfigError that names the file, the field path and the value.
"""
from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from capacity.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 8 * 1024 * 1024  # a model card or scenario is a few KB; refuse absurd files early
MAX_DEPTH = 64  # nesting of mappings/lists in a user file
MAX_NODES = 200_000  # scalars + collections in a user file
MAX_SHOWN = 80  # characters of a value echoed in an error message


def short_path(path: Any, limit: int = 200) -> str:
    """A path as typed, cut to `limit` characters, for error messages."""
    text = str(path)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any, limit: int = MAX_SHOWN) -> str:
    """repr() of a value cut to `limit` characters, for error messages (a user file can hold megabytes); a number
    of more than MAX_DIGITS digits to 4 significant digits (cut, its magnitude would be wrong)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_DIGITS:
        from decimal import Decimal

        return format(Decimal(value), ".4g")
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_LONG_NUMBER = re.compile(r"(?<![\w./-])-?\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w/]|\.\w)")
MAX_DIGITS = 15  # a number in an error message with more digits than this is shown to 4 significant digits


def short_numbers(text: str) -> str:
    """`text` with every number of more than MAX_DIGITS digits written to 4 significant digits (1e+100, not a
    101-digit integer with its commas): an error about an absurd value stays one short line."""
    def fix(m: re.Match) -> str:
        raw = m.group(0)
        mantissa = re.split(r"[eE]", raw)[0]
        if sum(c.isdigit() for c in mantissa) <= MAX_DIGITS:
            return raw
        from decimal import Decimal, InvalidOperation

        try:
            return format(Decimal(raw.replace(",", "").replace("_", "")), ".4g")
        except (InvalidOperation, ValueError):
            return raw
    return _LONG_NUMBER.sub(fix, text)


class _Refused(Exception):
    """A user file that parses but is refused (aliases, too deep, too many nodes)."""


_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases (a 1 KB 'billion laughs' file expands to gigabytes) and bounds
    nesting depth and node count while composing, before anything is built."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            mark = event.start_mark
            raise _Refused(f"YAML aliases are not accepted in user files (*{event.anchor} at line {mark.line + 1})")
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels")
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.1 reads `3.35e12` (no dot before the exponent) as a string; people write it as a number (YAML 1.2, JSON)
_BoundedLoader.yaml_implicit_resolvers = {k: [r for r in v if r[0] != "tag:yaml.org,2002:float"]
                                         for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _check_shape(data: Any) -> None:
    """Depth and size bounds for parsed JSON (iterative: a deep document must not exhaust the stack)."""
    stack, nodes = [(data, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels")
        if nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def parse_text(text: str, source: str, kind: str = "yaml") -> Any:
    """Parse user-supplied YAML or JSON text with the same bounds as a file (the dashboard's paste box too)."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"{source}: {len(text):,} characters, more than the {MAX_FILE_BYTES:,} allowed")
    try:
        if kind == "json":
            data = json.loads(text)
            _check_shape(data)
            return data
        loader = _BoundedLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _Refused as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        problem = getattr(exc, "problem", None) or getattr(exc, "msg", None) or str(exc)
        raise ConfigError(f"{source}: not valid {'JSON' if kind == 'json' else 'YAML'}{where}: "
                          f"{str(problem)[:200]}") from None


def read_text(path: str | Path, what: str = "file", limit: int = MAX_FILE_BYTES) -> str:
    """A user file as UTF-8 text: a missing, unreadable, oversized or non-UTF-8 file is one ConfigError."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ConfigError(f"{short(str(p), 200)}: {what} not found")
        size = p.stat().st_size
        if size > limit:
            raise ConfigError(f"{p}: {what} is {size:,} bytes, more than the {limit:,} allowed")
        with p.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{short(str(p), 200)}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise ConfigError(f"{p}: {what} is more than the {limit:,} bytes allowed")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); is it the right file?") from None


def check_writable(path: str | Path, force: bool = False, what: str = "output") -> Path:
    """Before long work: the folder exists and is writable, the path is not a folder, and an existing file is
    only replaced with --force. One ConfigError line otherwise."""
    import os

    p = Path(path)
    if len(str(p)) > 4096 or len(p.name) > 255:
        raise ConfigError(f"{what} path {short(str(p), 100)}: too long")
    if p.is_dir():
        raise ConfigError(f"{what} {p}: is a folder, not a file")
    parent = p.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {p}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{what} {p}: cannot write to {parent}")
    if p.exists() and not force:
        raise ConfigError(f"{what} {p} exists; pass --force to overwrite it")
    return p


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path, what: str = "output"):
    """Yield a temporary path in the destination's folder; when the block ends without an error the file is
    flushed to disk (fsync) and renamed over `path` in one step. On any failure (a full disk, a read-only
    folder, Ctrl-C) the temporary file is removed and nothing half-written remains; an OSError becomes one
    ConfigError naming the user's path, never the temporary one. Every file output goes through here."""
    import os
    import tempfile

    p = Path(path)
    folder = p.parent
    try:
        fd, name = tempfile.mkstemp(prefix=f".{p.name[:200]}.", suffix=".tmp", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise ConfigError(f"{what} {short_path(p)}: cannot write it ({exc.strerror or exc})") from None
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the data on disk before the name points at it
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the output gets the permissions a plain open would
        os.replace(tmp, p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{what} {short_path(p)}: cannot write it ({exc.strerror or exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes, what: str = "output") -> Path:
    """Write text (UTF-8) or bytes to `path` all or nothing (see atomic_path)."""
    with atomic_path(path, what) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping."""
    p = Path(path)
    text = read_text(p)
    data = parse_text(text, str(p), "json" if p.suffix == ".json" else "yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def read_json(path: str | Path, what: str = "file", limit: int = 64 * 1024 * 1024) -> Any:
    """Parse a JSON file; a missing file or bad JSON is one ConfigError naming the path and the line."""
    p = Path(path)
    text = read_text(p, what, limit)
    try:
        data = json.loads(text)
        _check_shape(data)
        return data
    except _Refused as exc:
        raise ConfigError(f"{p}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    """'source: field.path: message (got value)' for each error, joined by '; ': wrong values and unknown fields
    first, missing fields after them, at most 8 (a file of junk must not make a page-long line)."""
    parts: list[str] = []
    errors = sorted(exc.errors(), key=lambda e: e["type"] == "missing")
    for err in errors:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")  # a validator's own sentence reads better alone
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {short(value)})"
        if loc == "(top level)" and isinstance(value, dict):
            parts.append(msg[:300])  # a rule over several fields: its own sentence names them
        else:
            parts.append(f"{loc[:120]}: {msg[:300]}{shown}")
        if len(parts) >= 8 and len(errors) > 8:
            parts.append(f"... {len(errors) - 8} more")
            break
    return f"{source}: " + "; ".join(parts)


def validate(model: type[M], data: dict[str, Any], source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def strict_json(obj: Any) -> Any:
    """A copy of `obj` for strict JSON: non-finite floats (a saturated P99, an interval with too few samples)
    become null (the record next to them says why), tuples become lists, numpy scalars plain numbers."""
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    item = getattr(obj, "item", None)  # a numpy scalar
    if callable(item):
        return strict_json(item())
    return str(obj)


def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text (RFC 8259: no Infinity or NaN) of a result; what every `--json` prints."""
    return json.dumps(strict_json(obj), indent=indent, allow_nan=False)
