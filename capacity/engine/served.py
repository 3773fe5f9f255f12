"""Whether the engine release a spec names serves the card's model type (issue 46: "an engine flag the release does
not have ... one line naming the field and value, exit 1"). `vllm@0.11` with a Gemma-4 checkpoint is refused: vLLM
first registers Gemma4ForConditionalGeneration in 0.19.0.

The table (capacity/data/model_releases.yaml) holds, per engine and model type, the class the config.json's
`architectures` names, the last release read whose model registry lacks it (`absent_through`) and the first that
has it (`first`): vLLM's `_MODELS` dicts in model_executor/models/__init__.py (0.4.0-0.5.5) and
model_executor/models/registry.py (0.6.0 on), read in every release 0.4.0-0.19.0; SGLang's
sglang/srt/models/*.py (`EntryClass`) in a sample of its wheels. A release at or before `absent_through` is
refused; a model type not in the table, a release between the two (SGLang's sample), an unpinned spec (`vllm`,
`sglang`: the current release) and TensorRT-LLM (not read) are never refused. Where the release meets the card:
`Vllm.for_card` (vllm/engine.py, which resolve, budget and engine_for all go through) and `Sglang._resolve`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from capacity.errors import ConfigError

TABLE_PATH = Path(__file__).resolve().parents[1] / "data" / "model_releases.yaml"
Key = tuple[int, int, int, int]


@dataclass(frozen=True)
class FirstRelease:
    model_type: str
    vllm_class: str  # the class the checkpoint's `architectures` names (vLLM and SGLang use the same name here)
    absent_through: str  # the last release read whose registry lacks it
    first: str  # the first release read that registers it


def version_key(v: str) -> Key:
    """'0.4.6.post2' -> (0, 4, 6, 2); '0.5.0rc0' -> (0, 5, 0, -1) (before 0.5.0)."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+)|(rc\d+))?", v)
    if not m:
        raise ConfigError(f"release {v!r}: expected X.Y[.Z][.postN]")
    return (int(m[1]), int(m[2]), int(m[3] or 0), -1 if m[5] else int(m[4] or 0))


@cache
def table() -> dict[str, dict[str, FirstRelease]]:
    """engine -> model type -> its first release (capacity/data/model_releases.yaml)."""
    data: dict[str, Any] = yaml.safe_load(TABLE_PATH.read_text())
    return {eng: {mt: FirstRelease(mt, str(row["class"]), str(row["absent_through"]), str(row["first"]))
                  for mt, row in (body.get("models") or {}).items()}
            for eng, body in data.items()}


def first_release(engine: str, model_type: str) -> FirstRelease | None:
    return table().get(engine, {}).get(model_type)


def check_served(label: str, engine: str, version: Key, card: Any) -> None:
    """Refuse, in one line, a pinned release (`label`, `version`) whose model registry lacks the card's model type.
    Called by Vllm.for_card (a spec naming a version) and Sglang._resolve (`sglang@X.Y.Z`: the version the spec
    names, not the release line whose memory rules apply)."""
    row = first_release(engine, card.architecture)
    if row is None or version > version_key(row.absent_through):
        return
    where = "model_executor/models/registry.py" if engine == "vllm" else "sglang/srt/models"
    raise ConfigError(f"engine {label!r}: model_type {card.architecture!r} ({row.vllm_class}) is not served by this "
                      f"release ({engine} registers it from {row.first}, {where}; absent through "
                      f"{row.absent_through}); use {engine}@{row.first} or newer")


__all__ = ["FirstRelease", "check_served", "first_release", "table", "version_key"]
