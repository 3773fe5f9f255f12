"""Calibration: real torch kernels on the CPU (quick grids), the profile format, the calibrated cost model,
and every bad-input path named in the issue (unknown device, CUDA without CUDA, truncated profile, another
schema version, another model)."""
import json
import warnings

import pytest

from capacity.cost.calibrated import CalibratedCost, OffGridWarning
from capacity.cost.profile import SCHEMA_VERSION, ProfileMismatchWarning, load_profile
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.errors import ConfigError
from tests.conftest import MODELS, ROOT, run_cli

torch = pytest.importorskip("torch")  # the dev extra installs torch==2.13.0; CI has it


@pytest.fixture(scope="module")
def tiny():
    from capacity.model.card import load_model_card

    return load_model_card(MODELS / "tiny.yaml")


@pytest.fixture(scope="module")
def quick_profile(tiny, tmp_path_factory):
    from calibrate.suite import run_suite

    out = tmp_path_factory.mktemp("prof") / "tiny-quick.json"
    prof = run_suite(tiny, "cpu", out, quick=True, threads=1, progress=False, command="pytest")
    return prof, out


# ---- the suite and the profile it writes ------------------------------------------------------------
def test_quick_suite_writes_a_complete_profile(quick_profile, tiny):
    prof, path = quick_profile
    assert prof.schema_version == SCHEMA_VERSION
    pv = prof.provenance
    assert pv.device == "cpu" and pv.cpu_threads == 1 and pv.torch_version.startswith("2.13")
    assert pv.dtype == "bf16" and pv.quick and pv.gpu is None and pv.date[:4].isdigit()
    assert {"qkv", "o", "gate_up", "down", "elementwise", "layer"} <= set(prof.linear)
    for col in [*prof.linear.values(), prof.embed, prof.lm_head]:
        assert all(v is not None and v > 0 for v in col)
    assert sum(st.role == "fit" for st in prof.steps) >= 4 and sum(st.role == "holdout" for st in prof.steps) >= 1
    assert prof.fit is not None and set(prof.fit.scales) <= {"layers", "prefill_attn", "decode_attn"}
    assert load_profile(path) == prof  # round trip through JSON


def test_bigger_steps_take_longer_in_the_measured_tables(quick_profile):
    prof, _ = quick_profile
    # 256 tokens through a layer body costs more than 1 token; 16 x 256 decode attention more than 1 x 16
    assert prof.linear["layer"][-1] > prof.linear["layer"][0]
    assert prof.decode_attn[-1][-1] > prof.decode_attn[0][0]
    assert prof.prefill_attn[-1][-1] > prof.prefill_attn[0][0]


def test_stack_forward_samples_one_token_per_emitting_sequence(tiny):
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, "cpu", max_context=512)
    st = stack.prepare([(5, 0), (7, 100)], [10, 300, 20])
    with torch.inference_mode():
        out = stack.forward(st)
    assert out.shape == (5,)  # two prefill chunks + three decodes
    with pytest.raises(ConfigError, match="max context 512"):
        stack.prepare([(500, 100)], [])


# ---- the calibrated model reproduces its tables on the grid -----------------------------------------
def test_calibrated_cost_on_grid_points_is_the_table(quick_profile, tiny):
    prof, _ = quick_profile
    raw = CalibratedCost(prof.model_copy(update={"fit": None}), tiny, use_fit=False)
    L = tiny.num_layers
    b, ctx = prof.decode_batch[1], prof.decode_context[1]
    comp = raw.components(StepPlan(decode_contexts=(ctx,) * b))
    # 2-D tables are made monotone too: a point is the minimum over points with at least as much of both
    quad = lambda t, i, j: min(v for row in t[i:] for v in row[j:] if v is not None)
    assert comp["decode_attn"] == pytest.approx(L * quad(prof.decode_attn, 1, 1), rel=1e-9)
    i = prof.tokens.index(b)
    # 1-D tables are made non-decreasing first (a point slower than a larger size takes that size's time)
    mono = lambda col: min(col[i:])
    assert comp["layers"] == pytest.approx(L * mono(prof.linear["layer"]) + mono(prof.embed) + mono(prof.lm_head),
                                           rel=1e-9)
    c, k = prof.prefill_chunk[2], prof.prefill_cached[1]
    comp = raw.components(StepPlan(prefills=(PrefillChunk(c, k),)))
    assert comp["prefill_attn"] == pytest.approx(L * quad(prof.prefill_attn, 2, 1), rel=1e-9)
    assert comp["decode_attn"] == 0.0


