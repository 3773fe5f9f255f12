"""`capacity` command line. Domain errors are caught here, and only here: one line on stderr, exit 1.

The app and its option types live in `common`; each command module registers its commands on import.
"""
from __future__ import annotations

import sys

import typer

from capacity.cli import costs, memory, plan, simulate, truth  # noqa: F401  (registers the commands)
from capacity.cli.common import app
from capacity.cli.plan import load_scenario
from capacity.errors import CapacityError

__all__ = ["app", "load_scenario", "main"]


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
