"""`capacity autoscale`: a replica pool that follows a time-varying load (capacity.sim.autoscale), a load curve or
a replayed trace, against static provisioning for the peak and against a perfect system (the lower bound), through
the run pipeline; with --startup-sweep, the start-up cliff per policy (capacity.plan.autoscale_sweep)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from capacity.cli.autoscale_inputs import AutoscaleInputs, minutes, print_bound, print_sweep
from capacity.cli.common import GpuMemOpt, JsonOpt, ModelOpt, app, engine_config, load_card
from capacity.cli.engine_options import FROM_DECLARATIONS, engine_options
from capacity.errors import CapacityError
from capacity.files import dumps
from capacity.io.fleet import ready_at
from capacity.model.gpus import get_gpu, with_memory
from capacity.plan.autoscale import autoscale_report
from capacity.sim.autoscale import AutoscaleConfig


@app.command()
@engine_options("autoscale", param="engine")
def autoscale(
    model: ModelOpt,
    workload: Annotated[Optional[str], typer.Option(
        "--workload", help="Workload YAML/JSON with curve arrivals (a daily curve); or --trace")] = None,
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU")] = "h100-sxm",
    engine: dict = FROM_DECLARATIONS,  # --tp, --max-num-seqs, --max-model-len: EngineConfig's declarations
    policy: Annotated[str, typer.Option("--policy", help="concurrency, queue, kv, predictive or sla (Dynamo's SLA "
                                        "planner: throughput-based with its correction factor)")] = "concurrency",
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
    trace: Annotated[Optional[str], typer.Option(
        "--trace", help="Replay a trace as published (Mooncake JSONL, Azure or BurstGPT CSV, capacity's own) instead "
        "of --workload; its load curve is its arrivals per --window-s")] = None,
    trace_format: Annotated[Optional[str], typer.Option(
        "--trace-format", help="--trace: mooncake, azure, burstgpt or capacity (default: read from the file)")] = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="--trace: multiply arrival times")] = 1.0,
    trace_window: Annotated[Optional[str], typer.Option(
        "--window", help="--trace: START:END seconds from its first request")] = None,
    bound: Annotated[bool, typer.Option("--bound/--no-bound", help="The perfect system's GPU-hours (needs an SLO or "
                                        "--per-replica-rate; the rate is the planner's search otherwise)")] = True,
    startup_sweep: Annotated[Optional[str], typer.Option(
        "--startup-sweep", help="LO:HI:STEP seconds: sweep the start-up delay and find where the SLO breaks")] = None,
    policies: Annotated[Optional[str], typer.Option(
        "--policies", help="--startup-sweep: comma-separated policies (default: --policy)")] = None,
    storage_gbps: Annotated[float, typer.Option(
        "--storage-gbps", help="--startup-sweep: storage bandwidth per replica for the start-up estimate, GB/s "
        "(0.01-100)")] = 2.0,
    workers: Annotated[Optional[int], typer.Option("--workers", help="--startup-sweep: processes (default: cores)")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Autoscaling over a load curve: replicas over time, P99 TTFT/TPOT per window against the SLO (violation
    minutes), GPU-hours and cost, against static provisioning for the peak. With --decode-tp, a prefill pool and
    a decode pool, each with its own controller."""

    if startup_s < 0:
        raise CapacityError(f"--startup-s: must be >= 0 (got {startup_s:g})")
    if static is not None and static < 1:
        raise CapacityError(f"--static: must be >= 1 (got {static})")
    card = load_card(model)
    g = with_memory(get_gpu(gpu), gpu_memory_gib)
    cfg = engine_config(**engine)
    tp = cfg.tensor_parallel_size
    slo_t = slo_ttft_ms / 1e3 if slo_ttft_ms else None
    slo_p = slo_tpot_ms / 1e3 if slo_tpot_ms else None
    settings = {"min_replicas": min_replicas, "max_replicas": max_replicas, "target": target, "interval_s": interval_s,
                "startup_s": startup_s, "cooldown_s": cooldown_s, "window_s": metric_window_s}
    inp = AutoscaleInputs(card, g, cfg, slo_t, slo_p, per_replica_rate, window_s, seed, router, settings)
    with inp.load(workload, trace, trace_format, time_scale, trace_window):
        if startup_sweep is not None:
            print_sweep(inp, startup_sweep, policies or policy, storage_gbps, workers, json_out)
            return
        if policies is not None:
            raise CapacityError("--policies: applies to --startup-sweep (one --policy per report)")
        asc = inp.controller(policy)
        decode = None
        if decode_tp is not None:
            if trace is not None:
                raise CapacityError("--trace with --decode-tp: a trace replay runs an aggregated pool")
            d_policy = decode_policy or policy
            dasc = AutoscaleConfig(min_replicas=decode_min if decode_min is not None else min_replicas,
                                   max_replicas=decode_max if decode_max is not None else max_replicas,
                                   policy=d_policy, target=decode_target if decode_target is not None else target,  # type: ignore[arg-type]
                                   interval_s=interval_s, startup_s=startup_s, cooldown_s=cooldown_s,
                                   window_s=metric_window_s, per_replica_rate=decode_rate,
                                   curve=inp.curve if d_policy == "predictive" else None)
            decode = (engine_config(**{**engine, "tensor_parallel_size": decode_tp}), dasc, link)
        elif any(x is not None for x in (decode_policy, decode_target, decode_min, decode_max, decode_rate)):
            raise CapacityError("--decode-policy/--decode-target/--decode-min/--decode-max/--decode-per-replica-rate: "
                                "need --decode-tp (a decode pool of its own)")
        per_replica = inp.per_replica() if bound and decode is None and (slo_t or slo_p or per_replica_rate) else None
        out = autoscale_report(card, g, cfg, inp.spec, asc, static, window_s=window_s, slo_ttft_s=slo_t,
                               slo_tpot_s=slo_p, price=price, seed=seed, router=router, decode=decode,
                               per_replica=per_replica, curve=inp.curve if trace is not None else None)
    _print_report(out, card.name, g.name, tp, policy, startup_s, window_s, bool(slo_t or slo_p), decode is not None,
                  json_out)


