"""Issue 49: the command and its files under failure. Workers never outlive the command (SIGTERM, SIGKILL);
output to a full disk or a closed pipe is an error or quiet, never a silently cut file with exit 0; no
half-written file is left behind; work is bounded before it starts; profiles with non-finite or absurd numbers
are refused on load; error lines keep numbers short. Each case runs the real entry point in a subprocess.

A nearly full disk is a small tmpfs where this machine allows mounting one (root, or `sudo -n`); elsewhere a
file-size limit (RLIMIT_FSIZE, the same short write then an error) stands in for it, and /dev/full always.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, children, run_cli

FREE_BYTES = 4096  # what the nearly full disk has left: one tmpfs page


def _mount_cmd(args: list[str]) -> list[str] | None:
    if os.geteuid() == 0:
        return args
    if subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", *args]
    return None


def _small_disk(tmp_path: Path, free: int):
    """(folder, preexec_fn): a folder on a disk with `free` bytes left. A real 16 KiB tmpfs filled up to that
    where mounting is allowed; else a plain folder and a child process limited to `free` bytes per file."""
    d = tmp_path / "full"
    d.mkdir()
    cmd = _mount_cmd(["mount", "-t", "tmpfs", "-o", "size=16k,mode=1777", "tmpfs", str(d)])
    if cmd is not None and subprocess.run(cmd, capture_output=True).returncode == 0:
        try:
            with (d / ".filler").open("wb") as f:
                try:
                    f.write(b"\0" * (16384 - free))
                except OSError:
                    pass
            yield d, None
        finally:
            subprocess.run(_mount_cmd(["umount", "-l", str(d)]), capture_output=True)
        return

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (free, free))
    yield d, limit


@pytest.fixture
def nearly_full(tmp_path):
    """A disk with one page (4 KiB) left: a longer output is cut by a short write, then fails."""
    yield from _small_disk(tmp_path, FREE_BYTES)


@pytest.fixture
def full(tmp_path):
    """A disk with nothing left."""
    yield from _small_disk(tmp_path, 0)


def cli(*args: str, stdout=subprocess.PIPE, preexec_fn=None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", CAPACITY_CACHE_DIR="off", PYTHONUNBUFFERED="1", **kw)
    return subprocess.run([sys.executable, "-c", "from capacity.cli import main; main()", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, cwd=ROOT, env=env,
                          preexec_fn=preexec_fn)


def one_line_error(r, *needles: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 1, (r.returncode, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err and len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("error: ") and len(err) <= 600, err
    for n in needles:
        assert n in err, err
    return err


DAY = """gpu: h100-sxm
startup_s: 60
cooldown_s: 60
interval_s: 10
window_s: 60
shared_gpus: 1
shared_check_requests: 100
models:
  - model: llama-3.1-8b
    slo_ttft_s: 0.5
    per_replica_rate: 4.0
    target: 6
    engine: {max_model_len: 4096}
    workload:
      arrivals: {kind: curve, duration_s: %d, curve: {shape: step, period_s: %d, points: [[0, 1], [100, 3], [200, 1]]}}
      input_len: {kind: fixed, value: 256}
      output_len: {kind: fixed, value: 16}
      num_requests: 1000000
"""


def small_day(tmp_path: Path, duration_s: int = 300) -> Path:
    p = tmp_path / "day.yaml"
    p.write_text(DAY % (duration_s, duration_s))
    return p


# ---- item 1: no worker outlives the command ------------------------------------------------------------------------
def _pdeathsig() -> int:
    import ctypes

    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # 2 = PR_GET_PDEATHSIG
    return sig.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_shared_pool_workers_die_with_their_parent():
    from capacity.plan.executors import stop_pool, worker_pool

    pool = worker_pool(1)
    try:
        assert pool.submit(_pdeathsig).result(timeout=60) == signal.SIGTERM
        assert pool.submit(signal.getsignal, signal.SIGINT).result(timeout=60) == signal.SIG_IGN
    finally:
        stop_pool(pool)


def test_every_process_pool_is_the_shared_one():
    """One helper starts pools (capacity.plan.executors.worker_pool): a pool built elsewhere would lack the
    parent-death handling, as fleet-day's did."""
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "capacity").rglob("*.py")
            if "ProcessPoolExecutor(" in p.read_text() and p.name != "executors.py"]
    assert not hits, hits


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # two fleet-day runs killed mid-pool (about 20 s): in CI (`pytest -m slow`)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_fleet_day_leaves_no_workers(tmp_path, sig):
    day = small_day(tmp_path, 86400)  # a whole day per run: the pool is busy for minutes
    env = dict(os.environ, COLUMNS="200", CAPACITY_CACHE_DIR="off")
    p = subprocess.Popen([sys.executable, "-c", "from capacity.cli import main; main()", "fleet-day", "--fleet",
                          str(day), "--workers", "2", "--json"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, cwd=ROOT)
    deadline = time.time() + 60
    kids: list[int] = []
    while time.time() < deadline and len(kids) < 2:
        time.sleep(0.3)
        kids = children(p.pid)
    assert len(kids) >= 2, "the pool never started"
    time.sleep(1)  # the workers are inside their day runs
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    assert rc == -sig, rc  # a shell reports 143 for SIGTERM
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.2)
    left = [k for k in kids if _alive(k)]
    for k in left:  # a failing run must not leave them to the next test
        os.kill(k, signal.SIGKILL)
    assert not left, "workers outlived the command"


