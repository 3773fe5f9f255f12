"""Reasoning models through a benchmark client's accounting (capacity/reasoning.py, capacity.sim.metrics.client_view).

The hand-computed case: one request whose first token comes 50 ms after it arrives, then a token every 10 ms,
120 generated in all: 100 reasoning tokens, then 20 of answer. Token k (1-based) is out at 0.05 + (k - 1) x 0.01 s,
so the last at 0.05 + 119 x 0.01 = 1.24 s and the first answer token (the 101st) at 0.05 + 100 x 0.01 = 1.05 s.

- `vllm bench serve --backend openai-chat` (first chunk of any kind ends TTFT) counting usage.completion_tokens:
  TTFT 50 ms, TPOT (1.24 - 0.05) / 119 = 10 ms (today's figures);
- the same client counting the answer only (the content text tokenised): TPOT (1.24 - 0.05) / 19 = 62.63 ms and
  20 output tokens over the 1.24 s window, 16.13 tokens/s;
- a client that starts its clock at the first content delta: TTFT 1.05 s, TPOT (1.24 - 1.05) / 19 = 10 ms.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from capacity.reasoning import Reasoning
from capacity.sim.metrics import Records, client_view, summarize
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
STEP, FIRST, GENERATED = 0.01, 0.05, 120


def _one() -> tuple[Records, np.ndarray, np.ndarray]:
    rec = Records(arrival=np.array([0.0]), first_scheduled=np.array([0.0]), first_token=np.array([FIRST]),
                  finish=np.array([FIRST + (GENERATED - 1) * STEP]), prompt_tokens=np.array([100]),
                  output_tokens=np.array([GENERATED]), cls=np.array([0]), preemptions=np.array([0]),
                  replica=np.array([0]))
    return rec, np.full(GENERATED - 1, STEP), np.ones(GENERATED - 1)


def _summary(reasoning: Reasoning | None):
    rec, itl, w = _one()
    return summarize(client_view(rec, reasoning), itl, w, np.random.default_rng(0), ci=False)


def test_vllm_openai_chat_counting_the_answer_only():
    s = _summary(Reasoning(content_tokens=20, counted="content"))
    assert s.ttft_s.mean == pytest.approx(0.05)
    assert s.tpot_s.mean == pytest.approx(1.19 / 19) and s.tpot_s.mean * 1e3 == pytest.approx(62.63, abs=0.01)
    assert s.itl_s.mean == pytest.approx(0.01)  # every chunk timed, reasoning deltas included
    assert s.e2e_s.mean == pytest.approx(1.24)
    assert s.output_tokens_per_s == pytest.approx(20 / 1.24) and s.requests_per_s == pytest.approx(1 / 1.24)


def test_clock_from_the_first_content_delta():
    s = _summary(Reasoning(content_tokens=20, counted="content", first_token="content"))
    assert s.ttft_s.mean == pytest.approx(1.05)
    assert s.tpot_s.mean == pytest.approx(0.01)
    assert s.e2e_s.mean == pytest.approx(1.24)
    # counting every token with the clock from the answer: (1.24 - 1.05) / 119
    assert _summary(Reasoning(content_tokens=20, first_token="content")).tpot_s.mean == pytest.approx(0.19 / 119)


def test_defaults_change_nothing():
    base = _summary(None)
    assert base.ttft_s.mean == pytest.approx(0.05) and base.tpot_s.mean == pytest.approx(0.01)
    for r in (Reasoning(content_tokens=20), Reasoning(share=0.5)):
        assert _summary(r).as_dict() == base.as_dict()
    rec, _, _ = _one()
    assert client_view(rec, None) is rec and client_view(rec, Reasoning(share=0.9)) is rec


def test_share_rounds_reasoning_down_and_leaves_an_answer():
    r = Reasoning(share=0.5)
    assert r.content(np.array([120, 7, 1])).tolist() == [60, 4, 1]  # 60, floor(3.5) = 3 and 0 reasoning tokens
    assert Reasoning(share=0.99).content(np.array([10])).tolist() == [1]  # floor(9.9) = 9 reasoning: one answer
    assert Reasoning(content_tokens=31.78).content(np.array([300, 20])).tolist() == [31.78, 20]


@pytest.mark.parametrize("fields, says", [
    ({}, "give one of share"),
    ({"share": 0.5, "content_tokens": 20}, "give one of share"),
    ({"share": 1.0}, "share"),
    ({"share": -0.1}, "share"),
    ({"content_tokens": 0.5}, "content_tokens"),
    ({"share": 0.5, "counted": "reasoning"}, "counted"),
    ({"share": 0.5, "first_token": "last"}, "first_token"),
])
def test_bad_values(fields, says):
    with pytest.raises(ValidationError, match=says):
        Reasoning(**fields)


@pytest.mark.parametrize("flags, says", [
    (["--reasoning-share", "1.5"], "reasoning: share: Input should be less than 1 (got 1.5)"),
    (["--reasoning-content-tokens", "0"], "reasoning: content_tokens: Input should be greater than or equal to 1 (got 0"),
    (["--reasoning-share", "0.5", "--reasoning-counted", "answer"], "reasoning: counted:"),
    (["--reasoning-counted", "content"], "give one of share"),
])
def test_bad_flags_are_one_line(flags, says):
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "20", *flags)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_yaml_is_one_line(tmp_path):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"arrivals": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 20,
                              "reasoning": {"share": 2}}))
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--workload", str(wl))
    assert r.returncode == 1 and "reasoning.share" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_simulate_counts_the_answer_only():
    """The same run counted two ways: TPOT and output tokens/s scale by the tokens counted, the rest is the same
    (fixed 64 generated, 16 counted: TPOT x 63 / 15; tokens/s x 16 / 64)."""
    base = ("simulate", "-m", "llama-3.1-8b", "-g", "h100", "--arrival", "closed", "--users", "4", "-n", "40",
            "--input-len", "256", "--output-len", "64", "--warmup", "0", "--json")
    a = json.loads(run_cli(*base).stdout)["summary"]
    b = json.loads(run_cli(*base, "--reasoning-content-tokens", "16", "--reasoning-counted", "content").stdout)["summary"]
    assert b["ttft_s"] == a["ttft_s"] and b["itl_s"] == a["itl_s"] and b["e2e_s"] == a["e2e_s"]
    assert b["tpot_s"]["mean"] == pytest.approx(a["tpot_s"]["mean"] * 63 / 15)
    assert b["output_tokens_per_s"] == pytest.approx(a["output_tokens_per_s"] * 16 / 64)
    assert b["requests_per_s"] == pytest.approx(a["requests_per_s"])


def test_dev_rows_are_ranges_with_the_printed_answer_length():
    """The two gpt-oss dev runs: the answer's tokens are the printout's total over 100 requests; the range runs
    from no reasoning to the requests' max_completion_tokens (dev rows only; the held-out file is not read)."""
    sys.path.insert(0, str(ROOT))
    from bench import serving_unseen as su

    rows = {r["id"]: r for r in su.load_runs("dev", "v2") if r.get("expressible") == "range"}
    assert set(rows) == {"gpubench-gpt-oss-20b-rtx4090-c10", "gpubench-gpt-oss-120b-gb10-c10"}
    for rid, total in (("gpubench-gpt-oss-20b-rtx4090-c10", 3178), ("gpubench-gpt-oss-120b-gb10-c10", 3212)):
        r = rows[rid]
        assert str(total) in r["reasoning_quote"] and r["reasoning"]["content_tokens"] == total / 100
        lo, hi = su.simulate_args(r, 0), su.simulate_args(r, 1)
        assert lo[lo.index("--output-len") + 1] == str(int(np.ceil(total / 100)))
        assert hi[hi.index("--output-len") + 1] == "210-390" == r["output_len"]
        assert lo[lo.index("--reasoning-counted") + 1] == "content" and lo[lo.index("--reasoning-ttft") + 1] == "any"


def test_an_answer_longer_than_any_context_is_refused_in_one_line():
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "1", "-n", "20",
                "--reasoning-content-tokens", "99999999999")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "content_tokens" in r.stderr and "10000000" in r.stderr
