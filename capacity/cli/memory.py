"""`capacity memory`, `capacity fleet`, `capacity gpus`, `capacity models`: the VRAM budget and the catalogues."""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional

import typer

from capacity.cli.common import (
    GpuMemOpt,
    GpuOpt,
    GroupOpt,
    JsonOpt,
    ModelOpt,
    WOpt,
    _scenario,
    app,
    engine_config,
    load_card,
)
from capacity.cli.engine_options import FROM_DECLARATIONS, engine_options
from capacity.engine import memory as mem
from capacity.engine.memory import kv_bytes_per_token
from capacity.engine.sglang.config import dp_attention as sglang_dp_attention
from capacity.engine.sglang.memory import CURRENT as SG_CURRENT
from capacity.engine.sglang.memory import RELEASES as SG_RELEASES
from capacity.engine.trtllm.release import CURRENT as TRT_CURRENT
from capacity.engine.trtllm.release import DEFAULT_BACKEND as TRT_BACKEND
from capacity.engine.vllm.release import CURRENT, LAST_PATCH, fmt, release
from capacity.errors import CapacityError
from capacity.files import dumps
from capacity.io.memory_report import memory_tables
from capacity.io.schema import schema_markdown
from capacity.model.card import MODELS_DIR, load_model_card
from capacity.model.gpus import catalogue, get_gpu, with_memory
from capacity.model.weights import count_params
from capacity.plan.memory import memory_answer, sglang_json, sglang_memory_answer, sglang_misfit
from capacity.units import GiB


@app.command()
@engine_options("memory", help={"data_parallel_size": "Data-parallel ranks (vLLM --data-parallel-size)",
                                "enable_expert_parallel": "Experts split whole over TP x DP ranks (vLLM)"})
def memory(
    model: ModelOpt, gpu: GpuOpt = "h100-sxm", weight_dtype: WOpt = None, quant_group_size: GroupOpt = None,
    settings: dict = FROM_DECLARATIONS,  # the engine options, generated from EngineConfig's declarations
    gpu_memory_gib: GpuMemOpt = None,
    target_concurrency: Annotated[Optional[int], typer.Option(
        "--target-concurrency", help="Also solve: smallest utilisation/TP and largest max_model_len for this many sequences")] = None,
    at_context: Annotated[int, typer.Option("--at-context", help="Context (tokens) for --target-concurrency")] = 4096,
    mem_fraction_static: Annotated[Optional[float], typer.Option(
        "--mem-fraction-static", help="--engine sglang: SGLang's F (default: the release's own rule)")] = None,
    json_out: JsonOpt = False,
) -> None:
    """VRAM budget per rank (weights, activations, non-torch, CUDA graphs, KV), blocks, concurrency, and
    the batch x context table, as vLLM would reserve it at start-up (`--engine sglang[@X.Y]`: as SGLang sizes its
    KV pool)."""
    engine = settings.get("engine")
    if engine is not None and (engine == "sglang" or engine.startswith("sglang@")):
        s = settings
        cfg = engine_config(**s)  # SglangConfig: another engine's setting given (--max-loras, --pp ...) is refused in
        dp = sglang_dp_attention(cfg)  # one line, and DP attention's own checks run (--dp N --enable-dp-attention)
        if (n := getattr(cfg, "data_parallel_size", 1)) != dp:  # (dp_size() is 1 with DP attention)
            raise CapacityError(f"data_parallel_size {n}: SGLang's data parallelism is modelled with "
                                "--enable-dp-attention only (its replicas behind a router are not)")
        _sglang_memory(model, gpu, s["tensor_parallel_size"], s["kv_cache_dtype"], weight_dtype, quant_group_size,
                       s.get("max_model_len"), s.get("max_num_seqs"), s.get("max_num_batched_tokens"), engine,
                       mem_fraction_static, gpu_memory_gib, json_out, dp, getattr(cfg, "ep_size", 1))
        return
    if mem_fraction_static is not None:
        raise CapacityError("--mem-fraction-static: an SGLang setting (use it with --engine sglang)")

    card, g, cfg = _scenario(model, gpu, settings, weight_dtype, quant_group_size, gpu_memory_gib)
    ans = memory_answer(card, g, cfg, target_concurrency, at_context)
    b, inverse = ans.budget, ans.inverse
    if json_out:
        typer.echo(dumps(ans.as_dict()))
    else:
        from rich.console import Console

        console = Console()  # the numbers are the answer, fitting or not: stdout; the verdict is the error below
        memory_tables(b, ans.table, console, verdict=False)
        if inverse:
            for key in ("min_gpu_memory_utilization", "min_tp", "max_model_len"):
                val = inverse[key]
                what = at_context if key != "max_model_len" else "max_model_len"
                console.print(f"{key} for {target_concurrency} x {what} tokens: "
                              + (f"{val:,}" if isinstance(val, int) else str(val) if val is not None
                                 else f"[red]none[/] ({inverse[key + '_why']})"))
    if not b.fits:
        raise CapacityError(f"does not fit: {b.reason}")


