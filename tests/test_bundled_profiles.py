"""The measured profiles shipped in calibrate/profiles: provenance, how they are found by name, held-out
accuracy of the calibrated model on their own whole-step timings, and refusal on another GPU or model."""
import json
from pathlib import Path

import pytest

from capacity.cost.profile import bundled_profiles, resolve_profile
from capacity.errors import ConfigError
from tests.conftest import ROOT, run_cli


def test_h200_profiles_carry_their_provenance():
    got = {name: prof for name, _, prof in bundled_profiles(gpu="h200")}
    assert set(got) >= {"llama-3.1-8b-h200", "llama-3.1-8b-h200-eager", "mixtral-8x7b-h200"}
    for name, prof in got.items():
        pv = prof.provenance
        assert pv.device_name == "NVIDIA H200" and pv.cuda_version and pv.driver_version and not pv.quick, name
        assert len([s for s in prof.steps if s.role == "holdout"]) >= 30, name
    assert got["llama-3.1-8b-h200"].provenance.cuda_graphs
    assert not got["llama-3.1-8b-h200-eager"].provenance.cuda_graphs
    assert not got["mixtral-8x7b-h200"].provenance.cuda_graphs  # MoE routing syncs with the host
    assert all(prof.model.name == "mixtral-8x7b" for name, _, prof in bundled_profiles(model="mixtral-8x7b"))


def test_profiles_command_lists_them_with_held_out_accuracy():
    r = run_cli("profiles", "--gpu", "h200", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert "tiny-cpu" not in rows  # measured on a CPU, not on this GPU
    # graph replay is what the fitted model describes well; eager steps are Python-launch bound and noisy
    assert rows["llama-3.1-8b-h200"]["holdout_median_abs_err"] < 0.10
    assert rows["llama-3.1-8b-h200"]["holdout_median_abs_err"] < rows["llama-3.1-8b-h200-eager"]["holdout_median_abs_err"]


def test_a_profile_is_found_by_name_and_a_wrong_name_lists_the_bundled_ones():
    assert Path(resolve_profile("llama-3.1-8b-h200")).resolve() == (ROOT / "calibrate/profiles/llama-3.1-8b-h200.json").resolve()
    with pytest.raises(ConfigError, match=r"profile 'llama-h100': no such file .*bundled: .*llama-3.1-8b-h200"):
        resolve_profile("llama-h100")
    from capacity.plan.planner import Scenario

    sc = Scenario.model_validate({"model": "llama-3.1-8b", "gpu": "h200", "profile": "llama-3.1-8b-h200"})
    assert sc.profile.endswith("profiles/llama-3.1-8b-h200.json")


def test_step_cost_by_profile_name_and_refusal_on_another_gpu():
    r = run_cli("step-cost", "--model", "llama-3.1-8b", "--profile", "llama-3.1-8b-h200", "--decode", "64x2048",
                "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "NVIDIA H200" in out["source"] and out["step_s"] > 0
    r = run_cli("step-cost", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--profile", "llama-3.1-8b-h200",
                "--decode", "64x2048")
    assert r.returncode != 0 and "h200" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("step-cost", "--model", "mistral-7b", "--profile", "llama-3.1-8b-h200", "--decode", "1x10")
    assert r.returncode != 0 and "llama-3.1-8b" in r.stderr and "Traceback" not in r.stderr


def test_fast_step_cost_equals_its_breakdown_and_is_stable_under_the_memo():
    import math

    from capacity.cost.calibrated import CalibratedCost
    from capacity.cost.profile import to_plan
    from capacity.model.card import load_model_card, resolve_model_path

    (_, path, prof), = [x for x in bundled_profiles(model="llama-3.1-8b", gpu="h200") if x[0] == "llama-3.1-8b-h200"]
    cost = CalibratedCost(prof, load_model_card(resolve_model_path("llama-3.1-8b")), gpu="h200")
    plans = [to_plan(st.prefills, st.decodes) for st in prof.steps]
    first = [cost.step_s(p) for p in plans]
    assert [cost.step_s(p) for p in plans] == first  # memoised lookups return what was computed
    for p, t in zip(plans, first):
        assert t == pytest.approx(math.fsum(cost.breakdown(p).values()), rel=1e-12)
