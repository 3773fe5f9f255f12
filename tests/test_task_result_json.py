"""The planner's cache entry (capacity.plan.tasks.TaskResult) has a generated JSON form: every field goes out and
comes back without a hand-written list of fields to keep in step (issue 50 item 4)."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from capacity.plan.tasks import RESULT_SCHEMA, TaskResult
from capacity.sim.metrics import Dist


def _full() -> TaskResult:
    d = Dist(12_000, 0.2, 0.15, 0.3, 0.35, 0.5, 0.9)
    return TaskResult(d, Dist(40, 0.02, 0.02, 0.03, 0.03, 0.04), Dist(), d, 1234.5, 3.25, True, 4.5, "roofline",
                      rejected=2, preemptions=7, kv_blocks=4096, p99_ci={"ttft_s": (0.45, 0.55)},
                      per_class={"chat": (d, Dist(3, 0.01, 0.01, 0.01, 0.01, 0.01))}, queue_wait=Dist(5, 0.1),
                      rising=True, backlogged=(3.0, 900.0))


def test_every_field_goes_through_json_text_and_back():
    t = _full()
    d = json.loads(json.dumps(t.to_json(), default=float))
    assert set(d) == {"schema"} | {f.name for f in dataclasses.fields(TaskResult)}  # no field left out
    assert d["schema"] == RESULT_SCHEMA
    assert TaskResult.from_json(d) == t


def test_numpy_scalars_and_non_finite_values_survive():
    t = TaskResult(Dist(np.int64(3), np.float64(0.1)), Dist(), Dist(), Dist(), np.float64(2.0), 1.0, np.bool_(True),
                   math.inf, "x", preemptions=np.int64(4), p99_ci={"ttft_s": (math.nan, math.nan)})
    back = TaskResult.from_json(json.loads(json.dumps(t.to_json(), default=float)))
    assert (back.ttft.n, back.preemptions, back.saturated, back.capacity) == (3, 4, True, math.inf)
    assert type(back.preemptions) is int and all(math.isnan(x) for x in back.p99_ci["ttft_s"])


@pytest.mark.parametrize("entry", [{"schema": RESULT_SCHEMA - 1}, [], {"schema": RESULT_SCHEMA, "ttft": {"n": 1}},
                                   {**_full().to_json(), "tokens_per_s": "fast"}])
def test_another_schema_or_a_broken_entry_is_a_value_error(entry):
    with pytest.raises(ValueError):  # the executor's cache drops the entry and recomputes
        TaskResult.from_json(entry)


def test_the_executor_cache_serves_back_what_it_stored(tmp_path):
    from capacity.plan.executors import SerialExecutor

    ex = SerialExecutor(cache=tmp_path)
    ex._put("k", _full())
    assert ex._get("k") == _full()
    (tmp_path / "k.json").write_text(json.dumps({"schema": RESULT_SCHEMA - 1}))
    assert ex._get("k") is None and not (tmp_path / "k.json").exists()
