"""Reliability: bad input through the real CLI (one line, exit 1, names the field and value), property-based
loaders, determinism, the result cache (keys, corruption, interruption). docs/reliability.md lists every case
and the test that backs it."""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity.errors import CapacityError, ConfigError
from tests.conftest import ROOT, run_cli

TINY = (ROOT / "models/tiny.yaml").read_text()


@pytest.mark.parametrize("name,text,args,needle", [
    ("malformed YAML", "num_layers: [1, 2\n", ["memory"], "not valid YAML at line"),
    ("wrong type", TINY.replace("num_layers: 4", "num_layers: four"), ["memory"], "num_layers: Input should be a valid integer"),
    ("NaN size", TINY.replace("hidden_size: 256", "hidden_size: .nan"), ["memory"], "hidden_size"),
    ("zero heads", TINY.replace("num_attention_heads: 8", "num_attention_heads: 0"), ["memory"], "num_attention_heads"),
    ("absurd layers", TINY.replace("num_layers: 4", "num_layers: 1000000000000"), ["memory", "-g", "h100"], "num_layers"),
    ("heads vs kv heads", TINY.replace("num_kv_heads: 2", "num_kv_heads: 3"), ["memory"], "must be a multiple of num_kv_heads"),
    ("heads not divisible by tp", TINY, ["memory", "--tp", "16"], "num_attention_heads (8) of tiny is not divisible by 16"),
    ("empty file", "", ["memory"], "expected a mapping"),
    ("top-level list", "- 1\n- 2\n", ["memory"], "expected a mapping"),
    ("unknown field", TINY + "flash: true\n", ["memory"], "flash: unknown field"),
])
def test_bad_model_cards(tmp_path, name, text, args, needle):
    p = tmp_path / "card.yaml"
    p.write_text(text)
    r = run_cli(args[0], "--model", str(p), *args[1:])
    assert r.returncode == 1, (name, r.stdout)
    assert needle in r.stderr, (name, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name,path,text,needle", [
    ("HF config missing a field", "config.json", '{"model_type": "llama", "hidden_size": 64}', "field 'num_hidden_layers' is missing"),
    ("HF unknown architecture", "config.json", '{"model_type": "gpt2"}', "model_type 'gpt2' is not supported"),
    ("GPU YAML negative bandwidth", "gpu.yaml", "memory_bytes: 8e10\nusable_memory_bytes: 8e10\nmem_bw_bytes_per_s: -1\n"
                                               "interconnect_bytes_per_s: 1e9\n", "mem_bw_bytes_per_s"),
])
def test_bad_hf_config_and_gpu_yaml(tmp_path, name, path, text, needle):
    p = tmp_path / path
    p.write_text(text)
    args = ["memory", "--model", str(p)] if path == "config.json" else ["memory", "--model", "tiny", "--gpu", str(p)]
    r = run_cli(*args)
    assert r.returncode == 1 and needle in r.stderr, (name, r.stderr)
    assert "Traceback" not in r.stderr


def test_missing_files_name_the_path(tmp_path):
    for args, needle in ((["memory", "--model", str(tmp_path / "nope.yaml")], "nope.yaml"),
                         (["simulate", "--model", "tiny", "--workload", str(tmp_path / "w.yaml"), "--gpu", "h100"], "w.yaml"),
                         (["step-cost", "--model", "tiny", "--profile", str(tmp_path / "p.json"), "--decode", "1x10"], "p.json"),
                         (["validate", "--run", str(tmp_path / "r.json"), "--fit", str(tmp_path / "f.json")], "r.json")):
        r = run_cli(*args)
        assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


# ---- property-based: loaders never crash with anything but the clear error ------------------------------------
FIELDS = ["num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "intermediate_size", "vocab_size",
          "max_position_embeddings", "dtype", "head_dim"]