# ---- item 2: stdout that cannot be written -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def day_report(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("day")
    r = run_cli("fleet-day", "--fleet", str(small_day(d)), "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    (d / "d.json").write_text(r.stdout)
    return d / "d.json"


def _outputs(day_report: Path) -> dict[str, tuple[str, ...]]:
    return {"memory --json": ("memory", "-m", "llama-3.1-8b", "--json"),
            "fleet-day --json": ("fleet-day", "--fleet", str(small_day(day_report.parent)), "--workers", "1",
                                 "--json"),
            "fleet-day --report": ("fleet-day", "--report", str(day_report))}


@pytest.mark.parametrize("what", ["memory --json", "fleet-day --json", "fleet-day --report"])
def test_output_to_dev_full_is_one_line_exit_1(day_report, what):
    with open("/dev/full", "w") as full:
        r = cli(*_outputs(day_report)[what], stdout=full)
    one_line_error(r, "stdout", "No space left on device")


@pytest.mark.parametrize("what", ["memory --json", "fleet-day --json"])
def test_output_cut_by_a_nearly_full_disk_is_an_error(day_report, nearly_full, what):
    """The bug: Python's unbuffered stdout (PYTHONUNBUFFERED=1) drops what a short write left, so the file
    ended cut at the disk's size with exit 0 and nothing on stderr."""
    folder, preexec = nearly_full
    with (folder / "out.json").open("w") as f:
        r = cli(*_outputs(day_report)[what], stdout=f, preexec_fn=preexec)
    one_line_error(r, "cannot write the output to stdout")
    with open(folder / "out.json") as f:  # what did land is not mistaken for a whole answer
        with pytest.raises(json.JSONDecodeError):
            json.loads(f.read())


def test_output_that_fits_still_exits_0(day_report, nearly_full):
    folder, preexec = nearly_full
    with (folder / "v.txt").open("w") as f:
        r = cli("--version", stdout=f, preexec_fn=preexec)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert (folder / "v.txt").read_text().startswith("capacity ")


@pytest.mark.parametrize("args", [("memory", "-m", "llama-3.1-8b", "--json"), ("memory", "-m", "llama-3.1-8b")])
def test_a_closed_pipe_is_quiet(args):
    """`capacity ... | head`: the reader left; no error line, no 'Exception ignored', not exit 0."""
    r_fd, w_fd = os.pipe()
    os.close(r_fd)  # the reader is gone before the first write
    try:
        r = cli(*args, stdout=w_fd)
    finally:
        os.close(w_fd)
    assert r.stderr == "" and r.returncode == 1, (r.returncode, r.stderr[-1000:])


# ---- item 5: nothing half-written on a full disk -------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run") / "run.json"
    r = cli("simulate", "-m", "llama-3.1-8b", "--rate", "5", "--requests", "100", "--save-run", str(run))
    assert r.returncode == 0, r.stderr
    return run


def _file_outputs(run_file: Path, full: Path) -> dict[str, tuple[tuple[str, ...], Path]]:
    run = str(run_file)
    return {
        "simulate --save-run": (("simulate", "-m", "llama-3.1-8b", "--rate", "5", "--requests", "100",
                                 "--save-run", str(full / "r.json")), full / "r.json"),
        "sweep --out": (("sweep", "-m", "llama-3.1-8b", "--vary", "engine.max_num_seqs=8,16,32", "--requests",
                         "100", "--seeds", "1", "--executor", "serial", "--out", str(full / "s.json")),
                        full / "s.json"),
        "compare --plot html": (("compare", run, run, "--plot", str(full / "p.html")), full / "p.html"),
        "compare --plot png": (("compare", run, run, "--plot", str(full / "p.png")), full / "p.png"),
        "loadtest --out": (("loadtest", "--url", "http://127.0.0.1:9", "-m", "x", "--rate", "50", "-n", "40",
                            "--timeout-s", "2", "--out", str(full / "l.json")), full / "l.json"),
        "plan --xlsx": (("plan", "-m", str(ROOT / "tests/golden/plan_small.yaml"), "--executor", "serial",
                         "--xlsx", str(full / "p.xlsx")), full / "p.xlsx"),
    }


@pytest.mark.parametrize("what", ["simulate --save-run", "sweep --out", "compare --plot html",
                                  pytest.param("compare --plot png", marks=pytest.mark.skipif(
                                      __import__("importlib").util.find_spec("matplotlib") is None,
                                      reason="matplotlib draws the PNG")),
                                  "loadtest --out",
                                  pytest.param("plan --xlsx", marks=pytest.mark.slow)])  # a plan: 10 s
def test_file_outputs_on_a_full_disk_leave_nothing_half_written(run_file, full, what):
    folder, preexec = full
    args, target = _file_outputs(run_file, folder)[what]
    r = cli(*args, preexec_fn=preexec)
    err = one_line_error(r, str(target), "cannot write it")
    assert "No space left on device" in err or "File too large" in err, err
    assert ".tmp" not in err, err  # the user's path, never a temporary one
    left = sorted(p.name for p in folder.iterdir() if p.name != ".filler")
    assert left == [], f"half-written files left behind: {left}"


def test_atomic_write_removes_its_temporary_file_on_any_failure(tmp_path):
    from capacity.errors import ConfigError
    from capacity.files import atomic_path, write_atomic

    dest = tmp_path / "out.json"
    dest.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(dest) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert dest.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    with pytest.raises(ConfigError, match=r"^--out .*/nowhere/x\.json: cannot write it"):
        write_atomic(tmp_path / "nowhere" / "x.json", "{}", "--out")
    write_atomic(dest, "new")
    assert dest.read_text() == "new" and oct(dest.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


# ---- item 10: the destination checked first, short numbers ---------------------------------------------------------
@pytest.fixture
def read_only(tmp_path):
    """A folder no write reaches: a read-only tmpfs when mounting is allowed (root ignores file modes), else a
    folder without write permission."""
    d = tmp_path / "ro"
    d.mkdir()
    cmd = _mount_cmd(["mount", "-t", "tmpfs", "-o", "size=16k,ro", "tmpfs", str(d)])
    if cmd is not None and subprocess.run(cmd, capture_output=True).returncode == 0:
        try:
            yield d
        finally:
            subprocess.run(_mount_cmd(["umount", "-l", str(d)]), capture_output=True)
        return
    if os.geteuid() == 0:
        pytest.skip("root writes through file modes and no read-only tmpfs could be mounted")
    d.chmod(0o555)
    try:
        yield d
    finally:
        d.chmod(0o755)


def test_xlsx_into_a_read_only_folder_fails_before_any_work(read_only):
    t0 = time.perf_counter()
    r = cli("plan", "-m", str(ROOT / "tests/golden/plan_small.yaml"), "--executor", "serial", "--xlsx",
            str(read_only / "r.xlsx"))
    took = time.perf_counter() - t0
    err = one_line_error(r, f"--xlsx {read_only / 'r.xlsx'}", f"cannot write to {read_only}")
    assert ".tmp" not in err
    assert took < 8, f"{took:.1f} s: the plan ran before the destination was checked"  # the plan alone is ~10 s


HUNDRED_DIGITS = "1" + "0" * 100


@pytest.mark.parametrize("args", [
    ("simulate", "-m", "llama-3.1-8b", "--rate", "1", "--requests", HUNDRED_DIGITS),
    ("memory", "-m", "llama-3.1-8b", "--max-model-len", HUNDRED_DIGITS),
    ("loadtest", "--url", "http://127.0.0.1:9", "-m", "x", "--rate", "1", "--requests", HUNDRED_DIGITS),
])
def test_a_hundred_digit_number_stays_short_in_the_error(args):
    err = one_line_error(cli(*args), "1.000e+100")
    assert HUNDRED_DIGITS[:20] not in err.replace(",", "") and len(err) < 200, err


def test_short_numbers():
    from capacity.files import short, short_numbers

    assert short_numbers(f"--requests {10**100:,} exceeds the limit of 2,000,000") == \
        "--requests 1.000e+100 exceeds the limit of 2,000,000"
    assert short_numbers("/a/12345678901234567890.json x1234567890123456789 2,000,000.") == \
        "/a/12345678901234567890.json x1234567890123456789 2,000,000."
    assert short(10**100) == "1.000e+100" and short(12) == "12"  # not the first 80 digits: a wrong magnitude


# ---- item 3: every load-test size bounded before any work ----------------------------------------------------------
@pytest.mark.parametrize("extra, named", [
    (("--input-len", "999999999999"), "--input-len 999,999,999,999 exceeds the limit"),
    (("--output-len", "999999999999"), "--output-len 999,999,999,999 exceeds the limit"),
    (("--input-len", "8-999999999999"), "--input-len 999,999,999,999 exceeds the limit"),
    (("--input-len", "lognormal:1e300:1"), "--input-len mean 1e+300 exceeds the limit"),
    (("--decode-sweep", "8,99999999999"), "--decode-sweep value 99,999,999,999 exceeds the limit"),
    (("--timeout-s", "1e300"), "--timeout-s 1e+300 exceeds the limit"),
    (("--max-duration-s", "1e12"), "--max-duration-s 1,000,000,000,000 exceeds the limit"),
    (("--think-s", "1e300", "--users", "2"), "--think-s 1e+300 exceeds the limit"),
    (("--warmup", "999999999999"), "--warmup 999,999,999,999 exceeds the limit"),
])
def test_loadtest_sizes_are_bounded_before_any_work(extra, named):
    args = ["loadtest", "--url", "http://127.0.0.1:9", "-m", "x", *extra]
    if "--users" not in extra:
        args += ["--rate", "1"]
    t0 = time.perf_counter()
    r = cli(*args, timeout=30)
    one_line_error(r, named)
    assert time.perf_counter() - t0 < 10


def test_loadtest_trace_lengths_are_bounded(tmp_path):
    trace = tmp_path / "t.jsonl"
    # below the trace reader's own bound (2^31 - 1 tokens, a count no request has), above the load test's
    trace.write_text('{"timestamp": 0, "input_tokens": 999999999, "output_tokens": 4}\n')
    one_line_error(cli("loadtest", "--url", "http://127.0.0.1:9", "-m", "x", "--trace", str(trace), timeout=30),
                   "a request's prompt (--input-len or --trace) 999,999,999 exceeds the limit")
    trace.write_text('{"timestamp": 0, "input_tokens": 999999999999, "output_tokens": 4}\n')
    one_line_error(cli("loadtest", "--url", "http://127.0.0.1:9", "-m", "x", "--trace", str(trace), timeout=30),
                   "row 1: input_tokens 999999999999 is more than 2,147,483,647 tokens")


# ---- item 4: non-finite and implausible profile numbers are refused on load ----------------------------------------
def _bad_profile(tmp_path: Path, where: str, value: float) -> Path:
    d = json.loads((ROOT / "capacity/data/profiles/tiny-cpu.json").read_text())
    node = d
    keys = where.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    p = tmp_path / "p.json"
    p.write_text(json.dumps(d))  # Python writes Infinity/NaN, as a broken calibration run would
    return p


@pytest.mark.parametrize("where, value, said", [
    ("fit.scales.layers", float("inf"), "fit.scales.layers: Input should be a finite number (got inf)"),
    ("fit.scales.decode_attn", 1e6, "fit.scales.decode_attn: Input should be less than or equal to 100"),
    ("fit.overhead_s", float("nan"), "fit.overhead_s: Input should be a finite number"),
    ("linear.qkv.0", 1e300, "linear.qkv.0: Input should be less than or equal to 3600 (got 1e+300)"),
    ("decode_attn.0.0", 1e-300, "decode_attn.0.0: Input should be greater than or equal to 0.000000001 (got 1e-300)"),
    ("steps.0.measured_s", float("inf"), "steps.0.measured_s: Input should be a finite number"),
])
@pytest.mark.parametrize("cmd", ["simulate", "step-cost"])
def test_profiles_with_non_finite_or_absurd_numbers_are_refused(tmp_path, where, value, said, cmd):
    prof = _bad_profile(tmp_path, where, value)
    args = (["simulate", "--rate", "1", "--requests", "20"] if cmd == "simulate" else ["step-cost", "--decode", "4x128"])
    r = cli(*args, "-m", "tiny", "--profile", str(prof), "--allow-profile-mismatch", timeout=60)
    one_line_error(r, str(prof), said)


@pytest.mark.parametrize("term, value", [("fixed_s", 1e300), ("per_token_s", float("inf")), ("per_seq_s", -1.0)])
def test_engine_fits_with_absurd_terms_are_refused(tmp_path, term, value):
    from capacity.errors import CapacityError
    from capacity.truth.fit import load_fit

    fit = {"kind": "engine_fit", "schema_version": 1, "frontend_s": 0.0,
           "cost": {"fixed_s": 0.01, "per_token_s": 1e-5, "per_seq_s": 1e-5, "per_key_s": 0.0, "per_pair_s": 0.0,
                    "attention": "per_sequence", term: value},
           "scheduler": {"num_blocks": 100, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 8}}
    p = tmp_path / "fit.json"
    p.write_text(json.dumps(fit))
    with pytest.raises(CapacityError, match=rf"cost\.{term} must be a finite number of seconds in \[0, 10\]"):
        load_fit(p)
    fit["cost"][term] = 0.001
    p.write_text(json.dumps(fit))
    load_fit(p)  # a plausible fit still loads
