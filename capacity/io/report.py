"""Rendering of results for people (rich tables) and machines (JSON-ready dicts). No computation here."""
from __future__ import annotations

import re

from capacity.files import dumps, write_atomic
from capacity.io.export import csv_safe
from capacity.plan.compare import UNMEASURED


def _lat(x: float) -> str:
    """A latency of the percentile table in at most 7 characters: ms with one decimal below 1 s, whole ms with
    separators below 100 s, whole seconds beyond (an overloaded run's queue wait)."""
    ms = x * 1e3
    return f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}" if ms < 100_000 else f"{x:,.0f} s"


def simulation_table(out: dict, console) -> None:
    """Percentiles (ms) of a simulated scenario, throughput, and where the step costs came from."""
    from rich.table import Table

    s = out["summary"]
    if out["saturated"]:
        early = " that was stopped early" if out.get("stopped_early", True) else ""
        offered = out.get("offered_rate_per_s")
        what = f"offered {offered:,.2f} req/s" if isinstance(offered, (int, float)) else "the arrivals as given"
        console.print(f"[bold red]{out['saturation']}[/] ({what}): the percentiles below describe an overloaded "
                      f"system{early}")
    measured = out["policy"] == "measured"  # a load test's summary: no simulated engine behind it
    d = out.get("disaggregated")
    where = (f"{d['prefill_replicas']} prefill (tp={d['prefill_tp']}) + {d['decode_replicas']} decode "
             f"(tp={d['decode_tp']}) x {out['gpu']}" if d else f"{out['replicas']} x {out['gpu']} (tp={out['tp']})")
    dp = (out.get("engine") or {}).get("data_parallel_size", 1)
    if not d and dp > 1:  # data parallelism: replicas of dp ranks, each tp GPUs
        ep = ", expert parallel" if out["engine"].get("enable_expert_parallel") else ""
        where = f"{out['replicas']} x {dp} data-parallel ranks x {out['gpu']} (tp={out['tp']}{ep})"
    title = (f"Measured {out['model']} at {out['gpu']}, {s['n_requests']:,} requests" if measured else
             f"Simulated {out['model']} on {where}, {out['policy']} batching, {s['n_requests']:,} measured requests")
    t = Table(title=title, title_justify="left")
    cols = ["metric (ms)", "mean", "p50", "p90", "p95", "p99", "p99 95% CI"]
    for c in cols:
        t.add_column(c, justify="left" if c.startswith("metric") else "right")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queue_wait_s", "queue wait")):
        m = s[key]
        if not m.get("n"):
            t.add_row(label, *["-"] * 6)
            continue
        ci = s.get("p99_ci_s", {}).get(key.replace("_s", ""))
        ci_txt = f"{_lat(ci[0])}-{_lat(ci[1])}" if ci and ci[0] == ci[0] else ""
        t.add_row(label, *(_lat(m[k]) for k in ("mean", "p50", "p90", "p95", "p99")), ci_txt)
    console.print(t)
    if s.get("prefix_hit_rate") is not None:
        console.print(f"prefix cache: {s['prefix_hit_rate']:.1%} of the measured requests' prompt tokens were "
                      "found cached (not computed again)")
    if s.get("per_class"):
        ct = Table(title="Per request class (ms)", title_justify="left")
        for c in ("class", "requests", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "meets its SLO"):
            ct.add_column(c, justify="left" if c == "class" else "right")
        for name, c in s["per_class"].items():
            att = c.get("slo_attainment")
            ct.add_row(name, f"{c['n_requests']:,}", *(_lat(c[k][st]) if c[k].get("n") else "-"
                                                     for k in ("ttft_s", "tpot_s") for st in ("p50", "p99")),
                       "-" if att is None else f"{att:.1%}")
        console.print(ct)
    console.print(f"throughput: {s['output_tokens_per_s']:,.1f} output tokens/s, {s['requests_per_s']:.3f} requests/s "
                  f"over {s['window_s']:.1f} s {'measured' if measured else 'simulated'}"
                  + ("" if measured else f"; step costs: {out['step_cost_source']}"))
    cc = out.get("capacity_check")
    if cc and cc.get("offered_over_capacity") is not None:
        console.print(f"capacity: {cc['capacity_req_per_s']:.3g} requests/s with the queue never empty (a closed loop "
                      f"of {cc['closed_loop_users']:,} users, as the planner measures it); offered "
                      f"{out['offered_rate_per_s']:g} req/s is {cc['offered_over_capacity']:.0%} of it")
    off = out.get("offline")
    if off:
        console.print(f"offline batch: {off['requests']} requests in a makespan of {off['makespan_s']:.2f} s: "
                      f"{off['requests_per_s']:.3f} requests/s, {off['output_tokens_per_s']:,.0f} output tokens/s, "
                      f"{off['total_tokens_per_s']:,.0f} total tokens/s")
    if s.get("goodput_req_per_s") is not None:
        console.print(f"goodput: {s['goodput_req_per_s']:.3f} requests/s meet every SLO ({s['slo_attainment']:.1%})")
    if measured:  # no engine internals to report: the server's own /metrics are in the run file
        console.print(f"[dim]{s['definitions']}[/]")
    else:
        n_warm = out['warmup_requests_excluded']
        warm = (f"first {n_warm} requests (the users' start-up cohort, sent at t=0) excluded as warm-up"
                if out.get("warmup_is_start_up_cohort") else f"first {n_warm} requests excluded as warm-up")
        console.print(f"[dim]{s['definitions']}; {warm}; "
                      f"{out['preemptions']} preemptions; "
                      + ("KV per pool below" if d else f"KV {out['kv_blocks_per_replica']:,} blocks x "
                         f"{out['block_size']} tokens per replica")
                      + f"; Little's law L={out['littles_law']['L']:.2f} vs "
                      f"lambda*W={out['littles_law']['lambda_W']:.2f}[/]")
    for n in out["notes"]:
        console.print(f"[dim]note: {n}[/]")


