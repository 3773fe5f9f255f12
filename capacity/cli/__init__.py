"""`capacity` command line. Domain errors are caught here, and only here: one line on stderr, exit 1.

The app and its option types live in `common`; each command module registers its commands on import, and the
app imports a command's module only when that command is asked for (common.LazyGroup, commands.COMMANDS).
"""
from __future__ import annotations

import io
import os
import sys

import typer
from pydantic import ValidationError

from capacity.cli.common import app
from capacity.errors import CapacityError
from capacity.files import format_validation_error, short_numbers
from capacity.plan.scenario import load_scenario

__all__ = ["app", "load_scenario", "main"]


MAX_MESSAGE = 600  # characters of an error line: a message never echoes megabytes of user input


class StdoutError(OSError):
    """Writing the command's output to stdout failed (a full disk, a file size limit): an error, never exit 0."""


class _StdoutRaw(io.RawIOBase):
    """File descriptor 1 under a BufferedWriter of our own. A buffered writer retries a short write and raises
    when the rest does not go: with PYTHONUNBUFFERED=1 Python's own stdout is a TextIOWrapper straight over the
    raw file, which drops what a short write left (a 15 KB JSON cut at a full disk's 12 KiB, exit 0). Errors
    come out as StdoutError so the boundary can say it was the output that failed."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b) -> int:
        try:
            return os.write(self._fd, b)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from None

    def close(self) -> None:  # fd 1 is not ours to close
        pass


def _own_stdout():
    """Replace sys.stdout by a checked, buffered writer on fd 1 (see _StdoutRaw); returns the original, or None
    when stdout is not the process's fd 1 (a test's capture, an embedding program)."""
    out = sys.stdout
    try:
        if type(out) is not io.TextIOWrapper or out.fileno() != 1:
            return None
        out.flush()
    except (OSError, ValueError, AttributeError):
        return None
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_StdoutRaw(1)), encoding=out.encoding, errors=out.errors,
                                  line_buffering=out.line_buffering)
    return out


def _drop_stdout() -> None:
    """After stdout failed (full disk, closed pipe): send what is still buffered to /dev/null, so the
    interpreter's final flush neither fails again nor prints 'Exception ignored'."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


def _flush_stdout() -> None:
    """The command's output is on its way only once flushed: a failure here is the command's failure."""
    sys.stdout.flush()


def _fail(message: str, code: int = 1) -> None:
    try:  # what the command printed before failing goes first (and a failing stdout must not hide the error)
        sys.stdout.flush()
    except (OSError, ValueError):
        _drop_stdout()
    line = short_numbers(" ".join(str(message).split()))  # one line, whatever the message held
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
    _own_stdout()
    try:
        try:
            code = app(standalone_mode=False)
        finally:  # also before typer.Exit(3) and friends: their output must reach the disk too
            _flush_stdout()
        if isinstance(code, int) and code:
            sys.exit(code)
    except BrokenPipeError:  # `capacity ... | head`: the reader has what it wanted; quiet, as cat and grep are
        _drop_stdout()
        sys.exit(1)  # not 0 (the output is incomplete); 1 as rich's own closed-pipe handling exits for tables
    except StdoutError as exc:
        _drop_stdout()
        _fail(f"cannot write the output to stdout ({exc.strerror or exc}); what was written is incomplete")
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
