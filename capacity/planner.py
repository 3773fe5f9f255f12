"""The planner: what to configure, how many GPUs, and what P99 users will see.

Given a scenario (model, GPU, engine knobs, workload shape, SLOs, target rate, price), `make_plan`:
1. finds, for each TP size that fits, the **max sustainable rate per replica** under the SLOs by bisection
   on the arrival rate. Each probe runs `seeds` simulations with common random numbers (the same seeds at
   every rate, so noise does not make the search zig-zag); a probe passes when the mean over seeds of the
   SLO percentile meets the SLO and no run saturated. The search stops when hi/lo <= 1 + tolerance and
   reports the bracket, never a single number pretending to be exact;
2. picks the TP with the fewest GPUs for the target rate (ties: smaller TP) and the replicas it needs;
3. simulates the **frontier** max_num_seqs x max_model_len at each replica's share of the target rate:
   memory feasibility per cell (the budget), P99 TTFT / TPOT with a bootstrap band, and the cell's capacity
   (tokens/s with the batch kept full, from a closed loop); cells whose max_model_len cannot hold the
   workload's longest request are marked;
4. recommends the feasible cell with the highest capacity that meets the SLOs at that load, re-runs the rate
   search for it, and **verifies** it with a fresh simulation (new seeds) of all replicas at the full target
   rate; if verification fails it adds a replica and says so;
5. derives trade-off statements from the frontier and the input-length sensitivity of TTFT.

Simulations are independent tasks (`SimTask`): pure data in, a small dict out, so they run in a process pool
(default), on Ray, or serially, and cache on disk by their hash (`capacity/sweep.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capacity.errors import CapacityError, ConfigError, DoesNotFit
from capacity.workload import Arrivals, WorkloadSpec

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLOSpec(_Strict):
    ttft_s: PosFloat = 1.5
    tpot_s: PosFloat = 0.05
    percentile: Literal[50, 90, 95, 99] = 99

    @model_validator(mode="after")
    def _check(self) -> SLOSpec:
        if self.ttft_s < self.tpot_s:
            raise ValueError(f"ttft_s ({self.ttft_s}) is below tpot_s ({self.tpot_s}): a first token cannot come "
                             "faster than one decode step, so these SLOs contradict each other")
        return self


class SearchSpec(_Strict):
    seeds: Annotated[int, Field(ge=1, le=20)] = 2
    requests: Annotated[int, Field(ge=100)] = 1000
    tolerance: Annotated[float, Field(gt=0, le=0.5)] = 0.08
    max_num_seqs: list[Annotated[int, Field(gt=0)]] = [16, 32, 64, 128, 256, 512, 1024]
    max_model_len: list[Annotated[int, Field(gt=0)]] = [2048, 4096, 8192, 16384, 32768, 65536, 131072]
    tp: list[Annotated[int, Field(gt=0)]] = [1, 2, 4, 8]
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1

    @model_validator(mode="after")
    def _check(self) -> SearchSpec:
        for name in ("max_num_seqs", "max_model_len", "tp"):
            if not getattr(self, name):
                raise ValueError(f"{name}: the grid is empty")
        return self


class Scenario(_Strict):
    """A full planning scenario file (see examples/scenario.yaml)."""

    model: str | dict[str, Any]  # card path / bundled name, or an inline card
    gpu: str = "h100-sxm"
    engine: dict[str, Any] = {}  # EngineConfig fields (tensor_parallel_size is searched unless given)
    workload: WorkloadSpec = WorkloadSpec()
    slo: SLOSpec = SLOSpec()
    target_rate_per_s: PosFloat = 10.0
    price_per_gpu_hour: PosFloat | None = None
    max_gpus: Annotated[int, Field(gt=0)] = 4096  # refuse plans that need more than this
    profile: str | None = None  # a profile file, or the name of a bundled one (`capacity profiles`)
    search: SearchSpec = SearchSpec()

    @field_validator("profile")
    @classmethod
    def _profile_path(cls, v: str | None) -> str | None:
        from capacity.profile import resolve_profile

        if v is None:
            return v
        try:
            return resolve_profile(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


# ---- simulation tasks --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimTask:
    """Everything one simulation needs, as plain data (picklable, hashable for the cache)."""

    card: dict
    gpu: str
    engine: dict
    workload: dict
    seed: int
    replicas: int = 1
    router: str = "round_robin"
    profile: str | None = None
    warmup_fraction: float = 0.1
    ci: bool = False

    def key(self) -> str:
        import hashlib
        import json

        from capacity import __version__

        d = {**self.__dict__, "v": __version__}
        if self.profile:  # the profile's contents, not just its name, decide the result
            from pathlib import Path

            p = Path(self.profile)
            d["profile_sha256"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


def run_task(task: SimTask) -> dict:
    """Run one simulation (in any process) and return the numbers the planner needs."""
    from capacity.config_io import validate
    from capacity.engine import EngineConfig
    from capacity.gpus import get_gpu
    from capacity.memory import budget
    from capacity.model_card import ModelCard
    from capacity.scenario import run_scenario

    card = ModelCard.model_validate(task.card)
    gpu = get_gpu(task.gpu)
    cfg = validate(EngineConfig, task.engine, "engine")
    b = budget(card, gpu, cfg)
    cost = step_cost(card, gpu.name, cfg.tensor_parallel_size, task.profile)
    wl = WorkloadSpec.model_validate(task.workload)
    res = run_scenario(b, cost, wl, replicas=task.replicas, router=task.router, seed=task.seed,
                       warmup_fraction=task.warmup_fraction, ci=task.ci)
    s = res.summary
    return {"ttft": s.ttft_s, "tpot": s.tpot_s, "e2e": s.e2e_s, "itl": s.itl_s, "tokens_per_s": s.output_tokens_per_s,
            "requests_per_s": s.requests_per_s, "saturated": res.sim.saturated, "capacity": res.sim.capacity_req_per_s,
            "p99_ci": s.p99_ci_s, "rejected": len(res.sim.rejected), "source": res.cost_source,
            "preemptions": res.sim.preemptions}


def step_cost(card, gpu_name: str, tp: int, profile: str | None):
    from capacity.costs import RooflineCost
    from capacity.gpus import get_gpu

    if profile and tp == 1:
        from capacity.calibrated import CalibratedCost
        from capacity.profile import load_profile

        return CalibratedCost(load_profile(profile), card, gpu=gpu_name, tp=tp, profile_path=profile)
    return RooflineCost(card, get_gpu(gpu_name), tp)


# ---- results ----------------------------------------------------------------------------------------
@dataclass
class RateSearch:
    tp: int
    max_rate: float  # highest rate that passed (req/s per replica)
    failed_rate: float  # lowest rate that failed
    capacity_rate: float  # saturation throughput (req/s) with the batch kept full
    probes: list[tuple[float, bool, float, float]] = field(default_factory=list)  # rate, ok, p_ttft, p_tpot
    unloaded: tuple[float, float] | None = None  # (p_ttft, p_tpot) at a tiny load


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
    stats: dict = field(default_factory=dict)  # metric -> stat -> mean over seeds (seconds)


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
    verification: dict
    tradeoffs: list[str]
    vllm_command: str
    sglang_command: str
    cost_per_million_tokens: float | None
    budget: dict
    source: str
    notes: list[str] = field(default_factory=list)
    memory_table: list[dict] = field(default_factory=list)
    scenario: dict = field(default_factory=dict)
    provenance: dict | None = None  # of the calibration profile, when one was used
    tool_version: str = ""


# ---- the plan ---------------------------------------------------------------------------------------
def _pkey(slo: SLOSpec) -> str:
    return f"p{slo.percentile}"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


class Planner:
    def __init__(self, sc: Scenario, card, executor) -> None:
        self.sc, self.card, self.ex = sc, card, executor
        self.card_dict = card.model_dump()
        self.notes: list[str] = []

    # one probe = `seeds` simulations at one rate
    def _tasks(self, engine: dict, rate: float | None, seeds: range, replicas: int = 1, closed_users: int | None = None,
               requests: int | None = None, ci: bool = False, router: str = "round_robin", workload=None) -> list[SimTask]:
        wl = workload or self.sc.workload
        n = requests or self.sc.search.requests
        if closed_users is not None:
            arr = Arrivals(kind="closed", users=closed_users)
        else:
            base = wl.arrivals
            arr = Arrivals(kind=base.kind if base.kind in ("poisson", "gamma", "constant") else "poisson",
                           rate_per_s=rate, cv=base.cv)
        w = wl.model_copy(update={"arrivals": arr, "num_requests": n}).model_dump()
        return [SimTask(self.card_dict, self.sc.gpu, engine, w, s, replicas, router, self.sc.profile,
                        self.sc.search.warmup_fraction, ci) for s in seeds]

    def _judge(self, results: list[dict]) -> tuple[bool, float, float]:
        k = _pkey(self.sc.slo)
        if any(r["saturated"] or not r["ttft"].get("n") for r in results):
            return False, math.inf, math.inf
        pt = _mean([r["ttft"][k] for r in results])
        pp = _mean([r["tpot"].get(k, 0.0) if r["tpot"].get("n") else 0.0 for r in results])
        return pt <= self.sc.slo.ttft_s and pp <= self.sc.slo.tpot_s, pt, pp

    def capacity(self, engine: dict, max_num_seqs: int) -> dict:
        """Throughput with the batch kept full: a closed loop of 2 x max_num_seqs users, no think time."""
        users = max(2, 2 * max_num_seqs)
        return self.ex.run(self._tasks(engine, None, range(1), closed_users=users,
                                       requests=max(self.sc.search.requests, 2 * users)))[0]

    def rate_search(self, engine: dict, tp: int, max_num_seqs: int) -> RateSearch:
        sp = self.sc.search
        seeds = range(sp.seeds)
        cap = self.capacity(engine, max_num_seqs)
        cap_rate = cap["requests_per_s"]
        if not cap_rate or not math.isfinite(cap_rate):
            raise CapacityError(f"could not measure a capacity at tp={tp} (no request finished)")
        lo_rate = cap_rate * 0.02
        ok, pt, pp = self._judge(self.ex.run(self._tasks(engine, lo_rate, seeds)))
        rs = RateSearch(tp, 0.0, lo_rate, cap_rate, [(lo_rate, ok, pt, pp)], (pt, pp))
        if not ok:
            return rs  # even a trickle misses the SLO: infeasible
        lo, hi = lo_rate, cap_rate * 1.05
        while hi / lo > 1 + sp.tolerance:
            mid = math.sqrt(lo * hi)
            ok, pt, pp = self._judge(self.ex.run(self._tasks(engine, mid, seeds)))
            rs.probes.append((mid, ok, pt, pp))
            lo, hi = (mid, hi) if ok else (lo, mid)
        rs.max_rate, rs.failed_rate = lo, hi
        return rs

    def engine_dict(self, tp: int, **over) -> dict:
        e = dict(self.sc.engine)
        e["tensor_parallel_size"] = tp
        e.update({k: v for k, v in over.items() if v is not None})
        return e

    def make(self) -> Plan:
        from capacity.config_io import validate
        from capacity.engine import EngineConfig, resolve
        from capacity.gpus import get_gpu
        from capacity.memory import budget

        sc, card = self.sc, self.card
        gpu = get_gpu(sc.gpu)
        fixed_tp = sc.engine.get("tensor_parallel_size")
        tps = [fixed_tp] if fixed_tp else sc.search.tp
        searches: list[RateSearch] = []
        fit_errors = []
        for tp in tps:
            done = [r for r in searches if r.max_rate > 0]
            if done and tp >= min(r.tp * math.ceil(sc.target_rate_per_s / r.max_rate) for r in done):
                self.notes.append(f"tp={tp} not searched: it cannot use fewer GPUs than the best found")
                continue
            try:
                e = validate(EngineConfig, self.engine_dict(tp), "engine")
                b = budget(card, gpu, e)
            except (DoesNotFit, ConfigError) as exc:
                fit_errors.append(f"tp={tp}: {exc}")
                continue
            rs = self.rate_search(self.engine_dict(tp), tp, b.max_num_seqs)
            searches.append(rs)
            if rs.max_rate == 0 and rs.unloaded:
                continue
        if not searches:
            raise DoesNotFit(f"no feasible configuration of {card.name} on {gpu.name}: " + "; ".join(fit_errors))
        usable = [r for r in searches if r.max_rate > 0]
        if not usable:
            r0 = searches[0]
            raise CapacityError(
                f"no feasible configuration: even at {r0.probes[0][0]:.3g} req/s per replica, P{sc.slo.percentile} "
                f"TTFT is {r0.unloaded[0] * 1e3:.0f} ms and TPOT {r0.unloaded[1] * 1e3:.1f} ms at tp={r0.tp} "
                f"(SLO {sc.slo.ttft_s * 1e3:.0f} ms / {sc.slo.tpot_s * 1e3:.1f} ms)")

        def gpus_for(r: RateSearch) -> int:
            return r.tp * math.ceil(sc.target_rate_per_s / r.max_rate)

        best = min(usable, key=lambda r: (gpus_for(r), r.tp))
        if gpus_for(best) > sc.max_gpus:
            raise CapacityError(
                f"target {sc.target_rate_per_s:g} req/s needs more than {sc.max_gpus} GPUs (max_gpus): the best is "
                f"tp={best.tp} at {best.max_rate:.3g} req/s per replica = {gpus_for(best)} x {gpu.name}")
        tp = best.tp
        replicas = math.ceil(sc.target_rate_per_s / best.max_rate)
        per_replica = sc.target_rate_per_s / replicas
        base_cfg = validate(EngineConfig, self.engine_dict(tp), "engine")
        base_budget = budget(card, gpu, base_cfg)
        frontier = self.frontier(tp, per_replica, base_budget.max_num_seqs)
        rec = self.recommend(frontier, base_budget)
        rec_search = None
        if rec is not None:
            rec_search = self.rate_search(self.engine_dict(tp, max_num_seqs=rec.max_num_seqs,
                                                           max_model_len=rec.max_model_len), tp, rec.max_num_seqs)
            if rec_search.max_rate > 0:
                replicas = min(replicas, math.ceil(sc.target_rate_per_s / rec_search.max_rate))
        rec_engine = self.engine_dict(tp, max_num_seqs=rec.max_num_seqs if rec else None,
                                      max_model_len=rec.max_model_len if rec else None)
        verification = self.verify(rec_engine, replicas)
        if not verification["passed"]:
            for _ in range(3):
                replicas += 1
                self.notes.append(f"verification at the target rate failed; trying {replicas} replicas")
                verification = self.verify(rec_engine, replicas)
                if verification["passed"]:
                    break
        rb = budget(card, gpu, validate(EngineConfig, rec_engine, "engine"))
        gpus = tp * replicas
        cost = None
        if sc.price_per_gpu_hour:
            tok_s = sc.target_rate_per_s * sc.workload.mean_output_tokens
            cost = gpus * sc.price_per_gpu_hour / (tok_s * 3600) * 1e6
        vllm, sglang = commands(card, rb, tp, sc.engine)
        trade = self.tradeoffs(frontier, rec)
        trade += self.sensitivity(rec_engine, per_replica)
        eng = resolve(base_cfg, card, gpu)
        from capacity import __version__
        from capacity.memory import batch_context_table, default_batches, default_contexts

        prov = None
        if sc.profile:
            from capacity.profile import load_profile

            prov = load_profile(sc.profile).provenance.model_dump()
        return Plan(card.name, gpu.name, sc.slo, sc.target_rate_per_s, searches, tp, replicas, gpus, frontier,
                    per_replica, rec, rec_search, verification, trade, vllm, sglang, cost, rb.as_dict(),
                    step_cost(card, gpu.name, tp, sc.profile).source,
                    self.notes + [f"engine defaults used: {', '.join(eng.defaults_used) or 'none'}"],
                    batch_context_table(rb, default_batches(rb.max_num_seqs), default_contexts(rb.max_model_len)),
                    {**sc.model_dump(), "model": card.model_dump()}, prov, __version__)

    def frontier(self, tp: int, rate: float, default_seqs: int) -> list[Cell]:
        from capacity.config_io import validate
        from capacity.engine import EngineConfig
        from capacity.gpus import get_gpu
        from capacity.memory import budget

        sc, gpu = self.sc, get_gpu(self.sc.gpu)
        longest = self._longest_request()
        seqs = sorted(set(sc.search.max_num_seqs))
        lens = sorted(x for x in set(sc.search.max_model_len) if x <= self.card.max_position_embeddings)
        if not lens:
            raise ConfigError(f"search.max_model_len: no value <= the model's max_position_embeddings "
                              f"({self.card.max_position_embeddings})")
        cells: dict[tuple[int, int], Cell] = {}
        sims: dict[int, tuple[list[SimTask], SimTask]] = {}
        for s in seqs:
            for m in lens:
                try:
                    e = validate(EngineConfig, self.engine_dict(tp, max_num_seqs=s, max_model_len=m,
                                                                max_num_batched_tokens=max(s, self._mnbt())), "engine")
                    b = budget(self.card, gpu, e)
                    cells[(s, m)] = Cell(s, m, True, covers_workload=m >= longest, kv_tokens=b.kv_tokens)
                except (DoesNotFit, ConfigError) as exc:
                    cells[(s, m)] = Cell(s, m, False, why=str(exc))
            if any(cells[(s, m)].feasible for m in lens):
                m = max(x for x in lens if cells[(s, x)].feasible)
                eng = self.engine_dict(tp, max_num_seqs=s, max_model_len=m, max_num_batched_tokens=max(s, self._mnbt()))
                load = self._tasks(eng, rate, range(sc.search.seeds), ci=True)
                cap = self._tasks(eng, None, range(1), closed_users=max(2, 2 * s),
                                  requests=max(sc.search.requests, 4 * s))
                sims[s] = (load, cap[0])
        flat = [t for load, cap in sims.values() for t in (*load, cap)]
        out = iter(self.ex.run(flat))
        k = _pkey(sc.slo)
        for s, (load, cap) in sims.items():
            res = [next(out) for _ in load]
            capr = next(out)
            ok, pt, pp = self._judge(res)
            band_t = band_p = None
            if not any(r["saturated"] for r in res):
                # the band: union of the seeds' bootstrap 95% intervals for P99, or the spread across seeds
                bt = [r["p99_ci"].get("ttft") for r in res if r.get("p99_ci")]
                bp = [r["p99_ci"].get("tpot") for r in res if r.get("p99_ci")]
                if k == "p99" and bt and all(b[0] == b[0] for b in bt + bp):
                    band_t = (min(b[0] for b in bt), max(b[1] for b in bt))
                    band_p = (min(b[0] for b in bp), max(b[1] for b in bp))
                else:
                    band_t = (min(r["ttft"][k] for r in res), max(r["ttft"][k] for r in res))
                    band_p = (min(r["tpot"].get(k, 0) for r in res), max(r["tpot"].get(k, 0) for r in res))
            stats = {}
            for metric in ("ttft", "tpot", "itl", "e2e"):
                keys = set.intersection(*[set(r[metric]) for r in res]) - {"n"}
                stats[metric] = {kk: _mean([r[metric][kk] for r in res]) for kk in sorted(keys)}
                ci = [r["p99_ci"].get(metric) for r in res if r.get("p99_ci") and r["p99_ci"].get(metric)]
                if ci and all(b[0] == b[0] for b in ci):
                    stats[metric]["p99_ci_low"] = min(b[0] for b in ci)
                    stats[metric]["p99_ci_high"] = max(b[1] for b in ci)
            for m in lens:
                c = cells[(s, m)]
                if not c.feasible:
                    continue
                c.p_ttft, c.p_tpot = pt, pp
                c.p_ttft_band, c.p_tpot_band = band_t, band_p
                c.stats = stats
                c.capacity_tokens_per_s = capr["tokens_per_s"]
                c.meets_slo = ok and c.covers_workload
        return [cells[(s, m)] for s in seqs for m in lens]

    def _mnbt(self) -> int:
        return int(self.sc.engine.get("max_num_batched_tokens") or 8192)

    def _longest_request(self) -> int:
        wl = self.sc.workload
        out = 0
        for c in range(len(wl.classes)):
            li, lo = wl.class_lengths(c)
            out = max(out, _max_len(li) + _max_len(lo))
        return out

    def recommend(self, frontier: list[Cell], base_budget) -> Cell | None:
        good = [c for c in frontier if c.meets_slo]
        if not good:
            self.notes.append("no frontier cell meets the SLOs at the per-replica load; keeping the engine defaults")
            return None
        # most capacity; then the smallest max_model_len that covers the workload (leaves the KV to batches)
        return max(good, key=lambda c: (round(c.capacity_tokens_per_s or 0, 6), -c.max_model_len))

    def verify(self, engine: dict, replicas: int) -> dict:
        sp = self.sc.search
        seeds = range(1000, 1000 + sp.seeds)
        res = self.ex.run(self._tasks(engine, self.sc.target_rate_per_s, seeds, replicas=replicas,
                                      requests=max(sp.requests, 200 * replicas), router="least_outstanding"))
        ok, pt, pp = self._judge(res)
        return {"passed": ok, "replicas": replicas, "p_ttft_s": pt, "p_tpot_s": pp, "seeds": list(seeds),
                "rate_per_s": self.sc.target_rate_per_s}

    def tradeoffs(self, frontier: list[Cell], rec: Cell | None) -> list[str]:
        m = rec.max_model_len if rec else max((c.max_model_len for c in frontier if c.feasible), default=None)
        row = [c for c in frontier if c.max_model_len == m and c.feasible and c.p_ttft is not None]
        out = []
        p = self.sc.slo.percentile
        for a, b in zip(row, row[1:]):
            if not (a.capacity_tokens_per_s and b.capacity_tokens_per_s):
                continue
            gain = b.capacity_tokens_per_s / a.capacity_tokens_per_s - 1
            out.append(f"max batch {a.max_num_seqs} -> {b.max_num_seqs}: {gain:+.0%} peak tokens/s "
                       f"({a.capacity_tokens_per_s:,.0f} -> {b.capacity_tokens_per_s:,.0f}), P{p} TTFT "
                       f"{_ms(a.p_ttft)} -> {_ms(b.p_ttft)}, P{p} TPOT {_ms(a.p_tpot, 1)} -> {_ms(b.p_tpot, 1)} "
                       f"at {self._rate_txt()}")
        return out

    def _rate_txt(self) -> str:
        return "the per-replica load"

    def sensitivity(self, engine: dict, rate: float) -> list[str]:
        """TTFT per 1k prompt tokens: the same load with prompts 1k (or half) shorter."""
        wl = self.sc.workload
        li = wl.input_len
        if li.kind != "fixed":
            return []
        d = 1024 if li.value > 1024 else li.value // 2
        if d <= 0:
            return []
        shorter = wl.model_copy(update={"input_len": li.model_copy(update={"value": li.value - d})})
        seeds = range(self.sc.search.seeds)
        a = self.ex.run(self._tasks(engine, rate, seeds))
        b = self.ex.run(self._tasks(engine, rate, seeds, workload=shorter))
        k = _pkey(self.sc.slo)
        if any(r["saturated"] for r in a + b):
            return []
        mean_a, mean_b = _mean([r["ttft"]["mean"] for r in a]), _mean([r["ttft"]["mean"] for r in b])
        pa, pb = _mean([r["ttft"][k] for r in a]), _mean([r["ttft"][k] for r in b])
        per_k = 1024 / d
        return [f"each 1k fewer prompt tokens ({li.value} -> {li.value - d} measured) saves "
                f"{(mean_a - mean_b) * per_k * 1e3:.0f} ms mean TTFT and {(pa - pb) * per_k * 1e3:.0f} ms "
                f"P{self.sc.slo.percentile} TTFT at the per-replica load"]


def _max_len(l) -> int:
    if l.kind == "fixed":
        return l.value
    if l.kind == "uniform":
        return l.high
    if l.kind == "empirical":
        return max(l.values)
    return l.high or int(l.mean * (1 + 3 * l.cv))  # lognormal without a cap: mean + 3 sd as "longest"


def _ms(x: float | None, nd: int = 0) -> str:
    if x is None:
        return "-"
    return "saturated" if not math.isfinite(x) else f"{x * 1e3:.{nd}f} ms"


def commands(card, b, tp: int, engine: dict) -> tuple[str, str]:
    model = card.hf_id or card.name
    kv = engine.get("kv_cache_dtype", "auto")
    util = engine.get("gpu_memory_utilization", 0.9)
    vllm = (f"vllm serve {model} --tensor-parallel-size {tp} --max-num-seqs {b.max_num_seqs} --max-model-len "
            f"{b.max_model_len} --gpu-memory-utilization {util} --max-num-batched-tokens {b.max_num_batched_tokens} "
            f"--kv-cache-dtype {kv}")
    sglang_kv = {"auto": "auto", "fp8": "fp8_e4m3", "int8": "auto"}[kv]
    sglang = (f"python -m sglang.launch_server --model-path {model} --tp {tp} --max-running-requests "
              f"{b.max_num_seqs} --context-length {b.max_model_len} --mem-fraction-static {util} "
              f"--chunked-prefill-size {b.max_num_batched_tokens} --kv-cache-dtype {sglang_kv}")
    return vllm, sglang


def make_plan(sc: Scenario, card, executor) -> Plan:
    return Planner(sc, card, executor).make()
