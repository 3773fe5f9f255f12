"""The reference of every user-facing file format (scenario, workload, engine, model card, GPU), generated from
the pydantic models themselves: field, type, default and the comment written beside the field in the code.
`docs/schema.md` is this text (`capacity schema > docs/schema.md`); a test fails when they differ, so the
reference cannot drift from the code."""
from __future__ import annotations

import inspect
import io
import re
import tokenize
from typing import Any

from pydantic import BaseModel

from capacity.curves import RateCurve
from capacity.engine.config import MemoryModelParams, settings_class
from capacity.engine.settings import bounds, meta
from capacity.model.card import MLA, ModelCard, MoE, VisionTower
from capacity.model.gpus import GPU
from capacity.plan.scenario import Scenario, SearchSpec, SLOSpec
from capacity.sessions import Sessions
from capacity.vision_requests import ImageRequests
from capacity.workload import Arrivals, Lengths, PrefixGroups, RequestClass, WorkloadSpec

UNITS = "SI units throughout: seconds (`_s`), bytes (`_bytes`), requests/s (`_per_s`), FLOP/s (`_flops`)."


def _models() -> list[tuple[str, type[BaseModel]]]:
    return [("Scenario (`capacity plan -m scenario.yaml`)", Scenario), ("engine", settings_class()),
            ("engine.memory_params", MemoryModelParams), ("workload (also `simulate --workload`)", WorkloadSpec),
            ("workload.arrivals", Arrivals), ("workload.arrivals.curve", RateCurve), ("lengths (input_len, output_len)", Lengths),
            ("workload.classes[]", RequestClass), ("workload.prefix", PrefixGroups),
            ("workload.sessions (docs/sessions.md)", Sessions), ("workload.images (docs/vision.md)", ImageRequests),
            ("slo", SLOSpec),
            ("search", SearchSpec), ("Model card (`models/*.yaml`)", ModelCard), ("model card: moe", MoE),
            ("model card: mla", MLA), ("model card: vision (docs/vision.md)", VisionTower), ("GPU (a catalogue entry or your own GPU YAML)", GPU)]


def _comments(cls: type) -> dict[str, str]:
    """field -> the comment on its line, or the comment lines right above it, in the class body's source."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    line_comment: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            line_comment[tok.start[0]] = tok.string.lstrip("#").strip()
    for i, line in enumerate(src.splitlines(), 1):
        s = line.strip()
        m = re.match(r"^([a-z_][a-z0-9_]*)\s*:", s)
        if s.startswith("#"):
            above.append(line_comment.get(i, ""))
            continue
        if m and line.startswith("    ") and not line.startswith("        "):
            text = " ".join(above + ([line_comment[i]] if i in line_comment else []))
            if text:
                out[m.group(1)] = text
        above = []
    return out


def _type(ann: Any) -> str:
    """int, float or None, list[int], one of 'a', 'b' ... (constraints such as > 0 are in the meaning column)."""
    import types
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(_type(a) for a in args)}]"
    if ann is type(None):
        return "None"
    return getattr(ann, "__name__", str(ann))


def _default(f) -> str:
    if f.is_required():
        return "required"
    d = f.get_default(call_default_factory=True)
    if isinstance(d, BaseModel):
        return "(see below)"
    if isinstance(d, list) and d and isinstance(d[0], BaseModel):
        return "(one default entry)"
    if isinstance(d, float) and d >= 1024**2 and float(d).is_integer() is False:
        return f"{d:.4g}"
    return repr(d)


def _bounds(f) -> str:
    """'> 0', '0 <= x <= 1' ... from the field's constraints (an optional field's too)."""
    b = bounds(f)
    out = [f"{sym} {v}" for sym, v in ((">", b.gt), (">=", b.ge), ("<", b.lt), ("<=", b.le)) if v is not None]
    return f" ({', '.join(out)})" if out else ""


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def _flags(f) -> str:
    """' Flag: `--max-num-seqs`. Launch: vLLM `--max-num-seqs`, ...' from an engine setting's declaration."""
    cli, launch = meta(f, "cli"), meta(f, "launch")
    out = f" Flag: `{cli['flag']}`." if cli else ""
    if launch:
        out += " Launch: " + ", ".join(f"{ENGINE_NAMES.get(e, e)} `{v}`" for e, v in launch.items()) + "."
    return out


def schema_markdown() -> str:
    parts = ["# File formats: every field, generated from the code", "",
             "Generated by `capacity schema` from the pydantic models (field, type, default, and the comment beside "
             "the field in the source), so it cannot drift from what the tool accepts. Unknown fields are errors "
             f"that name the field. {UNITS}", ""]
    for title, cls in _models():
        parts += [f"## {title}", ""]
        doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
        if doc:
            parts += [doc.split("\n\n")[0].replace("\n", " "), ""]
        notes = _comments(cls)
        parts += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, f in cls.model_fields.items():
            meaning = ((f.description or notes.get(name, "")) + _bounds(f)).strip()
            if flags := _flags(f):
                meaning = (meaning if meaning.endswith(".") or not meaning else meaning + ".") + flags
            meaning = meaning.strip().replace("|", "/")
            parts.append(f"| `{name}` | {_type(f.annotation)} | {_default(f)} | {meaning} |")
        parts.append("")
    return "\n".join(parts)
