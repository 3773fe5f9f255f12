"""Safe loading of user files (YAML/JSON) into pydantic models, with one-line errors.

Every user-supplied file goes through here: YAML is parsed with `yaml.safe_load` only, and a
pydantic ValidationError becomes a ConfigError that names the file, the field path and the value.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from capacity.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 8 * 1024 * 1024  # a model card or scenario is a few KB; refuse absurd files early


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(f"{p}: file is {p.stat().st_size} bytes, more than the {MAX_FILE_BYTES} allowed")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        problem = getattr(exc, "problem", None) or getattr(exc, "msg", None) or str(exc)
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def read_json(path: str | Path, what: str = "file") -> Any:
    """Parse a JSON file; a missing file or bad JSON is one ConfigError naming the path and the line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: {what} not found")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    """'source: field.path: message (got value)' for each error, joined by '; '."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")  # a validator's own sentence reads better alone
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        parts.append(f"{loc}: {msg}{shown}")
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
