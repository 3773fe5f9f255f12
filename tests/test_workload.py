"""Workload generators: distributions have the moments they claim, traces load or fail with a line."""
import json

import numpy as np
import pytest

from capacity.errors import ConfigError
from capacity.workload import Arrivals, Lengths, PrefixGroups, RequestClass, WorkloadSpec, generate, load_trace


@pytest.mark.parametrize("kind,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0), ("constant", 0.0)])
def test_interarrival_mean_and_cv(kind, cv):
    spec = WorkloadSpec(arrivals=Arrivals(kind=kind, rate_per_s=5.0, cv=cv or 1.0), num_requests=200_000)
    t = np.array([r.arrival_s for r in generate(spec, np.random.default_rng(0))])
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.2, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.03 * max(cv, 1))


def test_lognormal_lengths_have_the_requested_mean_and_cv():
    x = Lengths(kind="lognormal", mean=800, cv=0.6).draw(np.random.default_rng(1), 200_000)
    assert x.mean() == pytest.approx(800, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.6, rel=0.03)


def test_classes_priorities_and_prefix_groups():
    spec = WorkloadSpec(arrivals=Arrivals(rate_per_s=1.0), num_requests=20_000,
                        classes=[RequestClass(name="chat", weight=3, priority=0),
                                 RequestClass(name="batch", weight=1, priority=5, output_len=Lengths(value=1000))],
                        prefix=PrefixGroups(groups=4, tokens=300, share=0.5))
    reqs = generate(spec, np.random.default_rng(2))
    cls = np.array([r.cls for r in reqs])
    assert (cls == 1).mean() == pytest.approx(0.25, abs=0.01)
    assert all(r.priority == 5 and r.output_tokens == 1000 for r in reqs if r.cls == 1)
    grouped = [r for r in reqs if r.prefix_group >= 0]
    assert len(grouped) / len(reqs) == pytest.approx(0.5, abs=0.01)
    assert all(r.prefix_tokens == 300 and r.prompt_tokens > 300 and r.prefix_group < 4 for r in grouped)


def test_same_seed_same_workload():
    spec = WorkloadSpec(arrivals=Arrivals(kind="gamma", rate_per_s=3.0, cv=2.0), num_requests=100,
                        input_len=Lengths(kind="uniform", low=10, high=20))
    a = generate(spec, np.random.default_rng(9))
    b = generate(spec, np.random.default_rng(9))
    assert a == b


def test_trace_round_trip_jsonl_and_csv(tmp_path):
    rows = [{"timestamp": 10.0, "input_tokens": 50, "output_tokens": 5},
            {"timestamp": 10.5, "input_tokens": 100, "output_tokens": 20, "class": "default"}]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    reqs = load_trace(p, WorkloadSpec())
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 50, 5), (0.5, 100, 20)]
    c = tmp_path / "t.csv"
    c.write_text("timestamp,input_tokens,output_tokens\n1,10,2\n3,20,4\n")
    assert [r.arrival_s for r in load_trace(c)] == [0.0, 2.0]


@pytest.mark.parametrize("text,msg", [("{bad json", "line 1: not valid JSON"),
                                      ('{"timestamp": 1, "input_tokens": 0, "output_tokens": 3}', "must be > 0"),
                                      ('{"timestamp": 1, "input_tokens": 5}', "needs numeric timestamp"),
                                      ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 3, "class": "vip"}',
                                       "class 'vip' is not one of"),
                                      ('{"timestamp": -1, "input_tokens": 5, "output_tokens": 3}', "row 1: timestamp -1.0 is negative"),
                                      ('{"timestamp": 2, "input_tokens": 5, "output_tokens": 3}\n'
                                       '{"timestamp": 1, "input_tokens": 5, "output_tokens": 3}',
                                       "row 2: timestamp 1.0 is before the previous row's 2.0")])
def test_bad_traces_name_the_row(tmp_path, text, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_trace(p, WorkloadSpec())


def test_invalid_specs_are_rejected_by_field():
    from capacity.files import validate

    with pytest.raises(ConfigError, match="arrivals.rate_per_s"):
        validate(WorkloadSpec, {"arrivals": {"kind": "poisson", "rate_per_s": -2}}, "w.yaml")
    with pytest.raises(ConfigError, match="closed-loop arrivals need users"):
        validate(WorkloadSpec, {"arrivals": {"kind": "closed"}}, "w.yaml")
    with pytest.raises(ConfigError, match="input_len.hgh: unknown field"):
        validate(WorkloadSpec, {"input_len": {"kind": "uniform", "low": 5, "hgh": 3}}, "w.yaml")
