"""The load generator against real processes on 127.0.0.1: a misbehaving SSE server (500s, connections closed
mid-stream, stalls past the timeout, malformed lines, nobody listening) and a real engine (transformers
continuous batching on CPU, tiny random Llama, word-level tokenizer). Every request is accounted for, runs
finish within their bounds, lengths are exact on the real engine, and validate/fit run on its output."""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from capacity.truth.loadtest import counts, run_load, summarize_run
from capacity.workload import Request
from tests.conftest import ROOT, run_cli

pytest.importorskip("httpx_sse")  # in the dev extra: CI has it


class FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0  # requests seen, all modes (the Ctrl-C test waits on it)

    def log_message(self, *a):
        pass

    def do_POST(self):
        FaultHandler.served += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode, n = body["model"], body["max_tokens"]
        if mode == "http500":
            msg = b'{"error": "boom"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            if mode == "close" and i == 2:
                self.wfile.write(b'data: {"choices": [{"text": " w')  # half a line, then the socket goes away
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if mode == "stall" and i == 1:
                time.sleep(3)
            if mode == "malformed" and i == 1:
                self.wfile.write(b"data: {not json\n\n")
                self.wfile.flush()
                continue
            self.wfile.write(f'data: {{"choices": [{{"text": " w{i}"}}]}}\n\n'.encode())
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


@pytest.fixture(scope="module")
def fault_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FaultHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def reqs(n=6, out=5):
    return [Request(i, i * 0.01, 8, out) for i in range(n)]


@pytest.mark.parametrize("mode,status", [("ok", "ok"), ("http500", "http_error"), ("close", "connection_error"),
                                         ("stall", "timeout"), ("malformed", "malformed_stream")])
def test_every_request_is_accounted_for(fault_server, mode, status):
    t0 = time.perf_counter()
    run = run_load(fault_server, mode, reqs(), timeout_s=1.0, max_duration_s=20, metrics=False)
    assert time.perf_counter() - t0 < 20
    assert counts(run) == {status: 6}
    if mode == "ok":
        assert all(r["output_tokens"] == 5 and len(r["token_times"]) == 5 for r in run["requests"])
        s = summarize_run(run)
        assert s["n_requests"] == 6 and s["ttft_s"]["p50"] > 0 and s["outcomes"] == {"ok": 6}
    else:
        assert all(r["error"] for r in run["requests"])


def test_nobody_listening_and_the_run_bound():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    run = run_load(f"http://127.0.0.1:{port}", "x", reqs(4), timeout_s=2, max_duration_s=10, metrics=False)
    assert counts(run) == {"connection_error": 4}


def test_run_bound_cuts_a_long_run(fault_server):
    t0 = time.perf_counter()
    long = [Request(i, i * 0.5, 8, 3) for i in range(40)]  # would take 20 s to send them all
    run = run_load(fault_server, "ok", long, timeout_s=5, max_duration_s=2.0, metrics=False)
    assert time.perf_counter() - t0 < 6
    c = counts(run)
    assert sum(c.values()) == 40 and c.get("ok", 0) >= 3 and c.get("not_sent", 0) >= 30


