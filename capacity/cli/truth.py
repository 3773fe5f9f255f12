"""`capacity loadtest` and `capacity validate`: measuring a real server and comparing it with the simulator."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from capacity.cli.common import JsonOpt, _lengths, app
from capacity.cli.costs import engine_flags
from capacity.errors import CapacityError, require
from capacity.files import check_writable, dumps, write_atomic
from capacity.files import validate as check
from capacity.io.report import simulation_table
from capacity.limits import check as bound
from capacity.limits import check_lengths
from capacity.truth.compare import Change, Requests, as_dict, gate, parse_rules, records_run, write_plot
from capacity.truth.compare import compare as ab_compare
from capacity.truth.fit import compare as fit_compare
from capacity.truth.fit import fit_provenance, load_fit, replay, sim_summary, simulate_run
from capacity.truth.fit import load_run as load_fit_run
from capacity.truth.loadtest import counts, run_load, summarize_run
from capacity.truth.plots import run_figure
from capacity.truth.provenance import mismatches, parse_engine_config, run_engine
from capacity.truth.recipe import run_recipe
from capacity.truth.runfile import load_run
from capacity.truth.utilisation import describe
from capacity.workload import Arrivals, WorkloadSpec, generate, load_trace


@app.command()
def loadtest(
    url: Annotated[str, typer.Option("--url", help="Server base URL, e.g. http://127.0.0.1:8000")],
    model: Annotated[str, typer.Option("--model", "-m", help="Model name the server expects")],
    rate: Annotated[Optional[float], typer.Option("--rate", help="Open-loop arrival rate, req/s")] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests to send")] = 100,
    input_len: Annotated[str, typer.Option("--input-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "128",
    output_len: Annotated[str, typer.Option("--output-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "32",
    arrival: Annotated[str, typer.Option("--arrival", help="poisson, gamma, constant")] = "poisson",
    cv: Annotated[float, typer.Option("--cv", help="Gamma CV")] = 1.0,
    trace: Annotated[Optional[str], typer.Option("--trace", help="Replay a JSONL/CSV trace with exact timestamps")] = None,
    users: Annotated[Optional[int], typer.Option("--users", help="Closed loop: concurrent users (instead of --rate)")] = None,
    think_s: Annotated[float, typer.Option("--think-s")] = 0.0,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", help="Open loop: at most this many requests in flight, the rest wait at the client (vllm bench serve --max-concurrency)")] = None,
    prefill_sweep: Annotated[Optional[str], typer.Option("--prefill-sweep", help="Input lengths at the fixed output length")] = None,
    decode_sweep: Annotated[Optional[str], typer.Option("--decode-sweep", help="Output lengths at the fixed input length")] = None,
    endpoint: Annotated[str, typer.Option("--endpoint", help="completions or chat")] = "completions",
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per-request timeout")] = 60.0,
    max_duration_s: Annotated[float, typer.Option("--max-duration-s", help="Bound on the whole run")] = 600.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Optional[str], typer.Option("--out", help="Run JSON to write (partial results on interrupt)")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out file")] = False,
    engine_config: Annotated[Optional[str], typer.Option("--engine-config", help="The server's limits, recorded for fits: num_blocks=N,block_size=N,max_num_batched_tokens=N,max_num_seqs=N")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Requests sent (one at a time) and discarded before the measured load: start-up compilation, caches")] = 0,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="A earlier run file: compare this run with it (A/B)")] = None,
    fail_on: Annotated[Optional[str], typer.Option("--fail-on", help="With --baseline: exit 3 on a significant regression beyond e.g. p95_ttft:+10%,throughput:-5%")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Latency time line, engine /metrics and utilisation: FILE.html")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Load-test an OpenAI-compatible server; report the simulator's metrics (vllm bench serve conventions)."""
    import math

    import numpy as np

    for flag, val in (("--requests", requests), ("--timeout-s", timeout_s), ("--max-duration-s", max_duration_s)):
        if not math.isfinite(val) or val <= 0:
            raise CapacityError(f"{flag} {val}: must be a finite number > 0")
    bound("loadtest_requests", requests, "--requests")
    # every count, length and duration is bounded here, before a prompt is built or a request sent
    for flag, val in (("--timeout-s", timeout_s), ("--max-duration-s", max_duration_s), ("--think-s", think_s)):
        bound("loadtest_seconds", val, flag)
    if users is not None:
        if users <= 0:
            raise CapacityError(f"--users {users}: must be > 0")
        bound("loadtest_concurrency", users, "--users")
    if max_concurrency is not None:
        if max_concurrency <= 0 or users is not None:
            raise CapacityError(f"--max-concurrency {max_concurrency}: a cap >= 1 on an open loop (--rate or "
                                "--trace); closed-loop --users are their own cap")
        bound("loadtest_concurrency", max_concurrency, "--max-concurrency")
    if rate is not None and (not math.isfinite(rate) or rate <= 0):
        raise CapacityError(f"--rate {rate}: must be a finite number > 0")
    if seed < 0:
        raise CapacityError(f"--seed {seed}: must be >= 0")
    if not math.isfinite(think_s) or think_s < 0:
        raise CapacityError(f"--think-s {think_s}: must be a finite number >= 0")
    if not url.startswith(("http://", "https://")) or len(url) > 2048:
        raise CapacityError(f"--url {url[:80]!r}: expected http://HOST:PORT or https://...")
    if out:  # where the run goes is checked before the run, not after it
        check_writable(out, force, "--out")
    _check_plot(plot, force)
    base = None
    rules = None
    if fail_on and not baseline:
        raise CapacityError("--fail-on needs --baseline (the run to compare with)")
    if baseline:  # read and checked before the run, not after it
        base = Requests.of_run(load_run(baseline), baseline)
        rules = parse_rules(fail_on) if fail_on else {}
    if endpoint not in ("completions", "chat"):
        raise CapacityError(f"--endpoint {endpoint!r}: use completions or chat")
    li, lo = _lengths("--input-len", input_len), _lengths("--output-len", output_len)
    check_lengths("loadtest_tokens", li, "--input-len")
    check_lengths("loadtest_tokens", lo, "--output-len")
    if trace:
        reqs = load_trace(trace, max_rows=requests)
    else:
        if users is None and rate is None:
            raise CapacityError("give --rate (open loop), --users (closed loop) or --trace")

        arr = check(Arrivals, {"kind": arrival, "rate_per_s": rate if rate is not None else 1.0, "cv": cv},
                    "arrival options")
        reqs = generate(WorkloadSpec(arrivals=arr, input_len=li, output_len=lo, num_requests=requests),
                        np.random.default_rng(seed))
    if reqs:  # what a trace holds or a lognormal drew: the same bound as a length given outright
        bound("loadtest_tokens", max(q.prompt_tokens for q in reqs), "a request's prompt (--input-len or --trace)")
        bound("loadtest_tokens", max(q.output_tokens for q in reqs), "a request's output (--output-len or --trace)")
    if warmup < 0:
        raise CapacityError(f"--warmup {warmup}: must be >= 0")
    eng = None
    if engine_config:
        eng = parse_engine_config(engine_config)
    bound("loadtest_requests", warmup, "--warmup")
    if warmup:  # the first requests after start-up pay compilation and allocation: not what the engine serves at
        warm = [dataclasses.replace(q, id=-1 - i, arrival_s=0.0) for i, q in enumerate(reqs[:warmup])]
        warm += [dataclasses.replace(reqs[-1], id=-1 - i, arrival_s=0.0) for i in range(len(warm), warmup)]
        wrun = run_load(url, model, warm, users=1, timeout_s=timeout_s, max_duration_s=max_duration_s,
                        endpoint=endpoint, metrics=False)
        if not json_out:
            typer.echo(f"warm-up: {counts(wrun)} (not measured)", err=True)
    kind = ""  # a length sweep: which length, and its values
    values: list[int | None] = [None]
    swept = prefill_sweep or decode_sweep
    if swept:
        try:
            parts = [v.strip() for v in swept.split(",")]
            if not all(v.isascii() and v.isdigit() for v in parts):
                raise ValueError
            parsed = [int(v) for v in parts]
            if not parsed or any(x <= 0 for x in parsed) or len(parsed) > 100:
                raise ValueError
            values = list(parsed)
        except ValueError:
            raise CapacityError(f"--{'prefill' if prefill_sweep else 'decode'}-sweep {swept[:80]!r}: expected N,N,... "
                                "(at most 100)") from None
        for x in parsed:
            bound("loadtest_tokens", x, f"--{'prefill' if prefill_sweep else 'decode'}-sweep value")
        kind = "input" if prefill_sweep else "output"
    runs = []
    interrupted = False
    for v in values:
        rr = [dataclasses.replace(q) for q in reqs]
        if v is not None:
            for q in rr:
                if kind == "input":
                    q.prompt_tokens = v
                else:
                    q.output_tokens = v
        from rich.progress import Progress

        with Progress(transient=True, disable=json_out) as bar:
            task = bar.add_task(f"load {'' if v is None else f'({kind} {v}) '}", total=len(rr))
            run: dict = {}
            try:
                run = run_load(url, model, rr, users=users, think_s=think_s, timeout_s=timeout_s,
                               max_duration_s=max_duration_s, endpoint=endpoint,
                               progress=lambda task=task: bar.advance(task), engine=eng,
                               max_concurrency=max_concurrency)
            finally:
                if out and run:
                    write_atomic(out if v is None else f"{Path(out).with_suffix('')}.{kind}{v}.json",
                                 dumps(run, indent=None) + "\n", "--out")
        if run["meta"].get("interrupted"):
            interrupted = True
            typer.echo(f"interrupted: {counts(run)}; partial results "
                       + (f"saved to {out}" if out else "not saved (no --out)"), err=True)
        run["meta"]["warmup_requests"] = warmup
        run["summary"] = summarize_run(run)
        if run.get("utilisation"):
            run["summary"]["utilisation"] = run["utilisation"]["summary"]
        if v is not None:
            run["sweep"] = {kind + "_tokens": v}
        runs.append(run)
        if out:
            write_atomic(out if v is None else f"{Path(out).with_suffix('')}.{kind}{v}.json",
                         dumps(run, indent=None) + "\n", "--out")
    if plot and not swept:
        write_atomic(plot, run_figure(runs[0]).to_html(include_plotlyjs="cdn"), "--plot")
    failed: list[str] = []
    ab = None
    if base is not None and not interrupted:
        if swept:
            raise CapacityError("--baseline compares one run: leave out the length sweep")
        changes = ab_compare(base, Requests.of_run(runs[0], "this run"))
        failed = gate(changes, rules or {})
        ab = {"baseline": baseline, "changes": as_dict(changes), "rules": rules, "failed": failed}
    if json_out:
        typer.echo(dumps([{"summary": r["summary"], **({"sweep": r["sweep"]} if "sweep" in r else {})}
                               for r in runs] if swept else {"summary": runs[0]["summary"],
                                                             **({"compare": ab} if ab else {})}))
        if interrupted:
            raise typer.Exit(130)
        if failed:
            raise typer.Exit(3)
        return
    from rich.console import Console

    con = Console()
    for r in runs:
        s = r["summary"]
        simulation_table({"summary": s, "model": model, "replicas": 1, "gpu": url, "tp": "-", "policy": "measured",
                          "step_cost_source": "measured by capacity loadtest", "saturated": False, "saturation": "",
                          "offered_rate_per_s": rate, "warmup_requests_excluded": 0, "preemptions": "-",
                          "kv_blocks_per_replica": 0, "block_size": 0, "littles_law": {"L": float("nan"), "lambda_W": float("nan")},
                          "notes": []}, con)
        con.print(f"outcomes: {counts(r)}" + (f"  ({r['sweep']})" if "sweep" in r else ""))
        if s.get("client_wait"):
            c = s["client_wait"]
            con.print(f"client cap of {c['max_concurrency']} in flight: requests waited {c['mean_ms']:,.0f} ms on "
                      f"average for a slot (max {c['max_ms']:,.0f} ms), not in TTFT or E2E", highlight=False)
        if r.get("utilisation"):
            for line in describe(r["utilisation"]):
                con.print(line, highlight=False)
    if interrupted:
        raise typer.Exit(130)  # the partial results are out; the exit code says the run did not complete
    if ab is not None:
        _print_changes(con, ab, f"this run against the baseline {baseline}")
        if failed:
            raise typer.Exit(3)