junk = st.one_of(st.integers(-10**13, 10**13), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                 st.none(), st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=junk)
def test_any_field_value_is_valid_or_a_clear_error(field, value):
    """Replace one field of a valid card by anything: either a valid card whose memory budget keeps its
    invariants, or a ConfigError naming that field; never another exception."""
    import yaml

    from capacity.engine.config import EngineConfig
    from capacity.engine.memory import budget
    from capacity.files import validate
    from capacity.model.card import ModelCard
    from capacity.model.gpus import get_gpu

    data = yaml.safe_load(TINY)
    data[field] = value
    try:
        card = validate(ModelCard, data, "card")
    except ConfigError as exc:
        assert field in str(exc) or "num_attention_heads" in str(exc) or "hidden_size" in str(exc)
        return
    try:
        b = budget(card, get_gpu("h100-sxm"), EngineConfig())
    except CapacityError:
        return  # a clear "does not fit" is fine
    assert b.kv_budget_bytes >= 0 and b.num_blocks >= 0 and math.isfinite(b.kv_budget_bytes)
    assert b.kv_tokens == b.num_blocks * b.block_size


# ---- determinism ------------------------------------------------------------------------------------------
def test_same_scenario_and_seed_give_byte_identical_json():
    args = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "5", "--requests", "300",
            "--arrival", "gamma", "--cv", "2", "--input-len", "lognormal:800:0.5",
            "--max-num-seqs", "128", "--json")  # 128 sequences: a short capacity loop
    a, b = run_cli(*args, "--seed", "7"), run_cli(*args, "--seed", "7")
    assert a.returncode == 0 and a.stdout == b.stdout
    c = run_cli(*args, "--seed", "8")
    assert c.returncode == 0 and c.stdout != a.stdout  # and the seed matters (a run, not an error, differs)


# ---- the cache -----------------------------------------------------------------------------------------------
def _tasks(n=4, profile=None):
    from capacity.model.card import load_model_card
    from capacity.plan.planner import SimTask
    from capacity.workload import Arrivals, WorkloadSpec

    card = load_model_card(ROOT / "models/tiny.yaml").model_dump()
    wl = WorkloadSpec(arrivals=Arrivals(rate_per_s=3.0), num_requests=60).model_dump()
    return [SimTask(card, "h100-sxm", {}, wl, s, profile=profile) for s in range(n)]


def test_cache_key_covers_version_and_profile_contents(tmp_path):
    import capacity

    prof = tmp_path / "p.json"
    prof.write_text((ROOT / "calibrate/profiles/tiny-cpu.json").read_text())
    t = _tasks(1, str(prof))[0]
    k1 = t.key()
    prof.write_text(prof.read_text().replace('"quick": false', '"quick": false '))  # same name, new contents
    assert t.key() != k1
    before = _tasks(1)[0].key()
    old = capacity.__version__
    try:
        capacity.__version__ = old + "-next"  # a new tool version never reuses old results
        assert _tasks(1)[0].key() != before
    finally:
        capacity.__version__ = old


