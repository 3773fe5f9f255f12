"""`capacity disagg`: aggregated vs disaggregated prefill/decode on a unit of GPUs (capacity.plan.disagg), with
each role's settings searched on request; split from `capacity.cli.fleet`."""
from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from capacity.cli.common import (
    JsonOpt,
    ModelOpt,
    _lengths,
    app,
    engine_config,
    engine_overrides,
    load_card,
    role_engine,
)
from capacity.cli.engine_options import FROM_DECLARATIONS, engine_options
from capacity.errors import CapacityError
from capacity.files import dumps
from capacity.model.gpus import get_gpu
from capacity.plan.disagg import compare
from capacity.plan.disagg_commands import settings_text, simulate_command
from capacity.workload import WorkloadSpec


@app.command()
@engine_options("disagg", help={"max_model_len": ""}, defaults={"max_model_len": 8192}, param="engine")
def disagg(
    model: ModelOpt,
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU")] = "h100-sxm",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per unit (a node): every layout uses them all")] = 8,
    input_len: Annotated[str, typer.Option("--input-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "4096",
    output_len: Annotated[str, typer.Option("--output-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "256",
    slo_ttft_ms: Annotated[float, typer.Option("--slo-ttft-ms", help="P99 TTFT objective")] = 2000.0,
    slo_tpot_ms: Annotated[float, typer.Option("--slo-tpot-ms", help="P99 TPOT objective")] = 35.0,
    target_rate: Annotated[Optional[float], typer.Option("--target-rate", help="req/s to serve: units and GPUs each layout needs")] = None,
    price: Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="USD per GPU-hour")] = None,
    weight_dtype: Annotated[Optional[str], typer.Option("--weight-dtype", help="bf16, fp8, ... (fp8 lets TP 2 hold a 70B)")] = None,
    engine: dict = FROM_DECLARATIONS,  # --max-model-len: EngineConfig's declarations
    link: Annotated[str, typer.Option("--link", help="KV link: nvlink, ib-400, roce-200, eth-100")] = "nvlink",
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests per probe")] = 600,
    seeds: Annotated[int, typer.Option("--seeds", help="Simulations per probe")] = 1,
    decode_set: Annotated[Optional[list[str]], typer.Option(
        "--decode-set", help="KEY=VALUE of the decode pool's engine only, e.g. max_num_seqs=512 (repeat)")] = None,
    tune: Annotated[bool, typer.Option(
        "--tune", help="Search each role's batch cap and token budget for the best layout of each kind")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Aggregated vs disaggregated prefill/decode on a unit of GPUs: every layout's max rate under the P99 SLOs,
    the GPUs and cost for a target rate, and which wins and why; with --tune, each role's settings searched."""

    if not 100 <= requests <= 100_000 or not 1 <= seeds <= 10:
        raise CapacityError(f"--requests 100..100000 and --seeds 1..10 (got {requests}, {seeds})")
    for flag, v in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms)):
        if not (math.isfinite(v) and v > 0):
            raise CapacityError(f"{flag}: must be a number > 0 (got {v:g})")
    card = load_card(model, weight_dtype)
    g = get_gpu(gpu)
    spec = WorkloadSpec(input_len=_lengths("--input-len", input_len), output_len=_lengths("--output-len", output_len),
                        num_requests=requests)
    eng = engine_config(**engine)
    max_model_len = eng.max_model_len

    over = engine_overrides(decode_set, "--decode-set")
    checked = role_engine(eng, 1, over, "--decode-set")  # a bad value is one line now, not an error per layout
    over = {k: getattr(checked, k) for k in over}
    from rich.console import Console

    con = Console(stderr=True)
    with con.status("simulating layouts") as status:
        out = compare(card, g, eng, spec, (slo_ttft_ms / 1e3, slo_tpot_ms / 1e3), gpus=gpus, target_rate=target_rate,
                      price_per_gpu_hour=price, seeds=seeds, link=link, decode_over=over, tune_roles=tune,
                      progress=None if json_out else (lambda name: status.update(f"simulating {name}")))
    if json_out:
        typer.echo(dumps(out))
        return
    from rich.table import Table

    con = Console()
    t = Table(title=f"{card.name} on {gpus} x {g.name}, {input_len} in / {output_len} out: max rate under P99 TTFT "
                    f"<= {slo_ttft_ms:g} ms, TPOT <= {slo_tpot_ms:g} ms", title_justify="left")
    cols = ["layout", "req/s", "TTFT ms", "TPOT ms"] + (["GPUs"] if target_rate else []) + (
        ["$/1M tok"] if target_rate and price else [])
    for c in cols:
        t.add_column(c, justify="left" if c == "layout" else "right")
    for r in sorted(out["rows"], key=lambda r: -(r["max_rate"] or 0)):
        if r["max_rate"] is None:
            t.add_row(r["layout"], "-", r["why"][:40], "", *([""] * (len(cols) - 4)))
            continue
        cells = [r["layout"], f"{r['max_rate']:.2f}",
                 f"{r['p99_ttft_s'] * 1e3:.0f}" if r["p99_ttft_s"] is not None else "-",
                 f"{r['p99_tpot_s'] * 1e3:.1f}" if r["p99_tpot_s"] is not None else "-"]
        if target_rate:
            cells.append(str(r.get("total_gpus", "-")))
        if target_rate and price:
            c = r.get("cost_per_1m_output_tokens")
            cells.append(f"{c:.2f}" if c is not None else "-")
        t.add_row(*cells)
    con.print(t)
    for tp, why in out["tp_that_does_not_fit"].items():
        con.print(f"TP {tp} left out: {why}")
    if out["tuned"]:
        _print_tuned(con, out, f"-m {model} -g {gpu} --input-len {input_len} --output-len {output_len}"
                     + (f" --weight-dtype {weight_dtype}" if weight_dtype else "") + f" --max-model-len {max_model_len}",
                     link, decode_set or [])
    con.print(out["verdict"])


def _print_tuned(con, out: dict, args: str, link: str, decode_set: list[str]) -> None:
    """The two tuned winners: each role's settings, the rate before and after, and the simulate line."""
    from rich.table import Table

    t = Table(title="Each role's settings searched (the best layout of each kind)", title_justify="left")
    for c in ("layout", "settings", "req/s", "TTFT ms", "TPOT ms"):
        t.add_column(c, justify="left" if c in ("layout", "settings") else "right")
    lines = []
    for r in (out["best_aggregated"], out["best_disaggregated"]):
        if r is None or "settings" not in r:
            continue
        t.add_row(r["layout"], settings_text(r["settings"]) or "as given",
                  f"{r['max_rate_as_given']:.2f} -> {r['max_rate']:.2f}", f"{r['p99_ttft_s'] * 1e3:.0f}",
                  f"{r['p99_tpot_s'] * 1e3:.1f}")
        lines.append(simulate_command(r, args, link, decode_set))
    con.print(t)
    con.print("The same, one run each:")
    for line in lines:
        con.print(line, soft_wrap=True)
