"""The planner: what to configure, how many GPUs, and what P99 users will see.

Given a scenario (model, GPU, engine configuration, workload shape, SLOs, target rate, price), `make_plan`:
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

Every simulation of one configuration uses one engine configuration (`cell_engine`): the frontier cell, its
rate search, the verification, the memory budget shown and the launch command are the same engine, with
the engine's own default token budget for that GPU unless the scenario sets one. A calibrated profile is
used for every row or refused: the TP search is restricted to the profile's TP size, and a profile for
another model or GPU is an error before anything runs.

Simulations are independent tasks (`capacity.plan.tasks`): plain data in, a typed result out, so they run in
a process pool (default), on Ray, or serially, and cache on disk by their hash.
"""
from __future__ import annotations

import math

from capacity import __version__
from capacity.cost.factory import make_step_cost
from capacity.cost.overlap import overlapped_source, paced_source
from capacity.cost.profile import load_profile
from capacity.engine import engine_for, get_engine
from capacity.engine.config import EngineConfig
from capacity.engine.lockstep import attention_dp_ranks
from capacity.engine.memory import batch_context_table, default_batches, default_contexts
from capacity.engine.memory import budget as memory_budget
from capacity.engine.sglang.engine import launch_command as sglang_command
from capacity.engine.speculative import run_notes, with_draft
from capacity.engine.vllm.config import VllmConfig
from capacity.errors import CapacityError, ConfigError, DoesNotFit
from capacity.model.gpus import catalogue, get_gpu, with_memory
from capacity.pipeline import check_policy, overlapped_cpu_s
from capacity.plan import frontier
from capacity.plan import frontier as frontier_mod
from capacity.plan.frontier import tp_sizes, tune_budget
from capacity.plan.progress import phase
from capacity.plan.results import Cell, ContextCell, Plan, RateSearch, TpUnfit, Verification
from capacity.plan.roofline_level import output_handling_notes, roofline_notes
from capacity.plan.scenario import Scenario, SearchSpec, SLOSpec
from capacity.plan.sizing import mean as _mean
from capacity.plan.sizing import replicas_for
from capacity.plan.tasks import SimTask, TaskResult, run_task
from capacity.plan.why import infeasible_reason
from capacity.steady import capacity_loop
from capacity.steady import full_batch as steady_full_batch
from capacity.workload import Arrivals, Lengths, WorkloadSpec, context_of

__all__ = ["Plan", "Planner", "Scenario", "SearchSpec", "SLOSpec", "SimTask", "make_plan", "run_task"]


