"""Closed-loop users with fixed lengths: on a real vLLM (CPU build) they drift out of lock-step, the simulator's do
not (yet); on another real endpoint (evalscope's measurement, at the end) the lock-step held, as the simulator's.

`tests/data/vllm_closed_loop/users16_64in_32out.json`: 16 users, no think time, 64-token prompts and exactly
32 output tokens each, on vLLM 0.32's CPU build (tiny model, steps of ~7-10 ms), 640 requests. A wave of users
answered in the same step gets its first tokens in the same step: the size of a cluster of first-token times
(within 3 ms of each other) counts the users still in step. On the real engine the first 64 requests come in
clusters of up to 13 and the last 240 in clusters of ~2; TTFT falls from ~106 to ~64 ms as the prefills spread
over the decode steps. docs/fidelity.md (closed-loop lock-step) has the numbers, what is known of why, and a
caveat: on the 2-core VM the engine's processes and the load client share the cores."""
import json

import numpy as np
import pytest

from tests.conftest import ROOT

DATA = ROOT / "tests/data/vllm_closed_loop/users16_64in_32out.json"


def cluster_sizes(first_token_s, gap: float = 0.003) -> list[int]:
    ts = np.sort(np.asarray(first_token_s))
    sizes, cur = [], 1
    for a, b in zip(ts, ts[1:]):
        if b - a <= gap:
            cur += 1
        else:
            sizes.append(cur)
            cur = 1
    return sizes + [cur]


def _by_send(d: dict) -> tuple[np.ndarray, np.ndarray]:
    sent, ft = np.array(d["sent_s"]), np.array(d["first_token_s"])
    order = np.argsort(sent)
    return sent[order], ft[order]


def test_a_real_vllm_closed_loop_drifts_out_of_lock_step():
    d = json.loads(DATA.read_text())
    sent, ft = _by_send(d)
    assert len(sent) == 640
    early, late = cluster_sizes(ft[:64]), cluster_sizes(ft[400:])
    assert max(early) >= 10 and np.mean(early) > 4  # the start: most of the 16 users in step
    assert np.mean(late) < 3  # later: pairs, not waves
    assert (ft - sent)[400:].mean() < 0.75 * (ft - sent)[:64].mean()


@pytest.mark.xfail(strict=True, reason="not modelled yet: what drifts real closed-loop users apart (docs/fidelity.md)")
def test_the_simulator_drifts_as_the_real_engine_does():
    """The same load simulated step by step with a cost of ~9.5 ms a step: every wave stays in one step."""
    from capacity.cost.step import LinearCost
    from capacity.sched import make_scheduler
    from capacity.sim.simulator import simulate
    from capacity.workload import Arrivals, Lengths, WorkloadSpec

    spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=16), input_len=Lengths(kind="fixed", value=64),
                        output_len=Lengths(kind="fixed", value=32), num_requests=640)
    res = simulate(spec, LinearCost(fixed_s=0.0095, per_token_s=0.00005),
                   lambda: make_scheduler("continuous", max_num_seqs=64, max_num_batched_tokens=2048, block_size=32,
                                          num_blocks=1024), np.random.default_rng(0))
    r = res.records
    order = np.argsort(r.arrival)
    assert np.mean(cluster_sizes(r.first_token[order][400:])) < 3


def test_lock_step_note_counts_the_requests_that_share_a_first_token_step():
    """By hand: 16 first tokens in two steps of 8, 0.25 first tokens per step over the run -> each request
    shares its step with 8, itself included; users arriving independently would give 1 + 0.25: 6.4x, the note.
    In pairs: 2, none. Steps of 4 where the engine takes 1.5 prompts a step anyway: 4 / 2.5 = 1.6x, none (a
    busy engine, not a wave). Fewer than 4 users, or too few measured: none."""
    from capacity.steady import lock_step_note

    waves = np.repeat([1.0, 2.0], 8)
    (note,) = lock_step_note(waves, users=8, per_step=0.25)
    assert "in one step with 8 requests, itself included, 6x what 8 users" in note
    assert lock_step_note(np.repeat(np.arange(8.0), 2), users=8, per_step=0.25) == []
    assert lock_step_note(np.repeat(np.arange(8.0), 4), users=8, per_step=1.5) == []
    assert lock_step_note(np.repeat([1.0, 2.0, 3.0], 3), users=3, per_step=0.25) == []
    assert lock_step_note(np.array([1.0, 1.0, np.nan, np.nan]), users=8, per_step=0.25) == []


def test_a_lock_stepped_closed_loop_says_so_and_a_drifting_one_does_not():
    """The same 16 users through the pipeline (the door every command uses): with fixed lengths every wave's
    first tokens come in one step, and the run's notes say TTFT is the upper end; with output lengths 28-36
    they drift apart and it says nothing."""
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.workload import Arrivals, Lengths, WorkloadSpec

    # the engine alone: the server's tokeniser queue staggers a cohort that arrives together (tests/test_frontend.py)
    dep = Deployment(card=load_model_card(ROOT / "models/llama-3.1-8b.yaml"), gpu=get_gpu("h100-sxm"),
                     engine=EngineConfig(frontend_ms=0.0, frontend_us_per_input_token=0.0))
    notes = {}
    for name, out in (("fixed", Lengths(kind="fixed", value=32)), ("spread", Lengths(kind="uniform", low=28, high=36))):
        spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=16), input_len=Lengths(kind="fixed", value=512),
                            output_len=out, num_requests=480)
        notes[name] = [n for n in run(dep, spec, RunOptions(seed=0, ci=False)).notes if n.startswith("closed loop in lock-step")]
    assert len(notes["fixed"]) == 1 and "with 16 requests" in notes["fixed"][0]
    assert notes["spread"] == []


