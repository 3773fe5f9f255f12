"""`capacity` command line. Domain errors are caught here, and only here: one line on stderr, exit 1."""
from __future__ import annotations

import json
import math
import sys
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
    from capacity.cli_costs import make_step_cost

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


# The planning, step-cost and ground-truth commands live in their own modules; importing them registers them
# on `app`.
from capacity import cli_costs, cli_plan, cli_truth  # noqa: E402,F401
from capacity.cli_plan import load_scenario  # noqa: E402,F401  (public: tests and the dashboard use it)


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