def test_fitted_cost_applies_scales_and_overhead(quick_profile, tiny):
    prof, _ = quick_profile
    cost = CalibratedCost(prof, tiny)
    raw = CalibratedCost(prof.model_copy(update={"fit": None}), tiny, use_fit=False)
    plan = StepPlan(prefills=(PrefillChunk(32, 0),), decode_contexts=(16, 16, 16, 16))
    comp = raw.components(plan)
    expect = sum(prof.fit.scales.get(k, 1.0) * comp[k] for k in ("layers", "prefill_attn", "decode_attn"))
    assert cost.step_s(plan) == pytest.approx(expect + prof.fit.overhead_s, rel=1e-9)
    assert cost.source.startswith("calibrated profile")


def test_fit_recovers_known_scales(quick_profile, tiny):
    """Replace measured step times by a known law and check the fit finds it."""
    from calibrate.suite import fit_profile
    from capacity.cost.profile import to_plan

    prof, _ = quick_profile
    raw = CalibratedCost(prof.model_copy(update={"fit": None}), tiny, use_fit=False)
    steps = []
    for st in prof.steps:
        c = raw.components(to_plan(st.prefills, st.decodes))
        law = 1.5 * c["layers"] + 0.8 * c["prefill_attn"] + 1.2 * c["decode_attn"] + 0.002
        steps.append(st.model_copy(update={"measured_s": law}))
    fitted = fit_profile(prof.model_copy(update={"steps": steps, "fit": None}), tiny).fit
    assert fitted.scales["layers"] == pytest.approx(1.5, rel=1e-3)
    assert fitted.overhead_s == pytest.approx(0.002, rel=1e-2)
    if "prefill_attn" in fitted.scales:
        assert fitted.scales["prefill_attn"] == pytest.approx(0.8, rel=1e-2)
    assert fitted.median_abs_rel_err < 1e-3


def test_monotone_in_context_and_tokens_inside_the_grid(quick_profile, tiny):
    prof, _ = quick_profile
    cost = CalibratedCost(prof, tiny)
    ctxs = [16, 40, 100, 180, 256]
    times = [cost.step_s(StepPlan(decode_contexts=(c,) * 4)) for c in ctxs]
    assert times == sorted(times)
    toks = [4, 10, 30, 64, 200, 256]
    times = [cost.step_s(StepPlan(prefills=(PrefillChunk(n, 0),))) for n in toks]
    assert all(b >= a * 0.999 for a, b in zip(times, times[1:]))


def test_off_grid_warns_and_scales_by_work(quick_profile, tiny):
    prof, _ = quick_profile
    raw = CalibratedCost(prof.model_copy(update={"fit": None}), tiny, use_fit=False)
    b_max, ctx = prof.decode_batch[-1], prof.decode_context[-1]
    edge = raw.components(StepPlan(decode_contexts=(ctx,) * b_max))["decode_attn"]
    with pytest.warns(OffGridWarning, match="decode_attn"):
        twice = raw.components(StepPlan(decode_contexts=(ctx,) * (2 * b_max)))["decode_attn"]
    assert twice == pytest.approx(2 * edge, rel=1e-9)  # twice the KV read, twice the time
    assert raw.off_grid["decode_attn"] >= 1


# ---- bad input ---------------------------------------------------------------------------------------
def test_unknown_device_and_cuda_without_cuda(tiny):
    from calibrate.stack import resolve_device

    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")
    r = run_cli("calibrate", "--model", "tiny", "--device", "tpu", "--quick", "--out", "/tmp/never.json")
    assert r.returncode == 1 and r.stderr.strip().startswith("error: --device 'tpu': unknown device")
    assert "Traceback" not in r.stderr


