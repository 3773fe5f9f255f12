"""Model cards: load one from our YAML (`models/*.yaml`), a Hugging Face `config.json` (see `capacity.model.hf` and
the families in `capacity.model.families`), a bundled card's name or a Hugging Face id a bundled card carries.
The schema itself is `capacity.model.schema` (re-exported here, where every caller imports it from).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from capacity.errors import ConfigError
from capacity.files import read_mapping, validate
from capacity.model.hf import from_hf_config as _from_hf_config
from capacity.model.schema import (
    MLA,
    Checkpoint,
    ComputeDtype,
    EngineName,
    Family,
    GemmDtype,
    ModelCard,
    MoE,
    Name,
    NonNegInt,
    Pixels,
    PosInt,
    StateLayers,
    VisionTower,
    WeightDtype,
)

__all__ = ["MLA", "MODELS_DIR", "Checkpoint", "ComputeDtype", "EngineName", "Family", "GemmDtype", "ModelCard", "MoE",
           "Name", "NonNegInt", "Pixels", "PosInt", "StateLayers", "VisionTower", "WeightDtype", "bundled_by_hf_id",
           "from_hf_config", "load_model_card", "load_named_card", "resolve_model_path"]

# ---- loading ------------------------------------------------------------------------------------
def load_model_card(path: str | Path) -> ModelCard:
    """Load our YAML card, or a Hugging Face config.json (detected by `model_type`/`architectures`)."""
    data = read_mapping(path)
    if "model_type" in data or "architectures" in data:
        p = Path(path)
        name = (p.resolve().parent.name if p.name == "config.json" else p.stem) or "model"
        return _from_hf_config(data, name=name, source=str(path))
    return validate(ModelCard, data, str(path))


def load_named_card(name_or_path: str) -> ModelCard:
    """The card a name, path or Hugging Face id names (resolve_model_path): a published checkpoint's id gives the
    card in that checkpoint's format."""
    card = load_model_card(resolve_model_path(name_or_path))
    wanted = name_or_path.strip().lower()
    if any(c.id.lower() == wanted for c in card.checkpoints):
        return card.as_checkpoint(wanted)
    return card


def from_hf_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelCard:
    """A ModelCard from a Hugging Face config.json (see capacity.model.hf)."""
    return _from_hf_config(cfg, name, source)


MODELS_DIR = Path(__file__).resolve().parents[1] / "data" / "models"  # package data: works from a wheel


def resolve_model_path(name_or_path: str) -> Path:
    """Accept a path, the stem of a bundled card (`llama-3.1-8b`), or a Hugging Face id that a bundled card
    carries (`meta-llama/Llama-3.1-8B-Instruct`). Nothing is downloaded."""
    p = Path(name_or_path)
    try:
        if p.exists():
            return p
    except OSError as exc:  # a name the filesystem cannot even look up (too long, ...)
        raise ConfigError(f"model {name_or_path[:80]!r}...: not a usable path ({exc.strerror})") from None
    for cand in (MODELS_DIR / f"{name_or_path}.yaml", MODELS_DIR / name_or_path):
        if cand.is_file():
            return cand
    if "/" in name_or_path and not name_or_path.startswith((".", "/")) \
            and not name_or_path.lower().endswith((".json", ".yaml", ".yml")):  # org/name, not a missing file
        hit = bundled_by_hf_id().get(name_or_path.strip().lower())
        if hit is not None:
            return hit
        raise ConfigError(
            f"model {name_or_path!r}: no bundled card carries this Hugging Face id and nothing is downloaded; save "
            f"its config.json (https://huggingface.co/{name_or_path}/blob/main/config.json) and pass "
            "-m path/to/config.json")
    bundled = ", ".join(sorted(x.stem for x in MODELS_DIR.glob("*.yaml") if not x.stem.startswith("scenario")))
    raise ConfigError(f"model {name_or_path!r}: no such file or bundled card (bundled: {bundled})")


def bundled_by_hf_id() -> dict[str, Path]:
    """Lower-cased Hugging Face id (and alias) -> the bundled card carrying it."""
    out: dict[str, Path] = {}
    for f in sorted(MODELS_DIR.glob("*.yaml")):
        try:
            data = yaml.safe_load(f.read_text()) or {}
        except yaml.YAMLError:
            continue
        cks = [c.get("id") for c in data.get("checkpoints") or [] if isinstance(c, dict)]
        for hid in [data.get("hf_id"), *(data.get("hf_aliases") or []), *cks]:
            if isinstance(hid, str):
                out.setdefault(hid.lower(), f)
    return out
