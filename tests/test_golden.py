"""Golden outputs: the JSON of 18 CLI cases (memory, simulate with each policy, sweep, plan), recorded on purpose
(tests/golden/cases.py says when and why), must come out figure for figure the same, except the figures
`cases.CHANGES` lists with the reason each changed. New keys may appear; recorded keys may not vanish."""
import json
import math

import pytest

from tests.conftest import ROOT, run_cli
from tests.golden.cases import CASES, CHANGES, VOLATILE

OUT = ROOT / "tests" / "golden" / "outputs"


def flatten(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from flatten(v, f"{path}.{k}" if path else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from flatten(v, f"{path}[{i}]")
    else:
        yield path, x


def same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool) != isinstance(b, bool):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return a == b


def explained(case: str, path: str) -> str | None:
    for (c, prefix), why in CHANGES.items():
        if c == case and (path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")):
            return why
    return None


def diff(case: str, old: dict, new: dict) -> list[str]:
    got = dict(flatten(new))
    bad = []
    for path, v in flatten(old):
        if path.split(".")[-1] in VOLATILE or explained(case, path):
            continue
        if path not in got:
            bad.append(f"{path}: recorded {v!r}, now missing")
        elif not same(v, got[path]):
            bad.append(f"{path}: recorded {v!r}, now {got[path]!r}")
    return bad


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_output_unchanged(case):
    r = run_cli(*CASES[case], timeout=600)
    assert r.returncode == 0, r.stderr
    old = json.loads((OUT / f"{case}.json").read_text())
    bad = diff(case, old, json.loads(r.stdout))
    assert not bad, f"{case}: {len(bad)} figures changed without a reason in tests/golden/cases.py:\n" + "\n".join(bad[:40])


def test_every_listed_change_still_applies():
    """A reason in CHANGES must point at a recorded figure; stale entries would hide future regressions."""
    for (case, prefix) in CHANGES:
        old = dict(flatten(json.loads((OUT / f"{case}.json").read_text())))
        assert any(p == prefix or p.startswith(prefix + ".") or p.startswith(prefix + "[") for p in old), (case, prefix)


def test_the_comparison_can_fail():
    """The comparator itself: a changed figure, a missing key and a type change are each reported."""
    old = {"a": {"b": 1.0, "c": [1, 2]}, "d": "x", "e": True}
    assert diff("none", old, old) == []
    assert diff("none", old, {"a": {"b": 1.0 + 1e-6, "c": [1, 2]}, "d": "x", "e": True})
    assert diff("none", old, {"a": {"b": 1.0, "c": [1]}, "d": "x", "e": True})
    assert diff("none", old, {"a": {"b": 1.0, "c": [1, 2]}, "d": "x", "e": 1})