# ---- the plan --------------------------------------------------------------------------------------------
def plan_dict(p) -> dict:
    """The plan's JSON form (kept for callers of the earlier API: `Plan.as_dict()`)."""
    return p.as_dict()


def _ms(x, nd=0) -> str:
    import math

    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:,.{nd}f}"


def plan_answer(p, console) -> None:
    """The answer in the first lines: GPUs, replicas x TP, cost, the verified P99s, the configuration and the
    launch commands (issue 48: a reader stops after a dozen lines)."""
    pct, v, b = p.slo.percentile, p.verification, p.budget
    dp = p.gpus // max(1, p.replicas * p.tp)  # data-parallel ranks per replica (docs/parallelism.md)
    reps = f"{p.replicas} replica{'s' if p.replicas != 1 else ''} x tp={p.tp}" + (f" x dp={dp}" if dp > 1 else "")
    price = (p.scenario or {}).get("price_per_gpu_hour")
    cost = (f"; ${p.gpus * price:,.2f}/h, ${p.cost_per_million_tokens:,.3f} per 1M output tokens"
            if p.cost_per_million_tokens and price else "; cost: give --price-per-gpu-hour")
    console.print(f"[bold]Answer: {p.gpus} x {p.gpu}[/] ({reps}){cost}")
    seeds = f"{len(v.seeds)} fresh seed{'s' if len(v.seeds) != 1 else ''}"
    console.print(f"verified at {v.rate_per_s:g} req/s on {seeds}: P{pct} TTFT {_ms(v.p_ttft_s)} ms, "
                  f"P{pct} TPOT {_ms(v.p_tpot_s, 1)} ms -> "
                  + ("[green]meets the SLO[/]" if v.passed else "[red]misses the SLO[/]"))
    if p.recommended:
        rc = p.recommended
        console.print(f"configuration: max_num_seqs {rc.max_num_seqs}, max_model_len {rc.max_model_len:,}, "
                      f"max_num_batched_tokens {b.max_num_batched_tokens:,}, {b.release}")
    else:
        console.print(f"configuration: the engine's defaults at tp={p.tp}, {b.release}")
    console.print("launch (vLLM, then SGLang):")
    console.print(f"  {p.vllm_command}", soft_wrap=True, markup=False, highlight=False)
    console.print(f"  {p.sglang_command}", soft_wrap=True, markup=False, highlight=False)


