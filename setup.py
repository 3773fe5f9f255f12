"""The optional mypyc build of the simulator's hot modules (all metadata stays in pyproject.toml).

    pip install -e .                        # pure Python: the default, nothing compiled
    bash scripts/compile.sh                 # a checkout: compiled in place (.so next to each .py); --clean undoes it
    CAPACITY_MYPYC=1 pip wheel --no-deps --no-build-isolation -w dist .
                                            # a wheel with them compiled: needs a C compiler and mypy (the dev
                                            # extra's) to build, neither to install; `capacity.compiled()` says
                                            # which build runs

Compiled, the same sources give the same results bit for bit (`bench/compiled.py`, in CI), 2-2.6x faster.
"""
from __future__ import annotations

import os
import sys
from glob import glob

from setuptools import setup

MYPYC = os.environ.get("CAPACITY_MYPYC", "") not in ("", "0")
# the simulator's hot loop: the schedulers, the step costs, the engine loop and what drives it (not the packages'
# __init__: compiled, a package in a group named inside the package gets a wrong __path__)
COMPILED = sorted(set(glob("capacity/sched/*.py")) - {"capacity/sched/__init__.py"}) + [
    "capacity/cost/step.py", "capacity/cost/roofline.py", "capacity/sim/entities.py", "capacity/sim/simulator.py",
    "capacity/sim/routing.py", "capacity/sim/sources.py", "capacity/sim/lag.py"]

ext_modules = []
if MYPYC:
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("CAPACITY_MYPYC=1: mypyc is not importable here: pip install mypy==2.4.1 (the dev extra's) and build "
                 "with --no-build-isolation")
    # one shared library for the group, inside the package (capacity/compiled__mypyc...so): importable wherever
    # `capacity` is, an in-place build included
    ext_modules = mypycify(COMPILED, opt_level="3", group_name="capacity.compiled")

setup(ext_modules=ext_modules)
