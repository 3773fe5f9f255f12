"""The memory budget for people: the per-rank terms with their ranges (each engine's own arithmetic: vLLM's share
of the device, TensorRT-LLM's share of what its profile leaves), the KV cache, and the batch x context table."""
from __future__ import annotations

from typing import Any

from capacity.engine.memory import MemoryBudget
from capacity.units import GiB


def _g(x: float) -> str:
    return f"{x / GiB:.2f}"


def _rng(b: MemoryBudget, term: str) -> str:
    lo, hi = b.ranges.get(term, [0.0, 0.0])
    return "" if abs(hi - lo) < 0.005 * GiB else f"{lo / GiB:.2f}-{hi / GiB:.2f}"


def memory_tables(b: MemoryBudget, table: list[dict], console: Any, verdict: bool = True) -> None:
    """The budget per rank (each estimated term with its range), the KV cache, and the batch x context table;
    with `verdict`, a line saying why it does not fit (off where the caller's error says it)."""
    from rich.table import Table

    est = set(b.estimates)
    checked = "checked against logs" if b.release_checked else "from its code only"
    t = Table(title=f"VRAM per rank: {b.model} on {b.gpu}, tp={b.tp}, {b.release} ({checked})",
              title_justify="left")
    t.add_column("term")
    t.add_column("GiB", justify="right")
    t.add_column("range", justify="right")
    t.add_column("basis")
    trt = b.engine == "trtllm"  # its fraction is a share of the memory free after its profile, not of the device
    t.add_row("GPU total (engine's view)", _g(b.total_bytes), "", "")
    if not trt:
        t.add_row(f"usable = total x {b.gpu_memory_utilization}", _g(b.usable_bytes), "", "gpu_memory_utilization")
    t.add_row("- weights", _g(b.weights_bytes), _rng(b, "weights"), "from the card")
    t.add_row("- activation peak", _g(b.activation_bytes), _rng(b, "activation"),
              (("execution context: 1 layer x 1-3.5" if "decoder" in est else "vLLM's derivation, wider") if trt
               else "derived") if "activation" in est else "given")
    t.add_row("- CUDA context + NCCL" if trt else "- non-torch memory", _g(b.non_torch_bytes), _rng(b, "non_torch"),
              ("estimate" if trt else "from logs") if "non_torch" in est else "given")
    if b.runner_buffers_bytes:  # TensorRT-LLM's engine backend: its runtime and decoder buffers (with a range)
        t.add_row("- runtime + decoder buffers" if trt else "- runner buffers", _g(b.runner_buffers_bytes),
                  _rng(b, "runner_buffers") if trt else "", "derived")
    graph_basis = ("off (eager)" if not b.cuda_graph_bytes else
                   (("estimate" if trt else "from logs") if "cuda_graphs" in est else "given")
                   + (", in budget" if b.cuda_graphs_in_budget else ", outside"))
    t.add_row(("- " if b.cuda_graphs_in_budget else "  ") + "CUDA graphs", _g(b.cuda_graph_bytes),
              _rng(b, "cuda_graphs"), graph_basis)
    if trt:
        free = (b.total_bytes - b.weights_bytes - b.activation_bytes - b.non_torch_bytes - b.cuda_graph_bytes
                - b.runner_buffers_bytes)
        t.add_row("= free after the engine" if "decoder" in est else "= free after the profile", _g(free), "", "")
        t.add_row("= KV cache budget (x 0.9)", _g(b.kv_budget_bytes), _rng(b, "kv_budget"), "free_gpu_memory_fraction")
    else:
        t.add_row("= KV cache budget", _g(b.kv_budget_bytes), _rng(b, "kv_budget"), "")
        t.add_row("outside (context + graphs)", _g(b.outside_budget_bytes), "", "estimate")
    console.print(t)
    kv = Table(title="KV cache", title_justify="left", show_header=False)
    kv.add_row("KV bytes per token", f"{b.kv_bytes_per_token:,.0f} B ({b.kv_dtype}, per rank)")
    kv.add_row("block size", f"{b.block_size} tokens")
    lo, hi = b.num_blocks_range or [b.num_blocks, b.num_blocks]
    kv.add_row("GPU blocks", f"{b.num_blocks:,} (range {lo:,}-{hi:,})" if lo != hi else f"{b.num_blocks:,}")
    kv.add_row("planner uses", f"{b.planning_blocks:,} blocks ({b.kv_estimate} end)")
    if b.kv_groups.sliding:
        g = b.kv_groups
        kv.add_row("KV groups", f"{g.full} full + {g.sliding} sliding-window of {g.group_size} layers")
        kv.add_row(f"blocks per request at {b.max_model_len:,}",
                   f"{g.startup_blocks(b.max_model_len, b.block_size):,} to admit (window + "
                   f"{g.inflight:,} tokens in flight), {b.blocks_for(b.max_model_len):,} held decoding")
    kv.add_row("KV tokens (as TensorRT-LLM logs)" if trt else "KV tokens (as vLLM logs)", f"{b.kv_tokens:,}")
    kv.add_row(f"concurrency at {b.max_model_len:,}", f"{b.max_concurrency:.2f}x")
    kv.add_row("contiguous seqs at max len", f"{b.contiguous_max_seqs}")
    kv.add_row("engine knobs", f"max_num_seqs {b.max_num_seqs}, max_num_batched_tokens {b.max_num_batched_tokens}")
    if b.defaults_used:
        kv.add_row("engine defaults used", ", ".join(b.defaults_used))
    console.print(kv)
    if table:
        contexts = sorted({r["context"] for r in table})
        bt = Table(title=f"Batch x context: KV GiB ({'paged' if b.paged_kv else 'contiguous'}); red = does not "
                   "fit the planner's blocks", title_justify="left")
        bt.add_column("batch")
        for c in contexts:
            bt.add_column(f"{c // 1024}k" if c % 1024 == 0 else f"{c:,}", justify="right")
        by: dict[int, dict[int, dict]] = {}
        for r in table:
            by.setdefault(r["batch"], {})[r["context"]] = r
        for batch, cells in by.items():
            row = []
            for c in contexts:
                r = cells[c]
                txt = f"{r['kv_bytes'] / GiB:,.1f}"
                row.append(f"[green]{txt}[/]" if r["fits"] else f"[red]{txt}x[/]")
            bt.add_row(str(batch), *row)
        console.print(bt)
    if verdict and not b.fits:
        console.print(f"[bold red]does not fit:[/] {b.reason}")
    for w in b.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    if trt:
        console.print("[dim]The KV formula is read from TensorRT-LLM's code and checked on its logs; the peak's terms "
                      "are estimates (docs/trtllm.md). Override with --activation-gib, --non-torch-gib, "
                      "--cuda-graph-gib when you have measured values.[/]")
        return
    console.print("[dim]Activation is derived from the release's profiling code; non-torch and CUDA-graph terms "
                  "come from real start-up logs (ranges: their spread). Override with --activation-gib, "
                  "--non-torch-gib, --cuda-graph-gib when you have measured values.[/]")