def plan_report(p, console, wall_s: float, ex) -> None:
    from rich.table import Table

    b = p.budget
    pct = p.slo.percentile
    console.print(f"[bold]Capacity plan: {p.model} on {p.gpu}[/], {p.target_rate:g} req/s, P{pct} TTFT <= "
                  f"{p.slo.ttft_s * 1e3:,.0f} ms, P{pct} TPOT <= {p.slo.tpot_s * 1e3:,.0f} ms")
    plan_answer(p, console)
    console.print(f"\n[bold]Details[/] (step costs: {p.source})")
    limit = ("max_num_seqs" if b.planning_tokens >= b.max_num_seqs * b.max_model_len
             else "KV cache at max_model_len")
    g = 2**30
    extra = (f" - graphs {b.cuda_graph_bytes / g:.2f}" if b.cuda_graphs_in_budget else "") + (
        f" - buffers {b.runner_buffers_bytes / g:.2f}" if b.runner_buffers_bytes else "")
    console.print(f"memory of the recommended configuration (tp={p.tp}, max_num_seqs {b.max_num_seqs}), per rank: "
                  f"usable {b.usable_bytes / g:.2f} GiB - weights {b.weights_bytes / g:.2f} - "
                  f"activations {b.activation_bytes / g:.2f} - non-torch {b.non_torch_bytes / g:.2f}{extra} = KV "
                  f"{b.kv_budget_bytes / g:.2f} GiB -> {b.kv_tokens:,} tokens (planned on {b.planning_tokens:,}, "
                  f"the {b.kv_estimate} end); concurrency is limited by {limit}")
    if p.budget_config:
        console.print(f"[dim]  (`{p.budget_config}` prints this budget)[/]", soft_wrap=True)

    import math

    t = Table(title=f"Max rate per replica under the SLOs (req/s; bracket = last pass .. first fail; peak = "
                    f"saturated), per TP at the engine's defaults and (*) as recommended; replicas run at "
                    f"{p.headroom:.0%} of it", title_justify="left")
    sources = {r.source for r in [*p.searches, p.rec_search] if r is not None}
    cols = ["configuration", "max", "bracket", "peak", "replicas", "GPUs"]
    if len(sources) > 1:
        cols.append("step costs")
    for c in cols:
        t.add_column(c, justify="left" if c in ("configuration", "step costs") else "right", no_wrap=True)
    for u in p.tp_unfit:
        t.add_row(f"tp={u.tp}", "[dim]does not fit[/]", "", "", "", "", *([""] if len(sources) > 1 else []))
    rows = [(f"tp={r.tp}", r) for r in p.searches]
    if p.rec_search is not None and p.recommended is not None:
        rows.append((f"[bold]tp={p.tp} seqs={p.recommended.max_num_seqs}*[/]", p.rec_search))
    for label, r in rows:
        src = [_src(r.source)] if len(sources) > 1 else []
        if r.max_rate <= 0:
            t.add_row(label, "[red]none[/]", "see below", f"{r.capacity_rate:.2f}", "-", "-", *src)
            continue
        reps = math.ceil(p.target_rate / (r.max_rate * p.headroom) - 1e-9)
        if r is p.rec_search:
            reps = p.replicas  # after verification (which may have added replicas)
        t.add_row(label, f"{r.max_rate:.2f}", f"{r.max_rate:.2f}-{r.failed_rate:.2f}", f"{r.capacity_rate:.2f}",
                  str(reps), str(reps * r.tp), *src)
    console.print(t)
    for u in p.tp_unfit:
        console.print(f"  tp={u.tp} does not fit: {u.why}")
    for r in p.searches:
        if r.max_rate <= 0 and r.why:
            console.print(f"  tp={r.tp} serves no rate {r.why}")

    seqs = sorted({c.max_num_seqs for c in p.frontier})
    lens = sorted({c.max_model_len for c in p.frontier})
    by = {(c.max_num_seqs, c.max_model_len): c for c in p.frontier}
    wide = console.width >= 150  # bands only where they fit: at 80 columns nothing is cut, nothing wraps
    ft = Table(title=f"Frontier at {p.per_replica_rate:.2f} req/s per replica (tp={p.tp}): latency does not depend "
                     f"on max_model_len (paged KV); 'fits' is the max_model_len range the memory holds (!: below the "
                     f"workload's longest request)", title_justify="left")
    heads = ["seqs", "TTFT ms", "TPOT ms", "tok/s", "KV blk", "preempt", "SLO", "fits"]
    if wide:
        heads = ["max_num_seqs", f"P{pct} TTFT ms [band]", f"P{pct} TPOT ms [band]", "peak tokens/s", "KV blocks",
                 "preemptions", "SLO", "max_model_len fits"]
    else:
        ft.title = (f"Frontier at {p.per_replica_rate:.2f} req/s per replica (tp={p.tp}): P{pct} TTFT/TPOT, peak "
                    f"output tok/s, KV blocks, preemptions; fits: the max_model_len range the memory holds (!: "
                    f"below the longest request)")
    for c in heads:
        ft.add_column(c, justify="left" if c in ("SLO", "fits") else "right", no_wrap=True)
    rec = p.recommended

    def k(m: int) -> str:
        return f"{m // 1024}k" if m >= 1024 and m % 1024 == 0 else f"{m:,}"

    for s in seqs:
        cells = [by[(s, m)] for m in lens]
        live = next((c for c in cells if c.feasible and c.p_ttft is not None), None)
        fit = [c for c in cells if c.feasible]
        fits = (f"{k(fit[0].max_model_len)}{'!' if not fit[0].covers_workload else ''}"
                + (f"-{k(fit[-1].max_model_len)}" if len(fit) > 1 else "")) if fit else "[dim]none[/]"
        label = f"[bold]{s}*[/]" if rec is not None and rec.max_num_seqs == s else str(s)
        if live is None:
            ft.add_row(label, "-", "-", "-", "-", "-", "[dim]does not fit[/]", fits)
            continue
        sat = live.saturated or live.p_ttft is None or live.p_ttft == float("inf")
        bt = f" [{_ms(live.p_ttft_band[0])}-{_ms(live.p_ttft_band[1])}]" if live.p_ttft_band and wide else ""
        bp = f" [{_ms(live.p_tpot_band[0], 1)}-{_ms(live.p_tpot_band[1], 1)}]" if live.p_tpot_band and wide else ""
        ok = any(c.meets_slo for c in cells)
        ft.add_row(label, "[red]saturated[/]" if sat else _ms(live.p_ttft) + bt, "" if sat else _ms(live.p_tpot, 1) + bp,
                   f"{live.capacity_tokens_per_s or 0:,.0f}", f"{live.kv_blocks or 0:,}",
                   f"{live.preemptions or 0:.0f}", "[green]meets[/]" if ok else "[red]misses[/]", fits)
    console.print(ft)
    context_table(p, console)

    if p.tradeoffs:
        console.print("trade-offs at the per-replica load:")
    for line in p.tradeoffs:
        console.print(f"- {line}")
    for n in p.notes:
        console.print(f"[dim]note: {n}[/]")
    console.print(f"[dim]{wall_s:.1f} s wall; {ex.misses} simulations run, {ex.hits} from the cache[/]")


