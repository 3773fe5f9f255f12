"""The dashboard's engine controls, generated from the settings' declarations (capacity/engine/settings.py): for
each engine setting with a flag or a `ui` declaration, its label, widget, help, offered values and bounds. Pure:
no Streamlit here; app.py renders these specs, so a setting declared on EngineConfig reaches the dashboard
without a copy of its label, help or bounds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capacity.engine.config import settings_fields
from capacity.engine.settings import bounds, meta, value_type


@dataclass(frozen=True)
class Control:
    """One engine control: the EngineConfig field it sets and how the dashboard offers it."""
    field: str
    label: str
    kind: str  # selectbox, select_slider, slider, number, checkbox, radio, text
    help: str
    value: Any  # what it shows first (None: empty, the engine decides)
    options: tuple | None = None
    min: float | None = None
    max: float | None = None
    step: float | None = None
    none_label: str | None = None  # an extra first option that stands for None ("engine's own")
    placed: bool = False  # declared with a `ui` entry (the app places those); others are generic

    def choices(self) -> list:
        """The options a select widget offers (the None option first, where there is one)."""
        return ([self.none_label] if self.none_label else []) + list(self.options or ())

    def to_value(self, shown: Any) -> Any:
        """The setting's value for what a widget returned (the None option back to None)."""
        return None if self.none_label is not None and shown == self.none_label else shown


def _kind(typ: type, choices: tuple | None) -> str:
    if typ is bool:
        return "checkbox"
    if choices is not None:
        return "selectbox"
    if typ in (int, float):
        return "number"
    return "text"


def engine_controls(cls: Any = None) -> dict[str, Control]:
    """field -> its Control, in the declaration's order, for every setting with a CLI flag or a `ui` entry."""
    fields = cls.model_fields if cls is not None else settings_fields()
    out: dict[str, Control] = {}
    for name, f in fields.items():
        ui, cli = meta(f, "ui"), meta(f, "cli")
        if not ui and not cli:
            continue
        typ, choices = value_type(f)
        b = bounds(f)
        help_ = ui.get("help") or (f"{cli['flag']}: {cli['help']}" if cli else (f.description or ""))
        default = f.get_default(call_default_factory=True)
        opts = ui.get("options", choices)
        low, high = b.low, b.high
        if typ is int and b.gt is not None and b.ge is None:
            low = int(b.gt) + 1  # > 0 for a count: at least 1
        if typ in (int, float):  # one numeric type throughout (a widget refuses a mix)
            low, high = (None if x is None else typ(x) for x in (low, high))
        out[name] = Control(
            field=name, label=ui.get("label", name), kind=ui.get("kind", _kind(typ, choices)), help=help_,
            value=ui.get("value", default), options=tuple(opts) if opts is not None else None,
            min=ui.get("min", low), max=ui.get("max", high), step=ui.get("step"),
            none_label=ui.get("none_label"), placed=bool(ui))
    return out


__all__ = ["Control", "engine_controls"]
