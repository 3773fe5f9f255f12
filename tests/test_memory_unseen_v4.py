"""The integrity of the fourth round of real start-up logs (tests/data/startup_v4, scored by
`bench/memory_unseen.py --set v4`). These tests read the data files only; they never run the memory model, so the
held-out group stays unscored here (it is scored once, at the end, by the lead).

Checked for every record of both groups: it names a source URL, the sha256 rule put it in the right file, its
printed numbers are in its verbatim text, its source was not cited by an earlier collection, and inputs.yaml gives
it either a runnable input (a config copy that exists, a catalogue GPU, an engine spec) or the reason it cannot be
given to capacity.
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import memory_unseen as mu  # noqa: E402

V4 = ROOT / "tests" / "data" / "startup_v4"
GROUPS = {g: mu.load_cases(g, V4) for g in ("dev", "heldout")}
ALL = [c for cases in GROUPS.values() for c in cases]
INPUTS = (yaml.safe_load((V4 / "inputs.yaml").read_text()) or {})["cases"]


def _held_out(url: str) -> bool:
    return int(hashlib.sha256(url.encode()).hexdigest(), 16) % 3 == 0


def test_round_four_has_the_logs_the_issue_asks_for():
    """At least 40 logs, from all three engines, with ids unique across the files."""
    ids = [c["id"] for c in ALL]
    assert len(ids) >= 40
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    assert {c["kind"] for c in ALL} == {"vllm", "sglang", "trtllm"}


def test_every_record_names_its_source():
    for c in ALL:
        src = c["log"].get("source")
        assert isinstance(src, str) and re.match(r"https://[\w.-]+/\S+$", src), (c["id"], src)


def test_the_split_follows_the_hash_of_the_source():
    """A record is in *_heldout.yaml exactly when int(sha256(source URL)) % 3 == 0 (the README's rule)."""
    for group, cases in GROUPS.items():
        for c in cases:
            assert _held_out(c["log"]["source"]) == (group == "heldout"), (c["id"], c["file"])
    assert "int(hashlib.sha256(source.encode()).hexdigest(), 16) % 3" in (V4 / "README.md").read_text()


def test_the_hash_rule_is_the_one_pinned_on_known_urls():
    """Hand-checked values of the rule, so a change to the rule itself shows (sha256 computed outside Python)."""
    assert _held_out("https://github.com/vllm-project/vllm/issues/12742")
    assert not _held_out("https://github.com/vllm-project/vllm/pull/12604")


def test_every_case_has_inputs_or_a_reason():
    ids = {c["id"] for c in ALL}
    assert set(INPUTS) == ids, (sorted(set(INPUTS) - ids), sorted(ids - set(INPUTS)))
    from capacity.model.gpus import catalogue

    gpus = catalogue()
    for c in ALL:
        inp = INPUTS[c["id"]]
        if inp.get("skip"):
            assert isinstance(inp["skip"], str) and len(inp["skip"]) > 10, c["id"]
            continue
        assert {"model", "gpu", "engine"} <= set(inp), c["id"]
        assert (ROOT / "tests" / "data" / inp["model"]).is_file(), (c["id"], inp["model"])
        assert inp["gpu"] in gpus, (c["id"], inp["gpu"])
        assert inp["engine"].split("@")[0] == c["kind"], (c["id"], inp["engine"])


def test_every_printed_number_is_in_the_verbatim_text():
    """`logged` / `figures` / `readings` hold only numbers the quoted lines print."""
    for c in ALL:
        rec = c["log"]
        text = (rec.get("log_excerpt") or "\n".join(rec.get("lines") or []) or rec.get("log") or "").replace(",", "")
        nums = rec.get("logged") or rec.get("figures") or rec.get("readings") or {}
        for key, v in nums.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            plain = f"{v}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
            assert re.search(re.escape(plain), text), (c["id"], key, v)


def test_the_sources_are_new():
    """No source of round 4 is cited by the earlier collections (tests/data outside startup_v4)."""
    cited = "\n".join(p.read_text(errors="replace") for p in (ROOT / "tests" / "data").rglob("*")
                      if p.is_file() and p.suffix in (".yaml", ".md", ".json") and V4 not in p.parents)
    for c in ALL:
        src = c["log"]["source"]
        assert not re.search(re.escape(src) + r"(?![\d/])", cited), (c["id"], src)


def test_the_bench_reads_round_four_only_when_asked():
    """`--set v4` picks this folder; the default stays the round-3 folder (startup_v3) and the dev group."""
    assert mu.SETS["v4"] == V4 and mu.SETS["v3"] == mu.V3 == ROOT / "tests" / "data" / "startup_v3"
    assert (mu.parse([]).set, mu.parse([]).group) == ("v3", "dev")
    assert mu.parse(["--set", "v4", "--group", "heldout"]).set == "v4"
    assert {c["id"] for c in mu.load_cases("dev")}.isdisjoint(c["id"] for c in GROUPS["dev"])
