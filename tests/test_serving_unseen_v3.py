"""Round 3 of the published serving runs (tests/data/serving_unseen_v3, scored by
`python bench/serving_unseen.py --set v3`): data integrity only. Every run names its source and quotes the
printed block; the dev/held-out split follows the sha256 rule fixed before any metric was read, for every record;
every published metric is one of the quoted numbers; each run either maps to a `capacity simulate` command the CLI
accepts or says why it cannot. Nothing is simulated here (the held-out group is scored once, at the end, by the lead).
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

DATA = su.SETS["v3"]
RUNS = {g: su.load_runs(g, "v3") for g in su.GROUPS}
ALL = [r for g in su.GROUPS for r in RUNS[g]]
GPUSTACK = "https://github.com/gpustack/gpustack/blob/47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d/docs/performance-lab/"


def test_files_and_ids():
    assert len(ALL) >= 25 and len({r["id"] for r in ALL}) == len(ALL)
    assert (DATA / "README.md").exists()
    for g in su.GROUPS:
        assert yaml.safe_load((DATA / f"{g}.yaml").read_text())["group"] == g


def test_no_source_of_rounds_1_and_2():
    old = {r["source"] for s in ("v1", "v2") for g in su.GROUPS for r in su.load_runs(g, s)}
    assert not old & {r["source"] for r in ALL}


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_source_and_quote(run):
    assert run["source"].startswith("https://github.com/"), run["source"]
    assert isinstance(run["quote"], str) and "Serving Benchmark Result" in run["quote"]


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_hash_rule_puts_each_record_in_its_file(run):
    h = int(hashlib.sha256(run["source"].encode()).hexdigest(), 16) % 3
    in_file = next(g for g in su.GROUPS if any(r is run for r in RUNS[g]))
    assert ("heldout" if h == 0 else "dev") == in_file == run["group"] == su.group_of(run["source"]), run["id"]


def test_hash_rule_pinned():
    # sha256 of the source URLs, mod 3, as computed on 2026-12-08 before any figure was transcribed
    assert su.group_of(GPUSTACK + "qwen3-32b/h100.md") == "dev"
    assert su.group_of(GPUSTACK + "qwen3.5-9b/h100-latency.md") == "dev"
    assert su.group_of(GPUSTACK + "qwen3-235b-a22b/h100.md") == "heldout"
    assert su.group_of(GPUSTACK + "qwen3.5-35b-a3b/h200-latency.md") == "heldout"


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_each_metric_is_in_the_quoted_lines(run):
    m = run["metrics"]
    assert m and set(m) <= set(su.METRICS), set(m) - set(su.METRICS)
    for name, v in m.items():
        assert isinstance(v, (int, float)) and v > 0 and math.isfinite(v), name
        assert repr(float(v)).removesuffix(".0") in run["quote"], (name, v)
    for key in ("input_tokens_total", "output_tokens_total", "num_prompts"):  # the totals the lengths come from
        assert str(run[key]) in run["quote"], key


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_command_parses_or_reason_given(run):
    check_command_parses_or_reason_given(run)


def test_lengths_and_arrivals_pinned():
    # gpustack qwen3-32b/h100, vLLM, random 4K input: 1,997,942 input and 99,790 generated tokens over 500 requests,
    # every request at t=0 (vllm bench serve's default rate inf, no cap)
    r = next(r for r in ALL if r["id"] == "gpustack-qwen3-32b-h100-vllm0110-4k")
    a = su.simulate_args(r)
    assert a[a.index("--input-len") + 1] == "3996" and a[a.index("--output-len") + 1] == "200"
    assert a[a.index("--arrival") + 1] == "offline" and a[a.index("--engine") + 1] == "vllm@0.11.0"
    # guidellm's constant profile at 4 requests/s: evenly spaced arrivals, the hybrid Qwen3.5-9B card
    g = su.simulate_args(next(r for r in ALL if r["id"] == "gpustack-qwen35-9b-h100-latency-vllm0171-sharegpt-rate4"))
    assert g[g.index("--arrival") + 1] == "constant" and g[g.index("--rate") + 1] == "4"
    assert "--max-concurrency" not in g  # guidellm's printed 'Maximum request concurrency' is the peak, not a cap
    # vllm bench serve --max-concurrency 8 at rate inf: a closed loop of 8 users
    c = su.simulate_args(next(r for r in ALL if r["id"] == "gpustack-qwen3-8b-h100-latency-vllm0110-sharegpt-c8"))
    assert c[c.index("--arrival") + 1] == "closed" and c[c.index("--users") + 1] == "8"
