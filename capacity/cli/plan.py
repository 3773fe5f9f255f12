"""`capacity plan`, `capacity sweep` and `capacity export`: scenario files, the planner, sweeps, the review workbook."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from capacity.cli.common import (
    AcceptOpt,
    CompOpt,
    DraftOpt,
    DraftVocabOpt,
    GpuMemOpt,
    GroupOpt,
    ImageDatasetOpt,
    ImageShareOpt,
    ImageSizeOpt,
    ImagesOpt,
    JsonOpt,
    OutputOpt,
    SpecOpt,
    WOpt,
    _lengths,
    _prices,
    app,
    image_section,
    output_kind,
    speculative_fields,
)
from capacity.cli.engine_options import FROM_DECLARATIONS, engine_options
from capacity.cli.layouts import plan_layouts
from capacity.errors import CapacityError
from capacity.files import check_writable, dumps, strict_json, validate
from capacity.io.export import check_destination, load_saved, tables, write_review
from capacity.io.fleet import load_report
from capacity.io.fleetday import load_day_report
from capacity.io.manifests import check_emit, emit_plan
from capacity.io.report import gpu_comparison, plan_report, sweep_table, to_csv, to_markdown, write_rows
from capacity.limits import MAX_CLOCK_S, MAX_RATE_PER_S, MIN_RATE_PER_S
from capacity.limits import check as bound
from capacity.model.card import ModelCard
from capacity.model.gpus import get_gpu, with_memory
from capacity.plan.compare import compare_gpus, comparison_table
from capacity.plan.executors import make_executor
from capacity.plan.planner import make_plan
from capacity.plan.scenario import Scenario, load_scenario
from capacity.plan.sweep import OPEN_LOOP, check_axes, grid, parse_axis
from capacity.plan.tasks import SimTask
from capacity.traces import sizing
from capacity.workload import Arrivals

TablesOpt = Annotated[bool, typer.Option(
    "--tables", help="With --xlsx: also write its JSON and each table as CSV beside the workbook")]


@app.command()
@engine_options("plan", optional=True, help={
    "tensor_parallel_size": "Fix TP (default: searched)",
    "data_parallel_size": "Data-parallel ranks per replica (vLLM --data-parallel-size)",
    "enable_expert_parallel": "MoE experts whole over tp x dp ranks",
    "max_model_len": "Fix max_model_len (default: the frontier searches it)",
    "max_num_seqs": "Fix max_num_seqs (default: the frontier searches it)"})
def plan(
    model: Annotated[str, typer.Option("--model", "-m", help="Scenario YAML (see examples/) or a model card")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU, or several to compare: h100-sxm,h200,l40s (default h100-sxm)")] = None,
    rate: Annotated[Optional[float], typer.Option("--target-rate", help="Requests/s the service must sustain")] = None,
    trace: Annotated[Optional[str], typer.Option(
        "--trace", help="Size for a trace (Mooncake, Azure, BurstGPT, capacity's): its busiest minute's rate and "
                        "its lengths, unless --target-rate/--input-len/--output-len say otherwise")] = None,
    input_len: Annotated[Optional[str], typer.Option("--input-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = None,
    output_len: Annotated[Optional[str], typer.Option("--output-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = None,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="TTFT SLO (default 1500)")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="TPOT SLO (default 50)")] = None,
    percentile: Annotated[Optional[int], typer.Option("--percentile", help="SLO percentile: 90, 95 or 99")] = None,
    price: Annotated[Optional[str], typer.Option("--price-per-gpu-hour", help="USD per GPU-hour: 2.5, or per GPU: h100-sxm=2.5,h200=3.6")] = None,
    headroom: Annotated[Optional[float], typer.Option("--headroom", help="Share of the max rate a replica runs at (default 0.8)")] = None,
    layouts: Annotated[Optional[str], typer.Option("--layouts", help="Compare layouts of --layout-gpus GPUs: tp,ep,dpN "
                                                   "(vLLM),adpN,adpN-ep (attention DP) or auto (docs/parallelism.md)")] = None,
    layout_gpus: Annotated[int, typer.Option("--layout-gpus", help="--layouts: GPUs of one replica")] = 8,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibrated profile (the TP search keeps to its TP size)")] = None,
    weight_dtype: WOpt = None, quant_group_size: GroupOpt = None, compute_dtype: CompOpt = None,
    settings: dict = FROM_DECLARATIONS,  # the engine options ("not given" by default), from EngineConfig's declarations
    seeds: Annotated[Optional[int], typer.Option("--seeds", help="Simulations per probe")] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests per simulation")] = None,
    executor: Annotated[str, typer.Option("--executor", help="pool, serial or ray")] = "pool",
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster (implies --executor ray)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the result cache")] = False,
    xlsx: Annotated[Optional[str], typer.Option("--xlsx", help="Also write a capacity-review workbook")] = None,
    tables_too: TablesOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing export files")] = False,
    gpu_memory_gib: GpuMemOpt = None,
    speculative: SpecOpt = None, acceptance: AcceptOpt = None, draft_model: DraftOpt = None,
    draft_vocab_size: DraftVocabOpt = None,
    images_per_request: ImagesOpt = None, image_size: ImageSizeOpt = None, image_share: ImageShareOpt = None,
    image_dataset: ImageDatasetOpt = None, json_out: JsonOpt = False, output: OutputOpt = None,
    emit: Annotated[Optional[tuple[str, str]], typer.Option("--emit", metavar="TARGET DIR", help="Also write manifests "
                    "that deploy the plan; TARGET: k8s, kserve, production-stack or llm-d (docs/deploy.md)")] = None,
    emit_autoscale: Annotated[Optional[str], typer.Option("--emit-autoscale", help="--emit's autoscaler: concurrency "
                              "(default), queue=N or kv=SHARE, the autoscale simulation's policies")] = None,
) -> None:
    """The capacity plan: memory budget, max batch x max context frontier with P99 and capacity, max
    sustainable rate under the SLOs, TP/replicas/GPUs for the target rate with cost, a verified recommended
    `vllm serve` configuration, and trade-offs."""
    import time


    kind = output_kind(output, json_out)
    json_out = kind == "json"
    gpus = [g.strip() for g in gpu.split(",") if g.strip()] if gpu else [None]
    prices = _prices(price, gpus)
    flags: dict = {"target_rate_per_s": rate, "profile": profile, "headroom": headroom}
    slo = {k: v for k, v in (("ttft_s", slo_ttft_ms and slo_ttft_ms / 1e3), ("tpot_s", slo_tpot_ms and slo_tpot_ms / 1e3),
                             ("percentile", percentile)) if v is not None}
    if slo:
        flags["slo"] = slo
    wl: dict = {}
    if trace:
        flags["target_rate_per_s"], wl, said = sizing(trace, rate)
        if not json_out:
            typer.echo(said, err=True)
    if input_len:
        wl["input_len"] = _lengths("--input-len", input_len).model_dump()
    if output_len:
        wl["output_len"] = _lengths("--output-len", output_len).model_dump()
    wl |= image_section(images_per_request, image_size, image_share, image_dataset)
    if wl:
        flags["workload"] = wl
    eng_flags = dict(settings)
    engine = eng_flags.pop("engine", None)
    engines = [e.strip() for e in engine.split(",") if e.strip()] if engine and "," in engine else None
    if engine is not None and not engines:
        eng_flags["engine"] = engine
    eng_flags.update(speculative_fields(speculative, acceptance, draft_model, draft_vocab_size))
    if eng_flags:
        flags["engine"] = eng_flags
    if gpu_memory_gib is not None:
        flags["gpu_memory_gib"] = gpu_memory_gib
    search = {k: v for k, v in (("seeds", seeds), ("requests", requests)) if v is not None}
    if search:
        flags["search"] = search
    if xlsx:

        check_destination(xlsx, force)  # fail before minutes of simulation, not after
    if emit or emit_autoscale:
        check_emit(emit, emit_autoscale, len(gpus) > 1 or bool(engines))  # before the simulations too
    if len(gpus) > 1 or engines:
        return _plan_gpus(model, flags, gpus, prices, (weight_dtype, quant_group_size, compute_dtype), executor, ray_address, no_cache,
                          xlsx, force, json_out, engines, tables_too)
    flags["gpu"] = gpus[0]
    flags["price_per_gpu_hour"] = prices.get(gpus[0] or "")
    sc, card = load_scenario(model, flags)
    card = _weights(card, weight_dtype, quant_group_size, compute_dtype)
    ex = make_executor("ray" if ray_address else executor, ray_address=ray_address, progress=not json_out,
                       cache=not no_cache)
    t0 = time.perf_counter()
    if layouts:
        return plan_layouts(sc, card, ex, layouts, layout_gpus, json_out)
    try:
        p = make_plan(sc, card, ex)
    finally:
        ex.close()
    wall = time.perf_counter() - t0

    if xlsx:

        paths = write_review(xlsx, p, force=force, tables_too=tables_too)
        if not json_out:
            typer.echo(f"wrote {', '.join(map(str, paths))}")
    if emit:
        said = emit_plan(p, emit, emit_autoscale)
        if not json_out:
            typer.echo(said)
    if json_out:
        typer.echo(dumps({**p.as_dict(), "wall_s": wall, "cache_hits": ex.hits, "simulations": ex.misses}))
        return
    if kind in ("csv", "md"):

        tabs = tables(strict_json(p.as_dict()))
        if kind == "csv":  # one table in a CSV: the frontier (--xlsx writes every table as CSV)
            typer.echo(to_csv(*tabs["Frontier"]), nl=False)
        else:
            typer.echo(f"## Capacity plan: {p.model} on {p.gpu}\n\n{p.gpus} x {p.gpu} ({p.replicas} replica"
                       f"{'s' if p.replicas != 1 else ''} of TP {p.tp}) for {p.target_rate:g} req/s; `{p.vllm_command}`\n")
            for name, (head, rows) in tabs.items():
                typer.echo(to_markdown(head, rows, name))
        return
    from rich.console import Console

    plan_report(p, Console(), wall, ex)


def _weights(card, weight_dtype, group, compute_dtype=None):
    if weight_dtype is not None:
        if group is None and weight_dtype == "int4":
            group = 128
        card = card.with_overrides(weight_dtype=weight_dtype, quant_group_size=group)
    return card.with_overrides(gemm_dtype=compute_dtype) if compute_dtype is not None else card


def _plan_gpus(model, flags, gpus, prices, weights, executor, ray_address, no_cache, xlsx, force, json_out,
               engines=None, tables_too=False):
    """`--gpu a,b,c` and/or `--engine vllm,sglang`: one plan per GPU type and engine, compared by cost per 1M
    output tokens (GPUs when unpriced), each labelled `gpu (engine)` when engines are compared."""
    import time


    scenarios = []
    for g in gpus:
        for e in engines or [None]:
            f = {**flags, "gpu": g, "price_per_gpu_hour": prices.get(g or "")}
            if e is not None:
                f["engine"] = {**flags.get("engine", {}), "engine": e}
            sc, card = load_scenario(model, f)
            scenarios.append((sc, _weights(card, *weights)))
    ex = make_executor("ray" if ray_address else executor, ray_address=ray_address, progress=not json_out,
                       cache=not no_cache)
    t0 = time.perf_counter()
    try:
        options = compare_gpus(scenarios, ex)
    finally:
        ex.close()
    wall = time.perf_counter() - t0
    best = next((o for o in options if o.plan is not None), None)
    if best is None:
        raise CapacityError("no GPU type can serve this: " + "; ".join(f"{o.gpu}: {o.why}" for o in options))
    if xlsx:

        paths = write_review(xlsx, best.plan, force=force, comparison=comparison_table(options), tables_too=tables_too)
        if not json_out:
            typer.echo(f"wrote {', '.join(map(str, paths))} (the comparison, then the plan of {best.label}, the "
                       "first in it)")
    if json_out:
        typer.echo(dumps({"comparison": [o.row() for o in options],
                          "plans": {o.label: o.plan.as_dict() for o in options if o.plan is not None},
                          "wall_s": wall, "cache_hits": ex.hits, "simulations": ex.misses}))
        return
    from rich.console import Console


    gpu_comparison(options, Console(), wall, ex)


@app.command()
def sweep(
    model: Annotated[str, typer.Option("--model", "-m", help="Scenario YAML or model card")],
    vary: Annotated[Optional[list[str]], typer.Option("--vary", help="FIELD=V1,V2,... (repeat for a grid)")] = None,
    prefill_sweep: Annotated[Optional[str], typer.Option("--prefill-sweep", help="Input lengths at fixed output, e.g. 512,1024,4096")] = None,
    decode_sweep: Annotated[Optional[str], typer.Option("--decode-sweep", help="Output lengths at fixed input")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", help="Arrival rate (default: the scenario's target)")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g")] = None,
    seeds: Annotated[int, typer.Option("--seeds")] = 2,
    requests: Annotated[int, typer.Option("--requests")] = 1000,
    executor: Annotated[str, typer.Option("--executor", help="pool, serial or ray")] = "pool",
    ray: Annotated[bool, typer.Option("--ray", help="Run on a local Ray")] = False,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster address")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache")] = False,
    out: Annotated[Optional[str], typer.Option("--out", help="Write results as JSON or CSV")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out file")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Simulate a grid over any scenario fields (dotted paths) and tabulate P50/P99 TTFT, TPOT and tokens/s."""
    import math


    if not 1 <= seeds <= 100:
        raise CapacityError(f"--seeds {seeds}: must be from 1 to 100")
    if requests <= 0:
        raise CapacityError(f"--requests {requests}: must be > 0")
    bound("requests", requests, "--requests")
    if rate is not None and (not math.isfinite(rate) or rate <= 0):
        raise CapacityError(f"--rate {rate}: must be a finite number > 0")

    if rate is not None and not MIN_RATE_PER_S <= rate <= MAX_RATE_PER_S:
        raise CapacityError(f"--rate {rate:g}: expected {MIN_RATE_PER_S:g} to {MAX_RATE_PER_S:g} req/s")
    if out:
        if not out.lower().endswith((".json", ".csv")):
            raise CapacityError(f"--out {out}: the name must end in .json or .csv")
        check_writable(out, force, "--out")  # before the simulations, not after them
    axes = [parse_axis(v) for v in vary or []]
    size = math.prod(len(v) for _, v in axes) if axes else 1
    bound("sweep_points", size * seeds, "the sweep grid (points x seeds)")
    if prefill_sweep:
        axes.append(parse_axis(f"workload.input_len={prefill_sweep}"))
        axes[-1] = ("workload.input_len", [{"kind": "fixed", "value": v} for v in axes[-1][1]])
    if decode_sweep:
        axes.append(parse_axis(f"workload.output_len={decode_sweep}"))
        axes[-1] = ("workload.output_len", [{"kind": "fixed", "value": v} for v in axes[-1][1]])
    check_axes(axes, rate is not None)
    sc, card = load_scenario(model, {"gpu": gpu})
    base = sc.model_dump(exclude_unset=True)
    base["model"] = card.model_dump()
    points = grid(base, axes)
    tasks, meta = [], []
    for point, data in points:
        s2 = validate(Scenario, data, f"sweep point {point}")
        assert isinstance(s2.model, dict)  # the grid's base carries the resolved card
        c2 = validate(ModelCard, s2.model, f"sweep point {point}: model")
        r = rate if rate is not None else s2.target_rate_per_s
        if requests / r > MAX_CLOCK_S:
            raise CapacityError(f"sweep point {point}: {requests:,} requests at {r:g} req/s would span "
                                f"{requests / r:.3g} s, more than {MAX_CLOCK_S:g} s")
        arr = s2.workload.arrivals  # its open-loop kind and cv, at the sweep's rate (what the planner simulates)
        if "workload.arrivals.cv" in point and arr.kind != "gamma":
            raise CapacityError(f"--vary workload.arrivals.cv: only gamma arrivals have a cv, the point {point} has "
                                f"{arr.kind} (add --vary workload.arrivals.kind=gamma)")
        arr = Arrivals(kind=arr.kind if arr.kind in OPEN_LOOP else "poisson", rate_per_s=r, cv=arr.cv)
        wl = s2.workload.model_copy(update={"arrivals": arr, "num_requests": requests})
        eng = s2.engine.model_dump(mode="json")
        task_gpu = (s2.gpu_name if s2.gpu_memory_gib is None  # a memory override travels as the GPU's fields
                    else with_memory(get_gpu(s2.gpu_name), s2.gpu_memory_gib).model_dump())
        for sd in range(seeds):
            tasks.append(SimTask(c2.model_dump(), task_gpu, eng, wl.model_dump(), sd, 1, "round_robin", s2.profile))
        meta.append((point, r))
    ex = make_executor("ray" if (ray or ray_address) else executor, ray_address=ray_address,
                       progress=not json_out, cache=not no_cache)
    try:
        res = ex.run(tasks)
    finally:
        ex.close()
    rows = []
    for j, (point, r) in enumerate(meta):
        rr = res[j * seeds:(j + 1) * seeds]
        def avg(key, stat, rr=rr):
            vals = [x.metric(key).stat(stat) for x in rr if x.metric(key).n]
            return sum(vals) / len(vals) if vals else None
        rows.append({**point, "rate_per_s": r, "saturated": any(x.saturated for x in rr),
                     "ttft_rising": any(x.rising for x in rr),
                     "ttft_p50_s": avg("ttft", "p50"), "ttft_p99_s": avg("ttft", "p99"),
                     "tpot_p50_s": avg("tpot", "p50"), "tpot_p99_s": avg("tpot", "p99"),
                     "tokens_per_s": sum(x.tokens_per_s for x in rr) / len(rr), "source": rr[0].source,
                     "kv_blocks": rr[0].kv_blocks, "preemptions": sum(x.preemptions for x in rr) / len(rr)})
    if out:

        write_rows(rows, out)
    if json_out:
        typer.echo(dumps({"rows": rows, "cache_hits": ex.hits, "simulations": ex.misses}))
        return
    from rich.console import Console


    sweep_table(rows, [a for a, _ in axes], Console(), ex)


