"""`capacity colocate`, `pools` and `fleet-day`: several models or traffic classes on a fleet (`capacity autoscale`
is in capacity.cli.autoscale)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from capacity.cli.common import JsonOpt, ModelOpt, _lengths, app, engine_config, load_card
from capacity.cli.engine_options import FROM_DECLARATIONS, engine_options
from capacity.errors import CapacityError
from capacity.files import dumps, read_mapping, validate
from capacity.io.fleetday import day_table, load_day_report, totals_table
from capacity.model.gpus import get_gpu
from capacity.plan.colocate import LAYOUTS, Fleet, best_layout
from capacity.plan.colocate import colocate as run_layouts
from capacity.plan.fleetday import DayFleet
from capacity.plan.fleetday import fleet_day as run_day
from capacity.plan.pools import size_pools


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

    f = validate(Fleet, read_mapping(fleet), fleet)
    out = run_layouts(f, seed)
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
    verdict = best_layout(out) or "none (each misses an SLO)"
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
@engine_options("pools", help={"max_model_len": ""}, defaults={"max_model_len": 8192}, param="engine")
def pools(
    model: ModelOpt,
    interactive_rate: Annotated[float, typer.Option("--interactive-rate", help="Interactive requests/s")],
    batch_rate: Annotated[float, typer.Option("--batch-rate", help="Batch requests/s")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU")] = "h100-sxm",
    engine: dict = FROM_DECLARATIONS,  # --tp, --max-model-len: EngineConfig's declarations
    interactive_input: Annotated[str, typer.Option("--interactive-input-len")] = "1024",
    interactive_output: Annotated[str, typer.Option("--interactive-output-len")] = "256",
    batch_input: Annotated[str, typer.Option("--batch-input-len")] = "2048",
    batch_output: Annotated[str, typer.Option("--batch-output-len")] = "512",
    slo_ttft_ms: Annotated[float, typer.Option("--slo-ttft-ms", help="Interactive P99 TTFT")] = 500.0,
    slo_tpot_ms: Annotated[float, typer.Option("--slo-tpot-ms", help="Interactive P99 TPOT")] = 50.0,
    batch_deadline_s: Annotated[float, typer.Option("--batch-deadline-s", help="Batch P99 end-to-end")] = 600.0,
    max_replicas: Annotated[int, typer.Option("--max-replicas")] = 32,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests per simulation (at least)")] = 2000,
    price: Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="USD per GPU-hour")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Interactive and batch traffic of one model: one pool with priority scheduling vs two pools, each sized to
    the fewest replicas that hold the interactive SLO and the batch deadline; the cheaper one recommended."""

    if not 100 <= requests <= 100_000:
        raise CapacityError(f"--requests: 100 to 100000 (got {requests})")
    card = load_card(model)
    g = get_gpu(gpu)
    eng = engine_config(**engine)
    tp = eng.tensor_parallel_size
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

    if (fleet is None) == (report is None):
        raise CapacityError("give one of --fleet (simulate a day) or --report (print a saved report)")
    if workers is not None and not 1 <= workers <= 256:
        raise CapacityError(f"--workers: 1 to 256 (got {workers})")
    if report is not None:
        out = load_day_report(report)
    else:

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
