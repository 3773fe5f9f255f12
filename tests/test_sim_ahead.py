"""One engine fed by an open-loop source runs ahead of the clock and drives its source itself
(`capacity.sim.entities.runs_ahead`, `Replica._arrivals`): no clock event per step or arrival. With a finite
`max_sim_s` the source is a clock process again and the engine yields to the clock before each arrival (running
ahead only in between); with several replicas neither shortcut applies. The three must give the same run bit for
bit: every per-request time, ITL sample and time-series row, and the counters (the clocked run's end is its
time limit, which it waits for)."""
import dataclasses

import numpy as np
import pytest
import simpy

from capacity.cost.roofline import RooflineCost
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.sched import make_scheduler
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Arrivals, Lengths, Request, WorkloadSpec

CARD = load_model_card("models/llama-3.1-8b.yaml")


def _run(workload, max_sim_s=float("inf"), blocks=27_703, fast=True, sched="continuous"):
    cost = RooflineCost(CARD, get_gpu("h100-sxm"))
    make = lambda: make_scheduler(sched, max_num_seqs=32, max_num_batched_tokens=2048, block_size=16,
                                  num_blocks=blocks)
    return simulate(workload, cost, make, np.random.default_rng(1), SimConfig(fast_forward=fast, max_sim_s=max_sim_s))


def _same(a, b):
    for f in dataclasses.fields(a.records):
        x, y = getattr(a.records, f.name), getattr(b.records, f.name)
        assert x.tobytes() == y.tobytes(), f.name
    for k in ("itl_values", "itl_weights", "itl_times", "timeseries"):
        assert getattr(a, k).tobytes() == getattr(b, k).tobytes(), k
    assert (a.steps, a.events, a.preemptions, a.time_in_system_area, a.saturated) == \
        (b.steps, b.events, b.preemptions, b.time_in_system_area, b.saturated)
    assert a.end_s == np.nanmax(a.records.finish) and b.end_s == 1e9  # (a clocked run waits for its time limit)


SPEC = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=6.0), input_len=Lengths(kind="uniform", low=200, high=3000),
                    output_len=Lengths(kind="uniform", low=20, high=400), num_requests=600)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("blocks", [27_703, 900])  # 900: the KV pool short, preemptions and a waiting queue
def test_driving_the_source_is_the_clock(fast, blocks):
    free = _run(SPEC, blocks=blocks, fast=fast)
    clocked = _run(SPEC, max_sim_s=1e9, blocks=blocks, fast=fast)
    _same(free, clocked)
    assert free.end_s < 1e9 and free.steps > 600
    if blocks == 900:
        assert free.preemptions > 0


@pytest.mark.parametrize("between", [False, True])
def test_ties_between_arrivals_and_step_ends(between):
    """Requests that arrive together (an offline batch at t = 0, then pairs at the same instant), and two arriving
    exactly when a step ends: SimPy orders same-time events by creation, which the driven source keeps. The
    source's event for them is created at the arrival before theirs: before the step began (they join the step
    planned at the tie), or, `between`, during it (the step's end comes first: they join the one after)."""
    base = [Request(id=i, arrival_s=t, prompt_tokens=300 + 7 * i, output_tokens=30 + (i % 5))
            for i, t in enumerate([0.0, 0.0, 0.0, 0.5, 0.5])]
    tie = float(_run(base).records.finish[0])  # a step end; arrivals at it leave every step before it unchanged
    assert 0 < tie < 0.5
    extra = [Request(id=3, arrival_s=tie - 1e-4, prompt_tokens=200, output_tokens=20)] if between else []
    n = 3 + len(extra)
    reqs = base[:3] + extra + [Request(id=n + i, arrival_s=tie, prompt_tokens=500, output_tokens=40)
                               for i in range(2)] + [
        dataclasses.replace(r, id=n + 2 + i) for i, r in enumerate(base[3:])] + [
        Request(id=n + 4, arrival_s=tie + 3.0, prompt_tokens=100, output_tokens=10)]
    free = _run(reqs)
    clocked = _run([dataclasses.replace(r) for r in reqs], max_sim_s=1e9)
    _same(free, clocked)
    first = free.records.first_scheduled  # in arrival order: the extra one at n - 1, the two at the tie at n, n + 1
    assert (first[n] > tie) == between and first[n + 1] == first[n]
    assert first[n - 1] == tie or not between  # the one that came during the step: in the step planned at the tie


def test_no_clock_events(monkeypatch):
    """The point of it: a driven run takes a handful of clock events, the clocked one several per request."""
    n = {"events": 0}
    step = simpy.Environment.step

    def counted(env):
        n["events"] += 1
        return step(env)

    monkeypatch.setattr(simpy.Environment, "step", counted)
    _run(SPEC)
    free, n["events"] = n["events"], 0
    _run(SPEC, max_sim_s=1e9)
    assert free <= 3 < 600 <= n["events"]
