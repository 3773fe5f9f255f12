"""Speculative decoding: the mean accepted length (closed form), the draft's memory (hand-counted shapes), the
verify step in the token budget, E tokens per verify step, published speed-ups (tests/data), bad input."""
from pathlib import Path

import pytest
import yaml

from capacity.engine.speculative import SpeculativeConfig, alpha_for_length, draft_memory, mean_accepted
from capacity.sched import ContinuousConfig, ContinuousScheduler
from capacity.sched.base import Seq, accept_drafts
from capacity.sched.kv import KVCacheManager
from capacity.workload import Request
from tests.conftest import run_cli

DATA = yaml.safe_load((Path(__file__).parent / "data" / "speculative_published.yaml").read_text())


def spec(**kw):
    return SpeculativeConfig(**{"method": "eagle", "num_speculative_tokens": 3, **kw})


def test_mean_accepted_length_closed_forms():
    # alpha 0.5, k 3: 1 + 0.5 + 0.25 + 0.125 = (1 - 0.5^4) / (1 - 0.5) = 1.875 (Leviathan et al. 2023, eq. 1)
    assert mean_accepted(spec(acceptance_rate=0.5)) == pytest.approx(1.875)
    assert mean_accepted(spec(acceptance=[0.8, 0.6, 0.4])) == pytest.approx(2.8)  # 1 + the per-position rates
    assert mean_accepted(spec(acceptance_rate=1.0)) == pytest.approx(4.0)  # every draft and the bonus token
    assert mean_accepted(spec(acceptance_rate=0.0)) == pytest.approx(1.0)
    assert alpha_for_length(1.875, 3) == pytest.approx(0.5)
    # the DeepSeek-V3 report's 85-90% second-token acceptance, k = 1: E = 1.875
    assert mean_accepted(spec(method="mtp", num_speculative_tokens=1, acceptance_source="deepseek-v3-mtp")) == 1.875


def test_accepted_drafts_pay_the_mean_in_whole_tokens():
    kv = KVCacheManager(100, 4)
    s = Seq(Request(0, 0.0, 4, 100, 0, 0, -1, 0))
    s.computed, s.generated = 5, 2
    kv.allocate_slots(s, 0)
    got = [accept_drafts(s, kv, 3, 1.5) for _ in range(4)]
    assert got == [1, 2, 1, 2]  # credit 1.5 -> 1 (0.5 left), 2.0 -> 2, 1.5 -> 1, 2.0 -> 2: 6 = 4 x 1.5
    assert (s.computed, s.generated) == (11, 8)  # both advance: the KV holds every accepted token
    assert s.kv_capacity >= s.computed
    s.output = 9
    assert accept_drafts(s, kv, 3, 2.9) == 1  # never past the request's outputs


def test_a_decode_costs_k_plus_one_tokens_of_the_budget():
    def third_prefill(k):
        s = ContinuousScheduler(ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=10, block_size=4,
                                                 num_blocks=100, spec_tokens=k, spec_extra_mean=0.0))
        for i in range(2):
            s.add(Request(i, 0.0, 4, 10, 0, 0, -1, 0))
        s.complete(s.schedule(0.0), 1.0)  # both prompts (8 tokens), first tokens out
        s.add(Request(2, 0.0, 8, 10, 0, 0, -1, 0))
        step = s.schedule(1.0)
        return [n for q, n in step.scheduled if q.req.id == 2]
    assert third_prefill(0) == [8]  # 10 - 2 decodes
    assert third_prefill(3) == [2]  # 10 - 2 x (1 + 3)


def test_draft_memory_of_an_eagle_head_on_llama_3_1_8b(card):
    c = card("llama-3.1-8b")
    w, kv = draft_memory(c, spec(acceptance_rate=0.7), 1, "bf16")
    h, inter = 4096, 14336
    layer = h * (h + 2 * 1024) + h * h + 3 * h * inter  # q + k, v (8 KV heads x 128) + o + gate/up/down
    fc = 2 * h * h  # EAGLE's fc over [embedding, hidden]
    assert 2 * (layer + fc) <= w <= 2 * (layer + fc) + 2 * 4 * h  # bf16; norms at most a few vectors
    assert kv == 2 * 8 * 128 * 2  # one layer: K and V, 8 heads x 128, bf16


def _tpot(model, gpu, tp, engine, users, spec_cfg):
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_named_card
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.workload import Arrivals, WorkloadSpec, fixed

    cfg = EngineConfig(engine=engine, tensor_parallel_size=tp, max_model_len=4096, speculative=spec_cfg)
    wl = WorkloadSpec(arrivals=Arrivals(kind="closed", users=users), input_len=fixed(256), output_len=fixed(512),
                      num_requests=max(8, 4 * users))
    r = run(Deployment(load_named_card(model), get_gpu(gpu), cfg), wl, RunOptions(seed=0, ci=False, timeseries=False))
    return r.summary.tpot_s.mean


@pytest.mark.parametrize("row", [r for r in DATA["llama-3.1-8b-eagle-vllm"]["rows"] if r["method"] == "eagle"],
                         ids=lambda r: f"{r['method']}-k{r['k']}")
def test_llama_eagle_speedup_within_15_percent_of_vllm_measured(row):
    d = DATA["llama-3.1-8b-eagle-vllm"]
    sc = SpeculativeConfig(method=row["method"], num_speculative_tokens=row["k"],
                           acceptance_rate=alpha_for_length(row["acceptance_length"], row["k"]))
    base = _tpot(d["model"], d["gpu"], d["tp"], d["engine"], d["concurrency"], None)
    got = base / _tpot(d["model"], d["gpu"], d["tp"], d["engine"], d["concurrency"], sc)
    published = d["baseline_tpot_ms"] / row["tpot_ms"]
    assert got == pytest.approx(published, rel=0.15)