def _src(source: str) -> str:
    """A step-cost source, short enough for a table cell (the full text is in the JSON)."""
    return source.split(" (")[0].replace("calibrated profile ", "profile ")


def write_rows(rows: list[dict], path: str) -> None:
    """Sweep rows as CSV or JSON by the name's suffix, written all or nothing (capacity.files.write_atomic)."""
    import csv
    import io
    import json
    from pathlib import Path

    p = Path(path)
    if p.suffix == ".csv":
        keys = list(dict.fromkeys(k for r in rows for k in r))
        f = io.StringIO(newline="")
        w = csv.DictWriter(f, fieldnames=[csv_safe(k) for k in keys])
        w.writeheader()
        for r in rows:  # user strings (sweep values, names) escaped: a spreadsheet must not run them
            w.writerow({csv_safe(k): csv_safe(json.dumps(v) if isinstance(v, (dict, list)) else v)
                        for k, v in r.items()})
        write_atomic(p, f.getvalue(), "--out")
    else:
        write_atomic(p, dumps(rows, indent=1) + "\n", "--out")


def sweep_table(rows: list[dict], axes: list[str], console, ex) -> None:
    """A row per grid point; axes headed by their last field names (full paths below), so two fit 80 columns."""
    from rich.table import Table

    short = [a.rsplit(".", 1)[-1] for a in axes]
    if len(set(short)) < len(short):
        short = list(axes)
    t = Table(title=f"Sweep ({len(rows)} points), latencies in ms; step costs: {rows[0]['source'] if rows else '-'}",
              title_justify="left")
    for a in short:
        t.add_column(a)
    for c in ("req/s", "TTFT\nP50", "TTFT\nP99", "TPOT\nP50", "TPOT\nP99", "output\ntokens/s"):
        t.add_column(c, justify="right")
    for r in rows:
        vals = []
        for a in axes:
            v = r[a]
            vals.append(str(v.get("value", v)) if isinstance(v, dict) else str(v))
        sat = " [red]sat.[/]" if r["saturated"] else " [yellow]rising[/]" if r.get("ttft_rising") else ""
        t.add_row(*vals, f"{r['rate_per_s']:g}{sat}", _ms(r["ttft_p50_s"]), _ms(r["ttft_p99_s"]), _ms(r["tpot_p50_s"], 1),
                  _ms(r["tpot_p99_s"], 1), f"{r['tokens_per_s']:,.0f}")
    console.print(t)
    if short != list(axes):
        console.print("[dim]" + "; ".join(f"{s_} = {a}" for s_, a in zip(short, axes)) + "[/]")
    sat = "sat. = saturated: the queue grew without bound, latencies of a run stopped early; " if any(
        r["saturated"] for r in rows) else ""
    if any(r.get("ttft_rising") and not r["saturated"] for r in rows):
        sat += "rising = TTFT still rising through the run: its latencies are a transient's (the planner fails it); "
    console.print(f"[dim]{sat}{ex.misses} simulations run, {ex.hits} from the cache[/]")


