"""The mypyc build of the simulator's hot modules (all metadata stays in pyproject.toml).

    pip install .  /  pip install -e .      # compiled where a C compiler is present (mypy comes from
                                            # [build-system] requires), pure Python with a one-line note where not
    CAPACITY_MYPYC=0 pip install -e .       # pure Python on purpose (nothing compiled)
    bash scripts/compile.sh [--clean]       # a checkout: compile in place again after editing a compiled module
                                            # (.so next to each .py), or remove them

`capacity --version` says which build runs. Compiled, the same sources give the same results bit for bit
(`bench/compiled.py`, in CI), 2-2.6x faster. An editable install compiles in place: a compiled module edited
afterwards is stale until `scripts/compile.sh` runs again (the test suite refuses to run on a stale build).
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from glob import glob

from setuptools import setup
from setuptools.command.build_ext import build_ext

# unset: compile where possible, else pure Python with a note; "0": pure Python; "1": compile or fail the install
MODE = os.environ.get("CAPACITY_MYPYC", "")
# the simulator's hot loop: the schedulers, the step costs, the engine loop and what drives it (not the packages'
# __init__: compiled, a package in a group named inside the package gets a wrong __path__)
COMPILED = sorted(set(glob("capacity/sched/*.py")) - {"capacity/sched/__init__.py"}) + [
    "capacity/cost/step.py", "capacity/cost/roofline.py", "capacity/sim/entities.py", "capacity/sim/simulator.py",
    "capacity/sim/routing.py", "capacity/sim/sources.py", "capacity/sim/lag.py", "capacity/sim/recorder.py"]


def _pure(why: str) -> list:
    """No compiled modules: fail where they were asked for (CAPACITY_MYPYC=1), else say why in one line."""
    if MODE == "1":
        sys.exit(f"CAPACITY_MYPYC=1: {why}")
    print(f"capacity: installing pure Python (2-2.6x slower simulations, same results): {why}", file=sys.stderr)
    return []


def _compiler() -> str | None:
    """The C compiler setuptools would call (CC, else the one Python was built with), if it is on PATH."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    return shutil.which(cc[0]) if cc else None


def _ext_modules() -> list:
    if MODE == "0":
        return []
    if _compiler() is None:
        return _pure("no C compiler found (set CC, or install gcc)")
    try:
        from mypyc.build import mypycify
    except ImportError:
        return _pure("mypyc is not importable (pip install mypy==2.4.1, or let pip build in isolation)")
    # one shared library for the group, inside the package (capacity/compiled__mypyc...so): importable wherever
    # `capacity` is, an in-place (editable) build included. pip's isolated build has none of the dependencies, so
    # mypy sees simpy and numpy as Any there: an ignore comment needed with them installed is unused without them.
    try:
        return mypycify(["--no-warn-unused-ignores", *COMPILED], opt_level="3", group_name="capacity.compiled")
    except SystemExit as e:  # mypyc exits on a type error it cannot compile past
        return _pure(f"mypyc stopped: {e.code}")


class _BuildExt(build_ext):
    """A compile or link that fails leaves the install pure Python (with the note) instead of failing it."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # CompileError, LinkError, a missing header: the build's own errors vary by platform
            if MODE == "1":
                raise
            for ext in self.extensions:  # nothing half-built stays next to the sources
                for path in (self.get_ext_fullpath(ext.name),):
                    if os.path.exists(path):
                        os.remove(path)
            _pure(f"the C build failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _BuildExt})
