"""The CI-sized fidelity run: a real engine (transformers continuous batching on this CPU), two fit runs and
one held-out run, with a loose bound that a broken simulator or fit still fails. The full benchmark and its
targets are `bench/fidelity.py` (docs/validation.md, Ground truth)."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("transformers")


def quick_run(tmp_path, i: int) -> tuple[dict, str]:
    out = tmp_path / f"fidelity{i}.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench/fidelity.py"), "--quick", "--out", str(out),
                        "--model-dir", str(tmp_path / "tiny-hf")], capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text()), r.stdout[-4000:]


def misses(d: dict) -> list[str]:
    """What a broken simulator, fit or replay would miss. Loose: a step cost off by 2x, a scheduler that ignores
    the token budget or a replay with the wrong arrival times lands far outside these; the full benchmark
    reports the real accuracy (3-11% on P50 here)."""
    held = d["heldout_median_abs_rel_err"]
    bounds = {"TPOT p50": 0.4, "TTFT p50": 0.6, "output tokens/s mean": 0.1}
    return [f"{k} {held[k]:.1%} (bound {b:.0%})" for k, b in bounds.items() if not abs(held[k]) < b]


@pytest.mark.slow  # a real engine: in CI (`pytest -m slow`), not in the default local run
def test_quick_fidelity_against_a_real_engine(tmp_path):
    # A real engine's timings on a shared 2-core machine are noisy: one CI run measured a held-out TPOT 40% off
    # (3-8% on an idle machine). A broken model misses on every run; a noisy neighbour rarely twice in a row.
    # So a miss is measured once more, and the test fails when the second run misses too.
    report = []
    for i in range(2):
        d, stdout = quick_run(tmp_path, i)
        assert [row["outcomes"] for row in d["rows"]] == [{"ok": 50}, {"ok": 60}, {"ok": 60}]
        fit = d["fit"]
        assert fit["attention"] == "packed" and fit["fixed_s"] > 0 and 0 < fit["frontend_s"] < 0.5, fit
        assert d["host"]["cpu"] and d["host"]["logical_cpus"] >= 1
        miss = misses(d)
        if not miss:
            return
        report.append(f"run {i + 1}: {', '.join(miss)}\n{stdout}")
    pytest.fail("the held-out run missed its bounds twice:\n" + "\n".join(report))


def test_the_bounds_catch_a_2x_step_cost():
    """The bounds above are not vacuous: a held-out TPOT twice the measured (error +100%) or half (-50%) misses."""
    ok = {"heldout_median_abs_rel_err": {"TPOT p50": 0.08, "TTFT p50": 0.1, "output tokens/s mean": 0.01}}
    assert misses(ok) == []
    for tpot in (1.0, 0.5):
        bad = {"heldout_median_abs_rel_err": {**ok["heldout_median_abs_rel_err"], "TPOT p50": tpot}}
        assert misses(bad) == [f"TPOT p50 {tpot:.1%} (bound 40%)"]
