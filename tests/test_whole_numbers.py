"""Counts in traces and profiles are whole numbers, never coerced (issue 49 item 9): a trace row with
`input_tokens: 10.7` is not cut to 10 tokens, `true` is not 1 token, and a profile's grid of token counts takes
JSON integers only. Each refusal names the row (or field path) and the value."""
from __future__ import annotations

import json

import pytest

from capacity.cost.profile import load_profile
from capacity.errors import ConfigError
from capacity.workload import WorkloadSpec, load_trace
from tests.conftest import ROOT, run_cli


def row(**kw) -> str:
    return json.dumps({"timestamp": 1, "input_tokens": 5, "output_tokens": 3, **kw})


@pytest.mark.parametrize("bad,msg", [
    (row(input_tokens=10.7), "row 2: input_tokens 10.7 is not a whole number of tokens"),
    (row(output_tokens=True), "row 2: output_tokens True is not a number"),
    (row(input_tokens=[5]), "row 2: input_tokens [5] is not a number"),
    (row(input_tokens="5.5"), "row 2: input_tokens '5.5' is not a whole number of tokens"),
    (row(input_tokens=float("nan")), "row 2: input_tokens nan is not a whole number of tokens"),
    (row(input_tokens=1e300), "row 2: input_tokens 1e+300 is more than 2,147,483,647 tokens"),
    (row(timestamp=True), "row 2: timestamp True is not a number"),
])
def test_trace_counts_are_whole_numbers(tmp_path, bad, msg):
    p = tmp_path / "t.jsonl"
    p.write_text(row() + "\n" + bad + "\n")
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("+", r"\+")):
        load_trace(p, WorkloadSpec())


def test_whole_floats_and_csv_strings_still_count(tmp_path):
    """10.0 (a JSON writer's float) and "10" (every CSV cell) are whole numbers; a CSV's 10.7 is not."""
    p = tmp_path / "t.jsonl"
    p.write_text(row(input_tokens=10.0) + "\n")
    assert load_trace(p, WorkloadSpec())[0].prompt_tokens == 10
    c = tmp_path / "t.csv"
    c.write_text("timestamp,input_tokens,output_tokens\n1,10,2\n2,10.7,2\n")
    with pytest.raises(ConfigError, match="row 2: input_tokens '10.7' is not a whole number of tokens"):
        load_trace(c)


def test_through_the_cli(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(row() + "\n" + row(timestamp=2, input_tokens=10.7) + "\n")
    w = tmp_path / "w.yaml"
    w.write_text(f"arrivals: {{kind: trace}}\ntrace: {p}\nnum_requests: 2\n")
    r = run_cli("simulate", "-m", "tiny", "--workload", str(w))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "row 2: input_tokens 10.7 is not a whole number of tokens" in r.stderr


@pytest.mark.parametrize("path,value,msg", [
    (("tokens", 0), True, "tokens.0: Input should be a valid integer"),
    (("tokens", 0), 1.5, "tokens.0: Input should be a valid integer"),
    (("decode_batch", 0), 1.0, "decode_batch.0: Input should be a valid integer"),
    (("provenance", "cpu_threads"), "8", "provenance.cpu_threads: Input should be a valid integer"),
    (("schema_version",), True, "schema_version True is not supported"),
])
def test_profile_counts_are_json_integers(tmp_path, path, value, msg):
    src = next((ROOT / "capacity" / "data" / "profiles").glob("*.json"))
    data = json.loads(src.read_text())
    assert load_profile(src)  # the bundled profile itself loads
    d = data
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=msg):
        load_profile(p)
