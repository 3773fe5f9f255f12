"""The optional compiled build (setup.py, scripts/compile.sh): what a user can see of it. Its results are checked bit
for bit against pure Python by bench/compiled.py, and the whole default suite runs compiled, both in .ci/run."""
import ast

import capacity
from tests.conftest import ROOT, run_cli


def test_version_says_which_build_runs():
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    build = "simulator compiled by mypyc" if capacity.compiled() else "pure Python"
    assert out.stdout.strip() == f"capacity {capacity.__version__} ({build})"


def test_the_compiled_modules_are_the_simulators_hot_loop_and_exist():
    """setup.py's list: every file exists; the package __init__ stays pure (compiled in a group named inside the
    package, a package gets a wrong __path__ and its other submodules stop importing)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and n.value.startswith("capacity/") and n.value.endswith(".py")]
    assert "capacity/sched/__init__.py" in listed  # named to be taken out of the glob
    for f in listed:
        assert "*" in f or (ROOT / f).is_file(), f
    assert {"capacity/sim/entities.py", "capacity/cost/roofline.py"} <= set(listed)
    assert not list((ROOT / "capacity").rglob("__init__.*.so"))  # no package compiled (an in-place build included)
