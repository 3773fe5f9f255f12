"""One simulation as a task: plain data in (`SimTask`: picklable, hashable for the cache), a typed result out
(`TaskResult`). `run_task` runs in any process (pool, Ray worker) through the one run pipeline."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from pydantic import TypeAdapter

import capacity
from capacity.engine.config import EngineConfig
from capacity.files import validate
from capacity.model.card import ModelCard
from capacity.model.gpus import resolve_gpu
from capacity.pipeline import Deployment, RunOptions, run
from capacity.sim.metrics import Dist
from capacity.workload import WorkloadSpec

RESULT_SCHEMA = 6  # bump when TaskResult changes shape: older cache entries are then recomputed (6: the JSON generated)


@dataclass(frozen=True)
class SimTask:
    """Everything one simulation needs, as plain data."""

    card: dict
    gpu: str | dict  # a catalogue name, or the GPU's fields (a user GPU file, a --gpu-memory-gib override)
    engine: dict  # EngineConfig fields
    workload: dict  # WorkloadSpec fields
    seed: int
    replicas: int = 1
    router: str = "round_robin"
    profile: str | None = None
    warmup_fraction: float = 0.1
    ci: bool = False

    def key(self) -> str:
        import hashlib
        import json

        # the version is read at call time: a new version never reuses old results
        d = {**self.__dict__, "v": capacity.__version__, "schema": RESULT_SCHEMA, "code": code_fingerprint()}
        if self.profile:  # the profile's contents, not just its name, decide the result
            from pathlib import Path

            p = Path(self.profile)
            d["profile_sha256"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


CODE_SUFFIXES = (".py", ".so", ".pyd", ".yaml", ".json", ".csv")


@functools.lru_cache(maxsize=4)
def code_fingerprint(root: str | None = None) -> str:
    """A hash of the package's code and data files (names and bytes), so a cached result is never served to
    code that would compute another one: a `git pull` or an edit changes the simulator without changing
    `__version__`. Hashed once per process (a few MB, milliseconds)."""
    import hashlib
    from pathlib import Path

    base = Path(root) if root else Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(q for q in base.rglob("*") if q.suffix in CODE_SUFFIXES and q.is_file()):
        h.update(p.relative_to(base).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class TaskResult:
    """The numbers the planner and sweeps need from one simulation."""

    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    tokens_per_s: float
    requests_per_s: float
    saturated: bool
    capacity: float | None  # req/s sustained while backlogged, when saturated
    source: str  # the step-cost source
    rejected: int = 0
    preemptions: int = 0
    kv_blocks: int = 0  # per replica
    p99_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    per_class: dict[str, tuple[Dist, Dist]] = field(default_factory=dict)  # class -> (TTFT, TPOT), multi-class only
    queue_wait: Dist = Dist()
    rising: bool = False  # TTFT still rising through the run (`capacity.pipeline.RunResult.rising`): a transient's percentiles
    backlogged: tuple[float, float] | None = None  # closed loops: (req/s, tokens/s) with every user in the loop

    @property
    def capacity_rates(self) -> tuple[float, float]:
        """(req/s, output tokens/s) of a capacity loop: over the stretch with every user in it
        (`capacity.sim.metrics.backlogged`), or over the whole run where that stretch is too short."""
        return self.backlogged if self.backlogged is not None else (self.requests_per_s, self.tokens_per_s)

    def metric(self, name: str) -> Dist:
        return {"ttft": self.ttft, "tpot": self.tpot, "itl": self.itl, "e2e": self.e2e}[name]

    def to_json(self) -> dict:
        """The cache's JSON form, generated from the fields (capacity.plan.executors writes it with
        `json.dumps(..., default=float)`, which also takes a numpy scalar a run may leave in a field)."""
        return {"schema": RESULT_SCHEMA, **_adapter().dump_python(self, warnings=False)}

    @classmethod
    def from_json(cls, d: dict) -> TaskResult:
        """Read back from `to_json`'s form; another schema or a malformed entry raises ValueError."""
        if not isinstance(d, dict) or d.get("schema") != RESULT_SCHEMA:
            raise ValueError("not a task result of this schema")
        return _adapter().validate_python({k: v for k, v in d.items() if k != "schema"})


@functools.cache
def _adapter() -> TypeAdapter[TaskResult]:
    return TypeAdapter(TaskResult)


def run_task(task: SimTask) -> TaskResult:
    """Run one simulation through the pipeline (in any process)."""
    dep = Deployment(ModelCard.model_validate(task.card), resolve_gpu(task.gpu),
                     validate(EngineConfig, task.engine, "engine"), profile=task.profile, replicas=task.replicas,
                     router=task.router)  # type: ignore[arg-type]
    res = run(dep, WorkloadSpec.model_validate(task.workload),
              RunOptions(seed=task.seed, warmup_fraction=task.warmup_fraction, ci=task.ci, timeseries=False))
    s = res.summary
    return TaskResult(s.ttft_s, s.tpot_s, s.itl_s, s.e2e_s, s.output_tokens_per_s, s.requests_per_s,
                      res.sim.saturated, res.sim.capacity_req_per_s, res.cost_source, len(res.sim.rejected),
                      res.sim.preemptions, res.budget.planning_blocks, dict(s.p99_ci_s),
                      {k: (c.ttft_s, c.tpot_s) for k, c in s.per_class.items()}, s.queue_wait_s, res.rising,
                      None if res.backlogged is None else (res.backlogged.requests_per_s, res.backlogged.tokens_per_s))
