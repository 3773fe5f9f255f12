"""Is a run's answer a steady state? A run at one arrival rate either settles or its queue grows; a finite run
cannot always tell, so two checks, each with its own evidence:

- the TTFT trend over the run (`capacity.sim.metrics.Trend`: batch means in arrival order and a one-sided slope
  test), which needs nothing but the run;
- the deployment's capacity (`capacity_loop`: a closed loop that keeps the queue from emptying, the planner's own
  measure), against which the offered rate is set: at or above it a backlog that forms never drains.

`stability_notes` turns both into what `capacity simulate`, the dashboard and the JSON say; the planner, `disagg`,
`pools` and `colocate` fail a run whose TTFT still rises. Measured false-alarm and detection rates:
`bench/steady_state.py`; the pinned ones: tests/test_steady_state.py.

Two states a load generator can hold a run in are said here too: a closed loop's users in lock-step
(`lock_step_note`), and a client's cap that holds arrivals back (`client_wait`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capacity.engine import MemoryBudget
from capacity.engine.config import EngineConfig
from capacity.sim.metrics import TREND_BATCHES, Trend, ttft_trend
from capacity.sim.simulator import SimResult
from capacity.workload import Arrivals, WorkloadSpec, least_tokens


@dataclass(frozen=True)
class Capacity:
    """A deployment's capacity for a workload: requests/s served with the queue never empty (`capacity_loop`)."""

    req_per_s: float
    users: int
    requests: int

    def utilisation(self, offered: float | None) -> float | None:
        return None if offered is None or not self.req_per_s > 0 else offered / self.req_per_s

    def as_dict(self, offered: float | None) -> dict:
        return {"capacity_req_per_s": self.req_per_s, "closed_loop_users": self.users,
                "closed_loop_requests": self.requests, "offered_over_capacity": self.utilisation(offered)}


CAPACITY_LOOP_ROUNDS = 4  # requests per user in the capacity loop: the first round is start-up, the last drains
NEAR_CAPACITY = 0.9  # offered / capacity from which `capacity simulate` says the percentiles settle slowly


