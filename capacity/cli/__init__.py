"""`capacity` command line. Domain errors are caught here, and only here: one line on stderr, exit 1.

The app and its option types live in `common`; each command module registers its commands on import.
"""
from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

from capacity.cli import costs, disagg, fleet, memory, plan, simulate, trace, truth  # noqa: F401  (registers the commands)
from capacity.cli.common import app
from capacity.cli.plan import load_scenario
from capacity.errors import CapacityError
from capacity.files import format_validation_error

__all__ = ["app", "load_scenario", "main"]


MAX_MESSAGE = 600  # characters of an error line: a message never echoes megabytes of user input


def _fail(message: str, code: int = 1) -> None:
    line = " ".join(str(message).split())  # one line, whatever the message held
    if len(line) > MAX_MESSAGE:
        line = line[: MAX_MESSAGE - 3] + "..."
    typer.echo(f"error: {line}", err=True)
    sys.exit(code)


def main() -> None:
    """Entry point, and the one boundary where failures become results for a person: every `capacity`
    command ends in its output, or in one line on stderr naming what was wrong and exit code 1 (130 when
    interrupted). Domain errors, usage errors (a bad option type, an unknown option), files that cannot be
    read or written, input too large or too deep, and anything unexpected (reported as an internal error,
    with CAPACITY_DEBUG=1 for the traceback) all end the same way."""
    import os
    import warnings

    try:  # typer >= 0.2x vendors click
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover
        from click import exceptions as cx  # type: ignore[no-redef]
    abort = getattr(cx, "Abort", KeyboardInterrupt)

    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    debug = bool(os.environ.get("CAPACITY_DEBUG"))
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except CapacityError as exc:
        _fail(str(exc))
    except cx.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" or not exc.format_message().strip():
            sys.exit(1)  # the help was printed: that is the answer to a bare command
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        _fail(f"{exc.format_message()}{where}")
    except ValidationError as exc:  # a value built into a typed model outside validate(): still one line
        _fail(format_validation_error(exc, exc.title))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except cx.ClickException as exc:
        _fail(exc.format_message())
    except OSError as exc:
        if debug:
            raise
        what = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        _fail(f"{str(what)[:200]}{exc.strerror or exc}")
    except (RecursionError, MemoryError) as exc:
        if debug:
            raise
        _fail(f"the input is too large or too deeply nested to process ({type(exc).__name__})")
    except SystemExit:
        raise
    except Exception as exc:  # a bug: still one line, and the way to see more
        if debug:
            raise
        _fail(f"internal error ({type(exc).__name__}: {exc}); please report it; CAPACITY_DEBUG=1 shows the "
              "traceback")


if __name__ == "__main__":
    main()
