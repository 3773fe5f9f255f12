"""The dashboard through Streamlit's AppTest: the numbers it shows are the planner's and simulator's for
the same scenario, edits update them, and a bad card is an error box, not a trace."""
import pytest

from tests.conftest import ROOT

pytest.importorskip("streamlit")  # in the dev extra: CI has it
from streamlit.testing.v1 import AppTest  # noqa: E402

DEFAULT_ENGINE = {"tensor_parallel_size": 1, "max_num_seqs": 256, "max_model_len": 8192, "max_num_batched_tokens": 8192,
                  "gpu_memory_utilization": 0.9, "block_size": 16, "kv_cache_dtype": "auto", "enable_chunked_prefill": True}


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


@pytest.fixture(scope="module")
def app():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _budget(gpu, **over):
    from capacity.config_io import validate
    from capacity.engine import EngineConfig
    from capacity.gpus import get_gpu
    from capacity.memory import budget
    from capacity.model_card import load_model_card

    return budget(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu(gpu),
                  validate(EngineConfig, {**DEFAULT_ENGINE, **over}, "engine"))


def test_default_numbers_equal_the_library(app):
    m = metrics(app)
    b = _budget("h100-sxm")
    assert m["KV tokens"] == f"{b.kv_tokens:,}" and m["KV blocks"] == f"{b.num_blocks:,}"

    from capacity.costs import RooflineCost
    from capacity.gpus import get_gpu
    from capacity.model_card import load_model_card
    from capacity.scenario import run_scenario
    from capacity.workload import WorkloadSpec

    wl = WorkloadSpec.model_validate({"arrivals": {"kind": "poisson", "rate_per_s": 8.0, "cv": 1.0},
                                      "input_len": {"kind": "fixed", "value": 1024},
                                      "output_len": {"kind": "fixed", "value": 256}, "num_requests": 1000,
                                      "classes": [{"slo_ttft_s": 1.5, "slo_tpot_s": 0.05}]})
    res = run_scenario(b, RooflineCost(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm")), wl,
                       seed=0)
    assert m["P99 TTFT (ms)"] == f"{res.summary.ttft_s['p99'] * 1e3:.1f}"
    assert m["P99 TPOT (ms)"] == f"{res.summary.tpot_s['p99'] * 1e3:.2f}"


def test_editing_widgets_updates_the_numbers(app):
    app.sidebar.selectbox[1].set_value("h200").run()  # the GPU
    assert not app.exception
    b = _budget("h200")
    assert metrics(app)["KV tokens"] == f"{b.kv_tokens:,}"
    app.sidebar.select_slider(key="max_len").set_value(32768).run()
    b = _budget("h200", max_model_len=32768)
    assert metrics(app)["Max concurrency at max_model_len"] == f"{b.max_concurrency:.1f}"


def test_bad_card_is_an_error_box():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    at.text_area(key="pasted_card").input("num_layers: -3\nfoo: 1\n").run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert errs and "num_layers: Input should be greater than 0 (got -3)" in errs[0] and "foo: unknown field" in errs[0]
    at.text_area(key="pasted_card").input("- just\n- a list\n").run()
    assert "expected a mapping" in at.error[0].value


def test_oversized_paste_is_refused():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    at.text_area(key="pasted_card").input("num_layers: 4\n" + "#" * 1_100_000).run()
    assert not at.exception and "more than the 1,000,000" in at.error[0].value


def test_step_cost_sources_are_the_profiles_for_this_model_and_gpu():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    src = next(s for s in at.sidebar.selectbox if s.label == "step-cost source")
    assert src.options == ["roofline"]  # llama-3.1-8b on the default h100-sxm: no bundled profile
    at.sidebar.selectbox[1].set_value("h200").run()
    src = next(s for s in at.sidebar.selectbox if s.label == "step-cost source")
    assert src.options == ["roofline", "llama-3.1-8b-h200-eager", "llama-3.1-8b-h200"]
    src.set_value("llama-3.1-8b-h200").run()
    assert not at.exception, [e.value for e in at.exception]

    from capacity.calibrated import CalibratedCost
    from capacity.model_card import load_model_card
    from capacity.profile import load_profile
    from capacity.scenario import run_scenario
    from capacity.workload import WorkloadSpec

    path = ROOT / "calibrate/profiles/llama-3.1-8b-h200.json"
    card = load_model_card(ROOT / "models/llama-3.1-8b.yaml")
    wl = WorkloadSpec.model_validate({"arrivals": {"kind": "poisson", "rate_per_s": 8.0, "cv": 1.0},
                                      "input_len": {"kind": "fixed", "value": 1024},
                                      "output_len": {"kind": "fixed", "value": 256}, "num_requests": 1000,
                                      "classes": [{"slo_ttft_s": 1.5, "slo_tpot_s": 0.05}]})
    res = run_scenario(_budget("h200"), CalibratedCost(load_profile(path), card, gpu="h200"), wl, seed=0)
    assert metrics(at)["P99 TPOT (ms)"] == f"{res.summary.tpot_s['p99'] * 1e3:.2f}"
