"""`capacity sweep` applies every field it varies or refuses it (issue 49 item 6): arrivals' kind and cv and the
GPU memory reach the simulations; fields the sweep would replace (num_requests, the rate) or never read (a plan's
headroom, SLOs, search), and a field given twice, are refused by name."""
from __future__ import annotations

import json

import pytest

from capacity.errors import ConfigError
from capacity.plan.sweep import check_axes, parse_axis
from tests.conftest import run_cli


def rows(*args: str) -> list[dict]:
    p = run_cli("sweep", "-m", "tiny", *args, "--rate", "20", "--requests", "100", "--seeds", "1", "--executor",
                "serial", "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["rows"]


def test_arrival_kind_cv_and_gpu_memory_are_applied():
    """Gamma gaps with cv 4 are burstier than with cv 0.5: a higher P99 TTFT at the same rate (the rows were
    identical when the sweep replaced arrivals by Poisson). 2 GiB of GPU memory gives the KV pool that
    `capacity simulate -m tiny --gpu-memory-gib 2` reports, 65,938 blocks (4.6 million without the override)."""
    lo, hi = rows("--vary", "workload.arrivals.kind=gamma", "--vary", "workload.arrivals.cv=0.5,4")
    assert (lo["workload.arrivals.cv"], hi["workload.arrivals.cv"]) == (0.5, 4)
    assert hi["ttft_p99_s"] > lo["ttft_p99_s"]
    two, four = rows("--vary", "gpu_memory_gib=2,4")
    assert two["kv_blocks"] == 65938 and two["kv_blocks"] < four["kv_blocks"] < 4_614_725


@pytest.mark.parametrize("axes,rate,msg", [
    (["engine.max_num_seqs=8", "engine.max_num_seqs=16"], False, "--vary engine.max_num_seqs: given twice"),
    (["workload.input_len.value=8", "workload.input_len=9"], False, "overlaps --vary workload.input_len.value"),
    (["workload.num_requests=5,6"], False, "a sweep point's requests are --requests"),
    (["workload.arrivals.rate_per_s=1,2"], False, "vary target_rate_per_s"),
    (["workload.arrivals.users=4"], False, "of workload.arrivals it varies kind, cv"),
    (["workload.arrivals.kind=closed"], False, "'closed': a sweep runs open-loop arrivals"),
    (["headroom=0.5,0.9"], False, "--vary headroom: not swept: a plan's field"),
    (["slo.ttft_p99_ms=100"], False, "--vary slo.ttft_p99_ms: not swept"),
    (["search.requests=100"], False, "--vary search.requests: not swept"),
    (["target_rate_per_s=1,2"], True, "--rate fixes every point's rate"),
])
def test_fields_a_sweep_would_not_apply_are_refused(axes, rate, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(".", r"\.")):
        check_axes([parse_axis(a) for a in axes], rate)


def test_refusals_are_one_line_through_the_cli():
    p = run_cli("sweep", "-m", "tiny", "--vary", "workload.arrivals.cv=0.5,4", "--requests", "50", "--seeds", "1",
                "--executor", "serial")
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "only gamma arrivals have a cv, the point {'workload.arrivals.cv': 0.5} has poisson" in p.stderr
    p = run_cli("sweep", "-m", "tiny", "--vary", "engine.max_num_seqs=8", "--prefill-sweep", "64", "--vary",
                "engine.max_num_seqs=16", "--requests", "50", "--seeds", "1", "--executor", "serial")
    assert p.returncode == 1 and "given twice" in p.stderr and "Traceback" not in p.stderr
