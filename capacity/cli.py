"""`capacity` command line. Domain errors are caught here, and only here: one line on stderr, exit 1."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from capacity.errors import CapacityError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Predict GPU memory, concurrency and GPU count for LLM serving (vLLM-faithful).")

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model card YAML, HF config.json, or bundled card name")]
GpuOpt = Annotated[str, typer.Option("--gpu", "-g", help="GPU catalogue name (see `capacity gpus`) or GPU YAML")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size")]
KvOpt = Annotated[str, typer.Option("--kv-dtype", help="KV cache dtype: auto, fp8, int8")]
WOpt = Annotated[Optional[str], typer.Option("--weight-dtype", help="Override weight format: bf16, fp16, fp8, int8, int4")]
GroupOpt = Annotated[Optional[int], typer.Option("--quant-group-size", help="Group size for int4 (default 128)")]
UtilOpt = Annotated[float, typer.Option("--gpu-memory-utilization", help="Fraction of GPU memory vLLM may use")]
LenOpt = Annotated[Optional[int], typer.Option("--max-model-len", help="Max context (default: the model's)")]
SeqOpt = Annotated[Optional[int], typer.Option("--max-num-seqs", help="Max batch (default: vLLM's rule)")]
MnbtOpt = Annotated[Optional[int], typer.Option("--max-num-batched-tokens", help="Token budget per step")]
BlockOpt = Annotated[Optional[int], typer.Option("--block-size", help="KV block size in tokens")]
EagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs")]
NoChunkOpt = Annotated[bool, typer.Option("--no-chunked-prefill", help="Disable chunked prefill")]
ContigOpt = Annotated[bool, typer.Option("--contiguous", help="Contiguous (non-paged) KV reservation")]
GraphInOpt = Annotated[bool, typer.Option("--cuda-graphs-in-budget",
                                          help="As VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1")]
ActOpt = Annotated[Optional[float], typer.Option("--activation-gib", help="Measured activation peak, GiB")]
NtOpt = Annotated[Optional[float], typer.Option("--non-torch-gib", help="Measured non-torch memory, GiB")]
CgOpt = Annotated[Optional[float], typer.Option("--cuda-graph-gib", help="Measured CUDA-graph memory, GiB")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output")]


def _scenario(model, gpu, tp, kv_dtype, weight_dtype, group, util, max_model_len, max_num_seqs, mnbt, block,
              eager, no_chunk, contiguous, graphs_in, act_gib, nt_gib, cg_gib):
    from capacity.config_io import validate
    from capacity.engine import EngineConfig
    from capacity.gpus import get_gpu
    from capacity.model_card import load_model_card, resolve_model_path
    from capacity.units import GiB

    card = load_model_card(resolve_model_path(model))
    if weight_dtype is not None:
        card = card.with_overrides(weight_dtype=weight_dtype,
                                   quant_group_size=group or (128 if weight_dtype == "int4" else None))
    for name, val in (("--activation-gib", act_gib), ("--non-torch-gib", nt_gib), ("--cuda-graph-gib", cg_gib)):
        if val is not None and (val < 0 or not math.isfinite(val)):
            raise CapacityError(f"{name}: must be a finite number >= 0 (got {val})")
    data = {
        "tensor_parallel_size": tp, "kv_cache_dtype": kv_dtype, "gpu_memory_utilization": util,
        "max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": mnbt,
        "block_size": block, "enforce_eager": eager, "enable_chunked_prefill": not no_chunk,
        "paged_kv": not contiguous, "cuda_graphs_in_budget": graphs_in,
        "activation_bytes": None if act_gib is None else act_gib * GiB,
        "non_torch_bytes": None if nt_gib is None else nt_gib * GiB,
        "cuda_graph_bytes": None if cg_gib is None else cg_gib * GiB,
    }
    cfg = validate(EngineConfig, data, "options")
    return card, get_gpu(gpu), cfg


@app.command()
def memory(
    model: ModelOpt, gpu: GpuOpt = "h100-sxm", tp: TpOpt = 1, kv_dtype: KvOpt = "auto", weight_dtype: WOpt = None,
    quant_group_size: GroupOpt = None, gpu_memory_utilization: UtilOpt = 0.9, max_model_len: LenOpt = None,
    max_num_seqs: SeqOpt = None, max_num_batched_tokens: MnbtOpt = None, block_size: BlockOpt = None,
    enforce_eager: EagerOpt = False, no_chunked_prefill: NoChunkOpt = False, contiguous: ContigOpt = False,
    cuda_graphs_in_budget: GraphInOpt = False, activation_gib: ActOpt = None, non_torch_gib: NtOpt = None,
    cuda_graph_gib: CgOpt = None,
    target_concurrency: Annotated[Optional[int], typer.Option(
        "--target-concurrency", help="Also solve: smallest utilisation/TP and largest max_model_len for this many sequences")] = None,
    at_context: Annotated[int, typer.Option("--at-context", help="Context (tokens) for --target-concurrency")] = 4096,
    json_out: JsonOpt = False,
) -> None:
    """VRAM budget per rank (weights, activations, non-torch, CUDA graphs, KV), blocks, concurrency, and
    the batch x context table, as vLLM would reserve it at start-up."""
    from capacity import memory as mem

    card, g, cfg = _scenario(model, gpu, tp, kv_dtype, weight_dtype, quant_group_size, gpu_memory_utilization,
                             max_model_len, max_num_seqs, max_num_batched_tokens, block_size, enforce_eager,
                             no_chunked_prefill, contiguous, cuda_graphs_in_budget, activation_gib, non_torch_gib,
                             cuda_graph_gib)
    b = mem.budget(card, g, cfg)
    table = mem.batch_context_table(b, mem.default_batches(b.max_num_seqs), mem.default_contexts(b.max_model_len))
    inverse = None
    if target_concurrency is not None:
        if target_concurrency <= 0 or at_context <= 0:
            raise CapacityError(f"--target-concurrency and --at-context must be > 0 (got {target_concurrency}, {at_context})")
        inverse = {"concurrency": target_concurrency, "context": at_context}
        for key, fn in (("min_gpu_memory_utilization", lambda: mem.min_gpu_memory_utilization(card, g, cfg, target_concurrency, at_context)),
                        ("min_tp", lambda: mem.min_tp(card, g, cfg, target_concurrency, at_context)),
                        ("max_model_len", lambda: mem.max_model_len_for(card, g, cfg, target_concurrency))):
            try:
                inverse[key] = fn()
            except CapacityError as exc:  # an answer of "impossible" is a result here, shown with its reason
                inverse[key] = None
                inverse[key + "_why"] = str(exc)
    if json_out:
        out = {"budget": b.as_dict(), "batch_context_table": table, "units": "bytes, tokens"}
        if inverse:
            out["inverse"] = inverse
        typer.echo(json.dumps(out, indent=2, default=float))
        return
    from rich.console import Console

    from capacity.report import memory_tables

    console = Console()
    memory_tables(b, table, console)
    if inverse:
        for key in ("min_gpu_memory_utilization", "min_tp", "max_model_len"):
            val = inverse[key]
            console.print(f"{key} for {target_concurrency} x {at_context if key != 'max_model_len' else 'max_model_len'} tokens: "
                          + (str(val) if val is not None else f"[red]none[/] ({inverse[key + '_why']})"))


@app.command()
def fleet(
    model: ModelOpt,
    gpu: Annotated[Optional[list[str]], typer.Option("--gpu", "-g", help="GPUs to compare (repeat); default all")] = None,
    context: Annotated[int, typer.Option("--context", help="Typical tokens per sequence (prompt + output)")] = 4096,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Sequences that must be in flight at once")] = 256,
    kv_dtype: KvOpt = "auto", weight_dtype: WOpt = None, gpu_memory_utilization: UtilOpt = 0.9,
    max_model_len: LenOpt = None, json_out: JsonOpt = False,
) -> None:
    """Memory-only fleet sizing across GPUs: for each GPU, the smallest TP that serves the model, its KV
    capacity, and the replicas and GPUs needed to hold `concurrency` sequences of `context` tokens (no
    latency: `capacity plan` adds the simulator)."""
    from capacity import memory as mem
    from capacity.gpus import catalogue

    if context <= 0 or concurrency <= 0:
        raise CapacityError(f"--context and --concurrency must be > 0 (got {context}, {concurrency})")
    names = gpu or list(catalogue())
    rows = []
    card = None
    for name in names:
        card, g, cfg = _scenario(model, name, 1, kv_dtype, weight_dtype, None, gpu_memory_utilization,
                                 max_model_len, None, None, None, False, False, False, False, None, None, None)
        row = {"gpu": g.name, "usable_memory_basis": g.usable_memory_basis}
        for tp in mem.TP_CHOICES:
            try:
                b = mem.budget(card, g, cfg.model_copy(update={"tensor_parallel_size": tp}))
            except CapacityError as exc:
                row["why_not_smaller_tp"] = str(exc)
                continue
            if context > b.max_model_len:
                raise CapacityError(f"--context {context} exceeds max_model_len {b.max_model_len} of {card.name}")
            seqs = min(b.concurrency_at(context), b.max_num_seqs)
            if seqs == 0:
                row["why_not_smaller_tp"] = f"tp={tp}: not one sequence of {context} tokens fits the KV cache"
                continue
            replicas = math.ceil(concurrency / seqs)
            row.update(tp=tp, weights_gib=b.weights_bytes / 2**30, kv_tokens=b.kv_tokens, seqs_per_replica=seqs,
                       kv_limited=seqs < b.max_num_seqs, replicas=replicas, gpus=tp * replicas,
                       max_model_len=b.max_model_len)
            break
        else:
            row["tp"] = None
        rows.append(row)
    if json_out:
        typer.echo(json.dumps({"model": card.name, "context": context, "concurrency": concurrency, "rows": rows,
                               "latency": "not part of this memory-only view: see `capacity plan`"}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Memory plan: {card.name}, {concurrency} sequences of {context:,} tokens in flight",
              title_justify="left")
    for col in ("GPU", "TP", "weights GiB/rank", "KV tokens/replica", "seqs/replica", "limited by", "replicas", "GPUs"):
        t.add_column(col, justify="right" if col not in ("GPU", "limited by") else "left")
    for r in sorted(rows, key=lambda r: (r["tp"] is None, r.get("gpus") or 0)):
        if r["tp"] is None:
            t.add_row(r["gpu"], "-", "", "", "", "[red]does not fit at tp<=16[/]", "", "")
            continue
        t.add_row(r["gpu"] + ("*" if r["usable_memory_basis"] == "estimate" else ""), str(r["tp"]),
                  f"{r['weights_gib']:.1f}", f"{r['kv_tokens']:,}", str(r["seqs_per_replica"]),
                  "KV cache" if r["kv_limited"] else "max_num_seqs", str(r["replicas"]), str(r["gpus"]))
    console = Console()
    console.print(t)
    console.print("[dim]* usable memory of this GPU is an estimate (no engine log seen). Latency (TTFT/TPOT/P99) "
                  "is not part of this memory-only view: `capacity plan` simulates it.[/]")


def _lengths(flag: str, value: str):
    """'1024' (fixed), '128-2048' (uniform), 'lognormal:MEAN:CV'."""
    from capacity.config_io import validate
    from capacity.workload import Lengths

    v = value.strip().lower()
    try:
        if v.startswith("lognormal:"):
            _, mean, cv = v.split(":")
            data = {"kind": "lognormal", "mean": float(mean), "cv": float(cv)}
        elif "-" in v:
            lo, hi = v.split("-")
            data = {"kind": "uniform", "low": int(lo), "high": int(hi)}
        else:
            data = {"kind": "fixed", "value": int(v)}
    except ValueError:
        raise CapacityError(f"{flag} {value!r}: expected N, LOW-HIGH or lognormal:MEAN:CV") from None
    return validate(Lengths, data, flag)


@app.command()
def simulate(
    model: ModelOpt, gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU (default h100-sxm, or the profile's)")] = None,
    tp: TpOpt = 1,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibrated step-cost profile (default: roofline)")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", help="Arrival rate, requests/s (all replicas)")] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests to simulate")] = 2000,
    input_len: Annotated[str, typer.Option("--input-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "1024",
    output_len: Annotated[str, typer.Option("--output-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "256",
    arrival: Annotated[str, typer.Option("--arrival", help="poisson, gamma, constant, closed")] = "poisson",
    cv: Annotated[float, typer.Option("--cv", help="Gamma arrivals: coefficient of variation (burstiness)")] = 1.0,
    users: Annotated[Optional[int], typer.Option("--users", help="Closed loop: concurrent users")] = None,
    think_s: Annotated[float, typer.Option("--think-s", help="Closed loop: mean think time, s")] = 0.0,
    workload: Annotated[Optional[str], typer.Option("--workload", help="Workload YAML/JSON (overrides the flags above)")] = None,
    policy: Annotated[str, typer.Option("--policy", help="continuous, static or priority")] = "continuous",
    replicas: Annotated[int, typer.Option("--replicas", help="Replicas behind the router")] = 1,
    router: Annotated[str, typer.Option("--router", help="round_robin or least_outstanding")] = "round_robin",
    max_batch: Annotated[Optional[int], typer.Option("--max-batch", help="Static batching: batch size")] = None,
    max_wait_ms: Annotated[float, typer.Option("--max-wait-ms", help="Static batching: batching window")] = 0.0,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching", help="Reuse shared-prefix KV blocks")] = False,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="SLO on TTFT for goodput")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="SLO on TPOT for goodput")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    warmup: Annotated[float, typer.Option("--warmup", help="Fraction of first requests excluded from metrics")] = 0.1,
    no_fast_forward: Annotated[bool, typer.Option("--no-fast-forward", help="One event per step (slow; for checks)")] = False,
    kv_dtype: KvOpt = "auto", gpu_memory_utilization: UtilOpt = 0.9, max_model_len: LenOpt = None,
    max_num_seqs: SeqOpt = None, max_num_batched_tokens: MnbtOpt = None, block_size: BlockOpt = None,
    allow_profile_mismatch: Annotated[bool, typer.Option("--allow-profile-mismatch")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Simulate serving: percentiles of TTFT, TPOT, ITL, E2E and queue wait (ms), throughput, goodput."""
    from capacity import memory as mem
    from capacity.config_io import read_mapping, validate
    from capacity.scenario import run_scenario
    from capacity.workload import Arrivals, RequestClass, WorkloadSpec

    prof_gpu = None
    if profile and gpu is None:
        from capacity.profile import load_profile

        prof_gpu = load_profile(profile).provenance.gpu
    card, g, cfg = _scenario(model, gpu or prof_gpu or "h100-sxm", tp, kv_dtype, None, None, gpu_memory_utilization,
                             max_model_len, max_num_seqs, max_num_batched_tokens, block_size, False, False, False,
                             False, None, None, None)
    b = mem.budget(card, g, cfg)
    if workload:
        spec = validate(WorkloadSpec, read_mapping(workload), workload)
    else:
        if requests <= 0:
            raise CapacityError(f"--requests: must be > 0 (got {requests})")
        arr = {"kind": arrival, "cv": cv, "think_s": think_s}
        if arrival == "closed":
            arr["users"] = users
        else:
            if rate is None:
                raise CapacityError("--rate is required for open-loop arrivals (or use --arrival closed --users N)")
            arr["rate_per_s"] = rate
        cls = RequestClass(slo_ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                           slo_tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None)
        spec = WorkloadSpec(arrivals=validate(Arrivals, arr, "arrival options"), input_len=_lengths("--input-len", input_len),
                            output_len=_lengths("--output-len", output_len), num_requests=requests, classes=[cls])
    cost = make_step_cost(card, gpu if profile else g.name, tp, profile, allow_profile_mismatch)
    res = run_scenario(b, cost, spec, policy=policy, replicas=replicas, router=router, seed=seed,
                       warmup_fraction=warmup, fast_forward=not no_fast_forward, prefix_caching=prefix_caching,
                       static_max_batch=max_batch, static_max_wait_s=max_wait_ms / 1e3)
    out = res.as_dict()
    out.update(model=card.name, gpu=g.name, tp=tp, replicas=replicas, requests=spec.num_requests)
    if json_out:
        typer.echo(json.dumps(out, indent=2, default=float))
        return
    from rich.console import Console

    from capacity.report import simulation_table

    simulation_table(out, Console())


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
    prefill_sweep: Annotated[Optional[str], typer.Option("--prefill-sweep", help="Input lengths at the fixed output length")] = None,
    decode_sweep: Annotated[Optional[str], typer.Option("--decode-sweep", help="Output lengths at the fixed input length")] = None,
    endpoint: Annotated[str, typer.Option("--endpoint", help="completions or chat")] = "completions",
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per-request timeout")] = 60.0,
    max_duration_s: Annotated[float, typer.Option("--max-duration-s", help="Bound on the whole run")] = 600.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Optional[str], typer.Option("--out", help="Run JSON to write (partial results on interrupt)")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Load-test an OpenAI-compatible server; report the simulator's metrics (vllm bench serve conventions)."""
    import numpy as np

    from capacity.loadtest import counts, run_load, summarize_run
    from capacity.workload import Arrivals, WorkloadSpec, generate, load_trace

    if requests <= 0 or timeout_s <= 0 or max_duration_s <= 0:
        raise CapacityError("--requests, --timeout-s and --max-duration-s must be > 0")
    if endpoint not in ("completions", "chat"):
        raise CapacityError(f"--endpoint {endpoint!r}: use completions or chat")
    li, lo = _lengths("--input-len", input_len), _lengths("--output-len", output_len)
    if trace:
        reqs = load_trace(trace)[:requests]
    else:
        if users is None and rate is None:
            raise CapacityError("give --rate (open loop), --users (closed loop) or --trace")
        arr = Arrivals(kind=arrival, rate_per_s=rate or 1.0, cv=cv)
        reqs = generate(WorkloadSpec(arrivals=arr, input_len=li, output_len=lo, num_requests=requests),
                        np.random.default_rng(seed))
    sweep = None
    if prefill_sweep or decode_sweep:
        vals = [int(v) for v in (prefill_sweep or decode_sweep).split(",")]
        sweep = ("input" if prefill_sweep else "output", vals)
    runs = []
    for v in (sweep[1] if sweep else [None]):
        rr = [dataclasses.replace(r) for r in reqs]
        if v is not None:
            for r in rr:
                if sweep[0] == "input":
                    r.prompt_tokens = v
                else:
                    r.output_tokens = v
        from rich.progress import Progress

        with Progress(transient=True, disable=json_out) as bar:
            task = bar.add_task(f"load {'' if v is None else f'({sweep[0]} {v}) '}", total=len(rr))
            run = {}
            try:
                run = run_load(url, model, rr, users=users, think_s=think_s, timeout_s=timeout_s,
                               max_duration_s=max_duration_s, endpoint=endpoint,
                               progress=lambda: bar.advance(task))
            finally:
                if out and run:
                    Path(out if v is None else f"{Path(out).with_suffix('')}.{sweep[0]}{v}.json").write_text(
                        json.dumps(run, default=float) + "\n")
        if run["meta"].get("interrupted"):
            typer.echo(f"interrupted: {counts(run)}; partial results "
                       + (f"saved to {out}" if out else "not saved (no --out)"), err=True)
        run["summary"] = summarize_run(run)
        if v is not None:
            run["sweep"] = {sweep[0] + "_tokens": v}
        runs.append(run)
        if out:
            Path(out if v is None else f"{Path(out).with_suffix('')}.{sweep[0]}{v}.json").write_text(
                json.dumps(run, default=float) + "\n")
    if json_out:
        typer.echo(json.dumps([{"summary": r["summary"], **({"sweep": r["sweep"]} if "sweep" in r else {})}
                               for r in runs] if sweep else {"summary": runs[0]["summary"]}, indent=2, default=float))
        return
    from rich.console import Console

    from capacity.report import simulation_table

    con = Console()
    for r in runs:
        s = r["summary"]
        simulation_table({"summary": s, "model": model, "replicas": 1, "gpu": url, "tp": "-", "policy": "measured",
                          "step_cost_source": "measured by capacity loadtest", "saturated": False, "saturation": "",
                          "offered_rate_per_s": rate, "warmup_requests_excluded": 0, "preemptions": "-",
                          "kv_blocks_per_replica": 0, "block_size": 0, "littles_law": {"L": float("nan"), "lambda_W": float("nan")},
                          "notes": []}, con)
        con.print(f"outcomes: {counts(r)}" + (f"  ({r['sweep']})" if "sweep" in r else ""))