def _print_report(out: dict, model: str, gpu: str, tp: int, policy: str, startup_s: float, window_s: float,
                  has_slo: bool, disagg: bool, json_out: bool) -> None:

    a, s = out["autoscaled"], out["static"]
    n_static = s["replicas"]
    if json_out:
        typer.echo(dumps(out))
        return
    if disagg:
        _print_disagg_autoscale(out, model, gpu, window_s, has_slo)
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"Autoscaling {model} on {gpu} (tp={tp}): {policy} policy, start-up {startup_s:g} s, "
                    f"{a['requests']:,} requests over {a['simulated_s'] / 3600:.2f} h", title_justify="left")
    for c in ("layout", "replicas", "GPU-hours", "cost $", "SLO-miss min", "P99 TTFT ms", "P99 TPOT ms"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    for name, d, reps in (("auto", a, f"{a['replicas']['min']}-{a['replicas']['max']}"),
                          ("static", s, str(n_static))):
        t.add_row(name, reps, *_layout_cells(d, has_slo))
    con.print(t)
    con.print(f"autoscaling uses {_versus(a, s, f'{n_static} static replicas', window_s, has_slo)}")
    print_bound(con, out)
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
        tt.add_row(f"{t0 / 3600:.2f} h" if window_s >= 60 else f"{t0:.0f} s", f"{w['requests'][i]:.0f}", str(ready),
                   "-" if ttft is None else ("inf" if ttft == float("inf") else f"{ttft * 1e3:.0f}"),
                   "ok" if w["met"][i] else "[red]miss[/]")
    con.print(tt)


def _layout_cells(x: dict, slo: bool) -> tuple[str, ...]:
    """GPU-hours, cost, SLO-miss minutes and the P99s of one layout of an autoscale report."""
    return (f"{x['gpu_hours']:.2f}", f"{x['cost_usd']:.2f}" if x["cost_usd"] is not None else "-",
            minutes(x["violation_minutes"]) if slo else "-",
            f"{x['p99_ttft_s'] * 1e3:.0f}" if x["p99_ttft_s"] is not None else ("inf" if x["saturated"] else "-"),
            f"{(x['p99_tpot_s'] or 0) * 1e3:.1f}")


def _versus(a: dict, s: dict, static: str, window_s: float, slo: bool) -> str:
    """'N% fewer GPU-hours than STATIC' (or more) and the SLO-miss minutes of both: the autoscaled layout `a`
    against the static one `s`."""
    saved = 1 - a["gpu_hours"] / s["gpu_hours"] if s["gpu_hours"] else 0.0
    fewer = f"{saved:.0%} fewer" if saved >= 0 else f"{-saved:.0%} more"
    miss = (f"; SLO missed in {minutes(a['violation_minutes'])} of {minutes(a['windows'] * window_s / 60)} minutes "
            f"(static: {minutes(s['violation_minutes'])})" if slo else "")
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


