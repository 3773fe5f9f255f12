"""The run pipeline and the engine seam, through the CLI and the library as users call them: one defect of
issue 15 per test (each failed before the restructuring), plus the seam a second engine plugs into."""
import json
import os
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.pipeline import Deployment, RunOptions, prepare, run
from capacity.workload import Request, WorkloadSpec
from tests.conftest import ROOT, run_cli

CARD = load_model_card(ROOT / "models/llama-3.1-8b.yaml")
TINY_SEARCH = {"seeds": 1, "requests": 100, "tolerance": 0.3, "max_num_seqs": [32, 256], "max_model_len": [4096],
               "tp": [1]}


def plan(scenario: dict):
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Scenario, make_plan

    sc = Scenario.model_validate({"model": "llama-3.1-8b", "target_rate_per_s": 4,
                                  "workload": {"input_len": {"kind": "fixed", "value": 512},
                                               "output_len": {"kind": "fixed", "value": 64}},
                                  "search": TINY_SEARCH, **scenario})
    return make_plan(sc, CARD, SerialExecutor(cache=False))


# ---- a step-cost source is used or refused, and every row names it ----------------------------------------
def test_plan_refuses_a_profile_of_another_model_in_one_line():
    r = run_cli("plan", "-m", "llama-3.1-70b", "--profile", "llama-3.1-8b-h200", "--seeds", "1", "--requests", "100")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "measured for model 'llama-3.1-8b', not 'llama-3.1-70b'" in r.stderr


def test_plan_refuses_a_profile_at_another_tp():
    r = run_cli("plan", "-m", "llama-3.1-8b", "--profile", "llama-3.1-8b-h200", "--tp", "2", "--seeds", "1",
                "--requests", "100")
    assert r.returncode == 1 and "was measured at tp=1, the scenario fixes tp=2" in r.stderr, r.stderr


@pytest.mark.slow  # over 5 s: in CI (`pytest -m slow`), not in the default local run
def test_plan_with_a_profile_searches_only_its_tp_and_every_row_names_it():
    p = plan({"gpu": "h200", "profile": "llama-3.1-8b-h200", "search": {**TINY_SEARCH, "tp": [1, 2, 4]}})
    assert [s.tp for s in p.searches] == [1]
    assert any("tp searched only at 1" in n for n in p.notes)
    assert all(s.source.startswith("calibrated profile llama-3.1-8b-h200") for s in p.searches + [p.rec_search])
    assert p.source.startswith("calibrated profile llama-3.1-8b-h200")


@pytest.mark.slow  # issue 20: the default run stays under 6 minutes on CI's machine; CI runs the slow group
def test_plan_default_gpu_is_the_profiles():
    p = plan({"profile": "llama-3.1-8b-h200"})  # no GPU given: the profile's own, not h100-sxm
    assert p.gpu == "h200"


# ---- one configuration per answer --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def a100_plan():
    return plan({"gpu": "a100-80gb"})


def test_frontier_recommendation_and_command_are_one_configuration(a100_plan):
    p = a100_plan
    default = 2048  # vLLM's default token budget for `vllm serve` on an A100 (not a >= 70 GiB non-A100 card)
    assert {c.max_num_batched_tokens for c in p.frontier if c.feasible} == {default}
    assert f"--max-num-batched-tokens {default}" in p.vllm_command
    assert p.rec_search.max_num_batched_tokens == default == p.budget.max_num_batched_tokens
    rec = p.recommended
    assert f"--max-num-seqs {rec.max_num_seqs}" in p.vllm_command and f"--max-model-len {rec.max_model_len}" in p.vllm_command
    assert rec.kv_tokens == p.budget.planning_tokens  # the frontier row, the budget shown and the command agree


