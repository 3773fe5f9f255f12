"""`capacity trace stats|convert`: public traces (Mooncake, Azure, BurstGPT) as published (capacity.traces)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from capacity.cli.common import JsonOpt, app
from capacity.errors import ConfigError
from capacity.files import dumps
from capacity.traces import convert as trace_convert
from capacity.traces import parse_window
from capacity.traces import stats as trace_stats

trace_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Read public LLM-serving traces (Mooncake, Azure, BurstGPT) as published.")
app.add_typer(trace_app, name="trace")

FormatOpt = Annotated[Optional[str], typer.Option(
    "--format", help="mooncake, azure, burstgpt or capacity (default: read from the first line)")]
ScaleOpt = Annotated[float, typer.Option(
    "--time-scale", help="Multiply arrival times by this (0.5: the same requests at twice the rate)")]
WindowOpt = Annotated[Optional[str], typer.Option(
    "--window", help="START:END seconds from the trace's first request (e.g. 600:1200)")]
RowsOpt = Annotated[Optional[int], typer.Option("--max-rows", help="Stop after this many requests")]


@trace_app.command()
def stats(
    path: Annotated[str, typer.Argument(help="The trace file")], fmt: FormatOpt = None, time_scale: ScaleOpt = 1.0,
    window: WindowOpt = None, max_rows: RowsOpt = None,
    peak_window: Annotated[float, typer.Option("--peak-window", help="Seconds of the busiest window")] = 60.0,
    json_out: JsonOpt = False,
) -> None:
    """Rate over the trace and its busiest window (what `plan --target-rate` should meet), the lengths, and
    for Mooncake the prompt share in blocks an earlier request had (an unbounded prefix cache's hit rate)."""
    if not (peak_window > 0 and peak_window < 1e9):
        raise ConfigError(f"--peak-window {peak_window:g}: expected seconds > 0")
    st = trace_stats(path, fmt, time_scale=time_scale, window=parse_window(window), peak_window_s=peak_window,
                     max_rows=max_rows)
    if json_out:
        typer.echo(dumps(st.as_dict()))
        return
    c = st.counts
    lines = [f"{path} ({st.format}): {c.kept:,} requests over {st.duration_s:,.1f} s",
             f"  rate: mean {st.mean_rate:,.2f} req/s; busiest {st.peak_window_s:g} s: {st.peak_rate:,.2f} req/s "
             f"(from {st.peak_at_s:,.0f} s)",
             f"  prompt tokens: mean {st.mean_input:,.0f}, P99 {st.p99_input:,.0f}; output tokens: mean "
             f"{st.mean_output:,.0f}, P99 {st.p99_output:,.0f}"]
    if st.reused_prompt_share is not None:
        lines.append(f"  prefix reuse: {st.reused_prompt_share:.1%} of prompt tokens are in 512-token blocks an "
                     "earlier request had (an unbounded prefix cache's hit rate)")
    skipped = [f"{c.dropped_zero:,} with 0 tokens (failed requests) dropped" if c.dropped_zero else "",
               f"{c.outside_window:,} outside the window" if c.outside_window else ""]
    if any(skipped):
        lines.append("  rows: " + "; ".join(s for s in skipped if s))
    import textwrap

    typer.echo("\n".join(textwrap.fill(x, 80, subsequent_indent="    ") for x in lines))
    typer.echo(f"  to plan for the busiest window:\n    capacity plan -m MODEL --target-rate {st.peak_rate:.3g} "
               f"--input-len {st.mean_input:.0f} --output-len {st.mean_output:.0f}")


@trace_app.command()
def convert(
    src: Annotated[str, typer.Argument(help="The published trace")],
    dest: Annotated[str, typer.Argument(help="The JSONL to write (capacity's trace: simulate --trace)")],
    fmt: FormatOpt = None, time_scale: ScaleOpt = 1.0, window: WindowOpt = None, max_rows: RowsOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite DEST")] = False,
) -> None:
    """Write a published trace as capacity's JSONL trace (`simulate --trace`, `workload.trace`), in time
    order from 0, with the window and time scale applied; Mooncake's hash_ids travel with each row."""
    c = trace_convert(src, dest, fmt, time_scale=time_scale, window=parse_window(window), max_rows=max_rows,
                      force=force)
    extra = "".join([f"; {c.dropped_zero:,} with 0 tokens dropped" if c.dropped_zero else "",
                     f"; {c.outside_window:,} outside the window" if c.outside_window else ""])
    typer.echo(f"wrote {dest}: {c.kept:,} requests of {c.read:,} read{extra}")
