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
from capacity.engine.config import EngineConfig, MemoryModelParams, settings_classes
from capacity.engine.settings import bounds, meta
from capacity.model.card import MLA, ModelCard, MoE, VisionTower
from capacity.model.gpus import GPU
from capacity.plan.scenario import Scenario, SearchSpec, SLOSpec
from capacity.reasoning import Reasoning
from capacity.sessions import Sessions
from capacity.vision_requests import ImageRequests
from capacity.workload import Arrivals, Lengths, PrefixGroups, RequestClass, WorkloadSpec

UNITS = "SI units throughout: seconds (`_s`), bytes (`_bytes`), requests/s (`_per_s`), FLOP/s (`_flops`)."


def _engines() -> list[tuple[str, type[BaseModel], list[str] | None, type]]:
    """The engine section: the settings every engine's class has, then those of some engines only, grouped by the
    engines that have them (vLLM's own; vLLM's and SGLang's ...)."""
    classes = settings_classes()
    groups: dict[tuple[str, ...], list[str]] = {}
    home: dict[tuple[str, ...], type[BaseModel]] = {}
    for c in classes:
        for n in c.model_fields:
            owners = tuple(k.ENGINE for k in classes if n in k.model_fields)
            if n not in groups.get(owners, []):
                groups.setdefault(owners, []).append(n)
                home.setdefault(owners, c)
    out: list[tuple[str, type[BaseModel], list[str] | None, type]] = []
    for owners, names in groups.items():
        mine = [k for k in classes if k.ENGINE in owners]  # the doc: of the class the owners share (a declaring one)
        doc = next(b for b in mine[0].__mro__ if all(issubclass(k, b) for k in mine))
        if len(owners) == len(classes):
            out.insert(0, ("engine (every engine)", home[owners], names, EngineConfig))
        else:
            who = " and ".join(ENGINE_NAMES.get(o, o) for o in owners)
            spec = " or ".join(f"`engine: {o}[@...]`" for o in owners)
            out.append((f"engine: {who} only ({spec})", home[owners], names, doc))
    return out


def _models() -> list[tuple[str, type[BaseModel], list[str] | None, type]]:
    return [("Scenario (`capacity plan -m scenario.yaml`)", Scenario, None, Scenario), *_engines(),
            ("engine.memory_params", MemoryModelParams, None, MemoryModelParams), ("workload (also `simulate --workload`)", WorkloadSpec, None, WorkloadSpec),
            ("workload.arrivals", Arrivals, None, Arrivals), ("workload.arrivals.curve", RateCurve, None, RateCurve), ("lengths (input_len, output_len)", Lengths, None, Lengths),
            ("workload.classes[]", RequestClass, None, RequestClass), ("workload.prefix", PrefixGroups, None, PrefixGroups),
            ("workload.sessions (docs/sessions.md)", Sessions, None, Sessions), ("workload.images (docs/vision.md)", ImageRequests, None, ImageRequests),
            ("workload.reasoning (docs/fidelity.md, \"Reasoning models\")", Reasoning, None, Reasoning),
            ("slo", SLOSpec, None, SLOSpec),
            ("search", SearchSpec, None, SearchSpec), ("Model card (`models/*.yaml`)", ModelCard, None, ModelCard), ("model card: moe", MoE, None, MoE),
            ("model card: mla", MLA, None, MLA), ("model card: vision (docs/vision.md)", VisionTower, None, VisionTower), ("GPU (a catalogue entry or your own GPU YAML)", GPU, None, GPU)]


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
    for title, cls, names, doc_cls in _models():
        parts += [f"## {title}", ""]
        doc = inspect.cleandoc(doc_cls.__dict__.get("__doc__") or "")
        if doc:
            parts += [doc.split("\n\n")[0].replace("\n", " "), ""]
        notes: dict[str, str] = {}
        for k in reversed(cls.__mro__):  # an engine's class: the comments on its own fields and on the shared ones
            if isinstance(k, type) and issubclass(k, BaseModel) and k is not BaseModel:
                notes.update(_comments(k))
        parts += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, f in cls.model_fields.items():
            if names is not None and name not in names:
                continue
            meaning = ((f.description or notes.get(name, "")) + _bounds(f)).strip()
            if flags := _flags(f):
                meaning = (meaning if meaning.endswith(".") or not meaning else meaning + ".") + flags
            meaning = meaning.strip().replace("|", "/")
            parts.append(f"| `{name}` | {_type(f.annotation)} | {_default(f)} | {meaning} |")
        parts.append("")
    return "\n".join(parts)
