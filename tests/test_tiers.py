"""The suite's tiers (tests/conftest.py TIERS, registered in pyproject.toml): every test file has exactly one, so
`pytest -m unit` (or engine_oracle, end_to_end) runs a tier alone and the three together are the whole suite."""
import re
import tomllib

from tests.conftest import ROOT, TIER_OF, TIERS


def test_every_test_file_has_one_tier():
    files = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert [f for f in files if f not in TIER_OF] == []  # a new test file: add it to one tier in conftest.TIERS
    assert [f for f in TIER_OF if f not in files] == []  # a renamed or removed one
    named = [n for names in TIERS.values() for n in names.split()]
    assert len(named) == len(set(named)), [n for n in named if named.count(n) > 1]


def test_the_tiers_are_registered_markers():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {re.match(r"\w+", m).group(0) for m in cfg["markers"]}
    assert set(TIERS) | {"slow"} <= registered


def test_a_tier_marker_reaches_the_tests(request):
    assert request.node.get_closest_marker("end_to_end") is not None
    assert request.node.get_closest_marker("unit") is None
