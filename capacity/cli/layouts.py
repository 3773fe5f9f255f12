"""`capacity plan --layouts`: the CLI side of capacity.plan.layouts (kept out of cli/plan.py, at its size limit)."""
from __future__ import annotations

import typer

from capacity.engine.config import engine_name
from capacity.files import dumps
from capacity.plan.engine_layouts import parse_layouts
from capacity.plan.layouts import compare_layouts, layouts_report


def plan_layouts(sc, card, ex, spec: str, gpus: int, json_out: bool) -> None:

    try:
        res, best, skipped = compare_layouts(sc, card, ex, *parse_layouts(spec, gpus, card, engine_name(sc.engine.engine)))
    finally:
        ex.close()
    if json_out:
        typer.echo(dumps({"layouts": [r.row() for r in res], "winner": best.layout.label if best else None,
                           "not_offered": skipped}))
        return
    from rich.console import Console

    layouts_report(card, sc.gpu_name, res, best, Console(), skipped)
