"""Lazy command registration (capacity/cli/common.LazyGroup): `capacity --help` lists every command from the static
table (capacity/cli/commands.py) without importing a command module; the table cannot drift from the commands'
real help; a command's module is imported when that command is asked for, and an error while it imports still
ends in one line, exit 1."""
import importlib
import importlib.abc
import importlib.machinery
import subprocess
import sys

import pytest
from typer.core import TyperGroup
from typer.main import get_group

from capacity.cli import main
from capacity.cli.commands import COMMANDS
from capacity.cli.common import app
from capacity.errors import ConfigError

from .conftest import ROOT

MODULES = sorted({module for module, _ in COMMANDS.values()})


def _all_commands():
    for module in MODULES:
        importlib.import_module(f"capacity.cli.{module}")
    return get_group(app).commands


def _first_paragraph(text: str) -> str:
    end = text.find("\n\n")
    return " ".join((text if end == -1 else text[:end]).split())


def test_table_matches_each_command_module_and_help():
    real = _all_commands()
    assert set(real) == set(COMMANDS)  # a command added or removed without its table entry fails here
    for name, command in real.items():
        module, help_text = COMMANDS[name]
        callback = command.callback if not isinstance(command, TyperGroup) else None
        if callback is not None:
            assert callback.__module__ == f"capacity.cli.{module}", name
        assert _first_paragraph(command.help or "") == help_text, name


def test_group_help_equals_the_eager_listing():
    """The lazy listing prints what click prints for the same commands all loaded, in the same order (the order
    the modules used to register them: autoscale, costs, disagg, fleet, memory, plan, simulate, truth; groups last)."""
    real = _all_commands()
    eager_order = [n for n in COMMANDS if not isinstance(real[n], TyperGroup)] + \
                  [n for n in COMMANDS if isinstance(real[n], TyperGroup)]
    assert list(COMMANDS) == eager_order
    lazy = get_group(app)
    eager = TyperGroup(name=lazy.name, commands={n: real[n] for n in eager_order}, params=lazy.params,
                       help=lazy.help, no_args_is_help=True, rich_markup_mode=None)
    for width in (60, 80, 200):
        texts = []
        for group in (lazy, eager):
            ctx = group.make_context("capacity", ["--version"] * 0, resilient_parsing=True, terminal_width=width)
            texts.append(group.get_help(ctx))
        assert texts[0] == texts[1]


def _modules_after(*argv: str) -> set[str]:
    code = ("import sys; sys.argv = ['capacity', *sys.argv[1:]]\nfrom capacity.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith('capacity') or m in ('simpy', 'openpyxl')))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    return set(r.stdout.split())


def test_help_imports_no_command_module():
    loaded = _modules_after("--help")
    assert "capacity.cli.commands" in loaded
    assert not {f"capacity.cli.{m}" for m in MODULES} & loaded
    assert not {"simpy", "capacity.pipeline", "capacity.plan.planner"} & loaded


def test_command_help_imports_its_own_module_only():
    loaded = _modules_after("memory", "--help")
    assert "capacity.cli.memory" in loaded
    assert not {"capacity.cli.plan", "capacity.cli.truth", "capacity.cli.simulate", "capacity.cli.fleet"} & loaded


def test_typo_suggests_from_every_command(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["capacity", "fleet-dya"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 1
    err = capsys.readouterr().err  # before lazy loading: the same line (typer suggests from the group's commands)
    assert err.startswith("error: No such command 'fleet-dya'. Did you mean 'fleet-day', 'fleet'? (see `"), err


class _Failing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves capacity.cli._boom, whose import raises `error`."""

    def __init__(self, error: Exception):
        self.error = error

    def find_spec(self, fullname, path, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == "capacity.cli._boom" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise self.error


@pytest.mark.parametrize("error, line", [
    (ConfigError("--boom 3: must be 2"), "error: --boom 3: must be 2\n"),
    (RuntimeError("half-imported"), "error: internal error (RuntimeError: half-imported); please report it; "
                                    "CAPACITY_DEBUG=1 shows the traceback\n"),
])
def test_error_while_a_command_module_imports_is_one_line(error, line, capsys, monkeypatch):
    monkeypatch.setitem(COMMANDS, "boom", ("_boom", "A command whose module fails to import."))
    monkeypatch.setattr(sys, "meta_path", [_Failing(error), *sys.meta_path])
    monkeypatch.setattr(sys, "argv", ["capacity", "boom", "--x", "1"])
    monkeypatch.delenv("CAPACITY_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 1
    assert capsys.readouterr().err == line
    assert "capacity.cli._boom" not in sys.modules


def test_python_dash_m_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "capacity.cli", "models"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "llama-3.1-8b" in r.stdout, r.stderr[-2000:]