def _short(x: float | None) -> str:
    """A latency in 5 characters or fewer: ms below 10 s, whole seconds above."""
    if x is None:
        return "-"
    return f"{x * 1e3:,.0f}" if x < 10 else f"{x:,.0f}s"


def context_table(p, console) -> None:
    """The max batch x request context trade-off: P99 TTFT / TPOT at 80% of each cell's own peak, the peak
    output tokens/s, and KV-limited cells (the cache holds fewer such requests than max_num_seqs)."""
    from rich.table import Table

    if not p.context_frontier:
        return
    pct = p.slo.percentile
    ctxs = sorted({c.context for c in p.context_frontier})
    seqs = sorted({c.max_num_seqs for c in p.context_frontier})
    by = {(c.context, c.max_num_seqs): c for c in p.context_frontier}
    t = Table(title=f"Request context (prompt + output tokens) x max_num_seqs: P{pct} TTFT / TPOT ms at "
                    f"{p.headroom:.0%} of each cell's peak, then peak output tokens/s; * = KV-limited (the cache "
                    f"holds fewer such requests than max_num_seqs); red = misses the SLO", title_justify="left")
    t.add_column("max_num_seqs", justify="right")
    for x in ctxs:
        t.add_column(f"{x // 1024}k" if x >= 1024 else str(x), justify="right")
    for s in seqs:
        row = []
        for x in ctxs:
            c = by.get((x, s))
            if c is None or not c.feasible:
                row.append("[dim]-[/]")
                continue
            kv = "*" if c.kv_concurrency is not None and c.kv_concurrency < s else ""
            lat = "sat." if c.saturated or c.p_ttft is None else f"{_short(c.p_ttft)}/{_ms(c.p_tpot)}"
            txt = f"{lat} {c.capacity_tokens_per_s or 0:,.0f}{kv}"
            row.append(txt if c.meets_slo else f"[red]{txt}[/]")
        t.add_row(str(s), *row)
    console.print(t)


