"""TensorRT-LLM's PyTorch executor host loop (capacity/engine/trtllm_host.py): fixed + per scheduled request,
overlapped with the GPU under the overlap scheduler (a step lasts the longer), added without it; the iteration-log
reader; the setting refused where the loop does not exist. Hand-computed figures throughout."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from capacity.cost.overlap import CpuOverlapCost, HostSerialCost, OutputPacedCost, cpu_wrap
from capacity.cost.step import LinearCost, PrefillChunk, StepPlan, decode_run_s
from capacity.engine import get_engine
from capacity.engine import trtllm_host as th
from capacity.engine.trtllm.config import TrtllmConfig
from capacity.errors import ConfigError
from tests.conftest import ROOT, run_cli

GPU = LinearCost(fixed_s=10e-3, per_token_s=0.0)  # every step 10 ms on the GPU, whatever its batch

# The 1.0-1.2 line as PyExecutor._profiler.profile_step's f-string writes it (py_executor.py), figures made up here
LINE = ("[10/01/2025-10:00:00] [TRT-LLM] [I] iter = {it}, global_rank = 0, rank = 0, currank_total_requests = 0/0, "
        "host_step_time = {host}ms, prev_device_step_time = {dev}ms, timestamp = 2025-10-01 10:00:00, "
        "num_scheduled_requests: {n}, states = {{'num_ctx_requests': {ctx}, 'num_ctx_tokens': 0, "
        "'num_generation_tokens': {n}}}")


def test_overlapped_host_loop_is_fixed_plus_per_request_against_the_gpu():
    c = CpuOverlapCost(GPU, per_step_s=2e-3, per_request_s=100e-6)
    fifty = StepPlan(decode_contexts=(500,) * 50)  # CPU 2 + 50 x 0.1 = 7 ms < GPU 10 ms: the GPU's
    assert c.step_s(fifty) == pytest.approx(10e-3, rel=1e-12)
    hundred = StepPlan(decode_contexts=(500,) * 100)  # CPU 2 + 10 = 12 ms > 10: the host's
    assert c.step_s(hundred) == pytest.approx(12e-3, rel=1e-12)
    # a prefill chunk that emits no token is still a scheduled request: 1 + 99 = 100 requests, 12 ms
    mixed = StepPlan(prefills=(PrefillChunk(300, emits_token=False),), decode_contexts=(9,) * 99)
    assert c.step_s(mixed) == pytest.approx(12e-3, rel=1e-12)
    # the 2 ms the GPU waits for the host, on top of the GPU's own breakdown (LinearCost: its 10 ms as overhead)
    assert c.breakdown(hundred)["overhead"] - GPU.breakdown(hundred)["overhead"] == pytest.approx(2e-3, rel=1e-9)
    np.testing.assert_allclose(c.decode_run_s([500] * 100, 5), [12e-3] * 5, rtol=1e-12)
    np.testing.assert_allclose(decode_run_s(c, [500] * 50, 3), [10e-3] * 3, rtol=1e-12)
    assert c.decode_line is None
    assert "2 ms a step + 100 us a scheduled request overlapped" in c.source


def test_per_request_term_off_keeps_the_flat_figure_and_the_output_pacing():
    flat = CpuOverlapCost(GPU, per_token_s=77e-6, per_step_s=2e-3)
    # 150 tokens x 77 us = 11.55 ms > 2 ms and > GPU 10 ms
    assert flat.step_s(StepPlan(decode_contexts=(5,) * 150)) == pytest.approx(11.55e-3, rel=1e-12)
    both = CpuOverlapCost(GPU, per_token_s=77e-6, per_step_s=2e-3, per_request_s=60e-6)
    # loop 2 + 150 x 0.06 = 11 ms < output handling 11.55 ms: the larger CPU term paces
    assert both.step_s(StepPlan(decode_contexts=(5,) * 150)) == pytest.approx(11.55e-3, rel=1e-12)
    assert both.breakdown(StepPlan(decode_contexts=(5,) * 150))["output handling"] == pytest.approx(1.55e-3, rel=1e-9)


def test_without_overlap_the_per_request_work_adds_to_the_step():
    s = HostSerialCost(GPU, 100e-6)
    assert s.step_s(StepPlan(decode_contexts=(500,) * 100)) == pytest.approx(20e-3, rel=1e-12)  # 10 + 100 x 0.1
    assert s.step_s(StepPlan()) == GPU.step_s(StepPlan())  # an empty step: no request, nothing added
    np.testing.assert_allclose(s.decode_run_s([500] * 30, 4), [13e-3] * 4, rtol=1e-12)
    assert s.breakdown(StepPlan(decode_contexts=(1,) * 30))["overhead"] == pytest.approx(10e-3 + 3e-3, rel=1e-9)


def test_cpu_wrap_picks_the_wrapper():
    assert cpu_wrap(GPU, 0.0, 0.0, 0.0, True) is GPU
    assert isinstance(cpu_wrap(GPU, 40e-6, 0.0, 0.0, True), OutputPacedCost)
    over = cpu_wrap(GPU, 0.0, 2e-3, 50e-6, True)
    assert isinstance(over, CpuOverlapCost) and over.per_request_s == 50e-6 and over.per_step_s == 2e-3
    serial = cpu_wrap(GPU, 0.0, 0.0, 50e-6, False)
    assert isinstance(serial, HostSerialCost)
    paced = cpu_wrap(GPU, 40e-6, 0.0, 50e-6, False)  # not overlapped: added, and the output handling beside it
    assert isinstance(paced, OutputPacedCost) and isinstance(paced.inner, HostSerialCost)
    assert over.with_inner(GPU).per_request_s == 50e-6


def test_reads_the_iteration_log_formats():
    text = "\n".join([
        LINE.format(it=5, host="30.5", dev="20.25", n=128, ctx=0),
        "[TRT-LLM] [I] something else, iter = 3",
        # later lines print num_scheduled_requests before the times, with ' ='
        "[TRT-LLM] iter = 12588, global_rank = 0, rank = 0, num_scheduled_requests = 18, kv_cache_util = 0.08, "
        "host_step_time = 29.9ms, prev_device_step_time = N/A, timestamp = 2026-09-17 10:58:33",
        # 0.19-0.21: elapsed_time in seconds, no device time
        "[04/28/2025-09:56:44] [TRT-LLM] [I] iter = 198, global_rank = 0, rank = 0, currank_total_requests = 0/0, "
        "elapsed_time = 0.00625s, timestamp = 2025-04-28 09:56:44, num_scheduled_requests: 10, states = "
        "{'num_ctx_requests': 1, 'num_ctx_tokens': 300, 'num_generation_tokens': 16}",
    ])
    rows = th.parse_iterlog(text)
    assert rows == [th.IterRow(5, 0.0305, 0.02025, 128, 0), th.IterRow(12588, 0.0299, None, 18, 0),
                    th.IterRow(198, 0.00625, None, 10, 1)]
    assert rows[0].host_bound  # 30.5 > 1.05 x 20.25
    assert not rows[1].host_bound  # no device time printed: cannot tell


def test_per_request_figure_from_host_bound_decode_rows():
    # host = 2 ms + 0.3 ms x n on three host-bound rows (device 20 ms), plus rows that must not count: a GPU-bound
    # row (20.5 < 1.05 x 20), a context row, and a first row without device time
    lines = [LINE.format(it=i, host=f"{2 + 0.3 * n:.3f}", dev="20.0", n=n, ctx=0)
             for i, n in enumerate((100, 150, 200, 200), 10)]
    lines += [LINE.format(it=20, host="20.5", dev="20.0", n=10, ctx=0),
              LINE.format(it=21, host="90.0", dev="20.0", n=100, ctx=3),
              LINE.format(it=1, host="5000", dev="N/A", n=1, ctx=1).replace("N/Ams", "N/A")]
    fit = th.per_request_from_log(th.parse_iterlog("\n".join(lines)))
    assert fit.rows == 4
    assert fit.per_request_s == pytest.approx(0.3e-3, rel=1e-9)
    assert fit.fixed_s == pytest.approx(2e-3, rel=1e-6)
    assert fit.per_request_range_s == pytest.approx((0.3e-3, 0.3e-3), rel=1e-6)  # exact line: no spread
    # scattered rows: host 32, 48, 62, 60 ms at 100, 150, 200, 200. OLS by hand: mean n 162.5, mean host 50.5 ms;
    # Sxx = 62.5^2 + 12.5^2 + 2 x 37.5^2 = 6875; Sxy = (-62.5)(-18.5) + (-12.5)(-2.5) + 37.5 x 11.5 + 37.5 x 9.5
    # = 1156.25 + 31.25 + 431.25 + 356.25 = 1975 (ms): slope 0.287273 ms; intercept 50.5 - 0.287273 x 162.5 = 3.818 ms
    scattered = [th.IterRow(i, h / 1e3, 0.02, n, 0) for i, (h, n) in enumerate(((32, 100), (48, 150), (62, 200),
                                                                                  (60, 200)))]
    f2 = th.per_request_from_log(scattered)
    assert f2.per_request_s == pytest.approx(1975 / 6875 * 1e-3, rel=1e-9)
    assert f2.fixed_s == pytest.approx((50.5 - 1975 / 6875 * 162.5) * 1e-3, rel=1e-9)
    lo, hi = f2.per_request_range_s
    assert lo < f2.per_request_s < hi


def test_too_few_rows_is_one_line():
    rows = [th.IterRow(1, 0.05, 0.02, 100, 0), th.IterRow(2, 0.06, 0.02, 100, 0)]
    with pytest.raises(ConfigError, match="2 host-bound decode-only rows at 1 batch size"):
        th.per_request_from_log(rows)


def test_the_engine_figure_by_backend_and_release(monkeypatch):
    py = get_engine("trtllm@1.2")
    assert th.applies(py, TrtllmConfig(engine="trtllm@1.2"))
    assert th.host_per_request_s(py, TrtllmConfig(engine="trtllm@1.2")) == 0.0  # no release measured yet
    assert th.host_per_request_s(py, TrtllmConfig(engine="trtllm@1.2", trtllm_host_us_per_request=250)) == 250e-6
    monkeypatch.setitem(th.PER_REQUEST_S, "1.2", (0.1e-3, 0.3e-3))
    assert th.host_per_request_s(py, TrtllmConfig(engine="trtllm@1.2")) == 0.3e-3  # the slow end
    assert th.host_per_request_s(py, TrtllmConfig(engine="trtllm@1.2"), profile="x.json") == 0.0  # fitted already
    cpp = get_engine("trtllm@1.1:tensorrt")
    assert not th.applies(cpp, TrtllmConfig(engine="trtllm@1.1:tensorrt"))
    with pytest.raises(ConfigError, match="trtllm_host_us_per_request 250.0: the PyTorch executor's host loop"):
        th.host_per_request_s(cpp, TrtllmConfig(engine="trtllm@1.1:tensorrt", trtllm_host_us_per_request=250))
    assert th.host_per_request_s(get_engine("vllm"), TrtllmConfig(engine="trtllm")) == 0.0


def _tpot(*extra: str) -> tuple[float, str]:
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "300", "--input-len", "200", "--output-len",
                "100", "--warmup", "0", "--seed", "0", "--json", "--engine", "trtllm@1.2", "--arrival", "offline",
                *extra, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    return d["summary"]["tpot_s"]["mean"], d["step_cost_source"]


def test_simulate_paces_steps_by_the_host_loop():
    base, src = _tpot()
    assert "a scheduled request" not in src
    slow, src_slow = _tpot("--trtllm-host-us", "2000")  # 300 requests at once: a step of ~300 x 2 ms >> the GPU's
    assert "2000 us a scheduled request overlapped" in src_slow
    assert slow > 5 * base
    tiny, _ = _tpot("--trtllm-host-us", "1")  # 2 ms + 1 us x batch < the GPU step: overlapped, nothing changes
    assert tiny == pytest.approx(base, rel=1e-9)
    serial, src_serial = _tpot("--trtllm-host-us", "1", "--no-async-scheduling")
    assert "1 us a scheduled request before each step" in src_serial
    no_overlap, _ = _tpot("--no-async-scheduling")
    assert serial > no_overlap  # added, not hidden


def test_bad_values_are_one_line():
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine", "trtllm@1.2", "--trtllm-host-us", "-5")
    assert r.returncode == 1 and "trtllm_host_us_per_request" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine", "trtllm@1.1:tensorrt", "-n", "20", "--arrival", "offline",
                "--trtllm-host-us", "100")
    assert r.returncode == 1 and "trtllm_host_us_per_request 100.0" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_dev_log_sources_follow_the_split_rule():
    """Every development source's URL hashes outside the held-out third (the held-out file is not read here)."""
    d = Path(ROOT) / "tests/data/trtllm_iterlogs"
    dev = yaml.safe_load((d / "dev.yaml").read_text())["sources"]
    assert dev and all(int(hashlib.sha256(s["url"].encode()).hexdigest(), 16) % 3 != 0 for s in dev)
    assert not any(s["usable"] for s in dev) and not th.PER_REQUEST_S  # no figure without a usable log
