"""The compiled build (setup.py at install, scripts/compile.sh in a checkout): what a user can see of it. Its results
are checked bit for bit against pure Python by bench/compiled.py; .ci/run runs the suites on the compiled install and
the oracle tests in pure Python."""
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


def test_a_compiled_module_edited_after_the_build_is_named_stale(tmp_path, monkeypatch):
    """The in-place build's trap: the .so runs, not the edited .py. Checked on a copy of the layout (a checkout with
    setup.py, one compiled module), with times set by hand."""
    import os

    pkg = tmp_path / "capacity"
    (pkg / "sched").mkdir(parents=True)
    (tmp_path / "setup.py").write_text("")
    init = pkg / "__init__.py"
    init.write_text((ROOT / "capacity" / "__init__.py").read_text())
    py, so = pkg / "sched" / "kv.py", pkg / "sched" / "kv.cpython-311-x86_64-linux-gnu.so"
    py.write_text("")
    so.write_bytes(b"")
    ns = {"__file__": str(init)}
    exec(compile(init.read_text(), str(init), "exec"), ns)
    os.utime(so, (1000.0, 1000.0))
    os.utime(py, (1000.5, 1000.5))  # within the copy's slack
    assert ns["stale_compiled"]() == []
    os.utime(py, (1010.0, 1010.0))  # edited ten seconds after the build
    assert ns["stale_compiled"]() == ["capacity/sched/kv.py"]
    (tmp_path / "setup.py").unlink()  # an installed wheel: nothing to rebuild, nothing said
    assert ns["stale_compiled"]() == []


def _compiled_modules() -> list:
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and n.value.startswith("capacity/") and n.value.endswith(".py")]
    files = {p for f in listed if "*" in f for p in ROOT.glob(f)} | {ROOT / f for f in listed if "*" not in f}
    return sorted(f for f in files if f.name != "__init__.py")


def test_no_compiled_class_derives_from_a_third_party_base():
    """pip builds in isolation, without pydantic, simpy or numpy: mypyc sees their classes as unknown and makes a
    subclass native, which fails at import ("mypyc classes can't have a metaclass", the CI failure of a BaseModel in
    cost/roofline.py). A class in a compiled module derives from the standard library's or the project's classes
    only, and names no metaclass."""
    offenders = []
    for path in _compiled_modules():
        tree = ast.parse(path.read_text())
        third = set()  # names bound to a third-party module or class at module level
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top = node.module.split(".")[0]
                if top not in ("capacity", "__future__", "typing", "collections", "dataclasses", "abc", "enum",
                               "mypy_extensions"):
                    third |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                third |= {(a.asname or a.name).split(".")[0] for a in node.names
                          if a.name.split(".")[0] not in ("math", "heapq", "bisect", "itertools", "functools")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for b in node.bases:
                    root = b
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    if isinstance(root, ast.Name) and root.id in third:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({ast.unparse(b)})")
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} metaclass"
                              for k in node.keywords if k.arg == "metaclass"]
    assert offenders == []
    assert len(_compiled_modules()) >= 10