def test_plan_budget_is_what_capacity_memory_prints_for_that_configuration(a100_plan):
    p = a100_plan
    r = run_cli(*shlex.split(p.budget_config)[1:], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["budget"]["kv_tokens"] == p.budget.kv_tokens
    # and the default `capacity memory` differs for a reason it can state: another max_num_seqs
    d = json.loads(run_cli("memory", "-m", "llama-3.1-8b", "-g", "a100-80gb", "--json").stdout)["budget"]
    assert d["max_num_seqs"] != p.budget.max_num_seqs or d["max_model_len"] != p.budget.max_model_len


def test_plan_output_says_which_configuration_its_memory_line_is():
    r = run_cli("plan", "-m", "tests/golden/plan_small.yaml", "--executor", "serial", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "memory of the recommended configuration (tp=1, max_num_seqs" in r.stdout
    assert "capacity memory -m llama-3.1-8b -g h100-sxm" in r.stdout
    head = r.stdout.splitlines()[:15]  # piped: the answer first (GPUs, cost, the verified P99s, the command)
    assert any(line.startswith("Answer: 1 x h100-sxm (1 replica x tp=1); $") and "per 1M output" in line
               for line in head)
    assert any("P99 TTFT" in line and "meets the SLO" in line for line in head)
    assert any(line.lstrip().startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct") for line in head)


@pytest.mark.parametrize("width", [80, 120, 160])
def test_plan_report_cuts_nothing_at_common_widths(a100_plan, width):
    """At 80, 120 and 160 columns no table cell is cut ("…") and the answer stays in the first 15 lines."""
    import io

    from rich.console import Console

    from capacity.io.report import plan_report

    class Ex:
        hits = misses = 0

    buf = io.StringIO()
    plan_report(a100_plan, Console(file=buf, width=width, color_system=None), 1.0, Ex())
    text = buf.getvalue()
    assert "…" not in text
    assert any(line.startswith("Answer: ") for line in text.splitlines()[:15])


# ---- engine settings reach the simulation ------------------------------------------------------------------
def test_chunked_prefill_off_is_simulated():
    """Two 3000-token prompts and a 4096-token budget: chunked prefill schedules 3000 + a 1096 chunk in the first
    step; without it the second prompt waits for a step of its own."""
    firsts = {}
    for chunked in (True, False):
        dep = Deployment(CARD, get_gpu("h100-sxm"), EngineConfig(max_num_batched_tokens=4096, max_model_len=4096,
                                                                 enable_chunked_prefill=chunked))
        sched = prepare(dep).make_scheduler()
        sched.add(Request(0, 0.0, 3000, 8))
        sched.add(Request(1, 0.0, 3000, 8))
        firsts[chunked] = [n for _, n in sched.schedule(0.0).scheduled]
    assert firsts == {True: [3000, 1096], False: [3000]}


def test_prefix_caching_and_policy_reach_the_planners_tasks(tmp_path):
    """A sweep over engine.enable_prefix_caching on a workload with a long shared prefix: the cached run has a
    lower TTFT (the setting reached the tasks); and engine.policy reaches them too."""
    sc = tmp_path / "prefix.yaml"
    sc.write_text("model: llama-3.1-8b\ngpu: l40s\nworkload:\n  arrivals: {kind: poisson}\n"
                  "  input_len: {kind: fixed, value: 3000}\n  output_len: {kind: fixed, value: 16}\n"
                  "  prefix: {groups: 1, tokens: 2900}\ntarget_rate_per_s: 2\n")
    r = run_cli("sweep", "-m", str(sc), "--vary", "engine.enable_prefix_caching=false,true", "--seeds", "1",
                "--requests", "200", "--executor", "serial", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    off, on = json.loads(r.stdout)["rows"]
    assert on["ttft_p50_s"] < 0.5 * off["ttft_p50_s"]
    from capacity.plan.planner import Planner, Scenario

    classes = [{"name": "chat", "priority": 0}, {"name": "batch", "priority": 1}]
    s = Scenario.model_validate({"model": "llama-3.1-8b", "workload": {"classes": classes},
                                 "engine": {"policy": "priority", "enable_prefix_caching": True}})
    task = Planner(s, CARD, None).tasks(Planner(s, CARD, None).engine(1), 1.0, range(1))[0]
    assert task.engine["policy"] == "priority" and task.engine["enable_prefix_caching"] is True


def test_engine_typo_is_one_line_naming_the_field(tmp_path):
    sc = tmp_path / "typo.yaml"
    sc.write_text("model: llama-3.1-8b\nengine: {max_num_seqz: 64}\n")
    r = run_cli("plan", "-m", str(sc))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "engine.max_num_seqz: unknown field" in r.stderr
    sc.write_text("model: llama-3.1-8b\nengine: {max_num_seqs: true}\n")  # strict: a boolean is not a count
    r = run_cli("plan", "-m", str(sc))
    assert r.returncode == 1 and "engine.max_num_seqs: Input should be a valid integer (got True)" in r.stderr


def test_static_batching_holds_kv_blocks_for_its_batch():
    """A batch of two requests of 100 + 28 tokens reserves 8 blocks of 16 each while it runs, none after."""
    dep = Deployment(CARD, get_gpu("h100-sxm"), EngineConfig(policy="static", static_max_batch=2,
                                                             static_max_wait_s=0.01, frontend_ms=0.0,
                                                             frontend_us_per_input_token=0.0))  # the engine alone
    wl = WorkloadSpec.model_validate({"arrivals": {"kind": "constant", "rate_per_s": 1000.0},
                                      "input_len": {"kind": "fixed", "value": 100},
                                      "output_len": {"kind": "fixed", "value": 28}, "num_requests": 2})
    res = run(dep, wl, RunOptions(warmup_fraction=0.0))
    kv = res.sim.timeseries[:, 3]
    assert kv.max() == 16 and kv[-1] == 0


def test_a_second_engine_is_one_object_in_the_registry(monkeypatch):
    """The seam: an engine model with other defaults and another command, registered in one place (its model, its
    builder, its configuration class), is used by the memory budget, the scheduler and the launch command of the
    run pipeline."""
    from typing import ClassVar

    from capacity.engine import config as config_mod
    from capacity.engine import registry
    from capacity.engine.vllm.config import VllmConfig
    from capacity.engine.vllm.engine import VllmV1

    for mod, name in ((config_mod, "_CLASSES"), (config_mod, "_SPECS"), (registry, "ENGINES"), (registry, "_BUILD"),
                      (registry, "CONFIGS")):
        monkeypatch.setattr(mod, name, dict(getattr(mod, name)))  # the registration ends with the test

    class OtherConfig(VllmConfig):  # vLLM's settings under another engine's name
        ENGINE: ClassVar[str] = "other"

    class Other(VllmV1):
        name = "other"

        def default_max_num_batched_tokens(self, cfg, card, gpu):
            return 1024

        def resolve(self, cfg, card, gpu):
            if cfg.max_num_batched_tokens is None:
                cfg = cfg.model_copy(update={"max_num_batched_tokens": 1024})
            return super().resolve(cfg, card, gpu)

        def launch_command(self, card, cfg, b):
            return f"other-engine --batch-tokens {b.max_num_batched_tokens}"

    registry.register(Other(), lambda spec: Other(), OtherConfig)
    try:
        dep = Deployment(CARD, get_gpu("h100-sxm"), EngineConfig(engine="other", max_num_seqs=64))
        p = prepare(dep)
        assert p.budget.max_num_batched_tokens == 1024 and p.budget.engine == "other"
        assert p.engine_model.launch_command(CARD, dep.engine, p.budget) == "other-engine --batch-tokens 1024"
        res = run(dep, WorkloadSpec.model_validate({"arrivals": {"rate_per_s": 2.0}, "num_requests": 50}),
                  RunOptions(ci=False))
        assert res.summary.n_requests > 0 and res.as_dict()["max_num_batched_tokens"] == 1024
    finally:
        monkeypatch.undo()
    with pytest.raises(ValueError, match="unknown engine 'other'"):
        EngineConfig(engine="other")


def test_sglang_command_translates_memory_by_meaning(a100_plan):
    """--mem-fraction-static is weights + KV pool over total (SGLang's meaning), not vLLM's utilisation: at
    least the share the weights and the planned pool take, plus the context and SGLang's load margin."""
    import re

    b = a100_plan.budget
    frac = float(re.search(r"--mem-fraction-static (\S+)", a100_plan.sglang_command).group(1))
    need = (b.weights_bytes + b.planning_tokens * b.kv_bytes_per_token) / b.total_bytes
    assert need <= frac <= need + 0.04  # weights + the planned pool (+ the CUDA context, the load's extra)
    assert f"--max-total-tokens {b.planning_tokens}" in a100_plan.sglang_command  # the pool the plan simulated


# ---- data ships with the package ----------------------------------------------------------------------
def test_cards_and_profiles_work_from_a_wheel_install(tmp_path):
    """`pip install .` (not editable): bundled cards and profiles come from the installed package. The wheel is
    built pure Python (CAPACITY_MYPYC=0): what ships is the same, and the mypyc compile (a minute of one core in the
    default run) is CI's install's, checked there (`.ci/run`: `capacity.compiled()`)."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True, timeout=300,
                   env=dict(os.environ, CAPACITY_MYPYC="0"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    *map(str, wheels.glob("capacity-*.whl"))], check=True, capture_output=True, timeout=300)
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "CAPACITY_CACHE_DIR": "off", "COLUMNS": "200"}
    where = tmp_path / "elsewhere"
    where.mkdir()

    def cli(*args):
        return subprocess.run([sys.executable, "-c", "import capacity, sys; from capacity.cli import main; "
                               "assert capacity.__file__.startswith(sys.argv[1]), capacity.__file__; "
                               "sys.argv = sys.argv[1:]; main()", str(target), *args],
                              capture_output=True, text=True, cwd=where, env=env, timeout=120)

    r = cli("memory", "-m", "llama-3.1-8b", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["budget"]["kv_tokens"] > 0
    r = cli("profiles", "--json")
    assert r.returncode == 0, r.stderr
    assert "llama-3.1-8b-h200" in {row["name"] for row in json.loads(r.stdout)}


# ---- the load tester keeps no state between runs -------------------------------------------------------
class _SSE(BaseHTTPRequestHandler):
    refuse_eos = False
    bodies: list

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if self.refuse_eos and "ignore_eos" in body:
            msg = b'{"error": "unknown field ignore_eos"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(body["max_tokens"]):
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        self.wfile.write(b'data: {"choices": [{"text": "", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n')


def _serve(refuse: bool):
    handler = type("H", (_SSE,), {"refuse_eos": refuse, "bodies": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, handler


def test_loadtest_learns_a_servers_quirks_per_run_only():
    from capacity.truth.loadtest import run_load

    reqs = [Request(i, 0.01 * i, 4, 3) for i in range(3)]
    a, ha = _serve(refuse=True)
    b, hb = _serve(refuse=False)
    try:
        ra = run_load(f"http://127.0.0.1:{a.server_port}", "m", reqs, metrics=False, max_duration_s=30)
        rb = run_load(f"http://127.0.0.1:{b.server_port}", "m", reqs, metrics=False, max_duration_s=30)
    finally:
        a.shutdown()
        b.shutdown()
    assert all(r["status"] == "ok" for r in ra["requests"] + rb["requests"])
    assert any("ignore_eos" not in body for body in ha.bodies)  # the refusing server got requests without it
    assert hb.bodies and all(body.get("ignore_eos") is True for body in hb.bodies)  # the next run starts afresh


def test_run_results_are_typed_and_json_is_their_form():
    dep = Deployment(CARD, get_gpu("h100-sxm"))
    res = run(dep, WorkloadSpec.model_validate({"arrivals": {"rate_per_s": 4.0}, "num_requests": 300}))
    d = res.as_dict()
    assert d["summary"]["ttft_s"]["p99"] == res.summary.ttft_s.p99
    assert d["engine"] == dep.engine.model_dump(mode="json") and d["kv_blocks_per_replica"] == res.budget.planning_blocks
    assert np.isfinite(res.summary.tpot_s.p50)
    with pytest.raises(ConfigError, match="measured with bf16 KV"):
        prepare(Deployment(CARD, get_gpu("h200"), EngineConfig(kv_cache_dtype="fp8"), profile="llama-3.1-8b-h200"))


# ---- the KV dtype reaches the step cost ----------------------------------------------------------------
def test_fp8_kv_halves_decode_attention_time():
    """L40S, 64 sequences at 12k context: the roofline's decode attention streams the KV bytes, so fp8 KV
    (1 byte per element) takes half the bf16 time: 64 x 12,289 keys x 32 layers x 2 x 8 heads x 128 dims."""
    out = {}
    for kv in ("auto", "fp8"):
        r = run_cli("step-cost", "-m", "llama-3.1-8b", "-g", "l40s", "--decode", "64x12288", "--kv-dtype", kv, "--json")
        assert r.returncode == 0, r.stderr
        out[kv] = json.loads(r.stdout)["breakdown_s"]
    bf16_bytes = 64 * 12289 * 32 * 2 * 8 * 128 * 2
    l40s = get_gpu("l40s")
    want = bf16_bytes / (l40s.mem_bw_bytes_per_s * 0.8)  # the roofline's 80% of datasheet bandwidth
    assert out["auto"]["attention"] == pytest.approx(want, rel=0.01)
    assert out["fp8"]["attention"] == pytest.approx(want / 2, rel=0.01)
    assert out["fp8"]["gemm"] == out["auto"]["gemm"]  # weights are not the KV cache


def test_sweep_over_the_kv_dtype_changes_latency_and_a_profile_refuses_fp8():
    r = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "l40s", "--vary", "engine.kv_cache_dtype=auto,fp8",
                "--prefill-sweep", "8000", "--rate", "0.5", "--seeds", "1", "--requests", "100", "--executor", "serial",
                "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    auto, fp8 = json.loads(r.stdout)["rows"]
    assert fp8["tpot_p50_s"] < auto["tpot_p50_s"]
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--profile", "llama-3.1-8b-h200", "--kv-dtype", "fp8", "--rate", "1")
    assert r.returncode == 1 and "measured with bf16 KV" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_priority_without_classes_is_refused_in_one_line():
    r = run_cli("simulate", "-m", "tiny", "--policy", "priority", "--rate", "1", "-n", "100")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "policy priority: the workload has no request classes of different priorities" in r.stderr


def test_engine_settings_reach_the_scheduler_and_the_cost():
    """kv_reservation and step_overhead_ms are engine settings: the run path hands them to the scheduler and the step
    cost (a dropped setting would leave 2 ms and vLLM's prompt-only reservation in place without a word)."""
    from capacity.cost.step import StepPlan
    from capacity.pipeline import Deployment, prepare

    card, gpu = load_model_card("capacity/data/models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")
    base = prepare(Deployment(card, gpu, EngineConfig()))
    p = prepare(Deployment(card, gpu, EngineConfig(step_overhead_ms=0.5, kv_reservation="prompt_and_output")))
    assert p.make_scheduler().cfg.reserve_output and not base.make_scheduler().cfg.reserve_output
    one = StepPlan(decode_contexts=(1000,))
    assert base.cost.step_s(one) - p.cost.step_s(one) == pytest.approx(1.5e-3, rel=1e-9)
    with pytest.raises(Exception, match="step_overhead_ms"):
        EngineConfig(step_overhead_ms=-1)


def test_async_scheduling_reaches_the_scheduler_the_launch_command_and_the_planner():
    """engine.async_scheduling: None takes the release's default (on for the current vLLM and from 0.14, whose
    release notes say so; off for 0.13, whose command does not name it); a value is what the scheduler runs and
    what the command says; the planner's tasks carry it."""
    from capacity.plan.planner import Planner, Scenario

    g = get_gpu("h100-sxm")
    for cfg, on, flag in ((EngineConfig(), True, "--async-scheduling"),
                          (EngineConfig(async_scheduling=False), False, "--no-async-scheduling"),
                          (EngineConfig(engine="vllm@0.13"), False, None),
                          (EngineConfig(engine="vllm@0.14"), True, "--async-scheduling")):
        p = prepare(Deployment(CARD, g, cfg))
        assert p.make_scheduler().cfg.async_scheduling is on
        cmd = p.engine_model.launch_command(CARD, cfg, p.budget)
        assert (flag in cmd.split()) if flag else "async-scheduling" not in cmd
    s = Scenario.model_validate({"model": "llama-3.1-8b", "engine": {"async_scheduling": False}})
    task = Planner(s, CARD, None).tasks(Planner(s, CARD, None).engine(1), 1.0, range(1))[0]
    assert task.engine["async_scheduling"] is False


def test_a_closed_loops_warm_up_is_its_start_up_cohort():
    """A closed loop's c users send c requests at t=0, a burst the loop never sees again once they drift apart.
    The warm-up leaves out at least those c (by hand below); left in at 10% of the requests, 100 of the 200
    burst requests set the P99 TTFT (docs/fidelity.md, "A closed loop's warm-up"). `--warmup 0` leaves out
    nothing; an open loop, or a loop with no more requests than users, keeps the fraction."""
    from capacity.pipeline import warmup_requests
    from capacity.workload import Arrivals, Lengths

    def wl(kind: str, users: int | None = None) -> WorkloadSpec:
        arr = Arrivals(kind=kind, users=users) if kind == "closed" else Arrivals(kind=kind, rate_per_s=1.0)
        return WorkloadSpec(arrivals=arr)
    assert warmup_requests(1000, 0.1, wl("closed", 200)) == 200
    assert warmup_requests(1000, 0.1, wl("closed", 50)) == 100
    assert warmup_requests(1000, 0.0, wl("closed", 200)) == 0
    assert warmup_requests(150, 0.1, wl("closed", 200)) == 15
    assert warmup_requests(1000, 0.1, wl("poisson")) == 100

    dep = Deployment(card=load_model_card(ROOT / "models/llama-3.1-8b.yaml"), gpu=get_gpu("h100-sxm"))
    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=200), input_len=Lengths(kind="uniform", low=800, high=1200),
                        output_len=Lengths(kind="uniform", low=100, high=300), num_requests=1000)
    res = run(dep, spec, RunOptions(seed=0, ci=False))
    assert res.warmup_requests == 200 and res.as_dict()["warmup_requests_excluded"] == 200
    assert res.as_dict()["warmup_is_start_up_cohort"] is True
    from rich.console import Console

    from capacity.io.report import simulation_table
    con = Console(width=200, record=True)
    simulation_table({**res.as_dict(), "model": "8B", "gpu": "h100-sxm", "replicas": 1, "tp": 1}, con)
    assert "first 200 requests (the users' start-up cohort, sent at t=0) excluded as warm-up" in con.export_text()
    r = res.sim.records
    ttft = r.first_token - r.arrival
    assert np.all(np.diff(r.arrival) >= 0) and np.all(r.arrival[:200] == 0)  # request order is send order
    assert res.summary.ttft_s.p99 == pytest.approx(np.percentile(ttft[200:], 99), rel=1e-9)
    assert ttft[:200].mean() > 10 * ttft[200:].mean()  # the cohort: 2.4 s against 143 ms
    assert np.percentile(ttft[100:], 99) > 10 * res.summary.ttft_s.p99  # the old 10%: 4.5 s against 253 ms


def test_simulate_takes_a_clients_cap_and_reports_its_wait(tmp_path):
    """`--max-concurrency C` with a rate: the run of `vllm bench serve --request-rate R --max-concurrency C`. The
    JSON gives the measured requests' waits at the client, the notes say what TTFT leaves out and that the client's
    backlog grew at a rate 16 slots cannot send; a cap where it means nothing, or in a plan or a fleet (whose rate
    searches and merged arrivals would drop it), is one line naming the field, exit 1."""
    from pydantic import ValidationError

    from capacity.plan.colocate import Fleet
    from capacity.workload import Arrivals, fixed

    out = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "30", "--max-concurrency", "16",
                  "--input-len", "1000", "--output-len", "200", "-n", "400", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    cw = d["client_wait"]
    assert cw["max_concurrency"] == 16 and cw["requests"] == 360 and cw["requests_waited"] > 300
    assert cw["backlog_rising"] is True and cw["mean_ms"] > 1000
    note = next(n for n in d["notes"] if n.startswith("client cap of 16 requests in flight"))
    assert "the client sent less than the offered rate" in note and "leave that wait out" in note
    assert d["summary"]["requests_per_s"] < 10  # 16 slots of a ~2.1-s request: about 7.5 req/s, not 30
    dep = Deployment(card=load_model_card(ROOT / "models/llama-3.1-8b.yaml"), gpu=get_gpu("h100-sxm"))
    free = run(dep, WorkloadSpec(arrivals=Arrivals(rate_per_s=2.0), input_len=fixed(100), output_len=fixed(20),
                                 num_requests=100), RunOptions(seed=0, ci=False))
    assert free.as_dict()["client_wait"] is None and not any("client cap" in n for n in free.notes)
    for kind in ("closed", "offline"):  # the CLI turns these into one line naming the field (below)
        with pytest.raises(ValidationError, match="max_concurrency 2: a client's cap on an open loop"):
            Arrivals(kind=kind, users=4, max_concurrency=2)
    with pytest.raises(ValidationError, match="max_concurrency: a client's cap is not simulated in a fleet"):
        Fleet.model_validate({"gpu": "h100-sxm", "models": [{"model": "llama-3.1-8b", "workload": {
            "arrivals": {"kind": "poisson", "rate_per_s": 2, "max_concurrency": 4}}}]})
    sc = tmp_path / "plan.yaml"
    sc.write_text("model: llama-3.1-8b\ntarget_rate_per_s: 10\nworkload:\n  arrivals: {kind: poisson, max_concurrency: 8}\n")
    for args in (("simulate", "-m", "llama-3.1-8b", "--arrival", "closed", "--users", "4", "--max-concurrency", "2"),
                 ("plan", "--model", str(sc))):
        r = run_cli(*args)
        assert r.returncode == 1 and "max_concurrency" in r.stderr and len(r.stderr.strip().splitlines()) == 1, args


def test_a_configuration_that_serves_no_rate_says_why_and_what_would_serve_one():
    """Qwen2.5-7B bf16 on one L4 at a 50 ms TPOT (issue 48: it said "none, fails at 0.0366"). By hand: 28 layers of
    q 3584^2 + k,v 2 x 3584 x 512 + o 3584^2 + MLP 3 x 3584 x 18944 = 233.0M weights, x 28 = 6.525G, plus the
    152,064 x 3,584 LM head = 7.07G x 2 bytes = 13.17 GiB read per decode step; at the L4's 300 GB/s, 47.1 ms of
    every step. The way out named first (FP8 weights) then does serve a rate."""
    from capacity.errors import CapacityError
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Scenario, make_plan

    card = load_model_card(ROOT / "capacity/data/models/qwen2.5-7b.yaml")
    sc = {"model": "qwen2.5-7b", "gpu": "l4", "target_rate_per_s": 0.5, "search": {**TINY_SEARCH, "seeds": 1},
          "workload": {"input_len": {"kind": "fixed", "value": 512}, "output_len": {"kind": "fixed", "value": 64}}}
    with pytest.raises(CapacityError) as exc:
        make_plan(Scenario.model_validate(sc), card, SerialExecutor(cache=False))
    msg = str(exc.value)
    assert "TPOT" in msg and "13.2 GiB per rank at 300 GB/s" in msg and "takes 47.1 ms" in msg
    assert "FP8 weights (--weight-dtype fp8)" in msg and "a TPOT objective >=" in msg
    p = make_plan(Scenario.model_validate(sc), card.with_overrides(weight_dtype="fp8"), SerialExecutor(cache=False))
    assert p.gpus >= 1 and p.verification.passed
