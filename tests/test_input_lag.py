"""Async scheduling's input lag (`capacity.sim.entities.Replica._take_lagged`): an engine that schedules step
n + 1 while step n runs (vLLM's async scheduling, TensorRT-LLM's and SGLang's overlap schedulers) takes a
request that came during step n into step n + 2, one step later than a synchronous engine; an idle engine takes
it at once. Traced by hand with steps of 0.125 s (exact in binary), whatever they hold."""
import numpy as np
import pytest

from capacity.cost.step import LinearCost
from capacity.sched import make_scheduler
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Arrivals, Request, WorkloadSpec, fixed

STEP = 0.125


def first_scheduled(reqs, async_scheduling, fast_forward=True):
    res = simulate(reqs, LinearCost(fixed_s=STEP),
                   lambda: make_scheduler("continuous", async_scheduling=async_scheduling, max_num_seqs=8,
                                          max_num_batched_tokens=4096, num_blocks=4096),
                   np.random.default_rng(0), SimConfig(fast_forward=fast_forward, timeseries=False))
    order = np.argsort([r.req.id for r in res.seqs]) if hasattr(res, "seqs") else None
    fs = res.records.first_scheduled
    return list(fs if order is None else fs[order])


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_request_that_comes_during_a_step_runs_a_step_later_with_async_scheduling(fast_forward):
    """A (prompt 10, 100 tokens out) decodes from t = 0: steps end at 0.125, 0.25, 0.375, 0.5, ...
    B comes at 0.3, during the step [0.25, 0.375]:
    - synchronous: the schedule call at 0.375 (for the step ending 0.5) sees it;
    - async: the call standing for 0.375's was made when that step began (0.25), the one for [0.375, 0.5] before
      B came too (at 0.25 the engine scheduled [0.375, 0.5]): B is first scheduled at 0.5.
    C comes exactly at 0.5, a step's end (a closed-loop user answering): later than that step's processing,
    so async takes it at 0.75 (the call at 0.625 stands for one made at 0.5, before C's request travelled)."""
    reqs = [Request(0, 0.0, 10, 100), Request(1, 0.3, 10, 100), Request(2, 0.5, 10, 100)]
    sync = first_scheduled(reqs, False, fast_forward)
    lag = first_scheduled(reqs, True, fast_forward)
    assert sync == [0.0, 0.375, 0.5]
    assert lag == [0.0, 0.5, 0.75]


def test_an_idle_engine_takes_its_input_at_once():
    """A (3 tokens out) finishes at 0.375. B comes at 0.3, during A's last step: the step after would hold
    nothing (A is done), so the engine takes B at once, at 0.375. C comes at 0.6, long after: scheduled on
    arrival. The same as a synchronous engine (async scheduling hides nothing when there is nothing to run)."""
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.3, 10, 3), Request(2, 1.5, 10, 3)]
    assert first_scheduled(reqs, True) == first_scheduled(reqs, False) == [0.0, 0.375, 1.5]


def test_closed_loop_users_wait_two_steps_more_and_the_fast_path_agrees():
    """Four closed-loop users, outputs of 10-40 tokens so that they drift apart. A user's next request comes at
    the end of the step that streamed its last token, after the schedule call for the next step: synchronous,
    it runs in the step after that (TTFT two steps); async, after the two calls made before it was sent (TTFT
    three steps). The first wave finds the engine idle (one step either way). The fast path gives the
    step-by-step answer."""
    from capacity.workload import Lengths

    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=4), input_len=fixed(10),
                        output_len=Lengths(kind="uniform", low=10, high=40), num_requests=80)
    runs = {}
    for a in (False, True):
        for f in (True, False):
            runs[a, f] = simulate(spec, LinearCost(fixed_s=STEP),
                                  lambda a=a: make_scheduler("continuous", async_scheduling=a, max_num_seqs=8,
                                                             max_num_batched_tokens=4096, num_blocks=4096),
                                  np.random.default_rng(1), SimConfig(fast_forward=f, timeseries=False))
    for a in (False, True):
        np.testing.assert_allclose(runs[a, True].records.first_token, runs[a, False].records.first_token, rtol=1e-12)
    ttft = {a: runs[a, False].records.first_token - runs[a, False].records.arrival for a in (False, True)}
    steps = {a: np.round(t / STEP, 9) for a, t in ttft.items()}
    assert list(steps[False][:4]) == list(steps[True][:4]) == [1.0] * 4  # the first wave: an idle engine
    assert set(steps[False][4:]) == {2.0} and set(steps[True][4:]) == {3.0}
