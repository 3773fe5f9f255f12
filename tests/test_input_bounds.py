"""Extreme rates and burstiness are refused by name, with the bound (capacity.limits), instead of a division by zero,
an overflow or a 27-digit GPU count (issue 49 item 7)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from capacity.limits import MAX_CLOCK_S
from capacity.plan.planner import replicas_for
from capacity.plan.scenario import Scenario
from capacity.workload import Arrivals, WorkloadSpec
from tests.conftest import run_cli


@pytest.mark.parametrize("args,msg", [
    (["plan", "-m", "tiny", "--target-rate", "1e-9"],
     "target_rate_per_s: Input should be greater than or equal to 0.000001 (got 1e-09)"),
    (["plan", "-m", "tiny", "--target-rate", "1e30"],
     "target_rate_per_s: Input should be less than or equal to 1000000 (got 1e+30)"),
    (["simulate", "-m", "tiny", "--arrival", "gamma", "--cv", "1e-300", "--rate", "5", "-n", "20"],
     "cv: Input should be greater than or equal to 0.01 (got 1e-300)"),
    (["simulate", "-m", "tiny", "--arrival", "gamma", "--cv", "1e300", "--rate", "5", "-n", "20"],
     "cv: Input should be less than or equal to 100 (got 1e+300)"),
    (["simulate", "-m", "tiny", "--rate", "1e-5", "-n", "20000"],
     "arrivals.rate_per_s 1e-05 with num_requests 20,000: the arrivals would span 2e+09 s, more than 1e+09 s"),
    (["sweep", "-m", "tiny", "--rate", "1e9", "--vary", "engine.max_num_seqs=8"],
     "--rate 1e+09: expected 1e-06 to 1e+06 req/s"),
    (["sweep", "-m", "tiny", "--rate", "1e-6", "--requests", "1001", "--vary", "engine.max_num_seqs=8"],
     "sweep point {'engine.max_num_seqs': 8}: 1,001 requests at 1e-06 req/s would span 1e+09 s, more than 1e+09 s"),
])
def test_extreme_rates_and_cvs_are_one_line(args, msg):
    r = run_cli(*args, "--executor", "serial") if args[0] != "simulate" else run_cli(*args)
    assert r.returncode == 1 and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "internal error" not in r.stderr


def test_the_bounds_hold_in_files_too():
    with pytest.raises(ValidationError, match="cv"):
        Arrivals(kind="gamma", rate_per_s=1.0, cv=1e-300)
    with pytest.raises(ValidationError, match="target_rate_per_s"):
        Scenario(model="tiny", target_rate_per_s=1e-9)
    with pytest.raises(ValidationError, match="would span"):
        WorkloadSpec(arrivals=Arrivals(rate_per_s=1e-6), num_requests=1001)
    assert WorkloadSpec(arrivals=Arrivals(rate_per_s=1e-6), num_requests=1000).num_requests / 1e-6 == MAX_CLOCK_S


def test_a_trickle_still_needs_one_replica():
    """1e-6 req/s against a replica that serves 1,000: ceil(1e-6 / 800 - 1e-9) is 0 replicas, then a division
    by zero; a plan always has at least one."""
    assert replicas_for(Scenario(model="tiny", target_rate_per_s=1e-6), 1000.0) == 1
    assert replicas_for(Scenario(model="tiny", target_rate_per_s=1000.0), 100.0) == 13  # 1000 / 80 = 12.5
