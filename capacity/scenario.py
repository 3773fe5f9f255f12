"""A scenario wires the halves together: the memory budget gives each replica its KV blocks and limits,
the step cost (roofline or a calibrated profile) times its steps, the workload feeds it, and the simulator
turns that into timelines and `metrics.summarize` into percentiles. The CLI, the planner and the dashboard
all go through `run_scenario`, so they cannot disagree about how a scenario is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from capacity.errors import CapacityError
from capacity.metrics import SLO, Summary, summarize
from capacity.simulator import SimConfig, SimResult, littles_law, simulate
from capacity.workload import WorkloadSpec


@dataclass
class ScenarioResult:
    summary: Summary
    sim: SimResult
    budget: object  # memory.MemoryBudget
    policy: str
    cost_source: str
    warmup_requests: int
    offered_rate_per_s: float | None
    little: tuple[float, float] = (0.0, 0.0)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        s = self.sim
        return {
            "summary": self.summary.as_dict(), "policy": self.policy, "step_cost_source": self.cost_source,
            "saturated": s.saturated, "saturation": s.saturation, "capacity_req_per_s": s.capacity_req_per_s,
            "offered_rate_per_s": self.offered_rate_per_s, "rejected": len(s.rejected),
            "rejected_examples": s.rejected[:3], "warmup_requests_excluded": self.warmup_requests,
            "simulated_s": s.end_s, "steps": s.steps, "engine_events": s.events, "preemptions": s.preemptions,
            "littles_law": {"L": self.little[0], "lambda_W": self.little[1]},
            "kv_blocks_per_replica": self.budget.num_blocks, "block_size": self.budget.block_size,
            "max_num_seqs": self.budget.max_num_seqs, "max_num_batched_tokens": self.budget.max_num_batched_tokens,
            "max_model_len": self.budget.max_model_len, "notes": self.notes, "units": "seconds, tokens",
        }


def scheduler_factory(policy: str, budget, *, prefix_caching: bool = False, static_max_batch: int | None = None,
                      static_max_wait_s: float = 0.0, chunked_prefill: bool = True):
    from capacity.scheduler import make_scheduler

    if policy in ("continuous", "priority"):
        kw = dict(max_num_seqs=budget.max_num_seqs, max_num_batched_tokens=budget.max_num_batched_tokens,
                  block_size=budget.block_size, num_blocks=budget.num_blocks, chunked_prefill=chunked_prefill,
                  prefix_caching=prefix_caching, max_model_len=budget.max_model_len)
    elif policy == "static":
        kw = dict(max_batch=static_max_batch or budget.max_num_seqs, max_wait_s=static_max_wait_s,
                  block_size=budget.block_size, num_blocks=budget.num_blocks, max_model_len=budget.max_model_len)
    else:
        kw = {}
    make_scheduler(policy, **kw)  # fail now, with the field named, not inside the simulation
    return lambda: make_scheduler(policy, **kw)


def run_scenario(budget, cost, workload: WorkloadSpec, *, policy: str = "continuous", replicas: int = 1,
                 router: str = "round_robin", seed: int = 0, warmup_fraction: float = 0.1,
                 fast_forward: bool = True, prefix_caching: bool = False, static_max_batch: int | None = None,
                 static_max_wait_s: float = 0.0, ci: bool = True, max_sim_s: float = float("inf")) -> ScenarioResult:
    if not 0 <= warmup_fraction < 1:
        raise CapacityError(f"warmup fraction: must be in [0, 1) (got {warmup_fraction})")
    factory = scheduler_factory(policy, budget, prefix_caching=prefix_caching, static_max_batch=static_max_batch,
                                static_max_wait_s=static_max_wait_s, chunked_prefill=True)
    rng = np.random.default_rng(seed)
    sim = simulate(workload, cost, factory, rng, SimConfig(replicas=replicas, router=router,
                                                            fast_forward=fast_forward, max_sim_s=max_sim_s))
    rec = sim.records
    n_warm = int(len(rec) * warmup_fraction)
    measured = rec.subset(np.arange(len(rec)) >= n_warm)
    # ITL samples are per token, not per request: the warm-up excludes tokens emitted before the first
    # measured request arrived.
    t0 = measured.arrival.min() if len(measured) else 0.0
    m = sim.itl_times >= t0
    slos = [SLO(c.slo_ttft_s, c.slo_tpot_s) for c in workload.classes]
    summary = summarize(measured, sim.itl_values[m], sim.itl_weights[m], rng, slos=slos, ci=ci)
    offered = workload.arrivals.rate_per_s
    notes = []
    if sim.rejected:
        notes.append(f"{len(sim.rejected)} requests rejected: {sim.rejected[0][1]}")
    if budget.estimates:
        notes.append("KV blocks from a memory budget with estimated terms: " + ", ".join(budget.estimates))
    return ScenarioResult(summary, sim, budget, policy, getattr(cost, "source", ""), n_warm, offered,
                          littles_law(sim), notes)
