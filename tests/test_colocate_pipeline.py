"""`capacity colocate`'s separate layout runs each model through the run pipeline (capacity.pipeline.run), on the
same requests the shared and swapped layouts simulate (issue 50 item 4)."""
from __future__ import annotations

import numpy as np
import pytest

from capacity.plan.colocate import Fleet, simulate_fleet, stream_seed


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1])
def test_a_models_seed_is_the_generator_of_seed_and_index(seed):
    """numpy's SeedSequence reads an integer as its 32-bit words and pads with zeros: seed + i * 2^32 seeds the
    same generator as the entropy [seed, i] the shared layout draws model i's requests from."""
    for i in range(4):
        a = np.random.default_rng([seed, i]).random(8)
        assert np.array_equal(a, np.random.default_rng(stream_seed(seed, i)).random(8))
    assert len({stream_seed(2**40, i) for i in range(16)}) == 16  # larger seeds: distinct, valid run seeds
    assert all(0 <= stream_seed(2**62, i) < 2**63 for i in range(16))


def _model(name: str, rate: float, n: int, prompt: int) -> dict:
    return {"model": name, "slo_ttft_s": 2.0, "slo_tpot_s": 0.1, "engine": {"max_model_len": 4096},
            "workload": {"arrivals": {"kind": "poisson", "rate_per_s": rate}, "num_requests": n,
                         "input_len": {"kind": "fixed", "value": prompt}, "output_len": {"kind": "fixed", "value": 64}}}


def test_an_overloaded_model_on_gpus_of_its_own_does_not_fail_another():
    """Separate layout: the 8B at 400 req/s of 2,048-token prompts saturates its H100 (a prefill of 2,048 tokens
    alone is ~0.1 s on an H100 at roofline, so ~10 prompts/s per replica, far below 400); the 7B at 1 req/s on
    an H100 of its own serves every request within its SLO. Each model's verdict is its own deployment's."""
    f = Fleet.model_validate({"gpu": "h100-sxm", "models": [_model("llama-3.1-8b", 400.0, 3000, 2048),
                                                            _model("mistral-7b", 1.0, 100, 256)]})
    out = simulate_fleet(f, "separate")
    big, small = out["models"]
    assert out["saturated"] and out["saturation"].startswith("llama-3.1-8b: saturated")
    assert not big["meets_slo"]
    assert small["requests"] == 100 and small["meets_slo"] and small["p99_ttft_s"] < 2.0
    assert not out["meets_slo"] and out["gpus"] == 2



def test_layouts_are_compared_on_the_engines_time_alone():
    """The shared simulation of several models has no server front end, so the separate layout runs without one
    (its TTFT is the engine's, as in the shared layout), and a front end set for a model is refused in one line."""
    from capacity.errors import ConfigError

    f = Fleet.model_validate({"gpu": "h100-sxm", "models": [_model("mistral-7b", 1.0, 60, 256)]})
    sep = simulate_fleet(f, "separate")["models"][0]
    assert sep["p50_ttft_s"] < 0.014  # a 256-token prefill on an idle H100: well under vLLM's 14.4 ms front end
    m = _model("mistral-7b", 1.0, 60, 256)
    m["engine"]["frontend_ms"] = 5.0
    with pytest.raises(ConfigError, match=r"models\[0\]\.engine\.frontend_ms: 5\.0: colocate compares"):
        simulate_fleet(Fleet.model_validate({"gpu": "h100-sxm", "models": [m]}), "separate")
