"""The planning scenario: what a `capacity plan` answers for (model, GPU, engine configuration, workload,
SLOs, target rate, price) and how hard it searches. One strict pydantic model, from YAML or CLI flags."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capacity.cost.factory import DEFAULT_GPU, profile_gpu
from capacity.cost.profile import resolve_profile
from capacity.engine.configs import AnyEngineConfig
from capacity.engine.vllm.config import VllmConfig
from capacity.errors import ConfigError
from capacity.files import read_mapping, validate
from capacity.model.card import ModelCard, load_named_card, resolve_model_path
from capacity.workload import Rate, WorkloadSpec

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    # strict: `true` is not a rate, "8" is not a count, 8.0 is not a whole number of requests
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SLOSpec(_Strict):
    ttft_s: PosFloat = 1.5  # time to first token at the percentile, s
    tpot_s: PosFloat = 0.05  # time per output token at the percentile, s
    percentile: Literal[50, 90, 95, 99] = 99  # which percentile the SLOs bound

    @model_validator(mode="after")
    def _check(self) -> SLOSpec:
        if self.ttft_s < self.tpot_s:
            raise ValueError(f"ttft_s ({self.ttft_s}) is below tpot_s ({self.tpot_s}): a first token cannot come "
                             "faster than one decode step, so these SLOs contradict each other")
        return self

    @property
    def key(self) -> str:
        return f"p{self.percentile}"


class SearchSpec(_Strict):
    seeds: Annotated[int, Field(ge=1, le=20)] = 2  # simulations per probe (common random numbers across rates)
    requests: Annotated[int, Field(ge=100)] = 1000  # requests per simulation
    tolerance: Annotated[float, Field(gt=0, le=0.5)] = 0.08  # the rate bisection stops when hi / lo <= 1 + tolerance
    max_num_seqs: list[Annotated[int, Field(gt=0)]] = [16, 32, 64, 128, 256, 512, 1024]  # batch caps the frontier tries (engine.max_num_seqs fixes one)
    max_model_len: list[Annotated[int, Field(gt=0)]] = [2048, 4096, 8192, 16384, 32768, 65536, 131072]  # context limits the frontier tries (engine.max_model_len fixes one)
    tp: list[Annotated[int, Field(gt=0)]] = [1, 2, 4, 8]  # tensor-parallel sizes searched (engine.tensor_parallel_size fixes one)
    # the context trade-off: requests of these many tokens (prompt + output) against each max_num_seqs, at the
    # per-replica load; [] skips it
    contexts: list[Annotated[int, Field(gt=1)]] = [1024, 4096, 16384, 65536]
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1  # share of each simulation's first requests left out of its metrics; a closed loop leaves out at least one request per user (capacity.pipeline.warmup_requests)

    @model_validator(mode="after")
    def _check(self) -> SearchSpec:
        for name in ("max_num_seqs", "max_model_len", "tp"):  # contexts may be empty: the trade-off is optional
            if not getattr(self, name):
                raise ValueError(f"{name}: the grid is empty")
        return self


class Scenario(_Strict):
    """A full planning scenario file (see examples/scenario.yaml)."""

    model: str | dict[str, Any]  # card path / bundled name, or an inline card
    gpu: str | None = None  # catalogue name or GPU YAML; None: the profile's GPU, or h100-sxm
    gpu_memory_gib: Annotated[float, Field(ge=0.5, le=4096, allow_inf_nan=False)] | None = None  # total memory the engine sees (overrides the GPU's)
    # Every knob of the engine (the class of the engine it names: capacity.engine.configs). tensor_parallel_size is searched over
    # `search.tp` unless given here; max_num_seqs and max_model_len are searched by the frontier.
    engine: AnyEngineConfig = VllmConfig()
    workload: WorkloadSpec = WorkloadSpec()  # the traffic shape; its rate comes from target_rate_per_s
    slo: SLOSpec = SLOSpec()  # latency objectives (classes may carry their own)
    target_rate_per_s: Rate = 10.0  # requests/s the whole service must sustain
    # Replicas run at this share of their max sustainable rate: replicas = ceil(target / (max rate x headroom)).
    # Below 1 it absorbs bursts and the search's bracket; 0.8 is a common operating point.
    headroom: Annotated[float, Field(gt=0, le=1)] = 0.8
    price_per_gpu_hour: PosFloat | None = None  # USD per GPU-hour, for cost per 1M output tokens
    max_gpus: Annotated[int, Field(gt=0)] = 4096  # refuse plans that need more than this
    profile: str | None = None  # a profile file, or the name of a bundled one (`capacity profiles`)
    search: SearchSpec = SearchSpec()  # how hard the planner searches

    @field_validator("workload")
    @classmethod
    def _steady(cls, v: WorkloadSpec) -> WorkloadSpec:
        # the planner sizes one steady rate (target_rate_per_s): a curve would be replaced by it without a word
        if v.arrivals.kind == "curve":
            raise ValueError("arrivals.kind curve: a plan sizes one steady rate (target_rate_per_s); simulate a "
                             "rate curve with `capacity simulate --workload`, or plan for its peak rate")
        if v.arrivals.max_concurrency is not None:  # the rate searches send every arrival: a cap would be dropped
            raise ValueError(f"arrivals.max_concurrency {v.arrivals.max_concurrency}: a benchmark client's cap; a plan "
                             "sizes the rate the server takes uncapped (simulate the capped client with "
                             "`capacity simulate --max-concurrency`)")
        return v

    @field_validator("profile")
    @classmethod
    def _profile_path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return resolve_profile(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @property
    def fixed_tp(self) -> int | None:
        """The TP size the scenario fixes, or None when the planner searches it."""
        e = self.engine
        return e.tensor_parallel_size if "tensor_parallel_size" in e.model_fields_set else None

    @property
    def gpu_name(self) -> str:
        if self.gpu is not None:
            return self.gpu
        if self.profile is not None:
            return profile_gpu(self.profile)

        return DEFAULT_GPU


def load_scenario(path: str, flags: dict) -> tuple[Scenario, ModelCard]:
    """A scenario file (has `model:`) or a model card (then flags fill the scenario): the scenario and its card.
    `flags` (None: not given) override what the file sets; what the file leaves unset stays unset. Shared by the
    CLI (`capacity plan`, `sweep`, `export`) and any other surface that reads scenario files."""
    p = resolve_model_path(path)
    data = read_mapping(p)
    if "model" in data and "num_layers" not in data:
        sc = validate(Scenario, data, str(p))
        model = sc.model
        if isinstance(model, dict):
            card = validate(ModelCard, model, f"{p}: model")
        else:
            mp = (p.parent / model) if not Path(model).is_absolute() and (p.parent / model).is_file() else model
            card = load_named_card(str(mp))
        over = {k: v for k, v in flags.items() if v is not None}
        if over:  # only what the file set, so that the engine's "not given" (e.g. a searched TP) survives
            sc = validate(Scenario, _merge(sc.model_dump(exclude_unset=True), over), str(p) + " + flags")
        return sc, card
    card = load_named_card(path)
    data = _merge({"model": str(p)}, {k: v for k, v in flags.items() if v is not None})
    return validate(Scenario, data, "options"), card


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