def _sglang_memory(model, gpu, tp, kv_dtype, weight_dtype, quant_group_size, max_model_len, max_num_seqs,
                   max_num_batched_tokens, engine, mem_fraction_static, gpu_memory_gib, json_out, dp=1, ep=1) -> None:
    """`memory --engine sglang`: SGLang's start-up memory (capacity.engine.sglang)."""
    card = load_card(model, weight_dtype, quant_group_size)
    g = with_memory(get_gpu(gpu), gpu_memory_gib)
    b = sglang_memory_answer(card, g, tp, engine, mem_fraction_static=mem_fraction_static, context_len=max_model_len,
                             kv_cache_dtype=kv_dtype, chunked_prefill_size=max_num_batched_tokens,
                             max_running=max_num_seqs, dp_attention=dp, ep_size=ep)
    if json_out:
        typer.echo(dumps(sglang_json(b)))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"SGLang {b.release} start-up memory: {card.name} on {g.name}, tp={tp}{f', DP attention {dp}' if dp > 1 else ''} (GiB per rank)",
                  title_justify="left")
        t.add_column("term")
        t.add_column("GiB", justify="right")
        t.add_column("how")
        f_how = "the release's default" if b.mem_fraction_default else "given"
        for name, v, how in (
                ("GPU total", b.total_bytes / GiB, "what the GPU reports"),
                ("CUDA context + distributed init", b.context_bytes / GiB, "estimate (before SGLang's T0)"),
                ("T0: free at start-up", b.free_at_start_bytes / GiB, "mem_fraction_static is a share of it"),
                ("weights", b.weights_bytes / GiB, "counted from the card"),
                ("A: free after the weights", b.avail_after_weights_bytes / GiB, ""),
                ("reserve T0 x (1 - F)", b.reserve_bytes / GiB, "activations, CUDA graphs, request table"),
                ("KV pool", b.kv_pool_bytes / GiB, f"A - reserve; {b.kv_bytes_per_token:,} B per token")):
            t.add_row(name, f"{v:.2f}", how)
        con = Console()
        con.print(t)
        con.print(f"mem_fraction_static {b.mem_fraction_static:.3f} ({f_how}); KV pool {b.kv_tokens:,} tokens "
                  f"(conservative {b.kv_tokens_low:,}); max_running_requests {b.max_running_requests:,}; "
                  f"chunked_prefill_size {b.chunked_prefill_size:,}; cuda_graph_max_bs {b.cuda_graph_max_bs}; "
                  f"context_len {b.context_len:,}")
        for n in b.notes:
            con.print(f"note: {n}")
    if not b.fits and max_model_len is None and b.kv_tokens > 1:  # SGLang starts and caps requests (max_req_len)
        typer.echo(f"note: SGLang starts and refuses requests of {b.kv_tokens - 1:,} tokens or more (max_req_len); "
                   "set --max-model-len to plan for longer ones", err=True)
    elif not b.fits:
        raise CapacityError("does not fit: " + sglang_misfit(b))


