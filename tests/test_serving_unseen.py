"""Published serving runs from sources the project had not used (tests/data/serving_unseen, scored by
bench/serving_unseen.py): the files' schema, the dev/held-out split (sha256 of the source URL, fixed before any
prediction), that no source is one the project already cites, the `capacity simulate` command each run maps to,
and a few cheap development runs through the bench end to end. The held-out group is only built here (its
commands), never simulated: it is scored once, at the end.
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

RUNS = {g: su.load_runs(g) for g in su.GROUPS}
ALL = [r for g in su.GROUPS for r in RUNS[g]]
REQUIRED = ("id", "source", "quote", "engine", "version", "model", "gpu", "tp", "dp", "dataset", "request_rate",
            "max_concurrency", "num_prompts", "metrics", "expressible")
# files where the project already cites published serving results (the runs must come from elsewhere)
CITED = [*(ROOT / "tests" / "data" / "published").glob("*.yaml"), *(ROOT / "tests" / "data").glob("*.yaml"),
         ROOT / "bench" / "published.py", ROOT / "bench" / "sglang_published.py", ROOT / "bench" / "mlperf.py",
         ROOT / "docs" / "fidelity.md", ROOT / "docs" / "validation.md"]


def test_enough_runs_and_unique_ids():
    assert len(ALL) >= 25
    assert len({r["id"] for r in ALL}) == len(ALL)
    assert all(RUNS[g] for g in su.GROUPS)


@pytest.mark.parametrize("group", su.GROUPS)
def test_split_follows_the_hash_rule(group):
    doc = yaml.safe_load((su.DATA / f"{group}.yaml").read_text())
    assert doc["group"] == group
    for r in RUNS[group]:
        h = int(hashlib.sha256(r["source"].encode()).hexdigest(), 16) % 3
        assert ("heldout" if h == 0 else "dev") == group == r["group"] == su.group_of(r["source"]), r["id"]


def test_group_rule_pinned():
    # sha256(b"a") = ca978112...48bb, which is 1 mod 3: dev. The split of two sources, as recorded on 2026-12-07.
    assert hashlib.sha256(b"a").hexdigest().startswith("ca978112ca1bbdca")
    assert su.group_of("a") == "dev"
    assert su.group_of("https://github.com/tenstorrent/tt-inference-server/issues/394") == "dev"
    assert su.group_of("https://github.com/tenstorrent/tt-inference-server/issues/340") == "heldout"


@pytest.mark.parametrize("run", ALL, ids=lambda r: r["id"])
def test_schema(run):
    missing = [k for k in REQUIRED if k not in run]
    assert not missing, missing
    assert run["source"].startswith("https://github.com/") and run["quote"].strip()
    assert run["engine"] in ("vllm", "sglang", "trtllm")
    assert isinstance(run["tp"], int) and run["tp"] >= 1 and isinstance(run["dp"], int) and run["dp"] >= 1
    assert isinstance(run["num_prompts"], int) and run["num_prompts"] >= 1
    assert run["request_rate"] == "inf" or run["request_rate"] > 0
    assert run["max_concurrency"] is None or run["max_concurrency"] >= 1
    m = run["metrics"]
    assert m and set(m) <= set(su.METRICS), set(m) - set(su.METRICS)
    assert all(isinstance(v, (int, float)) and v > 0 and math.isfinite(v) for v in m.values())
    if run["expressible"]:
        assert run["card"] and run["input_len"] and (run["output_len"] or run.get("output_tokens_total"))
    else:
        assert run.get("reason"), "a run capacity cannot express says why"


def test_sources_not_already_cited():
    text = "\n".join(p.read_text() for p in CITED if p.exists())
    for src in {r["source"] for r in ALL}:
        key = src.split("github.com/")[1]
        if "/blob/" in key:  # a file: its repository and path, at any commit
            repo, path = key.split("/blob/")[0], key.split("/blob/")[1].split("/", 1)[1]
            assert not (repo in text and path in text), src
        else:
            assert key not in text, src


def _run(rid):
    return next(r for r in ALL if r["id"] == rid)


def test_commands_follow_the_published_settings():
    # rate inf with --max-concurrency C: a closed loop of C users
    a = su.simulate_args(_run("achatbot-gpt-oss-20b-h100-sglang-c32"))
    assert a[a.index("--arrival") + 1] == "closed" and a[a.index("--users") + 1] == "32"
    assert a[a.index("--engine") + 1] == "sglang" and a[a.index("-n") + 1] == "160" and "--warmup" in a
    assert a[a.index("--warmup") + 1] == "0"
    # rate inf, no cap: an offline batch; DP 4: four replicas; no --ignore-eos: the printed mean output length
    b = su.simulate_args(_run("recipe-qwen2.5-vl-7b-random-8000-1000-128"))
    assert b[b.index("--arrival") + 1] == "offline" and b[b.index("--replicas") + 1] == "4"
    assert b[b.index("--output-len") + 1] == "913"  # 116924 generated tokens / 128 requests = 913.5 -> 913
    assert b[b.index("--input-len") + 1] == "8000"
    # a finite rate with a cap: Poisson behind the client's cap (built by hand: no published run has both)
    c = su.simulate_args({**_run("tt394-qwen3-4b-rtx-4090-128-128-c1"), "request_rate": 2, "max_concurrency": 16})
    assert c[c.index("--arrival") + 1] == "poisson" and c[c.index("--rate") + 1] == "2"
    assert c[c.index("--max-concurrency") + 1] == "16"
    with pytest.raises(ValueError, match="not expressible"):
        su.simulate_args(_run("recipe-seed-oss-36b-rtx3090-tp8-rate2"))
    # the hybrid run: the BF16 config's shapes as the FP8 checkpoint, with the server's FP8 KV cache
    n = su.simulate_args(_run("recipe-nemotron-3-nano-30b-a3b-fp8-h200-c1024"))
    assert n[n.index("--weight-dtype") + 1] == "fp8" and n[n.index("--kv-dtype") + 1] == "fp8"
    assert n[n.index("--users") + 1] == "1024" and n[n.index("-g") + 1] == "h200"


@pytest.mark.parametrize("group", su.GROUPS)
def test_every_expressible_run_builds_a_command(group):
    for r in RUNS[group]:
        if r["expressible"]:
            assert su.command(r).startswith("capacity simulate -m ")


def test_cold_prefill_bound_by_hand():
    # Qwen3-4B (tests/data/hf/qwen3-4b.json): 36 layers x (q 2560x4096 + kv 2 x 2560x1024 + o 4096x2560
    # + MLP 3 x 2560x9728) = 36 x 100,925,440 = 3,633,315,840 linear parameters; 4,096 tokens at the RTX 4090's
    # 165.2 TFLOP/s dense bf16: 2 x 3.633e9 x 4096 / 165.2e12 = 180.2 ms. The published mean TTFT is 76.6 ms.
    r = _run("tt394-qwen3-4b-rtx-4090-4096-128-c1")
    assert su.cold_prefill_bound_ms(r) == pytest.approx(2 * 36 * 100_925_440 * 4096 / 165.2e12 * 1e3, rel=1e-6)
    assert r["metrics"]["mean_ttft_ms"] < su.cold_prefill_bound_ms(r)


def test_cheap_dev_runs_through_the_bench():
    """Two single-user dev runs end to end (8 and 4 requests): the bench's prediction holds every published metric,
    and, as a lone user with fixed lengths must, E2E = TTFT + (OSL - 1) x TPOT and requests/s = 1 / E2E."""
    runs = [_run("tt394-qwen3-4b-rtx-4090-128-128-c1"), _run("tt394-qwen3-4b-rtx-4090-1024-128-c1")]
    res = su.score(runs)
    assert res["scored"] == 2 and res["failed"] == 0
    for r, row in zip(runs, res["rows"]):
        p = row["predicted"]
        assert set(p) == set(r["metrics"])
        assert p["mean_e2el_ms"] == pytest.approx(p["mean_ttft_ms"] + (r["output_len"] - 1) * p["mean_tpot_ms"],
                                                  rel=1e-3)
        assert p["request_throughput"] == pytest.approx(1e3 / p["mean_e2el_ms"], rel=2e-2)
        assert row["error"]["mean_tpot_ms"] == pytest.approx(p["mean_tpot_ms"] / r["metrics"]["mean_tpot_ms"] - 1)
    assert set(res["summary"]) >= {"mean_ttft_ms", "mean_tpot_ms"}
    assert res["summary"]["mean_tpot_ms"]["n"] == 2