# ---- a real engine -----------------------------------------------------------------------------------------
def start_engine(model_dir: str, blocks: int = 256, batch_tokens: int = 256):
    """transformers serve --continuous-batching on 127.0.0.1 (one CPU thread): (process, url)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("transformers")), "serve", model_dir,
                             "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                             "--cb-num-blocks", str(blocks), "--cb-block-size", "16",
                             "--cb-max-batch-tokens", str(batch_tokens)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("transformers serve did not start")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    pytest.importorskip("transformers")
    if shutil.which("transformers", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("transformers CLI not installed")
    from bench.engines.tiny_hf import build

    d = build(str(ROOT / "models/tiny.yaml"), str(tmp_path_factory.mktemp("tinyhf")))
    proc, url = start_engine(str(d))
    yield url, str(d)
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow  # a real engine: in CI (`pytest -m slow`), not in the default local run
def test_real_engine_exact_lengths_and_validation(engine, tmp_path):
    url, model = engine
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1 / 4.0, 24))
    run = run_load(url, model, [Request(i, float(t[i]), 48, 8) for i in range(24)], timeout_s=60, max_duration_s=120)
    assert counts(run) == {"ok": 24}
    assert {r["output_tokens"] for r in run["requests"]} == {8}
    assert {r["usage_prompt_tokens"] for r in run["requests"]} == {48}  # one word = one token
    s = summarize_run(run)
    assert 0 < s["ttft_s"]["p50"] < s["e2e_s"]["p50"] and s["tpot_s"]["n"] == 24
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    fit = tmp_path / "fit.json"
    # transformers CB has no batch cap of its own: 512 stands for "never binding" here
    r = run_cli("calibrate", "--from-run", str(path), "--num-blocks", "256", "--block-size", "16",
                "--max-batch-tokens", "256", "--max-seqs", "512", "--attention", "packed", "--out", str(fit),
                timeout=300)
    assert r.returncode == 0, r.stderr
    page = tmp_path / "validate.html"
    pred = tmp_path / "predicted.json"
    r = run_cli("validate", "--run", str(path), "--fit", str(fit), "--json", "--plot", str(page),
                "--save-prediction", str(pred))
    assert r.returncode == 0, r.stderr
    r2 = run_cli("compare", str(path), str(pred), "--json")  # the measured run against its prediction, A/B style
    assert r2.returncode == 0, r2.stderr
    ab = {c["metric"]: c for c in json.loads(r2.stdout)["changes"]}
    assert ab["mean_e2e"]["verdict"] in ("better", "worse", "no significant change")
    assert ab["mean_e2e"]["a"] == pytest.approx(s["e2e_s"]["mean"] * 1e3, rel=1e-9)
    html = page.read_text()
    for name in ("TTFT predicted", "running (simulated)", "KV used (simulated)", "host cpu %"):
        assert f'"name":"{name}"' in html, name
    rows = {f"{x['metric']} {x['stat']}": x for x in json.loads(r.stdout)["rows"]}
    assert abs(rows["TPOT p50"]["rel_err"]) < 0.5  # a broken model is off by far more; the bench reports accuracy


def test_bad_run_files_are_one_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"requests": []}')
    r = run_cli("validate", "--run", str(p), "--fit", str(p))
    assert r.returncode == 1 and "no successful request" in r.stderr
    p.write_text("[1, 2")
    r = run_cli("validate", "--run", str(p), "--fit", str(p))
    assert r.returncode == 1 and "not valid JSON" in r.stderr


def test_ctrl_c_saves_partial_results(fault_server, tmp_path):
    import signal

    out = tmp_path / "run.json"
    env = dict(os.environ, CAPACITY_CACHE_DIR="off")
    proc = subprocess.Popen([sys.executable, "-c", "from capacity.cli import main; main()", "loadtest", "--url",
                             fault_server, "--model", "ok", "--rate", "2", "--arrival", "constant", "--requests", "40",
                             "--input-len", "8", "--output-len", "3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            # a shell's background jobs inherit SIGINT as ignored; a user's terminal does not
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    start = FaultHandler.served
    for _ in range(600):  # interrupt once the load is really running (not during start-up imports)
        if FaultHandler.served - start >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "interrupted" in err, (proc.returncode, err)
    run = json.loads(out.read_text())
    c = counts(run)
    assert run["meta"]["interrupted"] and sum(c.values()) == 40 and c.get("ok", 0) >= 2 and c.get("not_sent", 0) >= 20


@pytest.mark.slow  # a real engine: in CI (`pytest -m slow`), not in the default local run
def test_regression_gate_on_a_real_engine(engine, tmp_path):
    """The CI regression gate, end to end (issue 23): a baseline load test; the same configuration again passes the
    gate; a server with a smaller token budget (8 tokens per step: a 64-token prompt takes 8 steps instead of 1,
    p50 TTFT about 3x: 59 vs 19 ms on this VM) fails it on TTFT, named, with exit 3.

    The gate's bootstrap guards against sampling noise, not against the shared VM slowing down between two runs
    (one CI run saw every request 1.8x slower in the repeat). So the threshold is +100% (the injected regression
    is +200%), and the same-configuration run is repeated once before the test calls it a false alarm."""
    url, model = engine
    load = ["loadtest", "--model", model, "--rate", "3", "-n", "30", "--input-len", "64", "--output-len", "8",
            "--seed", "1", "--json"]
    base = tmp_path / "base.json"
    r = run_cli(*load, "--url", url, "--out", str(base), timeout=300)
    assert r.returncode == 0, r.stderr
    gate = ["--baseline", str(base), "--fail-on", "p50_ttft:+100%,throughput:-20%"]
    for _ in range(2):
        r = run_cli(*load, "--url", url, *gate, timeout=300)
        if r.returncode == 0:
            break
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert json.loads(r.stdout)["compare"]["failed"] == []
    proc, slow = start_engine(model, batch_tokens=8)
    try:
        r = run_cli(*load, "--url", slow, *gate, timeout=300)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr
    failed = json.loads(r.stdout)["compare"]["failed"]
    assert failed and failed[0].startswith("p50_ttft:")


def test_host_and_gpu_utilisation_are_sampled_or_said_absent(fault_server):
    """Every load test samples host CPU/memory each second (psutil is in the loadtest extra) and the GPUs through
    NVML; on a machine without NVML the GPU columns are absent and one note says why."""
    from capacity.truth.utilisation import describe

    run = run_load(fault_server, "ok", [Request(i, i * 0.3, 8, 5) for i in range(6)], timeout_s=10, max_duration_s=20)
    u = run["utilisation"]
    assert len(u["samples"]) >= 2 and all("host_cpu_pct" in s and s["host_mem_used_gib"] > 0 for s in u["samples"])
    gpu = any(k.startswith("gpu0_") for k in u["samples"][0])
    assert gpu or sum("GPU utilisation not sampled" in n for n in u["notes"]) == 1
    lines = describe(u)
    assert lines[0].startswith("host: CPU mean") and all(len(x) <= 100 for x in lines)


def test_utilisation_summary_by_hand():
    from capacity.truth.utilisation import summarize

    rows = [{"t": float(i), "gpu0_util_pct": float(v)} for i, v in enumerate([10, 20, 30, 40, 100])]
    s = summarize(rows)["gpu0_util_pct"]
    assert s["mean"] == 40 and s["max"] == 100 and s["p95"] == pytest.approx(88.0)  # 40 + 0.8 x 60


def test_run_page_shows_what_the_run_has_and_says_what_it_lacks():
    pytest.importorskip("plotly")
    from capacity.truth.plots import run_figure

    reqs = [{"id": i, "status": "ok", "sent_s": i * 0.5, "first_token_s": i * 0.5 + 0.05, "finish_s": i * 0.5 + 0.4,
             "output_tokens": 8} for i in range(10)]
    scrapes = [{"t": float(t), "vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0,
                "vllm:gpu_cache_usage_perc": 0.25} for t in range(5)]
    util = {"samples": [{"t": float(t), "host_cpu_pct": 50.0, "gpu0_util_pct": 80.0} for t in range(5)]}
    fig = run_figure({"requests": reqs, "metrics": scrapes, "utilisation": util})
    names = {t.name for t in fig.data}
    assert {"TTFT", "E2E", "running (engine)", "waiting (engine)", "KV used (engine)", "host cpu %",
            "gpu0 util %"} <= names
    kv = next(t for t in fig.data if t.name == "KV used (engine)")
    assert list(kv.y) == [25.0] * 5  # a 0-1 fraction shown as %
    bare = run_figure({"requests": reqs})
    titles = [a.text for a in bare.layout.annotations]
    assert "requests running / waiting: the server has no /metrics" in titles and "utilisation (%): not sampled" in titles


def test_warmup_requests_are_sent_first_and_the_summary_says_measured(fault_server, tmp_path):
    """--warmup N sends N requests one at a time before the load and keeps them out of the run; the console
    summary of a load test calls its data measured and prints no simulator internals (KV blocks, Little's law)."""
    before = FaultHandler.served
    out = tmp_path / "run.json"
    r = run_cli("loadtest", "--url", fault_server, "--model", "ok", "--rate", "20", "-n", "5", "--input-len", "8",
                "--output-len", "3", "--warmup", "3", "--out", str(out),
                "--engine-config", "num_blocks=64,block_size=16,max_num_batched_tokens=256,max_num_seqs=8", timeout=120)
    assert r.returncode == 0, r.stderr
    assert FaultHandler.served - before == 8 and "warm-up: {'ok': 3} (not measured)" in r.stderr
    run = json.loads(out.read_text())
    assert len(run["requests"]) == 5 and run["meta"]["warmup_requests"] == 3
    assert run["meta"]["engine"] == {"num_blocks": 64, "block_size": 16, "max_num_batched_tokens": 256,
                                     "max_num_seqs": 8}
    assert run["meta"]["provenance"]["host"]["cpu"] and run["meta"]["provenance"]["host"]["logical_cpus"] >= 1
    assert "Measured ok at" in r.stdout and "Little's law" not in r.stdout and "KV 0 blocks" not in r.stdout


def test_lognormal_lengths_can_be_clipped_on_the_command_line():
    from capacity.cli.common import _lengths

    li = _lengths("--input-len", "lognormal:512:1.5:16:2048")
    x = li.draw(np.random.default_rng(0), 10_000)
    assert (li.low, li.high) == (16, 2048) and x.min() >= 16 and x.max() <= 2048 and (x == 2048).any()
    with pytest.raises(Exception, match=r"lognormal:MEAN:CV\[:MIN:MAX\]"):
        _lengths("--input-len", "lognormal:512:1.5:16")


@pytest.mark.slow  # 15 s of probes against a server: in CI (`pytest -m slow`), not in the default local run
def test_guided_engine_fit_runs_its_probes_fits_and_checks_a_held_out_run(fault_server, tmp_path):
    """`capacity fit-engine` end to end against an SSE server (the fault server's well-behaved mode: its timing is
    not an engine's, so only the workflow is checked here; bench/fidelity.py scores fits on real engines): warm-up,
    four closed-loop probes and an open loop after each burst, a fit with each term's range, a held-out open loop at a rate derived from a probe, and
    every run saved with the engine's limits."""
    out = tmp_path / "fit"
    r = run_cli("fit-engine", "--url", fault_server, "--model", "ok", "--engine-config",
                "num_blocks=256,block_size=16,max_num_batched_tokens=256,max_num_seqs=8", "--out-dir", str(out),
                "--scale", "0.25", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["fit.json", "held-out.json", "probe-decode-burst-poisson.json", "probe-decode-burst.json",
                     "probe-long-prompt-burst-poisson.json", "probe-long-prompt-burst.json",
                     "probe-short-prompt-burst-poisson.json", "probe-short-prompt-burst.json",
                     "probe-single-stream.json", "report.json"]
    poisson = json.loads((out / "probe-short-prompt-burst-poisson.json").read_text())
    assert poisson["meta"]["probe"] == "short-prompt-burst-poisson" and len(poisson["requests"]) == 2 * 6
    assert len(rep["speed_checks_tpot_s"]) == 1 + 4 and rep["speed_drift"] >= 0  # before the probes, after each
    assert set(rep["terms"]) == {"fixed_s", "per_token_s", "per_seq_s", "per_key_s", "per_pair_s", "frontend_s"}
    assert rep["held_out_rate_per_s"] > 0 and {(x["metric"], x["stat"]) for x in rep["held_out_check"]} >= {
        ("TTFT", "p50"), ("TPOT", "p99")}
    probe = json.loads((out / "probe-decode-burst.json").read_text())
    assert probe["meta"]["engine"]["max_num_seqs"] == 8 and probe["meta"]["users"] == 8
    r = run_cli("fit-engine", "--url", fault_server, "--model", "ok", "--engine-config",
                "num_blocks=256,block_size=16,max_num_batched_tokens=256,max_num_seqs=8", "--out-dir", str(out))
    assert r.returncode == 1 and "--force" in r.stderr


def test_a_clients_cap_holds_requests_at_the_client_and_the_replay_takes_the_sends(fault_server):
    """Six requests scheduled 10 ms apart, each streaming 20 tokens 2 ms apart: with a cap of one in flight
    (`--max-concurrency 1`) the client sends each when the one before has finished, in the order they came;
    uncapped they overlap. `capacity validate` replays a capped run at its sends (what the server saw), an
    uncapped one at its schedule; a cap on closed-loop users is one line, exit 1."""
    from capacity.truth.fit import replay

    rr = [Request(i, i * 0.01, 8, 20) for i in range(6)]
    capped = run_load(fault_server, "ok", rr, timeout_s=5, max_duration_s=20, metrics=False, max_concurrency=1)
    assert counts(capped) == {"ok": 6} and capped["meta"]["max_concurrency"] == 1
    r = sorted(capped["requests"], key=lambda x: x["sent_s"])
    assert [x["id"] for x in r] == list(range(6))  # first come, first served
    assert all(b["sent_s"] >= a["finish_s"] for a, b in zip(r, r[1:]))  # never two in flight
    assert r[-1]["sent_s"] - r[-1]["scheduled_s"] > 0.1  # the last waited for five 20-token streams
    assert [q.arrival_s for q in replay(capped)] == [x["sent_s"] for x in r]
    cw = summarize_run(capped)["client_wait"]
    assert cw["max_concurrency"] == 1 and cw["requests"] == 6
    assert cw["max_ms"] == pytest.approx((r[-1]["sent_s"] - r[-1]["scheduled_s"]) * 1e3) and cw["max_ms"] > 100
    free = run_load(fault_server, "ok", rr, timeout_s=5, max_duration_s=20, metrics=False)
    f = sorted(free["requests"], key=lambda x: x["sent_s"])
    assert free["meta"]["max_concurrency"] is None and any(b["sent_s"] < a["finish_s"] for a, b in zip(f, f[1:]))
    assert "client_wait" not in summarize_run(free)
    assert [q.arrival_s for q in replay(free)] == [x["scheduled_s"] for x in sorted(f, key=lambda x: x["scheduled_s"])]
    out = run_cli("loadtest", "--url", fault_server, "-m", "ok", "--users", "2", "--max-concurrency", "2")
    assert out.returncode == 1 and "--max-concurrency" in out.stderr and len(out.stderr.strip().splitlines()) == 1
