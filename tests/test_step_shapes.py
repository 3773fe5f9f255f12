"""bench/step_shapes.py compare: the same shapes measured with different kernels, side by side (hand-made files:
the ratios are worked by hand)."""
import json
import subprocess
import sys

from tests.conftest import ROOT


def _write(path, kernel, compiled, rows):
    path.write_text(json.dumps({"model": "tiny", "device": {"device_name": "NVIDIA H200"}, "attention_kernel": kernel,
                                "compiled": compiled, "rows": rows}))
    return str(path)


def test_compare_puts_each_kernel_beside_the_first_with_its_ratio(tmp_path):
    a = _write(tmp_path / "a.json", None, False, [  # a file from before paged attention: no kernel recorded
        {"shape": "decode 1 @ 1k", "eager_s": 0.0193, "graph_s": 0.0075},
        {"shape": "prefill 512", "eager_s": 0.0200, "graph_s": None}])
    b = _write(tmp_path / "b.json", "flash", True, [
        {"shape": "decode 1 @ 1k", "eager_s": 0.0150, "graph_s": 0.0060},
        {"shape": "prefill 512", "eager_s": 0.0150}])
    out = tmp_path / "cmp.json"
    r = subprocess.run([sys.executable, "bench/step_shapes.py", "compare", a, b, "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "sdpa" in r.stdout and "paged flash + compile" in r.stdout and "0.80x" in r.stdout and "0.75x" in r.stdout
    res = json.loads(out.read_text())
    assert res["kernels"] == ["sdpa", "paged flash + compile"]
    decode, prefill = res["rows"]
    assert decode["step_s"] == {"sdpa": 0.0075, "paged flash + compile": 0.0060}  # graph replays where captured
    assert abs(decode["ratio"]["paged flash + compile"] - 0.8) < 1e-12
    assert abs(prefill["ratio"]["paged flash + compile"] - 0.75) < 1e-12  # eager where there is no graph
