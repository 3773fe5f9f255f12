import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"


def pytest_sessionstart(session):
    """An in-place compiled build (pip install -e . compiles) shadows a later edit of a compiled module: the tests
    would test the old code. Refuse to run instead of passing on it."""
    from capacity import stale_compiled

    if stale := stale_compiled():
        pytest.exit(f"compiled modules older than their sources ({', '.join(stale[:3])}...): run "
                    "`bash scripts/compile.sh` (or `--clean` for pure Python)", returncode=4)


@pytest.fixture
def card():
    from capacity.model.card import load_model_card

    return lambda name: load_model_card(MODELS / f"{name}.yaml")


class _Overran(Exception):
    pass


def _overran(signum, frame):
    raise _Overran


def run_cli(*args: str, timeout: float = 60, process: bool = False, columns: int = 200, cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real `capacity` entry point as a user would (exit code, stdout and stderr), in this process: the same
    `main()`, argv, environment and working directory, its output captured, a traceback that escapes it turned into
    exit 1 and stderr text as the interpreter would print it. A command that has to be its own process (killed,
    timed, or left with state this process must not keep) passes `process=True`; CAPACITY_TEST_SUBPROCESS=1 runs
    every call that way (about 0.45 s of interpreter start and imports each). `columns`: the terminal width the
    command sees (COLUMNS); `cwd`: its working directory; `env`: its whole environment (default: this one with
    COLUMNS and the result cache off)."""
    if env is None:
        env = dict(os.environ, COLUMNS=str(columns), CAPACITY_CACHE_DIR="off")  # tests never read a stale result cache
    if process or os.environ.get("CAPACITY_TEST_SUBPROCESS"):
        return subprocess.run([sys.executable, "-c", "from capacity.cli import main; main()", *args],
                              capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    import contextlib
    import io
    import signal
    import traceback

    from capacity.cli import main

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    out, err = io.StringIO(), io.StringIO()
    code = 0
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["capacity", *args]
    signal.signal(signal.SIGALRM, _overran)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    except KeyboardInterrupt:  # the test run's own Ctrl-C, not the command's
        raise
    except _Overran:
        raise subprocess.TimeoutExpired(["capacity", *args], timeout, out.getvalue(), err.getvalue()) from None
    except BaseException:  # escaped main(): what the interpreter would print, exit 1
        code = 1
        err.write(traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in saved_signals.items():
            signal.signal(s, h)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
    return subprocess.CompletedProcess(["capacity", *args], code, out.getvalue(), err.getvalue())


_PROGRESS = re.compile(r"^\[[0-9][^\]]*\] .*: [0-9,]+ simulations? in ")


def said(stderr: str) -> list[str]:
    """stderr's lines less the progress lines a piped command prints once it has run 5 s (capacity/plan/progress.py):
    on a busy machine a plan that ends in an error may have printed some first."""
    return [line for line in stderr.strip().splitlines() if not _PROGRESS.match(line)]


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc): a killed command's workers must not outlive it."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


# Tiers, like the packages' layers (docs/ci.md): each test file's main subject, so one tier runs alone
# (`pytest -m unit`, `-m engine_oracle`, `-m end_to_end`; `-m 'unit or engine_oracle'` leaves out the CLI, the
# dashboard and the documented commands). A test that carries a tier marker itself keeps it.
#   unit: functions and modules by hand (cards, memory, costs, workloads, schedulers' rules, views), in process;
#   engine_oracle: the model against what engines and published runs did (recorded scheduler traces, start-up
#     logs, golden outputs, closed-form queueing, measured tables); .ci/run runs its simulator part in pure Python;
#   end_to_end: the commands, the dashboard, files and processes as a user meets them.
TIERS = {
    "unit": """autoscale autoscale_bound compare compute_dtype costs cost_kernels engine_graphs dashboard_views decode_floor expert_parallel
        gpus hybrid_cost hybrid_models input_bounds input_lag kv_offload memory memory_parallel memory_properties
        model_card output_paced prefix_cache published_bench runfile sessions speculative step_shapes trace_stream
        traces validate vision_requests vision_tokens vision_datasets whole_numbers workload workload_curve engine_release trtllm_limits
        reasoning allreduce_world_size vllm_host_weights state_space_floor dp_layouts
        trtllm_cpp_memory trtllm_releases trtllm_swa trtllm_adp trtllm_host
        sweep_fields devices calibrate disagg colocate_pipeline disagg_commands families family_ernie family_deepseek
        family_glm family_kimi family_lfm2 family_jamba family_qwen_moe family_minimax family_granite family_olmo
        family_phi family_cohere family_additions vllm_flags vllm_fallback eager_step
        task_result_json import_graph cost_factory_cache metrics_percentiles config_copies family_configs_2026
        device_stages model_releases sglang_mla_families""",
    "engine_oracle": """golden prefix_cache_golden scheduler encoder_budget sglang_sched sglang_scheduler_trace vllm_scheduler_trace
        simulator closed_loop_drift steady_state compiled_build memory_logs memory_unseen memory_unseen_v4 sglang sglang_startup_v3 sglang_dp_swa sglang_releases sglang_dsa
        trtllm mlperf saturation serving_unseen serving_unseen_v2 serving_unseen_v3 gemm_efficiency gemm_floor moe_floor bundled_profiles card_golden sim_ahead sim_ahead_closed
        frontend attention_dp image_cpu""",
    "end_to_end": """adversarial app autoscale_views browser cli docs_commands export fidelity fleetday launch
        loadtest manifests pipeline plan_answers plan_compare planner progress reliability reliability_io
        tiers engine_settings engine_configs cli_lazy""",
}
TIER_OF = {f"test_{name}.py": tier for tier, names in TIERS.items() for name in names.split()}


# Under xdist (`pytest -n 2`, .ci/run), how tests go to the workers (docs/ci.md, "Workers"), neither changing what
# any test checks (a `--dist` given on the command line is kept as given):
# - a test file with a module-scoped fixture of its own (a plan, a server, a browser, a real engine, a batch of
#   attacks run once) goes whole to one worker, so the fixture is built once, not once per worker that happens
#   to get one of its tests (xdist's `loadgroup` would do it, but its node-id suffix no longer takes on pytest 9);
# - the units that take longest start first (LONG_FIRST, then collection order), so that no worker is left
#   alone at the end with a long one.
LONG_FIRST = (  # node-id prefixes, or a documented command's start: the slow group's longest units (docs/ci.md
    # timings), then the default group's
    "capacity fleet-day --fleet examples/fleet-day.yaml",  # docs/examples.md's three-model day, ~200 s
    "tests/test_fidelity.py::test_quick_fidelity_against_a_real_engine",
    "tests/test_browser.py", "tests/test_loadtest.py", "tests/test_adversarial.py",
    "tests/test_plan_compare.py", "tests/test_launch.py",
)
SHARED_FIXTURE_FILES = frozenset(p.name for p in Path(__file__).parent.glob("test_*.py")
                                 if re.search(r"fixture\(\s*scope=.module.", p.read_text(encoding="utf-8"))) - {
    "test_devices.py", "test_simulator.py", "test_steady_state.py"}  # theirs only load a card: split them freely


def _dist_chosen(config) -> bool:
    args = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    return any(a == "--dist" or a.startswith("--dist=") for a in args)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's `load` scheduling with the files of SHARED_FIXTURE_FILES each one unit, in collection order."""
    if _dist_chosen(config) or config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            f = nodeid.split("::", 1)[0]
            return f if Path(f).name in SHARED_FIXTURE_FILES else nodeid

    config.option.loadscopereorder = False  # the workers' order (LONG_FIRST first), not by test count
    return FileUnits(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            tier = TIER_OF.get(item.path.name)
            if tier is not None:
                item.add_marker(tier)
    if os.environ.get("PYTEST_XDIST_WORKER") and not _dist_chosen(config):  # the order the workers report
        def rank(item) -> int:
            block = getattr(getattr(item, "callspec", None), "params", {}).get("block")
            cmds = getattr(block, "commands", [])
            return next((n for n, key in enumerate(LONG_FIRST)
                         if item.nodeid.startswith(key) or any(c.startswith(key) for c in cmds)), len(LONG_FIRST))

        items[:] = sorted(items, key=rank)  # stable: the rest keep their order
