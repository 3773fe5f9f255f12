"""Every card the loader makes, pinned: each bundled card and each Hugging Face config.json under tests/data,
loaded through `load_model_card`, is summarised (a digest of the card's JSON, its parameters, its weight bytes at
tp 1 and 2, its KV bytes per token) and compared with tests/data/card_golden.json.

The pinned file was recorded from the loader as it stood before the model families moved into
capacity/model/families/ (commit d68b5cb): the refactor must keep every card identical. It is a regression pin,
not a source of truth about the models (the per-family tests hold the hand-computed numbers). To re-record after
a deliberate card change: `python tests/test_card_golden.py --record`, and say in the commit which cards changed
and why."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from capacity.engine.budget import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import MODELS_DIR, load_model_card
from capacity.model.weights import count_params, weight_bytes_per_rank

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "card_golden.json"


def sources() -> list[Path]:
    cards = sorted(MODELS_DIR.glob("*.yaml"))
    configs = sorted(p for p in (ROOT / "tests" / "data").rglob("*.json")  # families/: pinned by their own tests
                     if p != GOLDEN and "families" not in p.parts and '"model_type"' in p.read_text())
    return cards + configs


def key(p: Path) -> str:
    return str(p.relative_to(ROOT))


def summary(p: Path) -> dict:
    try:
        card = load_model_card(p)
    except ConfigError as exc:  # a config the loader refuses: the message is pinned (less the list of families)
        return {"error": str(exc).replace(f"{ROOT}/", "").split("; supported:")[0]}
    text = json.dumps(card.model_dump(mode="json"), sort_keys=True)
    return {"digest": hashlib.sha256(text.encode()).hexdigest()[:20], "architecture": card.architecture,
            "params": count_params(card),
            "weight_bytes_tp1": sum(weight_bytes_per_rank(card, 1).values()),
            "weight_bytes_tp2": sum(weight_bytes_per_rank(card, 2).values()),
            "kv_bytes_per_token_tp1": kv_bytes_per_token(card, "bf16", 1),
            "kv_layers": card.num_kv_layers}


def test_golden_covers_every_source():
    pinned = json.loads(GOLDEN.read_text())
    assert sorted(pinned) == sorted(key(p) for p in sources())
    assert len(pinned) >= 60  # 16 bundled cards and 52 config.json files when recorded


@pytest.mark.parametrize("path", sources(), ids=key)
def test_card_unchanged(path: Path):
    pinned = json.loads(GOLDEN.read_text())
    assert summary(path) == pinned[key(path)]


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.write_text(json.dumps({key(p): summary(p) for p in sources()}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(sources())} cards in {GOLDEN}")