def test_a_fixed_length_closed_loop_that_drifted_apart_says_ttft_may_be_the_lower_end():
    """NIM's 8B row at 5 users, 5,000-token prompts, 500-token outputs: the simulated users drift apart (their
    prompts take different 8,192-token chunks) while the published TTFT, 280 ms, is 2.2x what they give: the run
    says TTFT may be the lower end. With exponential think time (users that do drift apart) it says nothing."""
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.workload import Arrivals, Lengths, WorkloadSpec

    dep = Deployment(card=load_model_card(ROOT / "models/llama-3.1-8b.yaml"), gpu=get_gpu("h100-sxm"),
                     engine=EngineConfig(max_num_batched_tokens=8192, max_model_len=5500))
    notes = {}
    for think in (0.0, 0.5):
        spec = WorkloadSpec(arrivals=Arrivals(kind="closed", users=5, think_s=think),
                            input_len=Lengths(kind="fixed", value=5000), output_len=Lengths(kind="fixed", value=500),
                            num_requests=60)
        notes[think] = [n for n in run(dep, spec, RunOptions(seed=0, ci=False)).notes if "closed loop" in n]
    assert len(notes[0.0]) == 1 and "may be the lower end" in notes[0.0][0]
    assert notes[0.5] == []


EVALSCOPE = ROOT / "tests/data/closed_loop_lock/evalscope_pr1641.yaml"


def _ramp_by_position(arrival, first_token, users: int) -> np.ndarray:
    """Mean TTFT by within-cycle position over the run's second half, as evalscope's maintainers measured it:
    requests in the order sent, cut into cycles of `users`."""
    order = np.argsort(arrival, kind="stable")
    ttft = (np.asarray(first_token) - np.asarray(arrival))[order]
    half = ttft[len(ttft) // 2:]
    half = half[: len(half) // users * users]
    return half.reshape(-1, users).mean(axis=0)


def test_a_fixed_length_closed_loop_keeps_its_ramp_as_a_real_endpoint_did():
    """evalscope's maintainers measured a real endpoint (tests/data/closed_loop_lock/evalscope_pr1641.yaml):
    8 users, 2,000-token prompts, 64 output tokens. With fixed outputs, in the run's second half the last request
    sent in a cycle waits 1.86x the first (the cohort is released together every cycle: lock-step is its steady
    state); with outputs of 48-64 tokens, or Poisson arrivals at 4/s, 1.00x. The endpoint's model, GPU and engine
    are not given, so only that shape is checked here, on an 8B on an H100 at vLLM's defaults (8,192-token
    step budget: a cycle's 16,000 prompt tokens take two steps, 200 and 374 ms to a first token: 1.87x; with a
    16,384-token budget, one step: 1.00x). The fixed run is 96 requests as theirs. The other two run 960 (0.96-1.05x
    over seeds 0-2): over 96 the simulated 48-64 run still ramps 1.31-1.62x, its users drift apart more slowly
    than the real ones did (docs/fidelity.md)."""
    import yaml

    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.workload import Arrivals, Lengths, WorkloadSpec

    real = {r["config"].split(" ")[0]: r for r in yaml.safe_load(EVALSCOPE.read_text())["runs"]}
    assert [r["ramp"] for r in real.values()] == [1.86, 1.00, 1.00]
    fixed_real = real["fixed"]["ttft_ms_by_position"]
    assert fixed_real[-1] / fixed_real[0] > 1.8  # as printed: 75 / 41

    dep = Deployment(card=load_model_card(ROOT / "models/llama-3.1-8b.yaml"), gpu=get_gpu("h100-sxm"))
    prompt = Lengths(kind="fixed", value=2000)
    runs = {"fixed": (Arrivals(kind="closed", users=8), Lengths(kind="fixed", value=64), 96),
            "spread": (Arrivals(kind="closed", users=8), Lengths(kind="uniform", low=48, high=64), 960),
            "open": (Arrivals(kind="poisson", rate_per_s=4.0), Lengths(kind="fixed", value=64), 960)}
    ramp = {}
    for name, (arr, out, n) in runs.items():
        res = run(dep, WorkloadSpec(arrivals=arr, input_len=prompt, output_len=out, num_requests=n),
                  RunOptions(seed=0, ci=False, warmup_fraction=0.0))
        r = res.sim.records
        by_pos = _ramp_by_position(r.arrival, r.first_token, 8)
        ramp[name] = by_pos[-1] / by_pos[0]
    assert ramp["fixed"] > 1.5, ramp  # the cohort's second half waits for a second prefill step, every cycle
    assert abs(ramp["spread"] - 1) < 0.2 and abs(ramp["open"] - 1) < 0.2, ramp
