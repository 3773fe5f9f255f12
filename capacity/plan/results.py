"""The plan's typed results: what the planner hands to the report, the workbook and the dashboard.
`Plan.as_dict()` is the JSON form (`capacity plan --json`), `Plan.from_dict()` reads it back (`capacity export`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from capacity.engine.budget import MemoryBudget
from capacity.plan.scenario import SLOSpec


@dataclass
class RateSearch:
    tp: int
    max_rate: float  # highest rate that passed (req/s per replica)
    failed_rate: float  # lowest rate that failed
    capacity_rate: float  # saturation throughput (req/s) with the batch kept full
    probes: list[tuple[float, bool, float, float]] = field(default_factory=list)  # rate, ok, p_ttft, p_tpot
    unloaded: tuple[float, float] | None = None  # (p_ttft, p_tpot) at a tiny load
    source: str = ""  # the step-cost source of every probe of this row
    max_num_seqs: int = 0  # the configuration searched
    max_num_batched_tokens: int = 0
    why: str = ""  # where no rate passed: the objective a trickle misses and the ways out (capacity.plan.why)


@dataclass
class TpUnfit:
    tp: int
    why: str  # "weights need 131.4 GiB per rank, usable is 71.2 GiB ..."


@dataclass
class MetricStats:
    """One latency of a frontier row: means over seeds of each statistic, and the P99 band (seconds)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_ci_low: float | None = None
    p99_ci_high: float | None = None


@dataclass
class Cell:
    max_num_seqs: int
    max_model_len: int
    feasible: bool
    why: str = ""
    covers_workload: bool = True
    p_ttft: float | None = None
    p_tpot: float | None = None
    p_ttft_band: tuple[float, float] | None = None
    p_tpot_band: tuple[float, float] | None = None
    capacity_tokens_per_s: float | None = None
    meets_slo: bool = False
    kv_tokens: int | None = None
    stats: dict[str, MetricStats] = field(default_factory=dict)  # ttft, tpot, itl, e2e
    max_num_batched_tokens: int | None = None  # as simulated (the engine's default unless the scenario sets it)
    kv_blocks: int | None = None
    preemptions: float | None = None  # mean over seeds, at the per-replica load
    saturated: bool = False  # at the per-replica load: its P99s are then null in JSON (unbounded)


@dataclass
class ContextCell:
    """The trade-off users face: requests of `context` tokens (prompt + output) against a batch cap, at the
    per-replica load. Where the KV cache runs out, preemptions and queueing appear and the P99s turn."""

    context: int
    max_num_seqs: int
    feasible: bool
    why: str = ""
    p_ttft: float | None = None
    p_tpot: float | None = None
    saturated: bool = False
    preemptions: float | None = None  # mean over seeds
    queue_wait_p99: float | None = None
    capacity_tokens_per_s: float | None = None  # peak, with the batch kept full
    kv_concurrency: int | None = None  # requests of this context the KV cache holds at once
    meets_slo: bool = False


@dataclass
class Verification:
    passed: bool
    replicas: int
    p_ttft_s: float
    p_tpot_s: float
    seeds: list[int]
    rate_per_s: float


@dataclass
class Plan:
    model: str
    gpu: str
    slo: SLOSpec
    target_rate: float
    searches: list[RateSearch]
    tp: int
    replicas: int
    gpus: int
    frontier: list[Cell]
    per_replica_rate: float
    recommended: Cell | None
    rec_search: RateSearch | None
    verification: Verification
    tradeoffs: list[str]
    vllm_command: str
    sglang_command: str
    cost_per_million_tokens: float | None
    budget: MemoryBudget  # of the recommended configuration (see budget_config)
    source: str
    notes: list[str] = field(default_factory=list)
    memory_table: list[dict] = field(default_factory=list)
    scenario: dict = field(default_factory=dict)
    provenance: dict | None = None  # of the calibration profile, when one was used
    tool_version: str = ""
    mean_output_tokens: float = 0.0  # class-weighted mean output length: what cost per 1M tokens divides by
    budget_config: str = ""  # which configuration the budget belongs to, as a `capacity memory` command
    headroom: float = 1.0  # replicas run at this share of the recommended configuration's max rate
    tp_unfit: list[TpUnfit] = field(default_factory=list)  # TP sizes searched that cannot hold the model
    context_frontier: list[ContextCell] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["slo"] = self.slo.model_dump()
        d["units"] = "seconds, requests/s, tokens/s, USD"
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """A plan read back from its JSON form; a file that is not one raises ValueError/TypeError/KeyError."""
        data = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return TypeAdapter(cls).validate_python(data)