@app.command()
def export(
    xlsx: Annotated[str, typer.Option("--xlsx", help="Workbook to write (.xlsx)")],
    plan_file: Annotated[Optional[str], typer.Option("--plan", help="A plan JSON (`capacity plan --json`)")] = None,
    sweep_file: Annotated[Optional[str], typer.Option("--sweep", help="Sweep rows JSON (`capacity sweep --out x.json`)")] = None,
    autoscale_file: Annotated[Optional[str], typer.Option(
        "--autoscale", help="An autoscale report JSON (`capacity autoscale --json`): adds the Autoscale sheet")] = None,
    fleet_day_file: Annotated[Optional[str], typer.Option(
        "--fleet-day", help="A fleet-day report JSON (`capacity fleet-day --json`): adds the Fleet day sheet")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files")] = False,
    tables_too: TablesOpt = False,
) -> None:
    """Write the capacity-review workbook from a saved plan, sweep, autoscale and/or fleet-day report."""

    plan_d, rows = (load_saved(plan_file, sweep_file) if plan_file or sweep_file or not (autoscale_file or fleet_day_file)
                    else (None, None))
    report = None
    if autoscale_file:

        report = load_report(autoscale_file)
    day = None
    if fleet_day_file:

        day = load_day_report(fleet_day_file)
    paths = write_review(xlsx, plan_d, rows, force=force, autoscale=report, fleet_day=day, tables_too=tables_too)
    typer.echo(f"wrote {', '.join(map(str, paths))}")