@app.command()
@engine_options("fleet")
def fleet(
    model: ModelOpt,
    gpu: Annotated[Optional[list[str]], typer.Option("--gpu", "-g", help="GPUs to compare (repeat); default all")] = None,
    context: Annotated[int, typer.Option("--context", help="Typical tokens per sequence (prompt + output)")] = 4096,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Sequences that must be in flight at once")] = 256,
    weight_dtype: WOpt = None,
    settings: dict = FROM_DECLARATIONS,  # the engine options, generated from EngineConfig's declarations
    json_out: JsonOpt = False,
) -> None:
    """Memory-only fleet sizing across GPUs: for each GPU, the smallest TP that serves the model, its KV
    capacity, and the replicas and GPUs needed to hold `concurrency` sequences of `context` tokens (no
    latency: `capacity plan` adds the simulator)."""

    if context <= 0 or concurrency <= 0:
        raise CapacityError(f"--context and --concurrency must be > 0 (got {context}, {concurrency})")
    names = gpu or list(catalogue())
    rows: list[dict[str, Any]] = []
    card = load_card(model, weight_dtype)
    for name in names:
        card, g, cfg = _scenario(model, name, {**settings, "tensor_parallel_size": 1}, weight_dtype)
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
            row.update(tp=tp, weights_gib=b.weights_bytes / 2**30, kv_tokens=b.planning_tokens, seqs_per_replica=seqs,
                       kv_limited=seqs < b.max_num_seqs, replicas=replicas, gpus=tp * replicas,
                       max_model_len=b.max_model_len)
            break
        else:
            row["tp"] = None
        rows.append(row)
    if json_out:
        typer.echo(dumps({"model": card.name, "context": context, "concurrency": concurrency, "rows": rows,
                               "latency": "not part of this memory-only view: see `capacity plan`"}))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Memory plan: {card.name}, {concurrency} sequences of {context:,} tokens in flight (per "
                    "replica: weights GiB per rank, KV tokens, sequences it holds; limit: the KV cache or "
                    "max_num_seqs)", title_justify="left")
    for col in ("GPU", "TP", "weights GiB", "KV tokens", "seqs", "limit", "replicas", "GPUs"):
        t.add_column(col, justify="right" if col not in ("GPU", "limit") else "left", no_wrap=True)
    for r in sorted(rows, key=lambda r: (r["tp"] is None, r.get("gpus") or 0)):
        if r["tp"] is None:
            t.add_row(r["gpu"], "-", "", "", "", "[red]does not fit at tp<=16[/]", "", "")
            continue
        t.add_row(r["gpu"] + ("*" if r["usable_memory_basis"] == "estimate" else ""), str(r["tp"]),
                  f"{r['weights_gib']:.1f}", f"{r['kv_tokens']:,}", str(r["seqs_per_replica"]),
                  "KV" if r["kv_limited"] else "seqs", str(r["replicas"]), str(r["gpus"]))
    console = Console()
    console.print(t)
    console.print("[dim]* usable memory of this GPU is an estimate (no engine log seen). Latency (TTFT/TPOT/P99) "
                  "is not part of this memory-only view: `capacity plan` simulates it.[/]")



@app.command()
def gpus(json_out: JsonOpt = False) -> None:
    """List the GPU catalogue (SI units inside; GiB and TB/s shown)."""
    cat = catalogue()
    if json_out:
        typer.echo(dumps({k: v.model_dump() for k, v in cat.items()}))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="GPU catalogue: usable GiB as the engine sees it, HBM TB/s, dense BF16/FP8 TFLOP/s, link GB/s "
                    "per direction", title_justify="left")
    for col in ("name", "GiB", "basis", "TB/s", "BF16", "FP8", "link"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("name", "basis") else "right")
    for g in cat.values():
        t.add_row(g.name, f"{g.usable_memory_bytes / 2**30:.2f}", g.usable_memory_basis, f"{g.mem_bw_bytes_per_s / 1e12:.2f}",
                  f"{g.bf16_flops / 1e12:,.0f}" if g.bf16_flops else "-",
                  f"{g.fp8_flops / 1e12:,.0f}" if g.fp8_flops else "-", f"{g.interconnect_bytes_per_s / 1e9:,.0f}")
    con = Console()
    con.print(t)
    no_bf16 = [f"{g.name} (FP16 {g.fp16_flops / 1e12:,.0f})" for g in cat.values() if not g.bf16_flops and g.fp16_flops]
    if no_bf16:
        con.print("-: no such tensor-core format. Without BF16 units, a bf16 model is served in fp16 at the FP16 "
                  f"rate: {', '.join(no_bf16)}", highlight=False)