@app.command()
def validate(
    run_file: Annotated[str, typer.Option("--run", help="A run JSON from `capacity loadtest --out`")],
    fit: Annotated[str, typer.Option("--fit", help="Engine fit JSON from `capacity calibrate --from-run`")],
    json_out: JsonOpt = False,
) -> None:
    """Replay a measured run (same arrivals and lengths) through the simulator and compare percentiles."""
    from capacity.loadtest import summarize_run
    from capacity.validate import compare, load_fit, load_run, sim_summary, simulate_run

    run = load_run(run_file)
    cost, sched = load_fit(fit)
    rows = compare(summarize_run(run), sim_summary(simulate_run(run, cost, sched)))
    if json_out:
        typer.echo(json.dumps({"rows": rows, "source": cost.source}, indent=2, default=float))
        return
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


@app.command()
def export(
    xlsx: Annotated[str, typer.Option("--xlsx", help="Workbook to write (.xlsx); CSV and JSON land next to it")],
    plan_file: Annotated[Optional[str], typer.Option("--plan", help="A plan JSON (`capacity plan --json`)")] = None,
    sweep_file: Annotated[Optional[str], typer.Option("--sweep", help="Sweep rows JSON (`capacity sweep --out x.json`)")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files")] = False,
) -> None:
    """Write the capacity-review workbook from a saved plan and/or sweep."""
    from capacity.export import load_saved, write_review

    plan_d, rows = load_saved(plan_file, sweep_file)
    paths = write_review(xlsx, plan_d, rows, force=force)
    typer.echo(f"wrote {', '.join(map(str, paths))}")


@app.command()
def calibrate(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model card (not needed with --from-run)")] = None,
    device: Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:N")] = "cpu",
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Profile JSON to write")] = None,
    tp: TpOpt = 1,
    quick: Annotated[bool, typer.Option("--quick", help="Small grids (seconds): for tests and smoke runs")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (recorded)")] = None,
    max_context: Annotated[Optional[int], typer.Option("--max-context", help="Largest context to measure")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and step shapes")] = 0,
    from_run: Annotated[Optional[list[str]], typer.Option("--from-run", help="Fit engine terms to measured runs instead")] = None,
    num_blocks: Annotated[int, typer.Option("--num-blocks", help="--from-run: the engine's KV blocks")] = 512,
    block_size: Annotated[int, typer.Option("--block-size", help="--from-run: the engine's block size")] = 16,
    max_batch_tokens: Annotated[int, typer.Option("--max-batch-tokens", help="--from-run: token budget per step")] = 512,
    max_seqs: Annotated[int, typer.Option("--max-seqs", help="--from-run: max sequences per step")] = 512,
) -> None:
    """Measure step costs with real torch kernels on a device and write a profile (needs torch:
    `pip install torch==2.13.0`); or, with --from-run, fit an engine's step-cost terms to measured runs."""
    from pathlib import Path

    from capacity.model_card import load_model_card, resolve_model_path

    if from_run:
        from capacity.validate import fit_engine, load_run, save_fit

        sched = {"num_blocks": num_blocks, "block_size": block_size, "max_num_batched_tokens": max_batch_tokens,
                 "max_num_seqs": max_seqs}
        fitted, info = fit_engine([load_run(r) for r in from_run], sched)
        dest = Path(out or "engine-fit.json")
        save_fit(dest, fitted, info, sched, list(from_run))
        typer.echo(f"wrote {dest}: fixed {fitted.fixed_s * 1e3:.3f} ms, per token {fitted.per_token_s * 1e6:.2f} us, "
                   f"per key {fitted.per_key_s * 1e9:.2f} ns, per pair {fitted.per_pair_s * 1e12:.2f} ps; "
                   f"median |error| on the fitted runs {info['median_abs_rel_err']:.1%}")
        return
    if model is None:
        raise CapacityError("--model is required (unless --from-run)")
    card = load_model_card(resolve_model_path(model))
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CapacityError("calibration needs torch: pip install torch==2.13.0") from None
    from calibrate.suite import run_suite

    if tp < 1:
        raise CapacityError(f"--tp: must be >= 1 (got {tp})")
    if max_context is not None and max_context < 2:
        raise CapacityError(f"--max-context: must be >= 2 (got {max_context})")
    dest = Path(out) if out else Path("calibrate/profiles") / f"{card.name}-{device.replace(':', '')}.json"
    prof = run_suite(card, device, dest, tp=tp, quick=quick, threads=threads, max_context=max_context, seed=seed,
                     command="capacity calibrate " + " ".join(sys.argv[2:]))
    hold = [st for st in prof.steps if st.role == "holdout"]
    typer.echo(f"wrote {dest}: {prof.provenance.device_name}, {len(prof.steps)} whole steps "
               f"({len(hold)} held out), fit median error {prof.fit.median_abs_rel_err:.1%}; "
               "check held-out accuracy with: python bench/step_accuracy.py --profile " + str(dest))


@app.command("step-cost")
def step_cost(
    model: ModelOpt,
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU (default: the profile's device, or h100-sxm)")] = None,
    tp: TpOpt = 1,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibrated profile JSON (default: roofline)")] = None,
    prefill: Annotated[Optional[list[str]], typer.Option("--prefill", help="NEW[:CACHED] tokens of a prefill chunk (repeat)")] = None,
    decode: Annotated[Optional[list[str]], typer.Option("--decode", help="BATCHxCONTEXT decoding sequences (repeat)")] = None,
    allow_profile_mismatch: Annotated[bool, typer.Option("--allow-profile-mismatch")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Time of one engine step (ms) with its breakdown, from the roofline or a calibrated profile."""
    from capacity.costs import PrefillChunk, StepPlan
    from capacity.model_card import load_model_card, resolve_model_path

    card = load_model_card(resolve_model_path(model))
    pre = []
    for item in prefill or []:
        parts = item.split(":")
        if len(parts) > 2 or not all(p.isdigit() for p in parts) or int(parts[0]) == 0:
            raise CapacityError(f"--prefill {item!r}: expected NEW[:CACHED] with NEW > 0, e.g. 512:1024")
        pre.append(PrefillChunk(int(parts[0]), int(parts[1]) if len(parts) == 2 else 0))
    dec: list[int] = []
    for item in decode or []:
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) == 0:
            raise CapacityError(f"--decode {item!r}: expected BATCHxCONTEXT with BATCH > 0, e.g. 32x2048")
        dec += [int(parts[1])] * int(parts[0])
    plan_ = StepPlan(tuple(pre), tuple(dec))
    longest = max([p.new_tokens + p.cached_tokens for p in pre] + [d + 1 for d in dec] + [0])
    if longest > card.max_position_embeddings:
        raise CapacityError(f"a sequence of {longest} tokens exceeds {card.name}'s max_position_embeddings "
                            f"({card.max_position_embeddings})")
    if plan_.num_tokens == 0:
        raise CapacityError("give at least one --prefill or --decode")
    cost = make_step_cost(card, gpu, tp, profile, allow_profile_mismatch)
    parts = cost.breakdown(plan_)
    total = sum(parts.values())
    if json_out:
        typer.echo(json.dumps({"step_s": total, "breakdown_s": parts, "source": cost.source,
                               "tokens": plan_.num_tokens}, indent=2))
        return
    typer.echo(f"step: {total * 1e3:.3f} ms for {plan_.num_tokens} tokens ({len(pre)} prefill chunks, "
               f"{len(dec)} decodes); source: {cost.source}")
    for k, v in parts.items():
        typer.echo(f"  {k:<14}{v * 1e3:10.3f} ms")


def make_step_cost(card, gpu: str | None, tp: int, profile: str | None, allow_mismatch: bool = False):
    """The step-cost implementation a command uses: the calibrated profile when given, else the roofline.
    With a profile, `gpu` None means "the profile's own device"."""
    from capacity.costs import RooflineCost
    from capacity.gpus import get_gpu

    if profile is None:
        return RooflineCost(card, get_gpu(gpu or "h100-sxm"), tp)
    from capacity.calibrated import CalibratedCost
    from capacity.profile import load_profile

    prof = load_profile(profile)
    gpu_name = get_gpu(gpu).name if gpu else None
    return CalibratedCost(prof, card, gpu=gpu_name, tp=tp, allow_mismatch=allow_mismatch, profile_path=profile)


def load_scenario(path: str, flags: dict):
    """A scenario file (has `model:`) or a model card (then flags fill the scenario)."""
    from capacity.config_io import read_mapping, validate
    from capacity.model_card import load_model_card, resolve_model_path
    from capacity.planner import Scenario

    p = resolve_model_path(path)
    data = read_mapping(p)
    if "model" in data and "num_layers" not in data:
        sc = validate(Scenario, data, str(p))
        model = sc.model
        if isinstance(model, dict):
            from capacity.model_card import ModelCard

            card = validate(ModelCard, model, f"{p}: model")
        else:
            mp = (p.parent / model) if not Path(model).is_absolute() and (p.parent / model).is_file() else model
            card = load_model_card(resolve_model_path(str(mp)))
        over = {k: v for k, v in flags.items() if v is not None}
        if over:
            sc = validate(Scenario, _merge(sc.model_dump(), over), str(p) + " + flags")
        return sc, card
    card = load_model_card(p)
    data = _merge({"model": str(p)}, {k: v for k, v in flags.items() if v is not None})
    return validate(Scenario, data, "options"), card


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@app.command()
def plan(
    model: Annotated[str, typer.Option("--model", "-m", help="Scenario YAML (see examples/) or a model card")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU (default h100-sxm)")] = None,
    rate: Annotated[Optional[float], typer.Option("--target-rate", help="Requests/s the service must sustain")] = None,
    input_len: Annotated[Optional[str], typer.Option("--input-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = None,
    output_len: Annotated[Optional[str], typer.Option("--output-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = None,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="TTFT SLO (default 1500)")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="TPOT SLO (default 50)")] = None,
    percentile: Annotated[Optional[int], typer.Option("--percentile", help="SLO percentile: 90, 95 or 99")] = None,
    price: Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="For cost per 1M output tokens")] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", help="Fix TP (default: searched)")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibrated profile (tp=1)")] = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help="Simulations per probe")] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests per simulation")] = None,
    executor: Annotated[str, typer.Option("--executor", help="pool, serial or ray")] = "pool",
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster (implies --executor ray)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the result cache")] = False,
    xlsx: Annotated[Optional[str], typer.Option("--xlsx", help="Also write a capacity-review workbook (+ CSV, JSON)")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing export files")] = False,
    json_out: JsonOpt = False,
) -> None:
    """The capacity plan: memory budget, max batch x max context frontier with P99 and capacity, max
    sustainable rate under the SLOs, TP/replicas/GPUs for the target rate with cost, a verified recommended
    `vllm serve` configuration, and trade-offs."""
    import time

    from capacity.planner import make_plan
    from capacity.sweep import make_executor

    flags: dict = {"gpu": gpu, "target_rate_per_s": rate, "price_per_gpu_hour": price, "profile": profile}
    slo = {k: v for k, v in (("ttft_s", slo_ttft_ms and slo_ttft_ms / 1e3), ("tpot_s", slo_tpot_ms and slo_tpot_ms / 1e3),
                             ("percentile", percentile)) if v is not None}
    if slo:
        flags["slo"] = slo
    wl = {}
    if input_len:
        wl["input_len"] = _lengths("--input-len", input_len).model_dump()
    if output_len:
        wl["output_len"] = _lengths("--output-len", output_len).model_dump()
    if wl:
        flags["workload"] = wl
    if tp is not None:
        flags["engine"] = {"tensor_parallel_size": tp}
    search = {k: v for k, v in (("seeds", seeds), ("requests", requests)) if v is not None}
    if search:
        flags["search"] = search
    sc, card = load_scenario(model, flags)
    if xlsx:
        from capacity.export import check_destination

        check_destination(xlsx, force)  # fail before minutes of simulation, not after
    ex = make_executor("ray" if ray_address else executor, ray_address=ray_address, progress=not json_out,
                       cache=not no_cache)
    t0 = time.perf_counter()
    try:
        p = make_plan(sc, card, ex)
    finally:
        ex.close()
    wall = time.perf_counter() - t0
    from capacity.report import plan_dict, plan_report

    if xlsx:
        from capacity.export import write_review

        paths = write_review(xlsx, plan_dict(p), force=force)
        if not json_out:
            typer.echo(f"wrote {', '.join(map(str, paths))}")
    if json_out:
        typer.echo(json.dumps({**plan_dict(p), "wall_s": wall, "cache_hits": ex.hits, "simulations": ex.misses},
                              indent=2, default=float))
        return
    from rich.console import Console

    plan_report(p, Console(), wall, ex)


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
    json_out: JsonOpt = False,
) -> None:
    """Simulate a grid over any scenario fields (dotted paths) and tabulate P50/P99 TTFT, TPOT and tokens/s."""
    from capacity.config_io import validate
    from capacity.planner import Scenario, SimTask
    from capacity.sweep import grid, make_executor, parse_axis

    axes = [parse_axis(v) for v in vary or []]
    if prefill_sweep:
        axes.append(parse_axis(f"workload.input_len={prefill_sweep}"))
        axes[-1] = ("workload.input_len", [{"kind": "fixed", "value": v} for v in axes[-1][1]])
    if decode_sweep:
        axes.append(parse_axis(f"workload.output_len={decode_sweep}"))
        axes[-1] = ("workload.output_len", [{"kind": "fixed", "value": v} for v in axes[-1][1]])
    sc, card = load_scenario(model, {"gpu": gpu})
    base = sc.model_dump()
    base["model"] = card.model_dump()
    points = grid(base, axes)
    tasks, meta = [], []
    from capacity.model_card import ModelCard
    from capacity.workload import Arrivals

    for point, data in points:
        s2 = validate(Scenario, data, f"sweep point {point}")
        c2 = validate(ModelCard, s2.model, f"sweep point {point}: model")
        r = rate or s2.target_rate_per_s
        wl = s2.workload.model_copy(update={"arrivals": Arrivals(kind="poisson", rate_per_s=r), "num_requests": requests})
        eng = {"tensor_parallel_size": 1, **s2.engine}
        for sd in range(seeds):
            tasks.append(SimTask(c2.model_dump(), s2.gpu, eng, wl.model_dump(), sd, 1, "round_robin", s2.profile))
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
        def avg(key, stat):
            vals = [x[key].get(stat) for x in rr if x[key].get("n")]
            return sum(vals) / len(vals) if vals else None
        rows.append({**point, "rate_per_s": r, "saturated": any(x["saturated"] for x in rr),
                     "ttft_p50_s": avg("ttft", "p50"), "ttft_p99_s": avg("ttft", "p99"),
                     "tpot_p50_s": avg("tpot", "p50"), "tpot_p99_s": avg("tpot", "p99"),
                     "tokens_per_s": sum(x["tokens_per_s"] for x in rr) / len(rr), "source": rr[0]["source"]})
    if out:
        from capacity.report import write_rows

        write_rows(rows, out)
    if json_out:
        typer.echo(json.dumps({"rows": rows, "cache_hits": ex.hits, "simulations": ex.misses}, indent=2, default=float))
        return
    from rich.console import Console

    from capacity.report import sweep_table

    sweep_table(rows, [a for a, _ in axes], Console(), ex)


@app.command()
def gpus(json_out: JsonOpt = False) -> None:
    """List the GPU catalogue (SI units inside; GiB and TB/s shown)."""
    from capacity.gpus import catalogue

    cat = catalogue()
    if json_out:
        typer.echo(json.dumps({k: v.model_dump() for k, v in cat.items()}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="GPU catalogue (dense tensor rates)")
    for col in ("name", "usable GiB", "basis", "HBM TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "link GB/s/dir"):
        t.add_column(col)
    for g in cat.values():
        t.add_row(g.name, f"{g.usable_memory_bytes / 2**30:.2f}", g.usable_memory_basis, f"{g.mem_bw_bytes_per_s / 1e12:.2f}",
                  f"{(g.bf16_flops or 0) / 1e12:.0f}", f"{(g.fp8_flops or 0) / 1e12:.0f}" if g.fp8_flops else "-",
                  f"{g.interconnect_bytes_per_s / 1e9:.0f}")
    Console().print(t)


@app.command()
def models(json_out: JsonOpt = False) -> None:
    """List bundled model cards with their parameter counts and KV bytes per token."""
    from capacity.memory import kv_bytes_per_token
    from capacity.model_card import MODELS_DIR, load_model_card

    rows = []
    for p in sorted(MODELS_DIR.glob("*.yaml")):
        try:
            c = load_model_card(p)
        except CapacityError:
            continue  # scenario files live here too
        rows.append({"card": p.stem, "params": c.params, "kv_bytes_per_token": kv_bytes_per_token(c, c.dtype),
                     "weights": c.weight_format, "moe": c.moe is not None, "mla": c.mla is not None})
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Bundled model cards")
    for col in ("card", "params (B)", "KV B/token", "weights", "kind"):
        t.add_column(col)
    for r in rows:
        kind = "MLA+MoE" if r["mla"] and r["moe"] else "MoE" if r["moe"] else "dense"
        t.add_row(r["card"], f"{r['params'] / 1e9:.2f}", f"{r['kv_bytes_per_token']:,.0f}", r["weights"], kind)
    Console().print(t)


def main() -> None:
    """Entry point: domain errors become one line on stderr and exit code 1; usage errors (a bad option
    type, an unknown option), which the CLI framework reports with exit code 2, also exit 1."""
    import warnings

    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        app()
    except CapacityError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except SystemExit as exc:
        sys.exit(1 if exc.code == 2 else exc.code)


if __name__ == "__main__":
    main()
