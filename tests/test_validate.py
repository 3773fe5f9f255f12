"""The engine fit recovers known truth: runs made by simulating a known step cost and front-end latency are
fitted back to those terms, and the fit predicts a third, different run."""
import math

import numpy as np
import pytest

from capacity.cost.step import LinearCost
from capacity.truth.fit import compare, fit_engine, load_fit, per_request, save_fit, sim_summary, simulate_run

SCHED = {"num_blocks": 128, "block_size": 32, "max_num_batched_tokens": 256, "max_num_seqs": 32}
TRUTH = LinearCost(2.0e-3, 6.0e-5, 3.0e-8, 4.0e-10, per_seq_s=1.0e-4)
FRONT = 4.0e-3


def synthetic_run(seed: int, rate: float, prompts, outputs, truth: LinearCost = TRUTH, constant: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    n = len(prompts)
    t = np.arange(1, n + 1) / rate if constant else np.cumsum(rng.exponential(1 / rate, n))
    run = {"requests": [{"id": i, "scheduled_s": float(t[i]), "sent_s": float(t[i]), "prompt_tokens": int(prompts[i]),
                         "max_tokens": int(outputs[i]), "output_tokens": int(outputs[i]), "status": "ok"}
                        for i in range(n)]}
    rec = simulate_run(run, truth, SCHED, frontend_s=FRONT).records
    for i, r in enumerate(run["requests"]):  # records are in arrival order, as the requests are
        r["first_token_s"], r["finish_s"] = float(rec.first_token[i]), float(rec.finish[i])
        r["token_times"] = list(np.linspace(r["first_token_s"], r["finish_s"], r["output_tokens"]))
    return run


@pytest.mark.parametrize("attention", ["per_sequence", "packed"])
def test_fit_recovers_the_front_end_and_predicts_another_workload(tmp_path, attention):
    from dataclasses import replace

    truth = replace(TRUTH, attention=attention)
    rng = np.random.default_rng(1)
    prefill_mix = synthetic_run(2, 3.0, np.clip(rng.lognormal(5.6, 0.9, 60), 16, 1536).astype(int), [4] * 60, truth)
    decode_mix = synthetic_run(3, 6.0, [64] * 80, np.clip(rng.lognormal(4.3, 0.7, 80), 8, 400).astype(int), truth)
    fit, info = fit_engine([prefill_mix, decode_mix], SCHED, attention=attention)
    assert fit.attention == attention
    assert info["frontend_s"] == pytest.approx(FRONT, rel=0.15)
    assert info["median_abs_rel_err"] < 0.03
    held_out = synthetic_run(4, 8.0, [256] * 80, [48] * 80, truth)  # neither fit run looks like this
    rows = compare(sim_summary(simulate_run(held_out, truth, SCHED, frontend_s=FRONT)),
                   sim_summary(simulate_run(held_out, fit, SCHED, frontend_s=info["frontend_s"])))
    for r in rows:  # the targets: P50 within 5%, P99 within 10%
        if r["metric"] in ("TTFT", "TPOT") and r["stat"] in ("p50", "p99"):
            assert abs(r["rel_err"]) < (0.05 if r["stat"] == "p50" else 0.10), r
    # per-request measured values line up with the run's own timestamps
    ttft, tpot = per_request(held_out)
    req = held_out["requests"][0]
    assert ttft[0] == pytest.approx(req["first_token_s"] - req["sent_s"])
    assert tpot[0] == pytest.approx((req["finish_s"] - req["first_token_s"]) / 47)
    # the front end survives a save and load
    save_fit(tmp_path / "fit.json", fit, info, SCHED, ["a", "b"])
    cost, sched, front = load_fit(tmp_path / "fit.json")
    assert sched == SCHED and front == pytest.approx(info["frontend_s"]) and math.isclose(cost.fixed_s, fit.fixed_s)
    assert cost.attention == attention and math.isclose(cost.per_seq_s, fit.per_seq_s)


def test_attention_kinds_count_pairs_as_their_kernels_do():
    from capacity.cost.step import PrefillChunk, StepPlan

    plan = StepPlan((PrefillChunk(4, 10),), (99, 9))  # 4 new on 10 cached; decodes at 99 and 9
    packed = LinearCost(per_pair_s=1.0, attention="packed").step_s(plan)
    per_seq = LinearCost(per_pair_s=1.0, attention="per_sequence").step_s(plan)
    assert packed == 6 * (14 + 100 + 10)  # 6 query tokens x 124 keys in one masked attention
    assert per_seq == 4 * (10 + 2.5)  # the chunk's causal pairs; decodes are counted by per_key_s
    assert LinearCost(per_seq_s=1.0).step_s(plan) == 3  # one chunk + two decodes
    with pytest.raises(ValueError, match="attention"):
        LinearCost(attention="dense")


def test_front_end_latency_adds_to_ttft_and_e2e_and_costs_no_engine_time():
    run = synthetic_run(5, 2.0, [100] * 30, [10] * 30)
    a = simulate_run(run, TRUTH, SCHED).records
    b = simulate_run(run, TRUTH, SCHED, frontend_s=0.01).records
    assert np.allclose(b.arrival, a.arrival)  # the client's arrival is kept
    assert np.allclose((b.first_token - b.arrival) - (a.first_token - a.arrival), 0.01)  # light load: no overlap
    assert np.allclose(b.finish - b.first_token, a.finish - a.first_token)


def test_a_fit_says_which_terms_its_runs_do_not_determine():
    """Two runs that only ever step one sequence at a time (a slow single stream, twice) cannot tell the fixed
    step cost from the per-sequence cost: every step has exactly one sequence, so the two columns of the
    Jacobian are the same. The fit still reproduces its own runs, and must say that these terms are not
    determined, naming the probe (a decode burst) that would separate them. A fit on varied runs pins the
    fixed cost and the per-token cost."""
    one = synthetic_run(5, 0.5, [64] * 12, [16] * 12, constant=True)  # 2 s apart: never two at once
    two = synthetic_run(6, 0.5, [200] * 12, [24] * 12, constant=True)
    fit, info = fit_engine([one, two], SCHED)
    assert info["median_abs_rel_err"] < 0.05  # looks fine on its own runs...
    bad = " ".join(info["warnings"])
    assert "per_seq_s" in bad and "decode burst" in bad  # ...and says what it cannot know
    f = info["uncertainty"]["per_seq_s"]["factor_95"]
    assert f is None or f > 2  # None: unbounded
    rng = np.random.default_rng(1)
    prefill_mix = synthetic_run(2, 3.0, np.clip(rng.lognormal(5.6, 0.9, 60), 16, 1536).astype(int), [4] * 60)
    decode_mix = synthetic_run(3, 6.0, [64] * 80, np.clip(rng.lognormal(4.3, 0.7, 80), 8, 400).astype(int))
    fit, info = fit_engine([prefill_mix, decode_mix, one], SCHED)
    for term in ("fixed_s", "per_token_s", "frontend_s"):
        assert info["uncertainty"][term]["factor_95"] < 2, (term, info["uncertainty"][term])


def test_fits_take_each_runs_engine_limits_and_refuse_to_guess(tmp_path):
    """A run records the engine's limits (`loadtest --engine-config`) and where it was measured; a fit takes each
    run's own limits (runs measured with different limits fit together), refuses a run without them unless all
    four are given, and `validate` warns when a run was measured elsewhere than the fit's runs."""
    import json

    from tests.conftest import run_cli

    rng = np.random.default_rng(1)
    small = {**SCHED, "num_blocks": 64}
    runs = {"a": synthetic_run(2, 3.0, np.clip(rng.lognormal(5.6, 0.9, 40), 16, 1536).astype(int), [4] * 40),
            "b": synthetic_run(3, 6.0, [64] * 50, np.clip(rng.lognormal(4.3, 0.7, 50), 8, 400).astype(int))}
    here = {"host": {"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": ["avx2", "avx512_bf16"]}}
    for name, run in runs.items():
        run["meta"] = {"engine": SCHED if name == "a" else small, "provenance": here}
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    bare = dict(runs["a"], meta={})
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    fit = tmp_path / "fit.json"
    r = run_cli("calibrate", "--from-run", str(tmp_path / "a.json"), "--from-run", str(tmp_path / "b.json"),
                "--out", str(fit), timeout=300)
    assert r.returncode == 0, r.stderr
    saved = json.loads(fit.read_text())
    assert saved["run_engines"] == [SCHED, small] and saved["provenance"] == here
    r = run_cli("calibrate", "--from-run", str(tmp_path / "bare.json"), "--out", str(tmp_path / "f2.json"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--engine-config" in r.stderr
    r = run_cli("calibrate", "--from-run", str(tmp_path / "bare.json"), "--num-blocks", "64",
                "--out", str(tmp_path / "f2.json"))
    assert r.returncode == 1 and "missing --block-size, --max-batch-tokens, --max-seqs" in r.stderr
    elsewhere = dict(runs["a"], meta={"engine": SCHED, "provenance": {"host": {"cpu": "AMD EPYC 7B13",
                                                                                "cpu_flags": ["avx2"]}}})
    (tmp_path / "c.json").write_text(json.dumps(elsewhere))
    r = run_cli("validate", "--run", str(tmp_path / "c.json"), "--fit", str(fit), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert any("CPU: Intel(R) Xeon(R) Processor vs AMD EPYC 7B13" in w for w in out["warnings"])
    assert out["engine"] == SCHED and out["preemptions"]["measured"] is None and out["preemptions"]["predicted"] >= 0


def test_a_run_wide_drift_widens_every_terms_range_in_quadrature():
    """Hand-computed: a 95% factor of 1.2 is a log standard error of ln(1.2) / 1.96 = 0.09302; with a run-wide
    drift of 0.1 the two add in quadrature, sqrt(0.09302^2 + 0.1^2) = 0.13658, so the factor becomes
    exp(1.96 x 0.13658) = 1.3069. An unbounded term stays unbounded; no drift changes nothing."""
    from capacity.truth.fit import widen_for_drift

    unc = {"fixed_s": {"value": 2e-3, "factor_95": 1.2}, "per_pair_s": {"value": 1e-9, "factor_95": None}}
    w = widen_for_drift(unc, 0.1)
    assert w["fixed_s"]["factor_95"] == pytest.approx(1.3069, abs=1e-4) and w["fixed_s"]["value"] == 2e-3
    assert w["per_pair_s"]["factor_95"] is None
    assert widen_for_drift(unc, 0.0) == unc
