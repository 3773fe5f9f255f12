"""Attention data parallelism in simulate and plan (capacity/engine/lockstep.py; docs/parallelism.md, "Attention data
parallelism"): D ranks with a scheduler and a KV pool each, routed by the engine's rule, stepped in lock step at
the slowest rank's attention plus the MoE/MLP over the gathered tokens."""
from __future__ import annotations

import json

import pytest

from capacity.cost.step import LinearCost, PrefillChunk, StepPlan
from capacity.engine.lockstep import (
    ROUTE_OF_ENGINE,
    LockStepCost,
    LockStepScheduler,
    RooflineAttention,
    gathered_tokens,
)
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.sched import make_scheduler
from capacity.workload import Request
from tests.conftest import ROOT, run_cli

DSV3 = ROOT / "tests/data/hf/deepseek-v3.json"
QWEN3_30B = ROOT / "tests/data/hf/qwen3-30b-a3b.json"
QWEN3_235B = ROOT / "tests/data/hf/qwen3-235b-a22b-fp8.json"


class PerToken:
    """An attention part of `s` seconds per token (a hand-checkable stand-in for RooflineAttention)."""

    def __init__(self, s: float) -> None:
        self.s = s

    def part_s(self, plan: StepPlan) -> float:
        return self.s * plan.num_tokens


def hand_cost(dp: int = 2, cuda_graphs: bool = True) -> LockStepCost:
    """The replica's cost at tp T: 10 ms + 1.1 ms a token, of which 1.0 ms is attention (projections and kernel)
    and 0.1 ms the rest (MoE, norms, all-reduces); at the attention TP T / D = T / 2 a token's attention on its
    rank takes 2.0 ms (twice the heads on each GPU)."""
    return LockStepCost(LinearCost(fixed_s=0.010, per_token_s=0.0011), PerToken(0.001), PerToken(0.002), dp,
                        cuda_graphs=cuda_graphs)


def test_one_busy_rank_costs_its_attention_plus_the_rest_over_the_gathered_tokens():
    c, idle = hand_cost(), StepPlan()
    prefill = StepPlan(prefills=(PrefillChunk(4),))
    # a prefill on rank 0, rank 1 idle: SUM_LEN gathers 4 tokens; rank 0's attention 4 x 2 ms + the rest over its
    # 4 tokens 10 ms + 4 x 0.1 ms = 8 + 10.4 = 18.4 ms
    assert c.lockstep_s((prefill, idle)) == pytest.approx(0.0184, abs=1e-12)
    # 4 decodes on rank 0 with CUDA graphs: every rank pads to 4, the MoE runs on 2 x 4 = 8 rows: 8 + 10.8 ms
    decode = StepPlan(decode_contexts=(100, 200, 300, 400))
    assert c.lockstep_s((decode, idle)) == pytest.approx(0.0188, abs=1e-12)
    # eager: SGLang's get_dp_padding_mode keeps SUM_LEN unless 2 x sum > dp x max (8 > 8 is false): 4 rows
    assert hand_cost(cuda_graphs=False).lockstep_s((decode, idle)) == pytest.approx(0.0184, abs=1e-12)
    # both busy, one prefilling 6 tokens, the other decoding 2: the slower attention (12 ms) + 10 + 8 x 0.1 ms
    two = StepPlan(decode_contexts=(5, 5))
    assert c.lockstep_s((StepPlan(prefills=(PrefillChunk(6),)), two)) == pytest.approx(0.0228, abs=1e-12)
    assert c.lockstep_s((idle, idle)) == 0.0


