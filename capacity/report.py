"""Rendering of results for people (rich tables) and machines (JSON-ready dicts). No computation here."""
from __future__ import annotations

from typing import Any

from capacity.memory import MemoryBudget
from capacity.units import GiB


def _g(x: float) -> str:
    return f"{x / GiB:.2f}"


def memory_tables(b: MemoryBudget, table: list[dict], console: Any) -> None:
    from rich.table import Table

    est = set(b.estimates)
    t = Table(title=f"VRAM budget per rank: {b.model} on {b.gpu}, tp={b.tp}", title_justify="left")
    t.add_column("term")
    t.add_column("GiB", justify="right")
    t.add_column("basis")
    t.add_row("GPU total (as the engine sees it)", _g(b.total_bytes), "catalogue usable_memory_bytes")
    t.add_row(f"usable = total x {b.gpu_memory_utilization}", _g(b.usable_bytes), "gpu_memory_utilization")
    t.add_row("- weights", _g(b.weights_bytes), "computed from the card (exact shapes)")
    t.add_row("- activation peak (profiling pass)", _g(b.activation_bytes),
              "estimate" if "activation" in est else "given")
    t.add_row("- non-torch memory", _g(b.non_torch_bytes), "estimate" if "non_torch" in est else "given")
    graph_basis = ("off (enforce_eager)" if not b.cuda_graph_bytes else
                   ("estimate" if "cuda_graphs" in est else "given")
                   + (", inside budget" if b.cuda_graphs_in_budget else ", outside budget (vLLM default)"))
    t.add_row(("- " if b.cuda_graphs_in_budget else "  ") + "CUDA graphs", _g(b.cuda_graph_bytes), graph_basis)
    t.add_row("= KV cache budget", _g(b.kv_budget_bytes), "")
    t.add_row("outside budget (CUDA context + graphs)", _g(b.outside_budget_bytes), "estimate")
    console.print(t)
    kv = Table(title="KV cache", title_justify="left", show_header=False)
    kv.add_row("KV bytes per token (per rank)", f"{b.kv_bytes_per_token:,.0f} B ({b.kv_dtype})")
    kv.add_row("block size", f"{b.block_size} tokens")
    kv.add_row("GPU blocks", f"{b.num_blocks:,}")
    kv.add_row("KV tokens", f"{b.kv_tokens:,}")
    kv.add_row(f"max concurrency at max_model_len {b.max_model_len:,}", f"{b.max_concurrency:.2f}x")
    kv.add_row("contiguous (non-paged) sequences at max_model_len", f"{b.contiguous_max_seqs}")
    kv.add_row("engine knobs", f"max_num_seqs {b.max_num_seqs}, max_num_batched_tokens {b.max_num_batched_tokens}"
               + (f" (defaults: {', '.join(b.defaults_used)})" if b.defaults_used else ""))
    console.print(kv)
    contexts = sorted({r["context"] for r in table})
    bt = Table(title=f"Batch x context: KV GiB needed ({'paged' if b.paged_kv else 'contiguous'}); "
               "red = does not fit", title_justify="left")
    bt.add_column("batch \\ context")
    for c in contexts:
        bt.add_column(f"{c:,}", justify="right")
    by = {}
    for r in table:
        by.setdefault(r["batch"], {})[r["context"]] = r
    for batch, cells in by.items():
        row = []
        for c in contexts:
            r = cells[c]
            txt = _g(r["kv_bytes"])
            row.append(f"[green]{txt}[/]" if r["fits"] else f"[red]{txt} x[/]")
        bt.add_row(str(batch), *row)
    console.print(bt)
    for w in b.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print("[dim]Estimates: activation = vLLM's profiling forward pass + dummy sampler; non-torch and "
                  "CUDA-graph terms from typical vLLM logs. Override with --activation-gib/--non-torch-gib/"
                  "--cuda-graph-gib when you have measured values.[/]")


def simulation_table(out: dict, console) -> None:
    """Percentiles (ms) of a simulated scenario, throughput, and where the step costs came from."""
    from rich.table import Table

    s = out["summary"]
    if out["saturated"]:
        console.print(f"[bold red]{out['saturation']}[/] (offered {out['offered_rate_per_s']} req/s): the "
                      "percentiles below describe an overloaded system that was stopped early")
    t = Table(title=f"Simulated {out['model']} on {out['replicas']} x {out['gpu']} (tp={out['tp']}), "
                    f"{out['policy']} batching, {s['n_requests']} measured requests", title_justify="left")
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
        ci_txt = f"{ci[0] * 1e3:.1f}-{ci[1] * 1e3:.1f}" if ci and ci[0] == ci[0] else ""
        t.add_row(label, *(f"{m[k] * 1e3:.1f}" for k in ("mean", "p50", "p90", "p95", "p99")), ci_txt)
    console.print(t)
    console.print(f"throughput: {s['output_tokens_per_s']:.1f} output tokens/s, {s['requests_per_s']:.3f} requests/s "
                  f"over {s['window_s']:.1f} s simulated; step costs: {out['step_cost_source']}")
    if s.get("goodput_req_per_s") is not None:
        console.print(f"goodput: {s['goodput_req_per_s']:.3f} requests/s meet every SLO ({s['slo_attainment']:.1%})")
    console.print(f"[dim]{s['definitions']}; first {out['warmup_requests_excluded']} requests excluded as warm-up; "
                  f"{out['preemptions']} preemptions; KV {out['kv_blocks_per_replica']:,} blocks x {out['block_size']} "
                  f"tokens per replica; Little's law L={out['littles_law']['L']:.2f} vs lambda*W="
                  f"{out['littles_law']['lambda_W']:.2f}[/]")
    for n in out["notes"]:
        console.print(f"[dim]note: {n}[/]")