class Planner:
    def __init__(self, sc: Scenario, card, executor) -> None:

        check_policy(sc.engine, sc.workload)
        self.sc, self.card, self.ex = sc, card, executor
        self.card_dict = card.model_dump()
        self.gpu = with_memory(get_gpu(sc.gpu_name), sc.gpu_memory_gib)
        # tasks carry the GPU's fields when it is not a plain catalogue entry (a GPU file, a memory override)
        self._task_gpu: str | dict = (self.gpu.name if catalogue().get(self.gpu.name) == self.gpu
                                      else self.gpu.model_dump())
        self.notes: list[str] = []
        self.sources: dict[int, str] = {}  # tp -> step-cost source
        self.frontier_tp = 1
        self.search_engines: dict[int, EngineConfig] = {}

    # ---- one engine configuration per question ---------------------------------------------------------
    def engine(self, tp: int, **over) -> EngineConfig:
        """The scenario's engine configuration at this TP size with `over` set (None values: unchanged)."""
        upd = {"tensor_parallel_size": tp, **{k: v for k, v in over.items() if v is not None}}
        return self.sc.engine.model_copy(update=upd)

    def cell_engine(self, tp: int, max_num_seqs: int | None = None, max_model_len: int | None = None) -> EngineConfig:
        """The configuration of a frontier cell, its rate search, its verification and its launch command: the
        scenario's token budget if it sets one, else the engine's default on this GPU, raised to max_num_seqs
        when that is larger (vLLM refuses a token budget below the batch cap)."""
        e = self.engine(tp, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
        if max_num_seqs is not None:

            mnbt = e.max_num_batched_tokens or get_engine(e.engine).default_max_num_batched_tokens(e, self.card, self.gpu)
            if mnbt < max_num_seqs:
                e = e.model_copy(update={"max_num_batched_tokens": max_num_seqs})
        return e

    def fitting_engine(self, tp: int):
        """The engine (and its budget) a TP size is searched with: the scenario's, or, when one request of the
        default max_model_len (the model's whole context) does not fit the KV cache, the largest max_model_len
        of the search grid that fits and still holds the workload's longest request (the note says so). A TP
        size is not written off because the model's longest context does not fit on it."""
        e = self.engine(tp)
        try:
            return e, self.budget(e)
        except DoesNotFit as exc:
            first = exc
        if self.sc.engine.max_model_len is not None:
            raise first
        longest = self.longest_request()
        for m in sorted((x for x in self.sc.search.max_model_len if x < self.card.max_position_embeddings), reverse=True):
            if m < longest:
                break
            try:
                e2 = self.engine(tp, max_model_len=m)
                b = self.budget(e2)
            except DoesNotFit:
                continue
            self.notes.append(f"tp={tp} searched at max_model_len {m:,}: the model's full {self.card.max_position_embeddings:,}"
                              f" does not fit ({str(first).split(';')[0]})")
            return e2, b
        raise first

    def budget(self, engine: EngineConfig):
        """The engine's budget as the simulations see it (capacity.pipeline.prepare): with speculative decoding,
        the draft's weights and KV taken from the pool, so the frontier, full batch and tables agree with them."""
        b = memory_budget(self.card, self.gpu, engine)
        if engine.speculative is not None:
            b = with_draft(b, self.card, engine.speculative, engine=get_engine(engine.engine).name)
        return b

    def check_source(self, tp: int) -> str:
        """Build the step cost once for this TP: a profile that cannot serve it is refused here, in one line."""
        if tp not in self.sources:
            kv = self.sc.engine.kv_cache_dtype
            cost = make_step_cost(self.card, self.gpu, tp, kv_dtype=kv, profile=self.sc.profile)
            src = cost.source
            # as capacity.pipeline.prepare wraps the cost
            per_step = overlapped_cpu_s(get_engine(self.sc.engine.engine), self.sc.engine, self.sc.profile, cost)
            if per_step:
                src = overlapped_source(src, per_step)
            if self.sc.engine.output_cpu_us_per_token is not None:  # the pipeline wraps the cost in it (overlap.py)
                src = paced_source(src, self.sc.engine.output_cpu_us_per_token / 1e6)
            self.sources[tp] = src
        return self.sources[tp]

    # one probe = `seeds` simulations at one rate
    def tasks(self, engine: EngineConfig, rate: float | None, seeds: range, replicas: int = 1,
               closed_users: int | None = None, requests: int | None = None, ci: bool = False,
               router: str = "round_robin", workload: WorkloadSpec | None = None) -> list[SimTask]:
        wl = workload or self.sc.workload
        n = requests or self.sc.search.requests
        if closed_users is not None:
            arr = Arrivals(kind="closed", users=closed_users)
        else:
            base = wl.arrivals
            arr = Arrivals(kind=base.kind if base.kind in ("poisson", "gamma", "constant") else "poisson",
                           rate_per_s=rate, cv=base.cv)
        w = wl.model_copy(update={"arrivals": arr, "num_requests": n}).model_dump()
        e = engine.model_dump(mode="json")
        return [SimTask(self.card_dict, self._task_gpu, e, w, s, replicas, router, self.sc.profile,
                        self.sc.search.warmup_fraction, ci) for s in seeds]

    def judge(self, results: list[TaskResult]) -> tuple[bool, float, float]:
        """Pass when no run saturated, no run's TTFT was still rising (its percentiles are a transient's, lower
        than a longer run would give: `pipeline.RunResult.rising`), and the SLO percentile (mean over seeds) meets
        the SLOs. When request classes carry SLOs of their own, each such class is held to its own and classes
        without one (batch traffic) are not constrained; otherwise every request is held to the scenario's SLO."""
        ok, pt, pp = self._judge_slo(results)
        return ok and not any(r.rising for r in results), pt, pp

    def _judge_slo(self, results: list[TaskResult]) -> tuple[bool, float, float]:
        k = self.sc.slo.key
        if any(r.saturated or not r.ttft.n for r in results):
            return False, math.inf, math.inf
        pt = _mean([r.ttft.stat(k) or 0.0 for r in results])
        pp = _mean([(r.tpot.stat(k) or 0.0) if r.tpot.n else 0.0 for r in results])
        own = [c for c in self.sc.workload.classes if c.slo_ttft_s is not None or c.slo_tpot_s is not None]
        if not own or not all(r.per_class for r in results):
            return pt <= self.sc.slo.ttft_s and pp <= self.sc.slo.tpot_s, pt, pp
        ok = True
        for c in own:
            dists = [r.per_class.get(c.name) for r in results]
            if any(d is None or not d[0].n for d in dists):
                return False, math.inf, math.inf
            ct = _mean([d[0].stat(k) or 0.0 for d in dists if d])
            cp = _mean([(d[1].stat(k) or 0.0) if d[1].n else 0.0 for d in dists if d])
            ok &= (c.slo_ttft_s is None or ct <= c.slo_ttft_s) and (c.slo_tpot_s is None or cp <= c.slo_tpot_s)
        return ok, pt, pp

    def full_batch(self, engine: EngineConfig, max_num_seqs: int) -> int:
        """The most sequences the engine can run at once on this workload (`capacity.steady.full_batch`)."""
        return steady_full_batch(engine, self.budget(engine), self.sc.workload, max_num_seqs)

    def capacity(self, engine: EngineConfig, max_num_seqs: int) -> TaskResult:
        """Throughput with the queue never empty (`capacity.steady.capacity_loop`, as `capacity simulate` measures it)."""
        wl = capacity_loop(engine, self.budget(engine), self.sc.workload, self.sc.search.requests,
                           max_num_seqs=max_num_seqs)
        dp = engine.dp_size() * attention_dp_ranks(engine)  # ranks, each its own scheduler: dp x the users
        return self.ex.run(self.tasks(engine, None, range(1), closed_users=(wl.arrivals.users or 0) * dp,
                                       requests=wl.num_requests * dp))[0]

    def rate_search(self, engine: EngineConfig, tp: int, max_num_seqs: int) -> RateSearch:
        sp = self.sc.search
        seeds = range(sp.seeds)
        cap = self.capacity(engine, max_num_seqs)
        cap_rate = cap.capacity_rates[0]
        if not cap_rate or not math.isfinite(cap_rate):
            raise CapacityError(f"could not measure a capacity at tp={tp} (no request finished)")
        lo_rate = cap_rate * 0.02
        lo, hi = lo_rate, cap_rate * 1.05
        mid = hi / (1 + sp.tolerance)
        if mid < cap_rate and hi / lo > 1 + sp.tolerance:  # the first probe above the trickle: with the trickle's batch
            frontier_mod.ahead(self.ex, self.tasks(engine, mid, seeds))
        ok, pt, pp = self.judge(self.ex.run(self.tasks(engine, lo_rate, seeds)))
        b = self.budget(engine)
        rs = RateSearch(tp, 0.0, lo_rate, cap_rate, [(lo_rate, ok, pt, pp)], (pt, pp), cap.source,
                        b.max_num_seqs, b.max_num_batched_tokens)
        if not ok:  # even a trickle misses the SLO: infeasible, and why
            rs.why = infeasible_reason(self, engine, rs)
            return rs
        # the top of the bracket first: where the SLOs still hold near the capacity, one probe settles it (the
        # default plan: 1 probe, not 6); otherwise it cost one probe and the bisection goes on below it (either way the answer is the highest rate that passed, at most
        # the tolerance below the lowest that failed)
        while hi / lo > 1 + sp.tolerance:
            if len(rs.probes) > 1:
                mid = math.sqrt(lo * hi)
            if mid >= cap_rate:  # at or above the capacity a backlog never drains, whatever a finite run shows
                ok, pt, pp = False, math.inf, math.inf
            else:
                ok, pt, pp = self.judge(self.ex.run(self.tasks(engine, mid, seeds)))
            rs.probes.append((mid, ok, pt, pp))
            lo, hi = (mid, hi) if ok else (lo, mid)
        rs.max_rate, rs.failed_rate = lo, hi
        return rs

    def make(self) -> Plan:
        sc, card, gpu = self.sc, self.card, self.gpu
        sc.workload.check_context(*context_of(sc.engine, card))
        getattr(self.ex, "prestart", lambda: None)()  # a pool's workers start while the first budgets are worked out
        tps = tp_sizes(self)
        dp = sc.engine.dp_size()  # GPUs of a replica: tp x dp
        searches: list[RateSearch] = []
        fit_errors: list[str] = []
        config_errors: set[str] = set()  # settings the engine refuses whatever the TP
        unfit: list[TpUnfit] = []
        for tp in tps:
            done = [r for r in searches if r.max_rate > 0]
            if done and tp * dp >= min(r.tp * dp * replicas_for(sc, r.max_rate) for r in done):
                self.notes.append(f"tp={tp} not searched: it cannot use fewer GPUs than the best found")
                continue
            try:
                e, b = self.fitting_engine(tp)
            except (DoesNotFit, ConfigError) as exc:
                if isinstance(exc, ConfigError):
                    config_errors.add(str(exc))
                fit_errors.append(f"tp={tp}: {exc}")
                unfit.append(TpUnfit(tp, str(exc)))
                continue
            self.check_source(tp)  # a profile that cannot serve this TP is an error, not a silent roofline
            self.search_engines[tp] = e
            phase(self.ex, f"rate search at tp={tp}", tps.index(tp), len(tps))
            searches.append(self.rate_search(e, tp, b.max_num_seqs))
        if not searches:
            if len(config_errors) == 1 and all(u.why in config_errors for u in unfit):
                raise ConfigError(next(iter(config_errors)))  # the same setting refused at every TP: say it once
            raise DoesNotFit(f"no feasible configuration of {card.name} on {gpu.name}: " + "; ".join(fit_errors))
        usable = [r for r in searches if r.max_rate > 0]
        if not usable:
            raise CapacityError("no feasible configuration of " + card.name + " on " + gpu.name + ": "
                                + "; ".join(f"tp={r.tp}: {r.why}" for r in searches))

        def gpus_for(r: RateSearch) -> int:
            return r.tp * dp * replicas_for(sc, r.max_rate)

        best = min(usable, key=lambda r: (gpus_for(r), r.tp))
        if gpus_for(best) > sc.max_gpus:
            raise CapacityError(
                f"target {sc.target_rate_per_s:g} req/s needs more than {sc.max_gpus} GPUs (max_gpus): the best is "
                f"tp={best.tp} at {best.max_rate:.3g} req/s per replica = {gpus_for(best)} x {gpu.name}")
        tp = best.tp
        replicas = replicas_for(sc, best.max_rate)
        per_replica = sc.target_rate_per_s / replicas
        base_cfg = self.search_engines[tp]
        phase(self.ex, "frontier (max_num_seqs x max_model_len)", len(tps), len(tps))
        frontier_mod.ahead(self.ex, frontier_mod.context_caps(self, tp))  # with the frontier's batch
        frontier = self.frontier(tp, per_replica)
        phase(self.ex, "context trade-off", len(tps) + 1, len(tps))
        contexts = self.context_frontier(tp)
        rec = self.recommend(frontier)
        rec_engine = self.cell_engine(tp, rec.max_num_seqs, rec.max_model_len) if rec else base_cfg
        rec_search = None
        if rec is not None:
            phase(self.ex, "the recommended configuration's rate", len(tps) + 2, len(tps))
            rec_search = self.rate_search(rec_engine, tp, rec.max_num_seqs)
            if rec_search.max_rate > 0:  # the GPU count is the recommended configuration's, at the headroom
                rec_replicas = replicas_for(sc, rec_search.max_rate)
                if rec_replicas > replicas:
                    # the frontier's pick (most peak throughput at the per-replica load) sustains less under the
                    # SLOs than the configuration the TP search found: recommend the one that needs fewer GPUs
                    same = [c for c in frontier if c.meets_slo and c.max_num_seqs == best.max_num_seqs]
                    alt = max(same, key=lambda c: c.max_model_len) if same else None
                    if alt is not None and alt is not rec:
                        alt_engine = self.cell_engine(tp, alt.max_num_seqs, alt.max_model_len)
                        alt_search = self.rate_search(alt_engine, tp, alt.max_num_seqs)
                        if alt_search.max_rate > 0 and replicas_for(sc, alt_search.max_rate) < rec_replicas:
                            self.notes.append(
                                f"max_num_seqs {rec.max_num_seqs} has the most peak throughput but sustains "
                                f"{rec_search.max_rate:.2f} req/s per replica under the SLOs; {alt.max_num_seqs} "
                                f"sustains {alt_search.max_rate:.2f} and needs fewer GPUs: recommended instead")
                            rec, rec_engine, rec_search = alt, alt_engine, alt_search
                            rec_replicas = replicas_for(sc, alt_search.max_rate)
                replicas = rec_replicas
                rec_engine, rec_search, replicas = tune_budget(self, rec_engine, tp, rec.max_num_seqs,
                                                               rec_search, replicas)
        phase(self.ex, f"verification at {sc.target_rate_per_s:g} req/s on {replicas} replica(s)", len(tps) + 3,
                    len(tps))
        frontier_mod.ahead(self.ex, [t for ts in frontier_mod.sensitivity_tasks(self, rec_engine, per_replica)[:2]
                                     for t in ts])  # the trade-off lines' loads, with the verification's batch
        verification = self.verify(rec_engine, replicas)
        if not verification.passed:
            for _ in range(3):
                replicas += 1
                self.notes.append(f"verification at the target rate failed; trying {replicas} replicas")
                verification = self.verify(rec_engine, replicas)
                if verification.passed:
                    break
        rb = self.budget(rec_engine)
        gpus = tp * dp * replicas
        mean_out = sc.workload.mean_output_tokens
        cost = None
        if sc.price_per_gpu_hour:
            cost = gpus * sc.price_per_gpu_hour / (sc.target_rate_per_s * mean_out * 3600) * 1e6
        em = engine_for(rec_engine.engine, card)
        vllm, sglang = em.launch_command(card, rec_engine, rb), sglang_command(card, rec_engine, rb, self.gpu)
        self.notes += em.launch_notes(rec_engine)
        if rec_engine.speculative is not None:  # what every figure above assumes (simulate prints the same)
            self.notes += run_notes(rec_engine.speculative, rb.warnings)
        phase(self.ex, "trade-offs", len(tps) + 4, len(tps))
        trade = self.tradeoffs(frontier, rec)
        trade += self.sensitivity(rec_engine, per_replica)
        eng = em.resolve(base_cfg, card, gpu)
        prov = None
        if sc.profile:
            prov = load_profile(sc.profile).provenance.model_dump()
        if not sc.profile:  # the roofline's level against published runs (bench/published.py, bench/mlperf.py)
            self.notes += roofline_notes(card, gpu, sc.headroom)
        if rec_search is not None:
            self.notes += output_handling_notes(rec_search.max_rate, mean_out,
                                                rec_engine.output_cpu_us_per_token is not None)
        scenario = {**sc.model_dump(), "model": card.model_dump(), "gpu": gpu.name}
        return Plan(card.name, gpu.name, sc.slo, sc.target_rate_per_s, searches, tp, replicas, gpus, frontier,
                    per_replica, rec, rec_search, verification, trade, vllm, sglang, cost, rb,
                    self.check_source(tp),
                    self.notes + [f"engine defaults used: {', '.join(eng.defaults_used) or 'none'}"],
                    batch_context_table(rb, default_batches(rb.max_num_seqs), default_contexts(rb.max_model_len)),
                    scenario, prov, __version__, mean_out, memory_command(card, gpu.name, rec_engine), sc.headroom,
                    unfit, contexts)

    # the frontier, the context map, the recommendation and the trade-off lines (capacity.plan.frontier)
    def frontier(self, tp: int, rate: float) -> list[Cell]:
        return frontier.frontier(self, tp, rate)

    def context_frontier(self, tp: int) -> list[ContextCell]:
        return frontier.context_frontier(self, tp)

    def recommend(self, cells: list[Cell]) -> Cell | None:
        return frontier.recommend(self, cells)

    def tradeoffs(self, cells: list[Cell], rec: Cell | None) -> list[str]:
        return frontier.tradeoffs(self, cells, rec)

    def sensitivity(self, engine: EngineConfig, rate: float) -> list[str]:
        return frontier.sensitivity(self, engine, rate)

    def longest_request(self) -> int:
        wl = self.sc.workload
        out = 0
        for c in range(len(wl.classes)):
            li, lo = wl.class_lengths(c)
            out = max(out, _max_len(li) + _max_len(lo))
        return out

    def verify(self, engine: EngineConfig, replicas: int) -> Verification:
        sp = self.sc.search
        seeds = range(1000, 1000 + sp.seeds)
        res = self.ex.run(self.tasks(engine, self.sc.target_rate_per_s, seeds, replicas=replicas,
                                      requests=max(sp.requests, 200 * replicas), router="least_outstanding"))
        ok, pt, pp = self.judge(res)
        return Verification(ok, replicas, pt, pp, list(seeds), self.sc.target_rate_per_s)

def _max_len(lengths: Lengths) -> int:
    if lengths.kind == "fixed":
        return int(lengths.value or 0)
    if lengths.kind == "uniform":
        return int(lengths.high or 0)
    if lengths.kind == "empirical":
        return max(lengths.values or [0])
    if lengths.high:
        return lengths.high
    return int((lengths.mean or 0) * (1 + 3 * (lengths.cv or 0)))  # lognormal without a cap: mean + 3 sd


def memory_command(card, gpu: str, e: EngineConfig) -> str:
    """The `capacity memory` invocation that prints the budget of configuration `e` (the plan's budget)."""
    parts = [f"capacity memory -m {card.name} -g {gpu} --tp {e.tensor_parallel_size}"]
    if e.engine != "vllm":
        parts.append(f"--engine {e.engine}")
    for flag, v in (("--max-num-seqs", e.max_num_seqs), ("--max-model-len", e.max_model_len),
                    ("--max-num-batched-tokens", e.max_num_batched_tokens), ("--block-size", e.block_size)):
        if v is not None:
            parts.append(f"{flag} {v}")
    if e.kv_cache_dtype != "auto":
        parts.append(f"--kv-dtype {e.kv_cache_dtype}")
    if (d := attention_dp_ranks(e)) > 1:  # SGLang's DP attention, TensorRT-LLM's attention DP
        parts.append("--trtllm-attention-dp" if e.engine.startswith("trtllm") else f"--dp {d} --enable-dp-attention")
    if e.gpu_memory_utilization != 0.9:
        parts.append(f"--gpu-memory-utilization {e.gpu_memory_utilization}")
    if e.enable_chunked_prefill is False:
        parts.append("--no-chunked-prefill")
    if e.enforce_eager:
        parts.append("--enforce-eager")
    if e.usage_context != "serve":
        parts.append(f"--usage-context {e.usage_context}")
    if isinstance(e, VllmConfig) and e.large_gpu_defaults is not None:
        parts.append("--large-gpu-defaults" if e.large_gpu_defaults else "--small-gpu-defaults")
    if isinstance(e, VllmConfig) and e.cuda_graphs_in_budget is not None:
        parts.append("--cuda-graphs-in-budget" if e.cuda_graphs_in_budget else "--cuda-graphs-outside-budget")
    if e.kv_estimate == "middle":
        parts.append("--optimistic")
    return " ".join(parts)


def make_plan(sc: Scenario, card, executor) -> Plan:
    return Planner(sc, card, executor).make()

