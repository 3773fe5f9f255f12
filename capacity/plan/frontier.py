"""The planner's view across configurations: the max_num_seqs x max_model_len frontier at each replica's share
of the load, the context trade-off map, the recommendation among the frontier's cells, and the trade-off
statements a plan prints (batch cap, context limit, prompt length).

Split from `capacity.plan.planner`, which searches rates and TP sizes and assembles the plan: these functions
take the planner (its scenario, executor, engines and budgets: `capacity.plan.view.PlannerView`) and change only
when what the plan shows across configurations changes.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from capacity.cost.profile import load_profile, profile_label
from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError, DoesNotFit
from capacity.plan.results import Cell, ContextCell, MetricStats
from capacity.plan.sizing import mean as _mean
from capacity.plan.sizing import replicas_for
from capacity.steady import CAPACITY_LOOP_ROUNDS
from capacity.workload import Lengths, WorkloadSpec

if TYPE_CHECKING:
    from capacity.plan.tasks import SimTask
    from capacity.plan.view import PlannerView

CONTEXT_REQUESTS = 300  # requests per simulation of the context trade-off map
TOKEN_BUDGETS = (2048, 4096, 8192, 16384)  # max_num_batched_tokens tried (vLLM's defaults run 2,048 to 16,384)
GROUP_BLOCKS = 0.005  # frontier cells whose KV blocks differ by at most this share share one simulation


def frontier(pl: PlannerView, tp: int, rate: float) -> list[Cell]:
    sc = pl.sc
    pl.frontier_tp = tp
    longest = pl.longest_request()
    # a knob the scenario fixes is not searched: the frontier is that value only
    seqs = [sc.engine.max_num_seqs] if sc.engine.max_num_seqs else sorted(set(sc.search.max_num_seqs))
    lens = ([sc.engine.max_model_len] if sc.engine.max_model_len else
            sorted(x for x in set(sc.search.max_model_len) if x <= pl.card.max_position_embeddings))
    if not lens:
        raise ConfigError(f"search.max_model_len: no value <= the model's max_position_embeddings "
                          f"({pl.card.max_position_embeddings})")
    cells: dict[tuple[int, int], Cell] = {}
    # one simulated configuration per group of cells that resolve to the same engine (token budget, KV
    # blocks within GROUP_BLOCKS of each other, simulated at the group's fewest: the safe side): with paged
    # KV, max_model_len only decides which requests are admitted, and the few blocks its buffers cost
    # (26,691 at 2k to 26,675 at 128k for an 8B on an H100) do not warrant a simulation each
    fits: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (s, token budget) -> [(blocks, max_model_len)]
    for s in seqs:
        for m in lens:
            try:
                b = pl.budget(pl.cell_engine(tp, s, m))
                cells[(s, m)] = Cell(s, m, True, covers_workload=m >= longest, kv_tokens=b.planning_tokens,
                                     max_num_batched_tokens=b.max_num_batched_tokens,
                                     kv_blocks=b.planning_blocks)
                fits.setdefault((s, b.max_num_batched_tokens), []).append((b.planning_blocks, m))
            except (DoesNotFit, ConfigError) as exc:
                cells[(s, m)] = Cell(s, m, False, why=str(exc))
    groups: dict[tuple[int, int, int], list[int]] = {}  # (s, fewest blocks, token budget) -> max_model_lens
    for (s, mnbt), members in fits.items():
        lo = None
        for blocks, m in sorted(members):
            if lo is None or blocks > lo * (1 + GROUP_BLOCKS):
                lo = blocks
            groups.setdefault((s, lo, mnbt), []).append(m)
    sims: dict[tuple[int, int, int], tuple[list[SimTask], list[SimTask]]] = {}
    for key, ms in groups.items():
        s = key[0]
        eng = pl.cell_engine(tp, s, max(ms))
        if pl.budget(eng).planning_blocks != key[1]:
            eng = eng.model_copy(update={"num_gpu_blocks_override": key[1]})
        load = pl.tasks(eng, rate, range(sc.search.seeds), ci=True)
        # peak tokens/s, averaged over the same seeds: one closed loop is noisy enough to make a bigger batch
        # cap look slower than a smaller one
        full = pl.full_batch(eng, s)
        cap = pl.tasks(eng, None, range(sc.search.seeds), closed_users=max(2, 2 * full),
                          requests=max(sc.search.requests, CAPACITY_LOOP_ROUNDS * max(2, 2 * full)))
        sims[key] = (load, cap)
    flat = [t for load, cap in sims.values() for t in (*load, *cap)]
    out = iter(pl.ex.run(flat))
    k = sc.slo.key
    for key, (load, capt) in sims.items():
        res = [next(out) for _ in load]
        caps = [next(out) for _ in capt]
        ok, pt, pp = pl.judge(res)
        band_t = band_p = None
        if not any(r.saturated or not r.ttft.n for r in res):  # nothing finished (all too long): no band
            # the band: union of the seeds' bootstrap 95% intervals for P99, or the spread across seeds
            bt = [r.p99_ci.get("ttft") for r in res if r.p99_ci]
            bp = [r.p99_ci.get("tpot") for r in res if r.p99_ci]
            if k == "p99" and bt and all(b is not None and b[0] == b[0] for b in bt + bp):
                band_t = (min(b[0] for b in bt if b), max(b[1] for b in bt if b))
                band_p = (min(b[0] for b in bp if b), max(b[1] for b in bp if b))
            else:
                band_t = (min(r.ttft.stat(k) for r in res), max(r.ttft.stat(k) for r in res))
                band_p = (min(r.tpot.stat(k) or 0 for r in res), max(r.tpot.stat(k) or 0 for r in res))
        stats = {metric: _metric_stats([r.metric(metric) for r in res],
                                       [r.p99_ci.get(metric) for r in res if r.p99_ci])
                 for metric in ("ttft", "tpot", "itl", "e2e")}
        for m in groups[key]:
            c = cells[(key[0], m)]
            c.p_ttft, c.p_tpot = pt, pp
            c.p_ttft_band, c.p_tpot_band = band_t, band_p
            c.stats = stats
            c.capacity_tokens_per_s = _mean([x.capacity_rates[1] for x in caps])
            c.preemptions = _mean([r.preemptions for r in res])
            c.saturated = any(r.saturated for r in res)
            c.meets_slo = ok and c.covers_workload
    return [cells[(s, m)] for s in seqs for m in lens]

def context_frontier(pl: PlannerView, tp: int) -> list[ContextCell]:
    """max_num_seqs x the context requests carry (prompt + output: the workload's mean output length kept,
    the prompt filling the rest). Per cell: the peak tokens/s with the batch kept full, and P99 TTFT/TPOT,
    preemptions and queue wait when a replica runs at `headroom` x that cell's own capacity, the operating
    point a plan would put it at. So the table shows where the KV cache, not the batch cap, limits
    concurrency (kv_concurrency < max_num_seqs: capacity stops growing, preemptions appear) and what it does
    to latency, at a load each cell can sustain. max_model_len is the smallest grid value that admits the
    context (with paged KV the value costs no latency)."""
    cells, runs = _context_runs(pl, tp)
    if not runs:
        return cells
    sc = pl.sc
    caps = pl.ex.run([cap for *_, cap in runs])
    loads = []
    for (cell, e, wl, _), capr in zip(runs, caps):
        cell.capacity_tokens_per_s = capr.capacity_rates[1]
        rate = capr.capacity_rates[0] * sc.headroom
        # one seed of CONTEXT_REQUESTS: a map of where the trade-off turns, not the plan's verified answer
        loads.append(pl.tasks(e, rate, range(1), workload=wl, requests=CONTEXT_REQUESTS) if rate > 0 else [])
    res = iter(pl.ex.run([t for load in loads for t in load]))
    k = sc.slo.key
    for (cell, *_), load in zip(runs, loads):
        rs = [next(res) for _ in load]
        if not rs:
            cell.saturated = True
            continue
        ok, pt, pp = pl.judge(rs)
        cell.saturated = any(r.saturated for r in rs)
        if not cell.saturated:
            cell.p_ttft, cell.p_tpot = pt, pp
            waits = [r.queue_wait.stat(k) for r in rs if r.queue_wait.n]
            cell.queue_wait_p99 = _mean([w or 0.0 for w in waits]) if waits else None
        cell.preemptions = _mean([r.preemptions for r in rs])
        cell.meets_slo = ok
    return cells


def context_caps(pl: PlannerView, tp: int) -> list[SimTask]:
    """The context map's kept-full loops (they depend on nothing the frontier finds): the planner runs them
    with the frontier's batch (`Executor.ahead`)."""
    return [cap for *_, cap in _context_runs(pl, tp)[1]]