def test_padding_rule_of_sglang():
    """layers/dp_attention.py DpPaddingMode.get_dp_padding_mode (0.5.5) and cuda_graph_runner.replay_prepare."""
    assert gathered_tokens([300, 0, 0, 0], extend=True, cuda_graphs=True) == 300  # SUM_LEN with any extend
    assert gathered_tokens([30, 10, 0, 0], extend=False, cuda_graphs=True) == 120  # graphs: dp x max
    assert gathered_tokens([30, 10, 0, 0], extend=False, cuda_graphs=False) == 40  # 80 > 120 false: SUM_LEN
    assert gathered_tokens([30, 30, 30, 10], extend=False, cuda_graphs=False) == 120  # 200 > 120: MAX_LEN


def sglang_rank(pool: int = 1000, **kw):
    return make_scheduler("sglang", max_total_tokens=pool, max_running_requests=8, chunked_prefill_size=512,
                          context_len=4096, **kw)


def test_each_rank_has_its_own_pool():
    """Two requests of 600 + 10 tokens, pools of 1,000 tokens a rank: round robin puts them on ranks 0 and 1 and
    both prefill in the first lock step (one pool of 1,000 could not hold both); a request of 1,500 tokens fits
    the two pools together but no rank's, and is refused."""
    ls = LockStepScheduler([sglang_rank(), sglang_rank()], "round_robin")
    a, b = ls.add(Request(0, 0.0, 600, 10)), ls.add(Request(1, 0.0, 600, 10))
    assert [ls.rank_of[id(a)], ls.rank_of[id(b)]] == [0, 1]
    step = ls.schedule(0.0)
    assert sorted(s.req.id for s, _ in step.scheduled) == [0, 1]
    assert step.plan.num_tokens == 512 + 512  # each rank's chunk (chunked_prefill_size 512 a rank)
    assert ls.kv_blocks_total == 2000
    assert ls.admissible(Request(2, 0.0, 1500, 10)) is not None
    one = sglang_rank()
    one.add(Request(0, 0.0, 600, 10))
    one.add(Request(1, 0.0, 600, 10))
    assert [s.req.id for s, _ in one.schedule(0.0).scheduled] == [0]  # a single pool: the second waits


def test_an_idle_rank_waits_for_the_busy_one():
    """The lock step: the scheduler tells the cost which rank holds what; rank 1 with nothing costs nothing but
    the step lasts rank 0's attention + the rest over rank 0's tokens."""
    c = hand_cost()
    ls = LockStepScheduler([sglang_rank(), sglang_rank()], "round_robin", c)
    ls.add(Request(0, 0.0, 100, 3))
    step = ls.schedule(0.0)
    assert step.plan.num_tokens == 100
    assert c.step_s(step.plan) == pytest.approx(0.100 * 2 + 0.010 + 100 * 0.0001, abs=1e-12)
    emitted, done = ls.complete(step, 1.0)
    assert [s.req.id for s in emitted] == [0] and not done
    # a plan the scheduler did not split is every rank running it (the safe side): 2 x 100 rows of MoE
    assert c.step_s(StepPlan(prefills=(PrefillChunk(100),))) == pytest.approx(0.2 + 0.010 + 200 * 0.0001, abs=1e-12)


def test_routing_rules_pinned_from_the_engines_code():
    """SGLang: round_robin (data_parallel_controller.py, 0.4.6.post5 / 0.5.5 / 0.5.20's auto). TensorRT-LLM: the
    fewest active prompt tokens among the ranks below expected = max(ceil((active + 1) / D), max active)
    (executor_request_queue.py _balance_requests_across_ranks)."""
    assert ROUTE_OF_ENGINE == {"sglang": "round_robin", "trtllm": "fewest_tokens"}
    rr = LockStepScheduler([sglang_rank(), sglang_rank()], "round_robin")
    assert [rr.rank_of[id(rr.add(Request(i, 0.0, n, 4)))] for i, n in enumerate((100, 50, 10, 10))] == [0, 1, 0, 1]
    ft = LockStepScheduler([sglang_rank(), sglang_rank()], "fewest_tokens")
    # 100 -> rank 0 (a tie, the lower rank); 50 -> rank 1 (0 tokens); 10 -> rank 1 (50 < 100); 10 -> rank 0: rank 1
    # holds 2 = expected max(ceil(4 / 2), 2) and is closed
    assert [ft.rank_of[id(ft.add(Request(i, 0.0, n, 4)))] for i, n in enumerate((100, 50, 10, 10))] == [0, 1, 1, 0]