@pytest.mark.parametrize("row", DATA["deepseek-v3-mtp-sglang"]["rows"], ids=lambda r: f"bs{r['concurrency']}")
def test_deepseek_v3_mtp_speedup_within_15_percent_of_sglang_published(row):
    d = DATA["deepseek-v3-mtp-sglang"]
    sc = SpeculativeConfig(method=row["method"], num_speculative_tokens=row["k"], acceptance_source=d["acceptance"])
    base = _tpot(d["model"], d["gpu"], d["tp"], d["engine"], row["concurrency"], None)
    got = base / _tpot(d["model"], d["gpu"], d["tp"], d["engine"], row["concurrency"], sc)
    assert got == pytest.approx(row["speedup"], rel=0.15)


BASE = ("simulate", "-m", "llama-3.1-8b", "--arrival", "closed", "--users", "1", "-n", "4", "--max-model-len", "4096")


@pytest.mark.parametrize("flags, field, value", [
    (("--speculative", "eagle:3", "--acceptance", "1.2"), "speculative.acceptance_rate", "1.2"),
    (("--speculative", "eagle:3", "--acceptance", "-0.1"), "speculative.acceptance_rate", "-0.1"),
    (("--speculative", "eagle:0", "--acceptance", "0.7"), "speculative.num_speculative_tokens", "0"),
    (("--speculative", "eagle:2", "--acceptance", "0.5,0.8"), "speculative", "0.8"),
    (("--speculative", "draft_model:3", "--acceptance", "0.7", "--draft-model", "llama-3.1-70b"),
     "speculative.draft_model llama-3.1-70b", "GiB"),
])
def test_bad_speculative_input_is_one_line_naming_the_field(flags, field, value):
    r = run_cli(*BASE, *flags)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert field in err and value in err


def test_launch_flags_spell_the_speculation_for_each_engine():
    from capacity.engine.speculative import launch_flags

    e3 = spec(method="eagle3", acceptance_rate=0.7, draft_path="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert launch_flags("vllm", e3) == [
        """--speculative-config '{"method":"eagle3","num_speculative_tokens":3,"model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}'"""]
    assert launch_flags("sglang", e3) == [
        "--speculative-algorithm EAGLE3", "--speculative-draft-model-path yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"]
    mtp = spec(method="mtp", num_speculative_tokens=1, acceptance_rate=0.875)
    assert launch_flags("vllm", mtp) == ["""--speculative-config '{"method":"mtp","num_speculative_tokens":1}'"""]
    assert launch_flags("sglang", mtp) == [  # SGLang's DeepSeek guide: EAGLE with one step, top-k 1, 2 draft tokens
        "--speculative-algorithm EAGLE", "--speculative-num-steps 1 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 2"]
    assert launch_flags("vllm", None) == []


def test_sglang_runs_speculation_without_its_overlap_scheduler():
    from capacity.engine.config import EngineConfig
    from capacity.engine.sglang.engine import Sglang

    on = EngineConfig(engine="sglang", speculative=spec(method="mtp", num_speculative_tokens=1, acceptance_rate=0.9))
    assert Sglang.overlap_schedule(EngineConfig(engine="sglang")) and not Sglang.overlap_schedule(on)


def test_the_draft_takes_its_memory_from_the_kv_cache(card):
    from capacity.engine import get_engine
    from capacity.engine.config import EngineConfig
    from capacity.engine.speculative import with_draft
    from capacity.model.gpus import get_gpu

    c = card("llama-3.1-8b")
    b = get_engine("vllm").budget(c, get_gpu("h100-sxm"), EngineConfig(max_model_len=4096))
    s = spec(acceptance_rate=0.7)
    w, kv = draft_memory(c, s, 1, "bf16")
    d = with_draft(b, c, s)
    assert d.weights_bytes == b.weights_bytes + w
    assert d.kv_bytes_per_token == b.kv_bytes_per_token + kv == 33 * 4096 * 32 // 32  # 32 layers + the head's one
    bb, bb_new = b.block_bytes, b.block_bytes * 33 / 32
    assert d.planning_blocks == int((b.planning_blocks * bb - w) // bb_new)


def test_the_planner_sizes_with_the_draft_as_its_simulations_do(card):
    """The plan's frontier, full batch, memory section and SGLang --max-total-tokens read the planner's budget; the
    simulations read capacity.pipeline.prepare's. With a draft both take its weights and KV from the pool (the
    planner's budget once kept the draft's 1.5 GiB in the KV cache: 6% more tokens than the runs had)."""
    from capacity.engine.config import EngineConfig
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, prepare
    from capacity.plan.planner import Planner, Scenario

    c = card("llama-3.1-8b")
    s = Scenario.model_validate({"model": "llama-3.1-8b", "engine": {
        "max_model_len": 8192, "speculative": {"method": "eagle3", "num_speculative_tokens": 3,
                                               "acceptance_rate": 0.7}}})
    p = Planner(s, c, None)
    e = p.engine(1)
    planned = p.budget(e)
    ran = prepare(Deployment(c, get_gpu("h100-sxm"), e)).budget
    assert planned.planning_blocks == ran.planning_blocks and planned.kv_tokens == ran.kv_tokens
    plain = p.budget(EngineConfig(max_model_len=8192))
    assert planned.kv_bytes_per_token == plain.kv_bytes_per_token + 4096  # the EAGLE-3 head's one layer, bf16
    assert planned.planning_blocks < plain.planning_blocks