@app.command()
def models(json_out: JsonOpt = False) -> None:
    """List bundled model cards with their parameter counts and KV bytes per token."""
    rows: list[dict[str, Any]] = []
    for p in sorted(MODELS_DIR.glob("*.yaml")):
        try:
            c = load_model_card(p)
        except CapacityError:
            continue  # scenario files live here too
        rows.append({"card": p.stem, "hf_id": c.hf_id, "params": count_params(c),
                     "kv_bytes_per_token": kv_bytes_per_token(c, c.dtype), "weights": c.weight_format,
                     "moe": c.moe is not None, "mla": c.mla is not None, "sliding": c.num_sliding_layers > 0,
                     "vision": c.vision is not None})
    if json_out:
        typer.echo(dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Bundled model cards", title_justify="left")
    for col in ("card", "params (B)", "KV B/token", "weights", "kind"):
        t.add_column(col, no_wrap=col != "kind", justify="right" if col in ("params (B)", "KV B/token") else "left")
    synthetic = [r["card"] for r in rows if not r["hf_id"]]  # no checkpoint anywhere: shapes for the tests
    for r in rows:
        if not r["hf_id"]:
            continue
        kind = "MLA+MoE" if r["mla"] and r["moe"] else "MoE" if r["moe"] else "dense"
        kind += " +SWA" if r["sliding"] else ""
        kind += " +vision" if r["vision"] else ""
        t.add_row(r["card"], f"{r['params'] / 1e9:,.2f}", f"{r['kv_bytes_per_token']:,.0f}", r["weights"], kind)
    con = Console()
    con.print(t)
    if synthetic:
        con.print(f"Also bundled, with no checkpoint to serve: {', '.join(synthetic)} (small shapes for tests and CPU "
                  "rehearsals; --json lists every card)", highlight=False)


@app.command()
def engines(json_out: JsonOpt = False) -> None:
    """The vLLM releases the memory model knows (`--engine vllm@X.Y`), how each accounts for start-up memory,
    and whether that accounting was checked against real start-up logs; then the other engines (SGLang's
    releases, TensorRT-LLM)."""
    rows: list[dict[str, Any]] = []
    for (major, minor), patch in sorted(LAST_PATCH.items()):
        rel = release(f"{major}.{minor}.{patch}")
        rows.append({"engine": f"vllm@{major}.{minor}", "release": fmt(rel.version), "runner": rel.runner,
                     "accounting": rel.accounting, "graphs_in_budget": rel.cuda_graphs_in_budget_default,
                     "checked_against_logs": rel.checked, "current": rel.version == CURRENT})
    others: list[dict[str, Any]] = [
        {"engine": f"sglang@{r}", "release": r, "runner": "pytorch", "accounting": "F x free memory at start",
         "graphs_in_budget": False, "checked_against_logs": True, "current": r == SG_CURRENT} for r in SG_RELEASES]
    others += [{"engine": f"trtllm@{r}", "release": r, "runner": f"{b} backend",
                "accounting": "0.9 x free after its profile" if b == "pytorch" else
                "engine, execution context, runtime and decoder buffers, then 0.9 x free", "graphs_in_budget": True,
                "checked_against_logs": False, "current": r == TRT_CURRENT} for r, b in TRT_BACKEND.items()]
    rows += others
    if json_out:
        typer.echo(dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="vLLM releases (--engine vllm@X.Y = the last patch of X.Y; vllm = the current one)",
              title_justify="left")
    for col in ("engine", "release", "runner", "accounting", "graphs", "logs"):
        t.add_column(col)
    for r in rows[:len(rows) - len(others)]:
        t.add_row(r["engine"] + (" *" if r["current"] else ""), r["release"], r["runner"], r["accounting"],
                  "in budget" if r["graphs_in_budget"] else "outside", "checked" if r["checked_against_logs"] else "")
    Console().print(t)
    o = Table(title="Other engines (--engine sglang\\[@X.Y], --engine trtllm\\[@X.Y\\[:pytorch|:tensorrt]]; * = what the "
              "bare name means)",
              title_justify="left")
    for col in ("engine", "KV pool", "logs"):
        o.add_column(col)
    for r in others:
        o.add_row(r["engine"] + (" *" if r["current"] else ""), r["accounting"] + (
                      f" ({r['runner']})" if r["engine"].startswith("trtllm") else ""),
                  "checked" if r["checked_against_logs"] else "formula only (docs/trtllm.md)")
    Console().print(o)


# The planning, step-cost and ground-truth commands live in their own modules; importing them registers them


@app.command()
def schema() -> None:
    """Print the reference of every file format (scenario, workload, engine, model card, GPU), generated from the
    code: every field with its type, default and meaning (this is docs/schema.md)."""
    typer.echo(schema_markdown())
