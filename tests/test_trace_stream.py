"""A replayed trace streams into the simulator and a long run's records are folded into arrays (issue 51: a
million-request trace in bounded memory): the source pulls one request ahead of the clock, folding changes no
figure, a bad row far into a trace is still one error naming it, and the P99 interval in batches is the same."""
import json

import numpy as np
import pytest

import capacity.sim.simulator as simmod
from capacity.cost.step import LinearCost
from capacity.errors import ConfigError
from capacity.sched import make_scheduler
from capacity.sim.metrics import p99_ci, summarize
from capacity.sim.simulator import SimConfig, Simulation, simulate
from capacity.workload import Arrivals, Request, WorkloadSpec
from tests.conftest import run_cli


def sched():
    return make_scheduler("continuous", max_num_seqs=16, max_num_batched_tokens=2048, num_blocks=4096)


COST = LinearCost(fixed_s=2e-3, per_token_s=2e-5)


def requests(n: int, seed: int = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / 60, n))
    return [Request(i, float(t[i]), int(rng.integers(16, 400)), int(rng.integers(1, 60))) for i in range(n)]


def test_the_source_pulls_one_request_ahead_of_the_clock():
    reqs = requests(400)
    sim = Simulation(COST, sched, np.random.default_rng(0), SimConfig())
    lead = []

    def stream():
        for i, r in enumerate(reqs):
            lead.append(i - sim.entered)  # pulled, less those the clock has reached
            yield r

    res = sim.run(stream())
    assert len(res.records) == 400 and res.records.finished.all()
    assert max(lead) == 1  # the next arrival (the fast path's horizon) and no more


@pytest.mark.parametrize("fast", [True, False])
def test_folding_a_long_runs_records_changes_no_figure(monkeypatch, fast):
    reqs = requests(3000)
    monkeypatch.setattr(simmod, "COMPACT_AT", 0)  # never fold: every Seq held to the end, as before folding
    whole = simulate(reqs, COST, sched, np.random.default_rng(0), SimConfig(fast_forward=fast))
    monkeypatch.setattr(simmod, "COMPACT_AT", 64)
    sim = Simulation(COST, sched, np.random.default_rng(0), SimConfig(fast_forward=fast))
    folded = sim.run(requests(3000))
    assert sim.recorder.folded and len(sim.recorder.seqs) == 0  # it did fold (all of it, by the end)
    for k, v in whole.records.__dict__.items():
        np.testing.assert_array_equal(getattr(folded.records, k), v, err_msg=k)
        assert getattr(folded.records, k).dtype == v.dtype
    # the ITL samples in another order: the same multiset of (value, weight, time)
    a = np.stack([whole.itl_values, whole.itl_weights, whole.itl_times])
    b = np.stack([folded.itl_values, folded.itl_weights, folded.itl_times])
    np.testing.assert_array_equal(a[:, np.lexsort(a)], b[:, np.lexsort(b)])
    s1 = summarize(whole.records, whole.itl_values, whole.itl_weights, np.random.default_rng(0)).as_dict()
    s2 = summarize(folded.records, folded.itl_values, folded.itl_weights, np.random.default_rng(0)).as_dict()
    for k in ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s"):
        assert s1[k] == s2[k]
    for q in ("p50", "p90", "p95", "p99"):
        assert s1["itl_s"][q] == s2["itl_s"][q]
    assert s2["itl_s"]["mean"] == pytest.approx(s1["itl_s"]["mean"], rel=1e-12)


def test_a_bad_row_deep_in_a_streamed_trace_is_one_error_naming_it(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"timestamp": i * 0.01, "input_tokens": 100, "output_tokens": 10} for i in range(500)]
    rows[420]["output_tokens"] = 2.5
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = WorkloadSpec(arrivals=Arrivals(kind="trace"), trace=str(p), num_requests=500)
    with pytest.raises(ConfigError, match=r"row 421: output_tokens 2\.5 is not a whole number"):
        simulate(spec, COST, sched, np.random.default_rng(0))
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"arrivals": {"kind": "trace"}, "trace": str(p), "num_requests": 500}))
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--workload", str(wl), "--json")
    assert r.returncode == 1 and "row 421: output_tokens 2.5" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_streamed_trace_replays_the_rows_it_was_given(tmp_path):
    """The trace's requests, in its order, shifted to start at 0: each record is its row's."""
    p = tmp_path / "t.csv"
    p.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{5 + i * 0.5},{100 + i},{1 + i % 7}\n"
                                                                      for i in range(40)))
    spec = WorkloadSpec(arrivals=Arrivals(kind="trace"), trace=str(p), num_requests=30)
    res = simulate(spec, COST, sched, np.random.default_rng(0))
    r = res.records
    assert len(r) == 30
    np.testing.assert_array_equal(r.arrival, np.arange(30) * 0.5)
    np.testing.assert_array_equal(r.prompt_tokens, 100 + np.arange(30))
    np.testing.assert_array_equal(r.output_tokens, 1 + np.arange(30) % 7)


def test_the_p99_interval_in_batches_is_the_one_at_once(monkeypatch):
    import capacity.sim.metrics as metrics

    x = np.random.default_rng(3).lognormal(size=5000)
    at_once = p99_ci(x, np.random.default_rng(7))
    monkeypatch.setattr(metrics, "BOOTSTRAP_CELLS", 5000 * 7)  # 7 resamples at a time
    assert p99_ci(x, np.random.default_rng(7)) == at_once
