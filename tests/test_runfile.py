"""Run files are checked in one place (capacity.truth.runfile) before calibrate --from-run fits them or compare
compares them (issue 49 items 7 and 8): a request that is not an object, a time that is missing, a string or NaN,
a negative time, times out of order and token times that go backwards are refused in one line naming the request,
the field and the value; never an internal error, never a fit of an impossible measurement."""
from __future__ import annotations

import copy
import json

import pytest

from capacity.errors import CapacityError
from capacity.truth.runfile import check_run
from tests.conftest import run_cli


def good_run(n: int = 12) -> dict:
    """n requests 0.5 s apart, 40 ms to the first token, 4 tokens 10 ms apart."""
    reqs = []
    for i in range(n):
        s = 0.5 * i
        times = [s + 0.04 + 0.01 * j for j in range(4)]
        reqs.append({"id": i, "status": "ok", "scheduled_s": s, "sent_s": s, "first_token_s": times[0],
                     "finish_s": times[-1], "token_times": times, "prompt_tokens": 32, "max_tokens": 4,
                     "output_tokens": 4})
    reqs.append({"id": n, "status": "http_error", "scheduled_s": 0.5 * n, "sent_s": float("nan"),
                 "first_token_s": float("nan"), "finish_s": float("nan"), "token_times": [], "prompt_tokens": 32,
                 "max_tokens": 4, "output_tokens": 0})  # a failed request's times are not measurements
    return {"meta": {}, "requests": reqs}


def broken(change) -> dict:
    run = copy.deepcopy(good_run())
    change(run["requests"])
    return run


def _del(r, k):
    del r[k]


CASES = [
    (lambda q: _del(q[3], "first_token_s"), "requests[3] (id 3): first_token_s is missing"),
    (lambda q: q.__setitem__(2, "x"), "requests[2]: not an object (got 'x')"),
    (lambda q: q[1].__setitem__("finish_s", "1.5"), "requests[1] (id 1): finish_s '1.5' is not a number of seconds"),
    (lambda q: q[1].__setitem__("sent_s", float("nan")), "requests[1] (id 1): sent_s nan is not a finite number"),
    (lambda q: q[4].__setitem__("finish_s", -1.0), "requests[4] (id 4): finish_s -1.0 is negative"),
    (lambda q: q[5].__setitem__("first_token_s", 2.0), "requests[5] (id 5): first_token_s 2.0 is before sent_s 2.5"),
    (lambda q: q[5].__setitem__("finish_s", 2.0), "requests[5] (id 5): finish_s 2.0 is before first_token_s 2.54"),
    (lambda q: q[6]["token_times"].__setitem__(2, 3.045),
     "requests[6] (id 6): token_times[2] 3.045 is before token_times[1] 3.05"),
    (lambda q: q[6]["token_times"].__setitem__(3, 9.0), "requests[6] (id 6): token_times[3] 9.0 is after finish_s 3.07"),
    (lambda q: q[7].__setitem__("output_tokens", True), "requests[7] (id 7): output_tokens True is not a whole number"),
    (lambda q: q[7].__setitem__("output_tokens", 3.5), "requests[7] (id 7): output_tokens 3.5 is not a whole number"),
]


@pytest.mark.parametrize("change,msg", CASES)
def test_impossible_requests_are_named(change, msg):
    with pytest.raises(CapacityError) as e:
        check_run(broken(change), "r.json")
    assert str(e.value).startswith(f"r.json: {msg}"), str(e.value)


def test_a_good_run_passes_and_a_fit_needs_its_replay_fields():
    assert check_run(good_run(), "r.json", fit=True)
    run = broken(lambda q: _del(q[0], "scheduled_s"))
    assert check_run(run, "r.json")  # compare does not replay
    with pytest.raises(CapacityError, match=r"requests\[0\] \(id 0\): scheduled_s is missing"):
        check_run(run, "r.json", fit=True)
    with pytest.raises(CapacityError, match=r"requests\[0\] \(id 0\): prompt_tokens 32.0 is not a whole number"):
        check_run(broken(lambda q: q[0].__setitem__("prompt_tokens", 32.0)), "r.json", fit=True)


def test_calibrate_and_compare_refuse_them_in_one_line(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(good_run()))
    fit = ["--num-blocks", "256", "--block-size", "16", "--max-batch-tokens", "512", "--max-seqs", "8", "--out",
           str(tmp_path / "fit.json")]
    for i, (change, msg) in enumerate(CASES[:5]):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(json.dumps(broken(change)))  # NaN is written as NaN, as json.dumps and loadtest write it
        for args in (["calibrate", "--from-run", str(bad), *fit], ["compare", str(good), str(bad)]):
            r = run_cli(*args)
            assert r.returncode == 1 and r.stderr.startswith(f"error: {bad}: {msg}"), r.stderr
            assert r.stderr.count("\n") == 1 and "internal error" not in r.stderr, r.stderr
    bad = tmp_path / "back.json"
    bad.write_text(json.dumps(broken(CASES[7][0])))
    r = run_cli("compare", str(good), str(bad))
    assert r.returncode == 1 and "token_times[2] 3.045 is before token_times[1] 3.05" in r.stderr