def test_cache_key_covers_the_code_itself(tmp_path, monkeypatch):
    """An edit or a `git pull` changes the simulator without changing __version__: the key must change too."""
    import shutil

    from capacity.plan import tasks

    pkg = tmp_path / "capacity"
    shutil.copytree(ROOT / "capacity", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    f0 = tasks.code_fingerprint(str(pkg))
    assert f0 == tasks.code_fingerprint.__wrapped__(str(pkg))  # deterministic
    sim = pkg / "sim" / "metrics.py"
    sim.write_text(sim.read_text() + "\n# one more line\n")
    f1 = tasks.code_fingerprint.__wrapped__(str(pkg))
    assert f1 != f0
    (pkg / "data" / "gpus.yaml").write_text((pkg / "data" / "gpus.yaml").read_text() + "\n")
    assert tasks.code_fingerprint.__wrapped__(str(pkg)) not in (f0, f1)  # data files too
    (pkg / "notes.txt").write_text("not code")
    f2 = tasks.code_fingerprint.__wrapped__(str(pkg))
    (pkg / "notes.txt").write_text("still not code")
    assert tasks.code_fingerprint.__wrapped__(str(pkg)) == f2
    before = _tasks(1)[0].key()
    monkeypatch.setattr(tasks, "code_fingerprint", lambda root=None: "another-build")
    assert _tasks(1)[0].key() != before


def test_corrupted_cache_entry_is_recomputed(tmp_path):
    from capacity.plan.executors import SerialExecutor

    tasks = _tasks(2)
    first = SerialExecutor(cache=tmp_path).run(tasks)
    (tmp_path / f"{tasks[0].key()}.json").write_text('{"ttft": {"p99": 1')  # torn write
    ex = SerialExecutor(cache=tmp_path)
    again = ex.run(tasks)
    assert ex.hits == 1 and ex.misses == 1
    assert again[0].ttft.p99 == pytest.approx(first[0].ttft.p99)


def test_a_task_queued_ahead_or_asked_again_runs_once_and_counts_as_if_each_batch_ran_alone(tmp_path, monkeypatch):
    """`Executor.ahead` and the executor's memory of its results (the planner's rounds on the pool): each
    distinct task is simulated once, the results are the ones a fresh run gives, and `misses`/`hits` (a plan's
    `simulations` and `cache_hits`) are what they were before: a repeat with the cache off is counted again, a
    repeat with it on is the cache hit it was, a task run ahead counts when it is asked for."""
    import capacity.plan.executors as executors
    from capacity.plan.executors import SerialExecutor

    tasks = _tasks(3)
    real, ran = executors.run_task, []
    monkeypatch.setattr(executors, "run_task", lambda t: (ran.append(t.seed), real(t))[1])
    ex = SerialExecutor(cache=False)
    ex.ahead([tasks[1], tasks[2], tasks[0]])
    a = ex.run([tasks[0]])
    assert sorted(ran) == [0, 1, 2] and (ex.hits, ex.misses) == (0, 1)  # the queued ones ran in this batch
    b = ex.run([tasks[1], tasks[0]])
    assert len(ran) == 3 and (ex.hits, ex.misses) == (0, 3)  # nothing ran again; counted as with the cache off
    assert b[1] is a[0]
    fresh = SerialExecutor(cache=False).run([tasks[1]])[0]
    assert (b[0].ttft.p99, b[0].tpot.p99, b[0].requests_per_s) == (fresh.ttft.p99, fresh.tpot.p99, fresh.requests_per_s)
    ran.clear()
    ex2 = SerialExecutor(cache=tmp_path)
    ex2.ahead([tasks[2]])
    ex2.run([tasks[0]])
    ex2.run([tasks[0], tasks[2]])  # before: tasks[0] read back from the disk cache, tasks[2] run now
    assert sorted(ran) == [0, 2] and (ex2.hits, ex2.misses) == (1, 2)
    ex3 = SerialExecutor(cache=tmp_path)  # a new executor finds both on disk
    ex3.run([tasks[2], tasks[0]])
    assert len(ran) == 2 and (ex3.hits, ex3.misses) == (2, 0)


def test_interrupted_sweep_keeps_a_consistent_cache_and_resumes(tmp_path, monkeypatch):
    import capacity.plan.executors as planner  # where the executors look run_task up
    from capacity.plan.executors import SerialExecutor

    tasks = _tasks(4)
    real = planner.run_task
    calls = {"n": 0}

    def flaky(task):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the sweep
        return real(task)

    monkeypatch.setattr(planner, "run_task", flaky)
    with pytest.raises(KeyboardInterrupt):
        SerialExecutor(cache=tmp_path).run(tasks)
    assert len(list(tmp_path.glob("*.json"))) == 2 and not list(tmp_path.glob("*.tmp*"))
    monkeypatch.setattr(planner, "run_task", real)
    ex = SerialExecutor(cache=tmp_path)
    out = ex.run(tasks)
    assert ex.hits == 2 and ex.misses == 2 and all(o.ttft.n > 0 for o in out)


def test_yaml_is_loaded_safely(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("!!python/object/apply:os.system ['echo pwned > " + str(tmp_path / "x") + "']\n")
    r = run_cli("memory", "--model", str(p))
    assert r.returncode == 1 and not (tmp_path / "x").exists() and "not valid YAML" in r.stderr