def full_batch(engine: EngineConfig, budget: MemoryBudget, wl: WorkloadSpec, max_num_seqs: int | None = None) -> int:
    """The most sequences the engine can run at once on this workload: max_num_seqs (the budget's unless
    given), or fewer where the KV cache cannot hold that many of the shortest prompts (every running sequence
    past its prefill holds its prompt's blocks). Where no bound is sure (prefix caching shares blocks; a trace;
    contiguous KV), max_num_seqs."""
    seqs = budget.max_num_seqs if max_num_seqs is None else max_num_seqs
    if engine.enable_prefix_caching or wl.prefix is not None or wl.trace or not budget.paged_kv:
        return seqs
    shortest = min(least_tokens(wl.class_lengths(c)[0]) for c in range(len(wl.classes)))
    return max(1, min(seqs, budget.planning_blocks // max(1, budget.blocks_for(max(1, shortest))) + 1))


def capacity_loop(engine: EngineConfig, budget: MemoryBudget, wl: WorkloadSpec, requests: int,
                  replicas: int = 1, max_num_seqs: int | None = None) -> WorkloadSpec:
    """The workload that measures a deployment's capacity: the throughput with its queue never empty, a closed
    loop of twice the full batch's users per replica (`full_batch`) without think time, at least four requests per
    user, read over the stretch where every user is in the loop (`capacity.sim.metrics.backlogged`: from the
    users-th completion to the last send, at least two requests per user). Read over the whole run instead, the
    start-up burst made it 0.2-3.8% low at two requests per user; at thirty it is within 0.2%
    (`bench/steady_state.py --capacity-only`). The queue never runs dry, so the engine admits what it would admit
    with a standing backlog (and preempts as it would) and sees the requests in the same order as with more
    users, with far fewer requests simulated (a batch cap of 1,024 on a cache that holds 418 prompts of 1,024
    tokens). This is the rate an open loop
    cannot exceed for long: above it a backlog that forms never drains. The planner's rate search and
    `capacity simulate`'s check both use it."""
    users, n = capacity_loop_size(engine, budget, wl, requests, replicas, max_num_seqs)
    return wl.model_copy(update={"arrivals": Arrivals(kind="closed", users=users), "num_requests": n})


def capacity_loop_size(engine: EngineConfig, budget: MemoryBudget, wl: WorkloadSpec, requests: int,
                       replicas: int = 1, max_num_seqs: int | None = None) -> tuple[int, int]:
    """`capacity_loop`'s users and requests, before anything is built (a caller bounds them first)."""
    users = max(2, 2 * full_batch(engine, budget, wl, max_num_seqs) * replicas)
    return users, max(requests, CAPACITY_LOOP_ROUNDS * users)


def stability_notes(sim: SimResult, trend: Trend | None, cap: Capacity | None, offered: float | None) -> list[str]:
    """What the run says about whether its percentiles are steady-state ones. A TTFT that rose through an
    overloaded run (offered at or above the capacity) marks the run saturated; a rise alone is a note (the queue
    may be a stable one too close to capacity to settle within the run), as is an offered rate at or near the
    capacity whose TTFT did not (yet) rise."""
    notes = []
    u = cap.utilisation(offered) if cap is not None else None
    cap_txt = (f"{cap.req_per_s:.3g} req/s with its queue never empty (a closed loop of {cap.users:,} users, the "
               "planner's measure)") if cap is not None else ""
    rise = (f"TTFT rose from {trend.first_s * 1e3:,.0f} ms (first {100 // TREND_BATCHES}% of the measured requests) to "
            f"{trend.last_s * 1e3:,.0f} ms (last {100 // TREND_BATCHES}%; trend over {TREND_BATCHES} batch means, "
            f"one-sided p={trend.p_value:.1g})") if trend is not None and trend.rising else ""
    if rise and u is not None and u >= 1 and not sim.saturated:
        sim.saturated = True
        sim.capacity_req_per_s = cap.req_per_s  # type: ignore[union-attr]
        sim.saturation = (f"saturated: {rise}, at or above the deployment's capacity, {cap_txt}: the queue grows "
                          "for as long as the load lasts, so these percentiles grow with the run's length")
    elif rise:
        notes.append(f"not steady: {rise}: the queue grew through the run, so these percentiles are a transient's "
                     "and grow with a longer run; the load is at or above capacity, or too close to it to settle in "
                     "this many requests (more with -n / num_requests shows which)"
                     + (f"; capacity {cap_txt}" if cap_txt else ""))
    elif u is not None and u >= NEAR_CAPACITY and not sim.saturated:
        where = "at or above" if u >= 1 else "near"
        notes.append(f"{where} capacity: the offered {offered:.3g} req/s is {u:.0%} of {cap_txt}: a backlog that "
                     "forms here drains slowly" + (" or never" if u >= 1 else "") + ", so the percentiles depend on "
                     "the run's length and jump with small changes of rate; plan with headroom below it")
    return notes


def wait_stats(waits_s: np.ndarray, cap: int) -> dict:
    """Waits at a capped client (s), as simulate and loadtest report them: the cap, the count, mean/P99/max ms."""
    ms = np.asarray(waits_s, dtype=float) * 1e3
    some = ms.size > 0
    return {"max_concurrency": cap, "requests": int(ms.size), "mean_ms": float(ms.mean()) if some else 0.0,
            "p99_ms": float(np.percentile(ms, 99)) if some else 0.0, "max_ms": float(ms.max()) if some else 0.0}


def client_wait(waits: np.ndarray | None, sent: np.ndarray, n_warm: int, cap: int | None) -> tuple[dict | None, list[str]]:
    """Behind a client's cap on requests in flight (arrivals.max_concurrency): how long the measured requests (sent
    at `sent`, in the records' order) waited at the client for a slot, in ms, and whether that wait grew through the
    run (the trend test of TTFT, on the wait over arrival time): then the client sent less than the offered rate,
    whatever TTFT says. (None, []) without a cap."""
    if waits is None or cap is None:
        return None, []
    w = waits[n_warm:]
    d = {**wait_stats(w, cap), "requests_waited": int((w > 0).sum()), "backlog_rising": False}
    if not d["requests_waited"]:
        return d, []
    grew = ttft_trend(sent - w, sent)
    d["backlog_rising"] = bool(grew is not None and grew.rising)
    rise = (f", and the wait grew through the run ({grew.first_s * 1e3:,.0f} -> {grew.last_s * 1e3:,.0f} ms): the "
            "client sent less than the offered rate" if grew is not None and grew.rising else "")
    return d, [f"client cap of {cap} requests in flight: {d['requests_waited']:,} of {d['requests']:,} measured "
               f"requests waited at the client for a slot (mean {d['mean_ms']:,.0f} ms, max {d['max_ms']:,.0f} ms)"
               f"{rise}; TTFT and E2E start at the send, as vllm bench serve times them, so they leave that wait out"]


def drift_note(workload) -> list[str]:
    """A closed loop of fixed lengths without think time whose simulated users drifted apart (no lock step seen):
    a real engine may keep such users in waves, so the simulated TTFT may be the lower end."""
    arr = workload.arrivals
    if ((arr.users or 0) >= 4 and arr.think_s == 0 and workload.input_len.kind == "fixed"
            and workload.output_len.kind == "fixed"
            and all(c.input_len is None and c.output_len is None for c in workload.classes)):
        return ["closed loop of fixed lengths without think time: the simulated users drifted apart, "
                "but a real engine may keep such users in waves (NIM's Llama-3.1-8B with 5,000-token "
                "prompts at 5-150 users: published TTFT 1.9-2.7x this simulator's), so TTFT here may be "
                "the lower end (docs/fidelity.md, closed-loop lock-step)"]
    return []


def lock_step_note(first_token: np.ndarray, users: int, per_step: float) -> list[str]:
    """A closed loop whose users came back in waves. `first_token`: the measured requests' first-token times (a
    step's first tokens share one time); `per_step`: first tokens per engine step over the run. For each request,
    how many got their first token in its step, itself included (the size-biased mean of those clusters): users
    arriving independently of each other would give 1 + per_step (a Poisson count seen from one of its members);
    waves give far more, also when a wave's prompts take several steps of the token budget. Fixed lengths without
    think time keep simulated users in such waves for good; real clients and engines drift apart within a few
    waves (docs/fidelity.md, closed-loop lock-step), so TTFT is then an upper end."""
    t = first_token[np.isfinite(first_token)]
    if users < 4 or t.size < 2 * users:
        return []
    _, counts = np.unique(t, return_counts=True)
    shared = float((counts * counts).sum() / t.size)
    ratio = shared / (1.0 + per_step)
    if shared < 4.0 or ratio < 3.0:
        return []
    return [f"closed loop in lock-step: the average measured request got its first token in one step with "
            f"{shared:.0f} requests, itself included, {ratio:.0f}x what {users} users arriving independently would "
            "give. Fixed lengths without think time keep simulated users in waves; real clients and engines drift "
            "apart within a few waves, so TTFT here is an upper end (safe, not accurate). Lengths a few percent "
            "apart (e.g. --output-len 190-210 for 200) give the other end (docs/fidelity.md, closed-loop lock-step)"]