def _rate(x) -> str:
    return "-" if x is None else f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def gpu_comparison(options, console, wall_s: float, ex) -> None:
    """`capacity plan --gpu a,b,c`: one row per GPU type, cheapest first (fewest GPUs when unpriced)."""
    from rich import box
    from rich.table import Table

    first = next(o.plan for o in options if o.plan is not None)
    pct, slo = first.slo.percentile, first.slo
    gpus_seen = {o.gpu for o in options}
    one_gpu = len(gpus_seen) == 1 and any(o.engine for o in options)  # engines compared on one GPU type
    name = {id(o): (o.engine or o.gpu) if one_gpu else o.label for o in options}  # the shortest label that tells
    what = f"engines compared on {next(iter(gpus_seen))}" if one_gpu else (
        "options compared" if any(o.engine for o in options) else "GPU types compared")
    t = Table(title=f"{first.model} at {first.target_rate:g} req/s, SLO P{pct} TTFT <= {slo.ttft_s * 1e3:.0f} ms and "
                    f"TPOT <= {slo.tpot_s * 1e3:.0f} ms: {what} (replicas at {first.headroom:.0%} of their max rate)",
              title_justify="left")
    t.box = box.SIMPLE_HEAD  # nine columns in 80: no vertical rules
    t.caption = "rate/rep: max req/s per replica under the SLO; latencies in ms; $/1M: USD per 1M output tokens"
    t.caption_justify = "left"
    for c in ("engine" if one_gpu else "GPU", "layout", "GPUs", "rate/rep", f"P{pct} TTFT", f"P{pct} TPOT", "$/h",
              "$/1M"):
        t.add_column(c, justify="left" if c in ("GPU", "engine", "layout") else "right", no_wrap=True)
    rows = [(o, o.row()) for o in options]
    for o, r in rows:
        label = name[id(o)] + (" [yellow]†[/]" if r.get("caveat") else "")
        if not r["fits"]:
            t.add_row(label, "[dim]no plan (below)[/]", "", "", "", "", "", "")
            continue
        t.add_row(label, f"{r['replicas']} x tp={r['tp']}", str(r["gpus"]), _rate(r["max_rate_per_replica"]),
                  _ms(r["p_ttft_s"]), _ms(r["p_tpot_s"], 1), f"{r['usd_per_hour']:,.2f}" if r["usd_per_hour"] else "-",
                  f"{r['cost_per_million_tokens']:,.3f}" if r["cost_per_million_tokens"] else "-")
    console.print(t)
    said = [name[id(o)] for o, r in rows if r.get("caveat")]
    if said:  # one caveat text for every option it applies to
        console.print(f"[yellow]†[/] nothing measured on {', '.join(said)}: {UNMEASURED}", highlight=False)
    skipped = re.compile(r"^tp=(\d+) not searched: (.*)$")
    console.print("max req/s per replica under the SLO at each TP size, searched at the base configuration (the "
                  "table: the recommended one's):")
    notes: dict[str, list[str]] = {}
    for o, r in rows:
        if not r["fits"]:
            console.print(f"  {name[id(o)]}: no plan: {r['why']}", markup=False, highlight=False)
            continue
        skips = [m for m in map(skipped.match, r["notes"]) if m]
        notes[name[id(o)]] = [n for n in r["notes"] if not skipped.match(n)]
        per_tp = ", ".join([f"tp={tp} {_rate(v)}" for tp, v in r["rate_per_tp"].items()]
                           + [f"tp={tp} does not fit" for tp in r["tp_unfit"]])
        if skips:
            per_tp += f"; tp={', '.join(m[1] for m in skips)} not searched ({skips[0][2]})"
        console.print(f"  {name[id(o)]}: {per_tp}", markup=False, highlight=False)
    common = set.intersection(*map(set, notes.values())) if notes else set()
    for label, ns in [("every option", [n for n in next(iter(notes.values()), []) if n in common])] + [
            (k, [n for n in v if n not in common]) for k, v in notes.items()]:
        for n in ns:
            console.print(f"note ({label}): {n}", markup=False, highlight=False)
    console.print("launch:")
    for o, _r in rows:
        if o.plan is not None:
            console.print(f"  {name[id(o)]}: {o.plan.vllm_command}", soft_wrap=True, markup=False, highlight=False)
    console.print(f"[dim]{wall_s:.1f} s wall; {ex.misses} simulations run, {ex.hits} from the cache[/]")



# ---- plain-text outputs (--output csv|md): the same tables for scripts and documents -----------------------
def simulation_rows(out: dict) -> tuple[list[str], list[list]]:
    """The percentile table of a simulation (ms), one row per metric."""
    s = out["summary"]
    head = ["metric", "n", "mean (ms)", "p50 (ms)", "p90 (ms)", "p95 (ms)", "p99 (ms)", "p99 CI low (ms)",
            "p99 CI high (ms)"]
    rows = []
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queue_wait_s", "queue wait")):
        m = s[key]
        ci = (s.get("p99_ci_s") or {}).get(key[:-2]) or (None, None)
        rows.append([label, m.get("n", 0), *(_num(m.get(k)) for k in ("mean", "p50", "p90", "p95", "p99")),
                     _num(ci[0]), _num(ci[1])])
    return head, rows


def _num(x, scale: float = 1e3):
    import math

    return None if x is None or not math.isfinite(x) else round(x * scale, 3)


def to_csv(head: list[str], rows: list[list]) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    w.writerows([["" if v is None else v for v in r] for r in rows])
    return buf.getvalue()


def to_markdown(head: list[str], rows: list[list], title: str = "") -> str:
    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:,.0f}"
        return str(v).replace("|", "/")

    out = [f"### {title}", ""] if title else []
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out) + "\n"
