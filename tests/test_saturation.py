"""Near saturation (issue 47 item 6): the quantities docs/fidelity.md, "MLPerf Server near saturation", reads from
the published LoadGen logs, pinned by hand."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.mlperf import DATA, inflight_per_replica, settings  # noqa: E402


def _runs() -> dict:
    d = yaml.safe_load(DATA.read_text())
    return {r["id"]: (r, settings(r, d["harness_common"])) for r in d["runs"]}


def test_littles_law_in_flight_of_the_h100_server_log():
    # v4.1 DGX-H100 Server: 74.42 completed samples/s x 44.954547 s mean latency / 4 replicas (TP 2 on 8 GPUs)
    # = 3,345.5 / 4 = 836.4 sequences per replica, by hand
    r, s = _runs()["v4.1/DGX-H100_H100-SXM-80GBx8_TRT/Server"]
    got = inflight_per_replica(r["throughput"]["completed_samples_per_s"], r["latency_ms"]["mean"] / 1e3,
                               s["replicas"])
    assert got == pytest.approx(836.4, abs=0.1)


def test_the_real_engines_ran_below_their_batch_cap():
    # the reading of docs/fidelity.md: the published Server runs held 0.5-0.82 of gpu_batch_size in flight,
    # so neither the batch cap nor a queue set their TPOT; the step cost at that batch did
    fracs = {}
    for rid, (r, s) in _runs().items():
        if r["scenario"] == "Offline" or s is None:
            continue
        n = inflight_per_replica(r["throughput"]["completed_samples_per_s"], r["latency_ms"]["mean"] / 1e3,
                                 s["replicas"])
        fracs[rid] = n / s["batch"]
    assert fracs and all(0.3 < f < 0.9 for f in fracs.values()), fracs
    # v4.1 H200 Server: 100.35 x 35.854895 s / 8 = 449.8 of 896 (0.502), by the same hand computation
    assert fracs["v4.1/H200-SXM-141GBx8_TRT/Server"] == pytest.approx(0.502, abs=0.005)


def test_inflight_rejects_nothing_silently():
    assert inflight_per_replica(10.0, 2.0, 0) == 20.0  # replicas 0 read as 1, never a division by zero
