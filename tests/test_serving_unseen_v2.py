"""Round 2 of the published serving runs (tests/data/serving_unseen_v2, scored by
`python bench/serving_unseen.py --set v2`): data integrity only. Every run names its source and quotes the
printed lines; the dev/held-out split follows the sha256 rule fixed before any prediction; every published metric
is one of the quoted numbers; each run either maps to a `capacity simulate` command the CLI accepts or says why it
cannot. Nothing is simulated here (the held-out group is scored once, at the end).
"""
from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import serving_unseen as su  # noqa: E402
from tests.unseen_commands import check_command_parses_or_reason_given  # noqa: E402

DATA = su.SETS["v2"]
RUNS = {g: su.load_runs(g, "v2") for g in su.GROUPS}
ALL = [r for g in su.GROUPS for r in RUNS[g]]


def test_files_and_ids():
    assert ALL and len({r["id"] for r in ALL}) == len(ALL)
    assert (DATA / "README.md").exists()
    for g in su.GROUPS:
        assert yaml.safe_load((DATA / f"{g}.yaml").read_text())["group"] == g


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_source_and_quote(run):
    assert run["source"].startswith("https://github.com/"), run["source"]
    assert isinstance(run["quote"], str) and run["quote"].strip()


@pytest.mark.parametrize("group", su.GROUPS)
def test_hash_rule_puts_each_run_in_its_file(group):
    for r in RUNS[group]:
        h = int(hashlib.sha256(r["source"].encode()).hexdigest(), 16) % 3
        assert ("heldout" if h == 0 else "dev") == group == r["group"], r["id"]


def test_hash_rule_pinned():
    # sha256(b"a") = ca978112...: 1 mod 3, dev; the two round-2 sources' groups as recorded on 2026-12-07
    assert su.group_of("a") == "dev"
    assert su.group_of("https://github.com/tenstorrent/tt-inference-server/issues/379") == "dev"
    assert su.group_of("https://github.com/vllm-project/vllm/pull/33743") == "heldout"


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_each_metric_is_in_the_quoted_lines(run):
    m = run["metrics"]
    assert m and set(m) <= set(su.METRICS), set(m) - set(su.METRICS)
    for name, v in m.items():
        assert isinstance(v, (int, float)) and v > 0 and math.isfinite(v), name
        assert repr(float(v)).removesuffix(".0") in run["quote"], (name, v)


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_command_parses_or_reason_given(run):
    check_command_parses_or_reason_given(run)


def test_sharegpt_lengths_are_the_printed_means():
    # rate-5 vLLM run on the RTX 3090: 213,987 input and 199,774 generated tokens over 1,000 requests
    r = next(r for r in ALL if r["id"] == "zhjunqin-llama3-8b-rtx3090-vllm041-sharegpt-rate5")
    a = su.simulate_args(r)
    assert a[a.index("--input-len") + 1] == "214" and a[a.index("--output-len") + 1] == "200"
    assert a[a.index("--arrival") + 1] == "poisson" and a[a.index("--rate") + 1] == "5"
    t = su.simulate_args(next(r for r in ALL if r["id"] == "zhjunqin-llama3-8b-rtx3090-trtllm090-sharegpt-rate8"))
    assert t[t.index("--max-num-seqs") + 1] == "40" and t[t.index("--engine") + 1] == "trtllm@0.13:tensorrt"
