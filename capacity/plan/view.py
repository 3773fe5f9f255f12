"""What the plan's helpers read of the planner: `PlannerView`, the part of `capacity.plan.planner.Planner` that
`capacity.plan.frontier` (the frontier, the context map, the recommendation, the trade-offs, the token-budget
tuning) and `capacity.plan.why` (why a configuration serves no rate) use. They take the planner through it, so
neither imports the module that imports them; mypy checks `Planner` against it where the planner passes itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from capacity.engine.budget import MemoryBudget
    from capacity.engine.config import EngineConfig
    from capacity.model.gpus import GPU
    from capacity.plan.results import RateSearch
    from capacity.plan.scenario import Scenario
    from capacity.plan.tasks import SimTask, TaskResult
    from capacity.workload import WorkloadSpec


class PlannerView(Protocol):
    """The planner's scenario, model card, GPU, executor and notes, and the questions the helpers ask it (each
    method is `Planner`'s, documented there)."""

    frontier_tp: int  # the TP size the frontier was simulated at (set by `capacity.plan.frontier.frontier`)

    @property
    def sc(self) -> Scenario: ...
    @property
    def card(self) -> Any: ...  # the model card (capacity.model.card.ModelCard)
    @property
    def gpu(self) -> GPU: ...
    @property
    def ex(self) -> Any: ...  # the executor (capacity.plan.executors): run(tasks) -> results
    @property
    def notes(self) -> list[str]: ...

    def budget(self, engine: EngineConfig) -> MemoryBudget: ...
    def cell_engine(self, tp: int, max_num_seqs: int | None = None, max_model_len: int | None = None) -> EngineConfig: ...
    def check_source(self, tp: int) -> str: ...
    def tasks(self, engine: EngineConfig, rate: float | None, seeds: range, replicas: int = 1,
              closed_users: int | None = None, requests: int | None = None, ci: bool = False,
              router: str = "round_robin", workload: WorkloadSpec | None = None) -> list[SimTask]: ...
    def judge(self, results: list[TaskResult]) -> tuple[bool, float, float]: ...
    def full_batch(self, engine: EngineConfig, max_num_seqs: int) -> int: ...
    def rate_search(self, engine: EngineConfig, tp: int, max_num_seqs: int) -> RateSearch: ...
    def longest_request(self) -> int: ...
