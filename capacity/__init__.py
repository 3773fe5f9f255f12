"""capacity: predict GPU memory, latency and GPU count for LLM serving before you deploy.

The core (model cards, GPU catalogue, memory budget) needs only numpy/pydantic/pyyaml; heavy packages
(torch, streamlit, plotly, openpyxl, ray) are imported inside the functions that use them.
"""
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

__version__ = "0.1.0"


def compiled() -> bool:
    """Whether the simulator's hot modules run compiled by mypyc (`pip install` compiles them where a C compiler is
    present; `scripts/compile.sh` in a checkout): the same sources and results, bit for bit (`bench/compiled.py`),
    about 2-2.6x faster."""
    mod = sys.modules.get("capacity.sched.continuous")
    if mod is not None:
        return not str(getattr(mod, "__file__", "")).endswith(".py")
    # not imported yet: what an import would load, without importing the simulator (`import capacity` stays light)
    here = Path(__file__).parent / "sched"
    return any((here / f"continuous{suffix}").is_file() for suffix in EXTENSION_SUFFIXES)


def stale_compiled() -> list[str]:
    """In a source checkout, the compiled modules whose .py was edited after the build: the .so next to it is what
    runs, so the edit has no effect until `scripts/compile.sh` runs again. Empty for an installed wheel."""
    pkg = Path(__file__).parent
    if not (pkg.parent / "setup.py").is_file():
        return []
    stale = []
    for so in pkg.rglob("*.so"):
        py = so.with_name(so.name.split(".", 1)[0] + ".py")
        # 1 s of slack: a copy of a whole tree writes the two within it, in either order
        if py.is_file() and py.stat().st_mtime > so.stat().st_mtime + 1.0:
            stale.append(py.relative_to(pkg.parent).as_posix())
    return sorted(stale)