def test_roofline_parts_deepseek_v3():
    """DeepSeek-V3 on H200 at tp 8, DP attention 8 (attention TP 1): a rank's attention part of a decode batch is
    above the tp-8 one (every attention weight on one GPU: 8 x the projection bytes) and at most 8 x it (MLA's
    latent KV is read whole at any TP, so the KV stream does not grow), the rest of the step stays positive, and a
    balanced step (every rank 32 decodes) costs at least the one-busy-rank step."""
    from capacity.cost.roofline import RooflineCost

    card, gpu = load_model_card(DSV3), get_gpu("h200")
    full, rank = RooflineCost(card, gpu, 8), RooflineCost(card, gpu, 1)
    c = LockStepCost(full, RooflineAttention(full), RooflineAttention(rank, with_allreduce=True), 8)
    p = StepPlan(decode_contexts=(2000,) * 32)
    a1, a8 = RooflineAttention(rank).part_s(p), RooflineAttention(full).part_s(p)
    assert a8 < a1 <= 8 * a8
    assert full.step_s(p) > RooflineAttention(full).part_s(p)
    one = c.lockstep_s((p,) + (StepPlan(),) * 7)
    assert c.lockstep_s((p,) * 8) >= one > RooflineAttention(rank).part_s(p)


def _json(r) -> dict:
    assert r.returncode == 0, r.stderr[-800:]
    return json.loads(r.stdout)


def test_simulate_runs_sglang_dp_attention_and_trtllm_attention_dp():
    common = ["--rate", "2", "--requests", "20", "--input-len", "500", "--output-len", "50", "--json"]
    d = _json(run_cli("simulate", "--model", str(QWEN3_30B), "--gpu", "h100", "--tp", "2", "--dp", "2",
                      "--enable-dp-attention", "--engine", "sglang@0.5.5", *common, timeout=300))
    assert "attention DP x2 in lock step" in d["step_cost_source"] and d["summary"]["n_requests"] > 0
    d = _json(run_cli("simulate", "--model", str(QWEN3_235B), "--gpu", "h200", "--tp", "8", "--engine", "trtllm",
                      "--trtllm-attention-dp", "--max-model-len", "8192", *common, timeout=300))
    assert "attention DP x8 in lock step" in d["step_cost_source"] and d["summary"]["n_requests"] > 0


def test_plan_no_longer_refuses_it():
    r = run_cli("plan", "--model", str(QWEN3_30B), "--gpu", "h100", "--tp", "2", "--dp", "2",
                "--enable-dp-attention", "--engine", "sglang@0.5.5", "--input-len", "500", "--output-len", "50",
                "--requests", "100", "--max-num-seqs", "256", timeout=600)  # no frontier search: not this test's subject
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-800:]
    assert "memory only" not in r.stdout + r.stderr and "--dp 2 --enable-dp-attention" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--model", str(DSV3), "--gpu", "h200", "--tp", "8", "--dp", "3", "--enable-dp-attention", "--engine", "sglang"],
     "enable_dp_attention: data_parallel_size 3 must be > 1 and divide"),
    (["--model", "models/llama-3.1-8b.yaml", "--gpu", "h100", "--tp", "2", "--dp", "2", "--enable-dp-attention",
      "--engine", "sglang"], "shards attention over the whole"),
    (["--model", "models/llama-3.1-8b.yaml", "--gpu", "h100", "--engine", "trtllm", "--trtllm-attention-dp"],
     "a dense model"),
])
def test_the_refusals_that_remain_are_one_line(args, needle):
    r = run_cli("simulate", *args, "--rate", "1", "--requests", "10")
    assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