def _context_runs(pl: PlannerView, tp: int) -> tuple[list[ContextCell], list[tuple[ContextCell, EngineConfig, WorkloadSpec, SimTask]]]:
    sc = pl.sc
    seqs = [sc.engine.max_num_seqs] if sc.engine.max_num_seqs else sorted(set(sc.search.max_num_seqs))
    out_len = max(1, round(sc.workload.mean_output_tokens))
    lens = sorted(set(sc.search.max_model_len) | {pl.card.max_position_embeddings})
    cells: list[ContextCell] = []
    runs: list[tuple[ContextCell, EngineConfig, WorkloadSpec, SimTask]] = []
    for ctx in sorted(set(sc.search.contexts)):
        if ctx > pl.card.max_position_embeddings:
            continue
        out = min(out_len, ctx // 2)
        wl = sc.workload.model_copy(update={
            "input_len": Lengths(kind="fixed", value=ctx - out), "output_len": Lengths(kind="fixed", value=out),
            "prefix": None, "classes": [c.model_copy(update={"input_len": None, "output_len": None})
                                        for c in sc.workload.classes]})
        m = sc.engine.max_model_len or next(x for x in lens if x >= ctx)
        for s in seqs:
            cell = ContextCell(ctx, s, True)
            cells.append(cell)
            if m < ctx:
                cell.feasible, cell.why = False, f"max_model_len {m} < {ctx}"
                continue
            try:
                e = pl.cell_engine(tp, s, m)
                b = pl.budget(e)
            except (DoesNotFit, ConfigError) as exc:
                cell.feasible, cell.why = False, str(exc)
                continue
            cell.kv_concurrency = b.concurrency_at(ctx)
            users = max(2, 2 * min(s, cell.kv_concurrency))  # more only queue behind a full batch
            cap = pl.tasks(e, None, range(1), closed_users=users, workload=wl,
                              requests=max(CONTEXT_REQUESTS, CAPACITY_LOOP_ROUNDS * users))[0]
            runs.append((cell, e, wl, cap))
    return cells, runs

def recommend(pl: PlannerView, frontier: list[Cell]) -> Cell | None:
    good = [c for c in frontier if c.meets_slo]
    if not good:
        pl.notes.append("no frontier cell meets the SLOs at the per-replica load; keeping the engine defaults")
        return None
    # most capacity; then the largest max_model_len: with paged KV a longer limit costs no latency at this
    # load (it only admits longer requests), and a smaller one would reject production prompts the test
    # workload happens not to have (the trade-off line says what it costs in full-length concurrency)
    return max(good, key=lambda c: (round(c.capacity_tokens_per_s or 0, 6), c.max_model_len))

def tradeoffs(pl: PlannerView, frontier: list[Cell], rec: Cell | None) -> list[str]:
    m = rec.max_model_len if rec else max((c.max_model_len for c in frontier if c.feasible), default=None)
    row = [c for c in frontier if c.max_model_len == m and c.feasible and c.p_ttft is not None]
    out = []
    p = pl.sc.slo.percentile
    steps = [(a, b) for a, b in zip(row, row[1:]) if a.capacity_tokens_per_s and b.capacity_tokens_per_s]
    i = 0
    while i < len(steps):  # a run of steps whose P99s stay within 5% is one line: it says one thing
        j = i
        while _flat(*steps[j]) and j + 1 < len(steps) and _flat(*steps[j + 1]):
            j += 1
        a, b = steps[i][0], steps[j][1]
        if j > i:
            seg = [a] + [s[1] for s in steps[i:j + 1]]
            top = max(seg, key=lambda c: c.capacity_tokens_per_s or 0.0)
            out.append(f"max batch {a.max_num_seqs} -> {b.max_num_seqs}: peak tokens/s {a.capacity_tokens_per_s:,.0f} "
                       f"-> {b.capacity_tokens_per_s:,.0f} (highest {top.capacity_tokens_per_s:,.0f} at "
                       f"{top.max_num_seqs}); P{p} TTFT {_ms(a.p_ttft)} and TPOT {_ms(a.p_tpot, 1)} at each step "
                       "(within 5%)")
        else:
            gain = (b.capacity_tokens_per_s or 0.0) / (a.capacity_tokens_per_s or 1.0) - 1
            out.append(f"max batch {a.max_num_seqs} -> {b.max_num_seqs}: {gain:+.0%} peak tokens/s "
                       f"({a.capacity_tokens_per_s:,.0f} -> {b.capacity_tokens_per_s:,.0f}), P{p} TTFT "
                       f"{_ms(a.p_ttft)} -> {_ms(b.p_ttft)}, P{p} TPOT {_ms(a.p_tpot, 1)} -> {_ms(b.p_tpot, 1)}")
        i = j + 1
    if rec is not None:
        out += _context_tradeoff(pl, frontier, rec)
    return out

def _flat(a: Cell, b: Cell) -> bool:
    """Both P99s finite and within 5% from one max batch to the next."""
    xs = (a.p_ttft, b.p_ttft, a.p_tpot, b.p_tpot)
    if any(x is None or not math.isfinite(x) or x <= 0 for x in xs) or a.saturated or b.saturated:
        return False
    return abs(b.p_ttft / a.p_ttft - 1) < 0.05 and abs(b.p_tpot / a.p_tpot - 1) < 0.05  # type: ignore[operator]


def _context_tradeoff(pl: PlannerView, frontier: list[Cell], rec: Cell) -> list[str]:
    """What a longer max_model_len costs: with paged KV, nothing in latency at this load (the cells of a row
    share one simulation), but fewer requests of that full length fit in the KV cache at once."""
    row = [c for c in frontier if c.max_num_seqs == rec.max_num_seqs and c.feasible and c.kv_tokens]
    if len(row) < 2:
        return []
    bs = pl.budget(pl.cell_engine(pl.frontier_tp, rec.max_num_seqs, rec.max_model_len)).block_size

    def full(c: Cell) -> int:
        return (c.kv_blocks or 0) // math.ceil(c.max_model_len / bs)

    lo, hi = row[0], row[-1]
    return [f"max_model_len {hi.max_model_len:,} admits requests up to that length at the same P{pl.sc.slo.percentile} "
            f"as {lo.max_model_len:,} at this load; its cost is concurrency at full length: {full(hi):,} requests "
            f"of {hi.max_model_len:,} tokens fit the KV cache at once vs {full(lo):,} of {lo.max_model_len:,} "
            f"(the workload's longest request is {pl.longest_request():,} tokens)"]

def sensitivity_tasks(pl: PlannerView, engine: EngineConfig, rate: float) -> tuple[list[SimTask], list[SimTask], int]:
    """The two loads `sensitivity` compares (the workload's, and its prompts d tokens shorter) and d; none where
    the prompt length is not fixed. The planner runs them with the verification's batch (`Executor.ahead`)."""
    wl = pl.sc.workload
    li = wl.input_len
    if li.kind != "fixed" or li.value is None:
        return [], [], 0
    d = 1024 if li.value > 1024 else li.value // 2
    if d <= 0:
        return [], [], 0
    shorter = wl.model_copy(update={"input_len": li.model_copy(update={"value": li.value - d})})
    seeds = range(pl.sc.search.seeds)
    return pl.tasks(engine, rate, seeds), pl.tasks(engine, rate, seeds, workload=shorter), d


def ahead(ex, tasks: list[SimTask]) -> None:
    """Queue tasks to run with the executor's next batch (`capacity.plan.executors.Executor.ahead`), where it can."""
    if tasks and hasattr(ex, "ahead"):
        ex.ahead(tasks)


def sensitivity(pl: PlannerView, engine: EngineConfig, rate: float) -> list[str]:
    """TTFT per 1k prompt tokens: the same load with prompts 1k (or half) shorter."""
    ta, tb, d = sensitivity_tasks(pl, engine, rate)
    if not d:
        return []
    li = pl.sc.workload.input_len
    assert li.value is not None
    ahead(pl.ex, tb)  # one round on the pool for both loads
    a = pl.ex.run(ta)
    b = pl.ex.run(tb)
    k = pl.sc.slo.key
    if any(r.saturated for r in a + b):
        return []
    mean_a, mean_b = _mean([r.ttft.mean for r in a]), _mean([r.ttft.mean for r in b])
    pa, pb = _mean([r.ttft.stat(k) for r in a]), _mean([r.ttft.stat(k) for r in b])
    per_k = 1024 / d
    return [f"each 1k fewer prompt tokens ({li.value} -> {li.value - d} measured) saves "
            f"{(mean_a - mean_b) * per_k * 1e3:.0f} ms mean TTFT and {(pa - pb) * per_k * 1e3:.0f} ms "
            f"P{pl.sc.slo.percentile} TTFT"]


def _metric_stats(dists: list, cis: list) -> MetricStats:
    keys = ("mean", "p50", "p90", "p95", "p99")
    have = [d for d in dists if d.n]
    vals = {kk: _mean([d.stat(kk) for d in have]) if have and len(have) == len(dists) else None for kk in keys}
    st = MetricStats(**vals)
    cis = [c for c in cis if c is not None]
    if cis and all(c[0] == c[0] for c in cis):
        st.p99_ci_low, st.p99_ci_high = min(c[0] for c in cis), max(c[1] for c in cis)
    return st


def _ms(x: float | None, nd: int = 0) -> str:
    if x is None:
        return "-"
    return "saturated" if not math.isfinite(x) else f"{x * 1e3:,.{nd}f} ms"


def tune_budget(pl: PlannerView, engine: EngineConfig, tp: int, max_num_seqs: int, search, replicas: int):
    """The token budget (vLLM's max_num_batched_tokens: how many prompt tokens a step carries next to its decodes,
    the trade of TTFT against TPOT; SGLang's chunked_prefill_size, the prompt tokens of a prefill batch) for the
    recommended configuration. Each of TOKEN_BUDGETS is probed at the rate a replica must sustain for one
    replica fewer; one that holds the SLOs there gets the rate search, and the one that needs the fewest
    replicas (then the highest rate) is recommended instead, with a note.
    Searched only where it can save a GPU (more than one replica), with chunked prefill on (without it the
    budget must hold a whole prompt) and where the scenario does not set the budget; for vLLM a budget below
    the batch cap (vLLM refuses it), and any budget without room for KV, is not tried. Returns (engine, search,
    replicas), unchanged when no budget does better."""
    sc = pl.sc
    kind = engine.engine.split("@")[0]  # vllm@0.11, sglang@0.4.6: the engine, whatever its release
    if replicas <= 1 or kind not in ("vllm", "sglang") or sc.engine.max_num_batched_tokens is not None:
        return engine, search, replicas
    b = pl.budget(engine)
    best = (replicas, 0.0, engine, search)  # a budget must save a replica: a higher rate alone changes nothing
    # the rate a replica must sustain for one replica fewer: a budget that fails there cannot win, and costs
    # one probe instead of a rate search
    need = sc.target_rate_per_s / (sc.headroom * (replicas - 1)) * (1 + 1e-9)
    seeds = range(sc.search.seeds)
    tried: list[EngineConfig] = []
    for v in TOKEN_BUDGETS:
        if v == b.max_num_batched_tokens or not b.chunked_prefill or (kind == "vllm" and v < max_num_seqs):
            continue
        e = engine.model_copy(update={"max_num_batched_tokens": v})
        try:
            pl.budget(e)
        except (DoesNotFit, ConfigError):
            continue
        tried.append(e)
    # each budget's probe at `need` depends on no other's result: they run as one batch (one round on the pool)
    ahead(pl.ex, [t for e in tried[1:] for t in pl.tasks(e, need, seeds)])
    for e in tried:
        if not pl.judge(pl.ex.run(pl.tasks(e, need, seeds)))[0]:
            continue
        s = pl.rate_search(e, tp, max_num_seqs)
        if s.max_rate > 0 and replicas_for(sc, s.max_rate) < replicas and (replicas_for(sc, s.max_rate),
                                                                          -s.max_rate) < best[:2]:
            best = (replicas_for(sc, s.max_rate), -s.max_rate, e, s)
    if best[2] is engine:
        return engine, search, replicas
    n, _, e, s = best
    pl.notes.append(f"max_num_batched_tokens {e.max_num_batched_tokens} (not {b.max_num_batched_tokens}) sustains "
                    f"{s.max_rate:.2f} req/s per replica under the SLOs, against {search.max_rate:.2f}: {n} "
                    f"replicas instead of {replicas}")
    return e, s, n


def tp_sizes(pl: PlannerView) -> list[int]:
    """The TP sizes to search: the scenario's fixed one, or the search grid; with a profile, only the TP
    size it was measured at (a profile is never replaced by the roofline for some rows)."""
    sc = pl.sc
    tps = [sc.fixed_tp] if sc.fixed_tp else list(sc.search.tp)
    if sc.profile is None:
        return tps
    ptp = load_profile(sc.profile).tp
    if sc.fixed_tp and sc.fixed_tp != ptp:
        raise ConfigError(f"profile {profile_label(sc.profile)} was measured at tp={ptp}, the scenario fixes "
                          f"tp={sc.fixed_tp}: use a profile measured at tp={sc.fixed_tp}, or no profile (the roofline)")
    pl.check_source(ptp)  # another model or GPU: refused now, before anything is simulated
    if tps != [ptp]:
        pl.notes.append(f"tp searched only at {ptp}: the profile {profile_label(sc.profile)} was measured "
                        f"there (other TP sizes would need the roofline; run without --profile for them)")
    return [ptp]
