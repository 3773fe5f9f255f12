"""`capacity autoscale`: a replica pool that follows a time-varying load (capacity.sim.autoscale), against
static provisioning for the peak, through the run pipeline."""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from capacity.cli.common import GpuMemOpt, JsonOpt, ModelOpt, TpOpt, app, engine_config, load_card
from capacity.errors import CapacityError
from capacity.files import dumps


@app.command()
def autoscale(
    model: ModelOpt,
    workload: Annotated[str, typer.Option("--workload", help="Workload YAML/JSON with curve arrivals (a daily curve)")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU")] = "h100-sxm",
    tp: TpOpt = 1,
    policy: Annotated[str, typer.Option("--policy", help="concurrency, queue, kv or predictive")] = "concurrency",
    target: Annotated[float, typer.Option("--target", help="concurrency: requests per replica; queue: waiting per "
                                          "replica; kv: cache share")] = 32.0,
    min_replicas: Annotated[int, typer.Option("--min", help="Fewest replicas")] = 1,
    max_replicas: Annotated[int, typer.Option("--max", help="Most replicas")] = 8,
    startup_s: Annotated[float, typer.Option("--startup-s", help="Model load + engine start-up, s")] = 120.0,
    cooldown_s: Annotated[float, typer.Option("--cooldown-s", help="Scale down after wanting fewer this long, s")] = 300.0,
    interval_s: Annotated[float, typer.Option("--interval-s", help="Controller period, s")] = 15.0,
    metric_window_s: Annotated[float, typer.Option("--metric-window-s", help="The controller averages its metric "
                                                   "over this window, s (Knative's stable window; 0: instantaneous)")] = 60.0,
    per_replica_rate: Annotated[Optional[float], typer.Option(
        "--per-replica-rate", help="predictive: req/s one replica sustains under the SLO (`capacity plan`'s max rate)")] = None,
    static: Annotated[Optional[int], typer.Option("--static", help="Replicas of the static comparison (default: "
                                                  "the autoscaled run's peak)")] = None,
    window_s: Annotated[float, typer.Option("--window-s", help="Window of the P99 timeline, s")] = 300.0,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="SLO on P99 TTFT per window")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="SLO on P99 TPOT per window")] = None,
    price: Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="USD per GPU-hour")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option("--max-num-seqs")] = None,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    router: Annotated[str, typer.Option("--router", help="round_robin, least_outstanding, or queue (one FIFO at "
                                        "the router: a new replica takes queued requests at once)")] = "round_robin",
    gpu_memory_gib: GpuMemOpt = None,
    decode_tp: Annotated[Optional[int], typer.Option(
        "--decode-tp", help="Disaggregated: the --tp pool prefills, a decode pool of this TP decodes; each pool "
        "autoscales (the --decode-* options, default: the prefill pool's)")] = None,
    decode_policy: Annotated[Optional[str], typer.Option("--decode-policy", help="--decode-tp: the decode pool's policy")] = None,
    decode_target: Annotated[Optional[float], typer.Option("--decode-target", help="--decode-tp: its target")] = None,
    decode_min: Annotated[Optional[int], typer.Option("--decode-min", help="--decode-tp: its fewest replicas")] = None,
    decode_max: Annotated[Optional[int], typer.Option("--decode-max", help="--decode-tp: its most replicas")] = None,
    decode_rate: Annotated[Optional[float], typer.Option(
        "--decode-per-replica-rate", help="--decode-tp, predictive: req/s one decode replica sustains")] = None,
    link: Annotated[str, typer.Option("--link", help="--decode-tp: KV link, nvlink, ib-400, roce-200, eth-100")] = "nvlink",
    json_out: JsonOpt = False,
) -> None:
    """Autoscaling over a load curve: replicas over time, P99 TTFT/TPOT per window against the SLO (violation
    minutes), GPU-hours and cost, against static provisioning for the peak. With --decode-tp, a prefill pool and
    a decode pool, each with its own controller."""
    from capacity.files import read_mapping, validate
    from capacity.io.fleet import autoscale_report, ready_at
    from capacity.model.gpus import get_gpu, with_memory
    from capacity.sim.autoscale import AutoscaleConfig
    from capacity.workload import WorkloadSpec

    spec = validate(WorkloadSpec, read_mapping(workload), workload)
    if spec.arrivals.kind != "curve":
        raise CapacityError(f"--workload: arrivals.kind is {spec.arrivals.kind}; autoscaling follows a curve "
                            "(arrivals: {kind: curve, curve_file: ...})")
    curve = spec.total_curve()
    asc = AutoscaleConfig(min_replicas=min_replicas, max_replicas=max_replicas, policy=policy,  # type: ignore[arg-type]
                          target=target, interval_s=interval_s, startup_s=startup_s, cooldown_s=cooldown_s,
                          window_s=metric_window_s,
                          per_replica_rate=per_replica_rate, curve=curve if policy == "predictive" else None)
    if static is not None and static < 1:
        raise CapacityError(f"--static: must be >= 1 (got {static})")
    card = load_card(model)
    g = with_memory(get_gpu(gpu), gpu_memory_gib)
    cfg = engine_config(tensor_parallel_size=tp, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    slo_t = slo_ttft_ms / 1e3 if slo_ttft_ms else None
    slo_p = slo_tpot_ms / 1e3 if slo_tpot_ms else None
    decode = None
    if decode_tp is not None:
        d_policy = decode_policy or policy
        dasc = AutoscaleConfig(min_replicas=decode_min if decode_min is not None else min_replicas,
                               max_replicas=decode_max if decode_max is not None else max_replicas,
                               policy=d_policy, target=decode_target if decode_target is not None else target,  # type: ignore[arg-type]
                               interval_s=interval_s, startup_s=startup_s, cooldown_s=cooldown_s,
                               window_s=metric_window_s, per_replica_rate=decode_rate,
                               curve=curve if d_policy == "predictive" else None)
        decode = (engine_config(tensor_parallel_size=decode_tp, max_num_seqs=max_num_seqs,
                                max_model_len=max_model_len), dasc, link)
    elif any(x is not None for x in (decode_policy, decode_target, decode_min, decode_max, decode_rate)):
        raise CapacityError("--decode-policy/--decode-target/--decode-min/--decode-max/--decode-per-replica-rate: "
                            "need --decode-tp (a decode pool of its own)")
    out = autoscale_report(card, g, cfg, spec, asc, static, window_s=window_s, slo_ttft_s=slo_t, slo_tpot_s=slo_p,
                           price=price, seed=seed, router=router, decode=decode)
    a, s = out["autoscaled"], out["static"]
    n_static = s["replicas"]
    if json_out:
        typer.echo(dumps(out))
        return
    if decode is not None:
        _print_disagg_autoscale(out, card.name, g.name, window_s, bool(slo_t or slo_p))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"Autoscaling {card.name} on {g.name} (tp={tp}): {policy} policy, start-up {startup_s:g} s, "
                    f"{a['requests']:,} requests over {a['simulated_s'] / 3600:.2f} h", title_justify="left")
    for c in ("layout", "replicas", "GPU-hours", "cost $", "SLO-miss min", "P99 TTFT ms", "P99 TPOT ms"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    for name, d, reps in (("auto", a, f"{a['replicas']['min']}-{a['replicas']['max']}"),
                          ("static", s, str(n_static))):
        t.add_row(name, reps, *_layout_cells(d, bool(slo_t or slo_p)))
    con.print(t)
    con.print(f"autoscaling uses {_versus(a, s, f'{n_static} static replicas', window_s, bool(slo_t or slo_p))}")
    # the pool per window: replicas ready at each window's start, next to that window's P99 TTFT
    w = a["window"]
    rows = min(len(w["start_s"]), 48)
    step = max(1, -(-len(w["start_s"]) // rows))
    tt = Table(title=f"Per window of {window_s:g} s (every {step})", title_justify="left")
    for c in ("start", "requests", "ready", "P99 TTFT ms", "SLO"):
        tt.add_column(c, justify="right")
    for i in range(0, len(w["start_s"]), step):
        t0 = w["start_s"][i]
        ready = ready_at(out, t0)
        ttft = w["ttft_s"][i]
        tt.add_row(f"{t0 / 3600:.2f} h", f"{w['requests'][i]:.0f}", str(ready),
                   "-" if ttft is None else ("inf" if ttft == float("inf") else f"{ttft * 1e3:.0f}"),
                   "ok" if w["met"][i] else "[red]miss[/]")
    con.print(tt)


def _layout_cells(x: dict, slo: bool) -> tuple[str, ...]:
    """GPU-hours, cost, SLO-miss minutes and the P99s of one layout of an autoscale report."""
    return (f"{x['gpu_hours']:.2f}", f"{x['cost_usd']:.2f}" if x["cost_usd"] is not None else "-",
            f"{x['violation_minutes']:.0f}" if slo else "-",
            f"{x['p99_ttft_s'] * 1e3:.0f}" if x["p99_ttft_s"] is not None else ("inf" if x["saturated"] else "-"),
            f"{(x['p99_tpot_s'] or 0) * 1e3:.1f}")


def _versus(a: dict, s: dict, static: str, window_s: float, slo: bool) -> str:
    """'N% fewer GPU-hours than STATIC' (or more) and the SLO-miss minutes of both: the autoscaled layout `a`
    against the static one `s`."""
    saved = 1 - a["gpu_hours"] / s["gpu_hours"] if s["gpu_hours"] else 0.0
    fewer = f"{saved:.0%} fewer" if saved >= 0 else f"{-saved:.0%} more"
    miss = (f"; SLO missed in {a['violation_minutes']:.0f} of {a['windows'] * window_s / 60:.0f} minutes "
            f"(static: {s['violation_minutes']:.0f})" if slo else "")
    return f"{fewer} GPU-hours than {static}{miss}"


def _print_disagg_autoscale(out: dict, model: str, gpu: str, window_s: float, slo: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    a, s, d = out["autoscaled"], out["static"], out["decode"]
    con = Console()
    t = Table(title=f"Autoscaling {model} on {gpu}, disaggregated: prefill TP {out['tp']} ({out['policy']}), decode "
                    f"TP {d['tp']} ({d['policy']}), KV over {d['link']}; {a['requests']:,} requests over "
                    f"{a['simulated_s'] / 3600:.2f} h", title_justify="left")
    for c in ("layout", "prefill", "decode", "GPU-h", "cost $", "SLO-miss min", "P99 TTFT ms", "P99 TPOT ms"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    rows = (("auto", a, f"{a['replicas']['min']}-{a['replicas']['max']}",
             f"{a['decode_replicas']['min']}-{a['decode_replicas']['max']}"),
            ("static", s, str(s["replicas"]), str(s["decode_replicas"])))
    for name, x, pre, dec in rows:
        t.add_row(name, pre, dec, *_layout_cells(x, slo))
    con.print(t)
    con.print(f"autoscaling both pools uses {_versus(a, s, 'each pool at its peak', window_s, slo)}")


@app.command()
def colocate(
    fleet: Annotated[str, typer.Option("--fleet", help="Fleet YAML/JSON: gpu, gpus, models [{model, workload, "
                                       "slo_ttft_s, slo_tpot_s, replicas, share, engine}]")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Several models on GPUs of their own, sharing GPUs (their steps taking turns, memory split by shares) or
    swapped in and out of GPUs (one resident at a time, vLLM sleep mode): GPUs, each model's KV blocks and P99
    TTFT/TPOT against its SLO, in each layout."""
    from capacity.files import read_mapping, validate
    from capacity.plan.colocate import LAYOUTS, Fleet, simulate_fleet

    f = validate(Fleet, read_mapping(fleet), fleet)
    out: dict[str, Any] = {lay: simulate_fleet(f, lay, seed) for lay in LAYOUTS}
    out["units"] = "seconds"
    if json_out:
        typer.echo(dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"{len(f.models)} models on {f.gpu}: GPUs of their own, shared or swapped (P99s in ms; mem: "
                    "the engine's share of GPU memory)", title_justify="left")
    for c in ("layout", "model", "GPUs", "mem", "KV blocks", "TTFT", "TPOT", "SLO"):
        t.add_column(c, justify="left" if c in ("layout", "model", "SLO") else "right")
    for lay in LAYOUTS:
        r = out[lay]
        for i, m in enumerate(r["models"]):
            ms = lambda x: "-" if x is None else f"{x * 1e3:.1f}"
            t.add_row(lay if i == 0 else "", m["model"], str(r["gpus"]) if i == 0 else "",
                      f"{m['gpu_memory_utilization']:.2f}", f"{m['kv_blocks']:,}", ms(m["p99_ttft_s"]),
                      ms(m["p99_tpot_s"]), "met" if m["meets_slo"] else "[red]missed[/]")
        t.rows[-1].end_section = True
    con.print(t)
    ok = [lay for lay in LAYOUTS if out[lay]["meets_slo"]]
    verdict = min(ok, key=lambda lay: (out[lay]["gpus"], LAYOUTS.index(lay))) if ok else "none (each misses an SLO)"
    def said(lay: str) -> str:
        n = out[lay]["gpus"]
        return f"{lay}: {n} GPU{'s' if n != 1 else ''}, {'every SLO met' if out[lay]['meets_slo'] else 'an SLO missed'}"
    con.print("; ".join(said(lay) for lay in LAYOUTS) + f" -> {verdict} (the fewest GPUs; on a tie the more isolated layout).")
    sw = out["swapped"]
    con.print(f"Shared: the models' steps take turns on a GPU and each engine has only its share of memory for KV. "
              f"Swapped: {sw['swaps']} swaps ({sw['swaps_per_hour']:.0f}/h), each "
              f"{'/'.join(f'{x:.2f}' for x in sw['swap_s'])} s to wake (weights over a {f.host_link_gbps:g} GB/s host "
              "link) plus the sleeping model's copy out; a model keeps the GPU while it has requests in flight.")


@app.command()
def pools(
    model: ModelOpt,
    interactive_rate: Annotated[float, typer.Option("--interactive-rate", help="Interactive requests/s")],
    batch_rate: Annotated[float, typer.Option("--batch-rate", help="Batch requests/s")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU")] = "h100-sxm",
    tp: TpOpt = 1,
    interactive_input: Annotated[str, typer.Option("--interactive-input-len")] = "1024",
    interactive_output: Annotated[str, typer.Option("--interactive-output-len")] = "256",
    batch_input: Annotated[str, typer.Option("--batch-input-len")] = "2048",
    batch_output: Annotated[str, typer.Option("--batch-output-len")] = "512",
    slo_ttft_ms: Annotated[float, typer.Option("--slo-ttft-ms", help="Interactive P99 TTFT")] = 500.0,
    slo_tpot_ms: Annotated[float, typer.Option("--slo-tpot-ms", help="Interactive P99 TPOT")] = 50.0,
    batch_deadline_s: Annotated[float, typer.Option("--batch-deadline-s", help="Batch P99 end-to-end")] = 600.0,
    max_model_len: Annotated[int, typer.Option("--max-model-len")] = 8192,
    max_replicas: Annotated[int, typer.Option("--max-replicas")] = 32,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests per simulation (at least)")] = 2000,
    price: Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="USD per GPU-hour")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Interactive and batch traffic of one model: one pool with priority scheduling vs two pools, each sized to
    the fewest replicas that hold the interactive SLO and the batch deadline; the cheaper one recommended."""
    from capacity.cli.common import _lengths
    from capacity.model.gpus import get_gpu
    from capacity.plan.pools import size_pools

    if not 100 <= requests <= 100_000:
        raise CapacityError(f"--requests: 100 to 100000 (got {requests})")
    card = load_card(model)
    g = get_gpu(gpu)
    eng = engine_config(tensor_parallel_size=tp, max_model_len=max_model_len)
    from rich.console import Console

    err = Console(stderr=True)
    with err.status("sizing") as status:
        out = size_pools(card, g, eng, interactive_rate=interactive_rate, batch_rate=batch_rate,
                         interactive_len=(_lengths("--interactive-input-len", interactive_input),
                                          _lengths("--interactive-output-len", interactive_output)),
                         batch_len=(_lengths("--batch-input-len", batch_input),
                                    _lengths("--batch-output-len", batch_output)),
                         slo_ttft_s=slo_ttft_ms / 1e3, slo_tpot_s=slo_tpot_ms / 1e3, batch_deadline_s=batch_deadline_s,
                         max_replicas=max_replicas, requests=requests, price_per_gpu_hour=price,
                         progress=None if json_out else (lambda m: status.update(f"sizing {m}")))
    if json_out:
        typer.echo(dumps(out))
        return
    from rich.table import Table

    def f(x, scale=1e3, fmt=".0f"):
        return "-" if x is None else format(x * scale, fmt)

    t = Table(title=f"{card.name} on {g.name} (tp={tp}): {interactive_rate:g} interactive + {batch_rate:g} batch "
                    f"req/s; interactive P99 TTFT <= {slo_ttft_ms:g} ms, TPOT <= {slo_tpot_ms:g} ms; batch P99 E2E "
                    f"<= {batch_deadline_s:g} s", title_justify="left")
    for c in ("layout", "replicas", "GPUs", "int. TTFT ms", "int. TPOT ms", "batch E2E s"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    one, two = out["one_pool"], out["two_pools"]
    t.add_row("one pool, priority", str(one["replicas"] or "-"), str(one["gpus"] or "-"),
              f(one.get("interactive", {}).get("p99_ttft_s")), f(one.get("interactive", {}).get("p99_tpot_s"), fmt=".1f"),
              f(one.get("batch", {}).get("p99_e2e_s"), 1, ".1f"))
    ti, tb = two["interactive_pool"], two["batch_pool"]
    t.add_row("two pools", f"{ti['replicas'] or '-'} + {tb['replicas'] or '-'}", str(two["gpus"] or "-"),
              f(ti.get("interactive", {}).get("p99_ttft_s")), f(ti.get("interactive", {}).get("p99_tpot_s"), fmt=".1f"),
              f(tb.get("batch", {}).get("p99_e2e_s"), 1, ".1f"))
    con = Console()
    con.print(t)
    con.print(f"recommended: {out['recommended'] or 'neither fits within --max-replicas'}"
              + (" (cost per hour: " + ", ".join(f"{k} ${v:.2f}" for k, v in out["cost_per_hour"].items() if v)
                 + ")" if out.get("cost_per_hour") else ""))


@app.command("fleet-day")
def fleet_day(
    fleet: Annotated[Optional[str], typer.Option("--fleet", help="Day fleet YAML/JSON: gpu, price_per_gpu_hour, startup_s, "
                                                 "models [{model, workload (curve arrivals), slo_ttft_s, slo_tpot_s, "
                                                 "engine, share}]")] = None,
    report: Annotated[Optional[str], typer.Option("--report", help="Print a saved `fleet-day --json` report instead")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Processes for the day runs (default: cores)")] = None,
    shared: Annotated[bool, typer.Option("--shared/--no-shared", help="Also size the models sharing GPUs")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Several models over a day: static provisioning for the peak, reactive and predictive autoscaling per model,
    and the models sharing GPUs; GPU-hours, cost and SLO-miss minutes per model and for the fleet."""
    from capacity.files import read_mapping, validate
    from capacity.io.fleetday import day_table, load_day_report, totals_table

    if (fleet is None) == (report is None):
        raise CapacityError("give one of --fleet (simulate a day) or --report (print a saved report)")
    if workers is not None and not 1 <= workers <= 256:
        raise CapacityError(f"--workers: 1 to 256 (got {workers})")
    if report is not None:
        out = load_day_report(report)
    else:
        from capacity.plan.fleetday import DayFleet
        from capacity.plan.fleetday import fleet_day as run_day

        f = validate(DayFleet, read_mapping(fleet), fleet)  # type: ignore[arg-type]
        out = run_day(f, seed, workers=workers, progress=not json_out, shared=shared)
    if json_out:
        typer.echo(dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    money = out["price_per_gpu_hour"] is not None
    head, rows = day_table(out)
    t = Table(title=f"{len(out['models'])} models on {out['gpu']} over their day (start-up {out['startup_s']:g} s): "
                    f"GPU-hours, {'cost, ' if money else ''}SLO-miss minutes ({out['window_s'] / 60:g}-min windows), "
                    "P99s in ms", title_justify="left")
    keep = [0, 1, 2, 3] + ([4] if money else []) + [5, 6, 7]
    short = {"replicas (fewest-most)": "replicas", "cost (USD)": "USD", "SLO-miss minutes": "miss min",
             "P99 TTFT (ms)": "TTFT", "P99 TPOT (ms)": "TPOT"}
    for j in keep:
        t.add_column(short.get(head[j], head[j]), justify="left" if j < 2 else "right")
    fmt = {3: "{:.1f}", 4: "{:,.0f}", 5: "{:.0f}", 6: "{:.0f}", 7: "{:.1f}"}
    for k, row in enumerate(rows):
        cells = [("-" if row[j] is None else fmt[j].format(row[j]) if j in fmt else str(row[j])) for j in keep]
        if k % 3:
            cells[0] = ""
        if row[9] == "yes":
            cells[keep.index(5)] += " sat"
        t.add_row(*cells, end_section=k % 3 == 2)
    con.print(t)
    head, rows = totals_table(out)
    tt = Table(title="The fleet", title_justify="left")
    for c in ("layout", "GPU-h") + (("USD",) if money else ()) + ("miss min",):
        tt.add_column(c, justify="left" if c == "layout" else "right")
    for r in rows:
        if r[2] is None:
            continue
        name = r[0] if r[0] != "shared" else f"shared, {r[1]} GPUs all day"
        miss = "met at the peaks" if r[0] == "shared" else f"{r[4]:.0f}"
        tt.add_row(name, f"{r[2]:.1f}", *([f"{r[3]:,.0f}"] if money else []), miss)
    con.print(tt)
    sh = out.get("shared")
    if sh is not None and sh["gpus"] is None:
        con.print(f"shared: not possible: {sh['why']}")
    for m in out["models"]:
        con.print(f"{m['model']}: {m['per_replica_rate']:.3g} req/s per replica ({m['rate_source']}); reactive "
                  f"target {m['target']:.3g} in flight ({m['target_source']}); peak {m['peak_rate_per_s']:.3g}, "
                  f"mean {m['mean_rate_per_s']:.3g} req/s")
    con.print(f"{out['wall_s']:.0f} s of simulation (day runs in parallel)." + (
        " Shared GPUs are checked with every model at its peak at once (conservative when the peaks differ) and "
        "provisioned all day." if sh is not None else ""))
