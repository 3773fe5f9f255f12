"""The import graph of `capacity` (issue 50): no more than MAX_CYCLES import circles, counting every import statement
(module level, inside a function, and under `if TYPE_CHECKING:`, which only an annotation uses but which still
makes two modules each other's dependency), and fewer than 50 first-party imports inside functions.

The circles resolved by moving the shared piece down or by a Protocol in the lower module stay resolved:
`capacity.draws` <-> the workload group (`SpecView`), `capacity.sched.base` <-> `kv` (`capacity.sched.seq`),
`continuous` <-> `stretch` and `sglang` <-> `sglang_overlap` (`capacity.sched.configs`), and the plan's frontier /
planner / why (`capacity.plan.view.PlannerView`), `capacity.engine.config` <-> `registry` (the config no longer
imports the registry: `register` hands each engine's class its spec check). The one left: seven modules of
`capacity.sim` (compiled together by mypyc; a Protocol there would cost native attribute access).
"""
import ast

import pytest

from .conftest import ROOT

grimp = pytest.importorskip("grimp")

MAX_CYCLES = 1  # with TYPE_CHECKING imports: capacity.sim's seven modules
MAX_FUNCTION_IMPORTS = 49  # issue 50: "function-level first-party imports under 50" (statements: 11 now)
RESOLVED = ("capacity.sched", "capacity.plan", "capacity.draws", "capacity.workload", "capacity.sessions",
            "capacity.replay", "capacity.vision_requests")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_circles_finds_a_circle_and_only_circles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}, "g": set()}
    assert sorted(circles(g)) == [["a", "b", "c"], ["d", "e"]]  # a self-import is no circle; d, e reach a, not back
    assert circles({"a": {"b"}, "b": set()}) == []


def _capacity_graph() -> dict[str, set[str]]:
    g = grimp.build_graph("capacity", exclude_type_checking_imports=False, cache_dir=None)
    return {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}


def test_import_circles_including_type_checking_imports():
    found = circles(_capacity_graph())
    assert len(found) <= MAX_CYCLES, "import circles (TYPE_CHECKING imports included):\n" + \
        "\n".join(" <-> ".join(c) for c in found)
    back = [c for c in found if any(m == p or m.startswith(p + ".") for m in c for p in RESOLVED)]
    assert not back, f"a resolved circle is back: {back}"


def test_a_circle_through_type_checking_imports_counts(tmp_path, monkeypatch):
    """A package whose modules import each other only for annotations has one circle in the graph measured."""
    pkg = tmp_path / "tcpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tcpkg.high import H\n")
    (pkg / "high.py").write_text("from tcpkg.low import *\nclass H: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = grimp.build_graph("tcpkg", exclude_type_checking_imports=False, cache_dir=None)
    assert circles({m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}) == [["tcpkg.high", "tcpkg.low"]]


def _function_imports() -> list[str]:
    """First-party imports inside a function body (module-level ones, TYPE_CHECKING blocks included, are not)."""
    out = []
    for path in sorted((ROOT / "capacity").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] if not node.level else ["capacity"]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                if any(n.split(".")[0] in ("capacity", "calibrate") for n in names):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(set(out))


def test_function_level_first_party_imports_under_50():
    found = _function_imports()
    assert len(found) <= MAX_FUNCTION_IMPORTS, "\n".join(found)