def test_truncated_profile_is_a_one_line_error(quick_profile, tmp_path):
    _, path = quick_profile
    bad = tmp_path / "trunc.json"
    bad.write_text(path.read_text()[:500])
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        load_profile(bad)
    r = run_cli("step-cost", "--model", "tiny", "--profile", str(bad), "--decode", "4x100")
    assert r.returncode == 1 and "truncated" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_other_schema_version_is_refused(quick_profile, tmp_path):
    _, path = quick_profile
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    bad = tmp_path / "v2.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"schema_version {SCHEMA_VERSION + 1} is not supported"):
        load_profile(bad)


def test_profile_for_another_model_tp_or_gpu(quick_profile, card, tiny):
    prof, _ = quick_profile
    with pytest.raises(ConfigError, match="measured for model 'tiny', not 'llama-3.1-8b'.*hidden_size"):
        CalibratedCost(prof, card("llama-3.1-8b"))
    with pytest.raises(ConfigError, match="measured at tp=1, scenario has tp=2"):
        CalibratedCost(prof, tiny, tp=2, gpu="h100-sxm")
    with pytest.raises(ConfigError, match="scenario gpu is h200"):
        CalibratedCost(prof, tiny, gpu="h200")
    with pytest.warns(ProfileMismatchWarning, match="used anyway"):
        CalibratedCost(prof, tiny, gpu="h200", allow_mismatch=True)


def test_profile_with_inconsistent_tables_is_refused(quick_profile, tmp_path):
    _, path = quick_profile
    data = json.loads(path.read_text())
    data["decode_attn"] = data["decode_attn"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="decode_attn must be"):
        load_profile(bad)


