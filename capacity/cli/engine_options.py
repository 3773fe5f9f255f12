"""The engine options of the commands, generated from the settings' declarations (capacity/engine/settings.py):
`@engine_options("simulate")` puts one typer option per engine setting declared for that command where the
command's `settings` parameter stands, and calls the command with `settings`: the EngineConfig fields given on
the command line (switches mapped to the value they set, `--...-gib` and `--max-wait-ms` scaled to the field's
unit). A setting added to EngineConfig with a flag appears in every command that takes engine settings."""
from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Optional

import typer

from capacity.engine.config import settings_fields
from capacity.engine.settings import declared, in_command, meta, value_type
from capacity.errors import CapacityError

# The `settings` parameter's default in a command's own signature (it stands where the generated options go; the
# wrapper always passes the given settings)
FROM_DECLARATIONS: dict[str, Any] = {}


@dataclass(frozen=True)
class EngineOption:
    """One generated option: the EngineConfig field, its flag(s), the Python type and default typer sees."""
    field: str
    flag: str
    help: str
    annotation: Any
    default: Any
    set_to: Any = None
    scale: float | None = None


def command_options(command: str, optional: bool = False, help: dict[str, str] | None = None,
                    defaults: dict[str, Any] | None = None) -> list[EngineOption]:
    """The options of `command`, in the declaration's order. optional: every default is None ("not given": a
    scenario file's value stands), as `capacity plan` needs; `help` and `defaults` (field -> value) are the
    command's own wording and defaults where they differ from the declaration's."""
    out = []
    for name, (f, cli) in declared(settings_fields(), "cli").items():
        if not in_command(cli, command):
            continue
        flag, set_to = cli["flag"], cli.get("set_to")
        ann: Any
        default: Any
        if set_to is not None:  # a one-sided switch
            ann, default = bool, False
        elif "/" in flag:  # a boolean pair
            ann, default = Optional[bool], None if optional else cli.get("default")
        else:
            base = float if cli.get("scale") else value_type(f)[0]
            default = None if optional else (defaults or {}).get(name, cli.get("default"))
            ann = Optional[base] if default is None else base
        out.append(EngineOption(name, flag, (help or {}).get(name, cli["help"]), ann, default, set_to,
                                cli.get("scale")))
    return out


def given(options: list[EngineOption], values: dict[str, Any]) -> dict[str, Any]:
    """The EngineConfig fields the command line gave (None and unset switches: not given)."""
    out: dict[str, Any] = {}
    for o in options:
        v = values.get(o.field)
        if o.set_to is not None:
            if v:
                out[o.field] = o.set_to
            continue
        if v is None:
            continue
        if o.scale is not None:
            if v < 0 or not math.isfinite(v):
                raise CapacityError(f"{o.flag}: must be a finite number >= 0 (got {v})")
            v = v * o.scale if o.scale >= 1 else v / (1 / o.scale)  # ms -> s as v / 1000, bit for bit
        out[o.field] = v
    return out


def engine_option(name: str, help: str | None = None) -> Any:
    """The typer option of one declared setting, for a signature written by hand (`Annotated[int, this]`)."""
    cli = meta(settings_fields()[name], "cli")
    return typer.Option(cli["flag"], help=help or cli["help"])


class EngineCommand:
    """A command with generated engine options. Its signature (what typer reads when it builds the command) is
    computed from the declarations each time, so a setting declared after import appears too."""

    def __init__(self, fn: Callable[..., Any], command: str, optional: bool, help: dict[str, str] | None,
                 defaults: dict[str, Any] | None, param: str) -> None:
        functools.update_wrapper(self, fn)
        self._fn, self._command, self._optional, self._help, self._defaults = fn, command, optional, help, defaults
        self._param = param
        self._sig = inspect.signature(fn, eval_str=True)
        if param not in self._sig.parameters:
            raise TypeError(f"{fn.__name__}: an engine command takes a `{param}` parameter")

    def options(self) -> list[EngineOption]:
        return command_options(self._command, self._optional, self._help, self._defaults)

    @property
    def __signature__(self) -> inspect.Signature:
        params = []
        own = set(self._sig.parameters)
        for p in self._sig.parameters.values():
            if p.name != self._param:
                params.append(p)
                continue
            for o in self.options():
                if o.field in own:
                    raise TypeError(f"{self._fn.__name__}: parameter {o.field} is also a declared engine setting")
                params.append(inspect.Parameter(
                    o.field, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                    annotation=Annotated[o.annotation, typer.Option(o.flag, help=o.help)]))
        kinds = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.default is not inspect.Parameter.empty else p
                 for p in params]
        return self._sig.replace(parameters=kinds)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        opts = self.options()
        values = {o.field: kwargs.pop(o.field, None) for o in opts}
        return self._fn(*args, **{self._param: given(opts, values)}, **kwargs)


def engine_options(command: str, *, optional: bool = False, help: dict[str, str] | None = None,
                   defaults: dict[str, Any] | None = None, param: str = "settings") -> Callable[[Callable[..., Any]], Any]:
    """Decorator (under `@app.command()`): the command's engine options from the declarations (see the module
    docstring), handed to the command as its `param` (a dict of the fields given); `help` and `defaults` are the
    command's own wording and defaults of a setting (field -> text or value)."""
    def wrap(fn: Callable[..., Any]) -> Any:
        return EngineCommand(fn, command, optional, help, defaults, param)
    return wrap


__all__ = ["FROM_DECLARATIONS", "EngineCommand", "EngineOption", "command_options", "engine_option", "engine_options", "given"]
