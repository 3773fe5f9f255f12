"""One declaration per engine setting: `setting(...)` is the pydantic `Field` of an `EngineConfig` field, with its
description (the schema reference's text), its bounds (in the field's type), and in `json_schema_extra` what the
surfaces need, read by the code that generates them:

- `cli`: the command-line flag (`--max-num-seqs`; a boolean pair `--a/--b`; or a one-sided switch that sets the
  field to `set_to`), its help, a `scale` from the flag's unit to the field's (`--activation-gib` -> bytes), and
  the commands that take it (`commands`; default: every command that takes engine settings, ENGINE_COMMANDS).
  `capacity.cli.engine_options` turns these into each command's typer options.
- `launch`: the engine's own flag for it, per engine (`vllm`, `sglang`, `trtllm`), as vLLM's `EngineArgs`
  (`vllm/engine/arg_utils.py`, `add_cli_args`), SGLang's `ServerArgs` (`python/sglang/srt/server_args.py`) and
  `trtllm-serve` (`tensorrt_llm/commands/serve.py`) name it. The launch commands take the names from here.
- `ui`: the dashboard's label, widget and offered values (`capacity.io.controls`).

This module imports nothing from the project: `capacity.engine.config` uses it to declare its fields.
"""
from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import Field
from pydantic.fields import FieldInfo

# Commands that take the whole set of engine settings (a setting declared without `commands` appears in each)
ENGINE_COMMANDS = ("simulate", "memory", "plan")
ENGINES = ("vllm", "sglang", "trtllm")
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def setting(default: Any = None, *, description: str, flag: str | None = None, help: str | None = None,
            set_to: Any = None, scale: float | None = None, cli_default: Any = None, commands: tuple[str, ...] | None = None,
            vllm: str | None = None, sglang: str | None = None, trtllm: str | None = None,
            ui: dict | None = None) -> Any:
    """The Field of one engine setting (see the module docstring); bounds stay in the field's type."""
    extra: dict[str, Any] = {}
    if flag is not None:
        cli: dict[str, Any] = {"flag": flag, "help": help or description}
        if set_to is not None:
            cli["set_to"] = set_to
        if cli_default is not None:
            cli["default"] = cli_default
        if scale is not None:
            cli["scale"] = scale
        if commands is not None:
            cli["commands"] = list(commands)
        extra["cli"] = cli
    launch = {k: v for k, v in (("vllm", vllm), ("sglang", sglang), ("trtllm", trtllm)) if v is not None}
    if launch:
        extra["launch"] = launch
    if ui is not None:
        extra["ui"] = ui
    return Field(default, description=description, json_schema_extra=extra or None)


def meta(f: FieldInfo, part: str) -> dict:
    """One part (`cli`, `launch`, `ui`) of a field's declaration ({} where it has none)."""
    extra = f.json_schema_extra
    got = extra.get(part) if isinstance(extra, dict) else None
    return dict(got) if isinstance(got, dict) else {}


def declared(cls: Any, part: str) -> dict[str, tuple[FieldInfo, dict]]:
    """field name -> (its FieldInfo, its `part` declaration), for the fields of `cls` (a class, or its fields: name ->
    FieldInfo) that declare `part`."""
    out = {}
    for name, f in (cls if isinstance(cls, dict) else cls.model_fields).items():
        m = meta(f, part)
        if m:
            out[name] = (f, m)
    return out


def in_command(cli: dict, command: str) -> bool:
    return command in cli.get("commands", ENGINE_COMMANDS)


def engine_flag(cls: Any, name: str, engine: str) -> str:
    """The engine's own launch flag for field `name` (KeyError where the declaration names none)."""
    return meta((cls if isinstance(cls, dict) else cls.model_fields)[name], "launch")[engine]


@dataclass(frozen=True)
class Bounds:
    """A field's numeric bounds, read from its type (through Optional and Annotated)."""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    @property
    def low(self) -> float | None:
        return self.ge if self.ge is not None else self.gt

    @property
    def high(self) -> float | None:
        return self.le if self.le is not None else self.lt


def bounds(f: FieldInfo) -> Bounds:
    found: dict[str, float] = {}

    def take(items) -> None:
        for m in items:
            for cls_, key in ((Gt, "gt"), (Ge, "ge"), (Lt, "lt"), (Le, "le")):
                if isinstance(m, cls_):
                    found[key] = getattr(m, key)
            if isinstance(m, FieldInfo):
                take(m.metadata)

    def walk(ann) -> None:
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin is typing.Annotated:
            take(args[1:])
            walk(args[0])
        elif origin in (typing.Union, types.UnionType):
            for a in args:
                walk(a)

    take(f.metadata)
    walk(f.annotation)
    return Bounds(**found)


def value_type(f: FieldInfo) -> tuple[type, tuple | None]:
    """The plain Python type of a field's value (int, float, bool, str, list) and its choices where it is a
    Literal (None otherwise); Optional and Annotated are seen through."""
    def walk(ann) -> tuple[type, tuple | None]:
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin is typing.Annotated:
            return walk(args[0])
        if origin in (typing.Union, types.UnionType):
            return walk(next(a for a in args if a is not type(None)))
        if origin is typing.Literal:
            return type(args[0]), tuple(args)
        if origin is not None:
            return origin, None
        return ann, None
    return walk(f.annotation)


def optional(f: FieldInfo) -> bool:
    ann = f.annotation
    return typing.get_origin(ann) in (typing.Union, types.UnionType) and type(None) in typing.get_args(ann)


__all__ = ["ENGINE_LABELS", "ENGINES", "ENGINE_COMMANDS", "Bounds", "bounds", "declared", "engine_flag", "in_command", "meta",
           "optional", "setting", "value_type"]