def _print_changes(con, ab: dict, title: str) -> None:
    con.print(f"[bold]{title}[/]", highlight=False)
    how = "paired requests" if ab["changes"][0].get("paired") else "requests"
    con.print(f"ms; throughput in output tokens/s; {ab['changes'][0]['level']:.0%} bootstrap intervals over {how}")
    con.print(Change.HEADER, highlight=False)
    for c in ab["changes"]:
        con.print(Change(**c).line(), highlight=False)
    for f in ab["failed"]:
        con.print(f"[red]regression[/]: {f}")
    if ab.get("rules") is not None and not ab["failed"]:
        con.print("gate: passed" if ab["rules"] else "gate: no --fail-on rules")


def _check_plot(plot: str | None, force: bool) -> None:
    """Before any work: an .html path that may be written, and plotly present."""
    if not plot:
        return
    if not plot.endswith(".html"):
        raise CapacityError(f"--plot {plot[:80]!r}: write the page to a .html file")
    require("plotly", "dashboard", "--plot")
    check_writable(plot, force, "--plot")


@app.command()
def compare(
    a: Annotated[str, typer.Argument(help="Run file A (the baseline): capacity loadtest --out or simulate --save-run")],
    b: Annotated[str, typer.Argument(help="Run file B (the change)")],
    level: Annotated[float, typer.Option("--level", help="Confidence level of the intervals")] = 0.95,
    fail_on: Annotated[Optional[str], typer.Option("--fail-on", help="Exit 3 on a significant regression beyond e.g. p95_ttft:+10%,p99_tpot:+10%,throughput:-5%")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap")] = 0,
    plot: Annotated[Optional[str], typer.Option("--plot", help="CDF overlays of TTFT/TPOT/E2E: FILE.html (plotly) or FILE.png (matplotlib)")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --plot file")] = False,
    json_out: JsonOpt = False,
) -> None:
    """A/B two runs: each metric's change with a bootstrap interval and a verdict (better, worse, no significant
    change); with --fail-on, a regression gate for CI (exit 3)."""
    if seed < 0:
        raise CapacityError(f"--seed {seed}: must be >= 0")
    rules = parse_rules(fail_on) if fail_on else {}
    if plot:
        if not plot.endswith((".html", ".png")):
            raise CapacityError(f"--plot {plot[:80]!r}: use a .html or .png file")
        check_writable(plot, force, "--plot")
    ra, rb = Requests.of_run(load_run(a), a), Requests.of_run(load_run(b), b)
    if plot:
        write_plot(ra, rb, plot, (f"A: {Path(a).name}", f"B: {Path(b).name}"))
    changes = ab_compare(ra, rb, level=level, seed=seed)
    failed = gate(changes, rules)
    ab = {"a": a, "b": b, "changes": as_dict(changes), "rules": rules, "failed": failed}
    if json_out:
        typer.echo(dumps(ab))
    else:
        from rich.console import Console

        _print_changes(Console(), ab, f"A (baseline): {a}\nB: {b}")
    if failed:
        raise typer.Exit(3)


@app.command()
def validate(
    run_file: Annotated[str, typer.Option("--run", help="A run JSON from `capacity loadtest --out`")],
    fit: Annotated[str, typer.Option("--fit", help="Engine fit JSON from `capacity calibrate --from-run`")],
    plot: Annotated[Optional[str], typer.Option("--plot", help="Measured and predicted time lines, utilisation: FILE.html")] = None,
    num_blocks: Annotated[Optional[int], typer.Option("--num-blocks", help="The engine's KV blocks (default: the run's record, else the fit's)")] = None,
    block_size: Annotated[Optional[int], typer.Option("--block-size", help="The engine's block size")] = None,
    max_batch_tokens: Annotated[Optional[int], typer.Option("--max-batch-tokens", help="Token budget per step")] = None,
    max_seqs: Annotated[Optional[int], typer.Option("--max-seqs", help="Max sequences per step")] = None,
    save_prediction: Annotated[Optional[str], typer.Option("--save-prediction", help="The predicted requests as a run file: capacity compare RUN PREDICTION")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --plot or --save-prediction file")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Replay a measured run (same arrivals and lengths) through the simulator and compare percentiles."""
    _check_plot(plot, force)
    if save_prediction:
        check_writable(save_prediction, force, "--save-prediction")
    given = engine_flags(num_blocks, block_size, max_batch_tokens, max_seqs)
    run = load_fit_run(run_file)
    cost, sched, frontend_s = load_fit(fit)
    warnings = []
    if given or (run.get("meta") or {}).get("engine"):
        sched = run_engine(run, given, run_file)  # the limits this run was measured with
    else:
        warnings.append(f"{run_file} does not record the engine's limits: simulated with the fit's "
                        f"({', '.join(f'{k}={v}' for k, v in sched.items())})")
    warnings += [f"measured elsewhere than the fit's runs (theirs vs this run's): {m}"
                 for m in mismatches(fit_provenance(fit), (run.get("meta") or {}).get("provenance"))]
    sim = simulate_run(run, cost, sched, frontend_s=frontend_s, timeseries=bool(plot))
    rows = fit_compare(summarize_run(run), sim_summary(sim))
    preempt = {"predicted": int(sim.preemptions), "measured": measured_preemptions(run)}
    if plot:
        write_atomic(plot, run_figure(run, sim, int(sched["num_blocks"])).to_html(include_plotlyjs="cdn"), "--plot")
    if save_prediction:
        ids = [q.id for q in replay(run)]  # the simulator numbers the replayed requests in this order
        write_atomic(save_prediction, dumps(records_run(sim.records, 0, {"source": "capacity validate",
                                                                         "run": run_file, "fit": fit}, ids),
                                            indent=None) + "\n", "--save-prediction")
    if json_out:
        typer.echo(dumps({"rows": rows, "source": cost.source, "engine": sched, "preemptions": preempt,
                          "warnings": warnings}))
        return
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Predicted vs measured: {run_file} (step costs: {cost.source})", title_justify="left")
    for c in ("metric", "stat", "measured ms", "predicted ms", "error"):
        t.add_column(c, justify="left" if c in ("metric", "stat") else "right")
    for r in rows:
        scale = 1 if r["metric"] == "output tokens/s" else 1e3
        t.add_row(r["metric"], r["stat"], f"{r['measured_s'] * scale:,.1f}", f"{r['predicted_s'] * scale:,.1f}",
                  f"{r['rel_err']:+.1%}")
    Console().print(t)
    m = preempt["measured"]
    typer.echo(f"preemptions: measured {'-' if m is None else m} (from the engine's /metrics), predicted "
               f"{preempt['predicted']}; engine limits {', '.join(f'{k}={v}' for k, v in sched.items())}")


def measured_preemptions(run: dict) -> int | None:
    """Preemptions during the run, from the engine's own counter in its /metrics (last minus first scrape);
    None when the server exposes none."""
    vals = [sum(v for k, v in row.items() if k != "t" and "preemption" in k) for row in run.get("metrics") or []
            if any("preemption" in k for k in row)]
    return int(round(vals[-1] - vals[0])) if len(vals) >= 2 else None


@app.command("fit-engine")
def fit_engine_cmd(
    url: Annotated[str, typer.Option("--url", help="Server base URL, e.g. http://127.0.0.1:8000")],
    model: Annotated[str, typer.Option("--model", "-m", help="Model name the server expects")],
    engine_config: Annotated[str, typer.Option("--engine-config", help="The server's limits: num_blocks=N,block_size=N,max_num_batched_tokens=N,max_num_seqs=N")],
    out_dir: Annotated[str, typer.Option("--out-dir", help="Folder for the probe runs, the fit and the report")] = "engine-fit",
    attention: Annotated[str, typer.Option("--attention", help="per_sequence (vLLM, SGLang) or packed (transformers CB on CPU)")] = "per_sequence",
    scale: Annotated[float, typer.Option("--scale", help="Multiply every probe's request count (0.25-4)")] = 1.0,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per-request timeout")] = 120.0,
    force: Annotated[bool, typer.Option("--force", help="Write into an existing --out-dir")] = False,
    json_out: JsonOpt = False,
) -> None:
    """The guided engine fit: warm up, run four probes (single stream, short- and long-prompt bursts, a decode
    burst) against a live server, fit the step-cost terms with their uncertainty, and check the fit on a held-out
    run at a rate derived from the probes."""
    import math

    if not url.startswith(("http://", "https://")) or len(url) > 2048:
        raise CapacityError(f"--url {url[:80]!r}: expected http://HOST:PORT or https://...")
    if not math.isfinite(scale) or not 0.25 <= scale <= 4:
        raise CapacityError(f"--scale {scale}: must be in [0.25, 4]")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise CapacityError(f"--timeout-s {timeout_s}: must be a finite number > 0")
    if attention not in ("per_sequence", "packed"):
        raise CapacityError(f"--attention {attention!r}: use per_sequence or packed")
    eng = parse_engine_config(engine_config)
    d = Path(out_dir)
    if d.exists() and (not d.is_dir() or (any(d.iterdir()) and not force)):
        raise CapacityError(f"--out-dir {out_dir}: exists and is not an empty folder (use --force to write into it)")
    d.mkdir(parents=True, exist_ok=True)
    say = (lambda msg: None) if json_out else (lambda msg: typer.echo(msg, err=True))
    rep = run_recipe(url, model, eng, d, attention=attention, scale=scale, timeout_s=timeout_s, say=say)
    if json_out:
        typer.echo(dumps(rep))
        return
    terms = rep["terms"] or {}
    typer.echo(f"fit: {rep['fit']} (median |error| on the probes {rep['fit_median_abs_rel_err']:.1%})")
    for k, v in terms.items():
        f = v["factor_95"]
        typer.echo(f"  {k:12s} {v['value']:.4g}  95% x/ {'unbounded' if f is None else format(f, '.2f')}")
    for w in rep["warnings"]:
        typer.echo(f"warning: {w}", err=True)
    typer.echo(f"held-out run ({rep['held_out_rate_per_s']:.2f} req/s, never fitted): predicted vs measured")
    for r in rep["held_out_check"]:
        typer.echo(f"  {r['metric']} {r['stat']}: {r['predicted_s'] * 1e3:8.2f} vs {r['measured_s'] * 1e3:8.2f} ms "
                   f"({r['rel_err']:+.1%})")