@pytest.mark.slow  # issue 20: the default run stays under 6 minutes on CI's machine; CI runs the slow group
def test_cli_calibrate_quick_end_to_end(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("calibrate", "--model", "tiny", "--device", "cpu", "--quick", "--threads", "1", "--out", str(out),
                timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.is_file() and "wrote" in r.stdout
    r = run_cli("step-cost", "--model", "tiny", "--profile", str(out), "--prefill", "64:0", "--decode", "4x100", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["step_s"] > 0 and res["source"].startswith("calibrated profile") and res["tokens"] == 68


def test_a_paged_attention_profile_says_so_and_predicts_mixed_lengths_by_their_mean(tiny):
    """--attention-kernel paged: the profile records the kernel (on a CPU the reference, with a note saying it is a
    rehearsal) and a paged decode layout, so mixed decode lengths cost what their mean context costs, not the
    longest padded over the batch."""
    from calibrate.suite import run_suite

    prof = run_suite(tiny, "cpu", None, quick=True, threads=1, progress=False, command="pytest", attention="paged")
    assert prof.decode_layout == "paged" and prof.provenance.attention_kernel == "reference"
    assert any("reference kernel" in n and "rehearsal" in n for n in prof.provenance.notes)
    cost = CalibratedCost(prof, tiny)

    def step(*contexts):
        return cost.step_s(StepPlan(decode_contexts=contexts))

    lo, hi = prof.decode_context[0], prof.decode_context[-1]  # 16 and 256 on the quick grid
    assert step(lo, hi) == pytest.approx(step((lo + hi) // 2, (lo + hi) // 2), rel=1e-9)
    assert step(lo, hi) < step(hi, hi)  # what the padded layout would cost


def test_bad_attention_kernel_is_one_line(tmp_path):
    r = run_cli("calibrate", "--model", "tiny", "--device", "cpu", "--quick", "--attention-kernel", "flash",
                "--out", str(tmp_path / "p.json"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--attention-kernel: auto, sdpa or paged (got 'flash')" in r.stderr
    r = run_cli("calibrate", "--model", "tiny", "--device", "cpu", "--quick", "--weight-dtype", "fp8",
                "--quant-group-size", "128", "--out", str(tmp_path / "p.json"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: fp8 block scales: intermediate_size 688 on this rank is not a multiple of 128"
    r = run_cli("memory", "--model", "tiny", "--quant-group-size", "128")  # bf16 weights: nothing to group
    assert r.returncode == 1 and r.stderr.strip() == ("error: --quant-group-size 128: model tiny stores bf16 weights, "
                                                      "which have no groups; give --weight-dtype too")


@pytest.mark.slow  # Inductor compiles C++ on a CPU: about 20 s
def test_compiled_layers_compute_what_the_eager_layers_compute(tiny):
    """calibrate/fusion.py: each layer's halves around attention through torch.compile (dynamic token count),
    shared by every layer; the whole step's final hidden states match the eager stack's within bf16 rounding,
    and steps of other sizes reuse the compiled code: two graphs per half, one for any token count from 2 (the
    start-up check compiles it with inference tensors, as steps pass) and one for a single token, which torch
    specialises."""
    from torch._dynamo.utils import counters

    from calibrate.fusion import compile_layers
    from calibrate.stack import DecoderStack

    torch._dynamo.reset()
    counters.clear()
    eager, comp = DecoderStack(tiny, "cpu", max_context=256), DecoderStack(tiny, "cpu", max_context=256)
    assert compile_layers(comp) is None
    finals = {}
    for name, stack in (("eager", eager), ("compiled", comp)):
        stack.lm_head = lambda x, rows, name=name: finals.__setitem__(name, x.index_select(0, rows).float())
    for shape in (([(30, 10), (17, 0)], [5, 40]), ([(100, 0)], [3] * 20), ([], [7] * 3), ([], [7])):
        for stack in (eager, comp):
            with torch.inference_mode():
                stack.forward(stack.prepare(*shape))
        assert (finals["eager"] - finals["compiled"]).abs().max() <= 0.03 * finals["eager"].abs().max()
    assert counters["stats"]["unique_graphs"] == 4


def test_a_failing_or_disagreeing_compile_leaves_the_stack_eager_and_says_why(tiny, monkeypatch):
    from calibrate.fusion import compile_layers
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, "cpu", max_context=64)

    def broken(fn, **kw):
        def run(*a):
            raise RuntimeError("no C++ compiler\nmore")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    why = compile_layers(stack)
    assert why == "torch.compile failed (RuntimeError: no C++ compiler): stayed eager"
    assert all("pre" not in vars(layer) and "post" not in vars(layer) for layer in stack.layers)

    def off(fn, **kw):
        return lambda *a: (lambda out: [o + 1 for o in out] if isinstance(out, tuple) else out + 1)(fn(*a))

    monkeypatch.setattr(torch, "compile", off)
    assert compile_layers(stack).startswith("compiled layer disagrees with eager")
    assert all("pre" not in vars(layer) for layer in stack.layers)


# ---- the shipped profile ---------------------------------------------------------------------------
def test_shipped_tiny_cpu_profile_loads_and_matches_the_card(tiny):
    path = ROOT / "calibrate/profiles/tiny-cpu.json"
    prof = load_profile(path)
    cost = CalibratedCost(prof, tiny, profile_path=str(path))
    assert sum(st.role == "holdout" for st in prof.steps) >= 30
    assert not prof.provenance.quick
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inside the grid: no extrapolation warning
        assert cost.step_s(StepPlan(prefills=(PrefillChunk(512, 1024),), decode_contexts=(900,) * 16)) > 0


def test_interrupted_calibration_resumes(tiny, tmp_path, monkeypatch):
    """Ctrl-C midway leaves a checkpoint; the rerun measures only what is missing, then removes it."""
    import calibrate.timing as timing
    from calibrate.suite import run_suite

    real = timing.measure
    calls = {"n": 0}

    def counting(*a, **k):
        calls["n"] += 1
        if calls.get("stop") == calls["n"]:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(timing, "measure", counting)
    run_suite(tiny, "cpu", tmp_path / "full.json", quick=True, threads=1, progress=False)
    total = calls["n"]
    out = tmp_path / "p.json"
    calls.update(n=0, stop=25)
    with pytest.raises(KeyboardInterrupt):
        run_suite(tiny, "cpu", out, quick=True, threads=1, progress=False)
    partial = tmp_path / "p.json.partial.json"
    assert partial.is_file() and not out.exists()
    assert len(json.loads(partial.read_text())["done"]) == 24
    calls.update(n=0, stop=None)
    prof = run_suite(tiny, "cpu", out, quick=True, threads=1, progress=False)
    assert calls["n"] == total - 24
    assert out.is_file() and not partial.exists() and prof.fit is not None
