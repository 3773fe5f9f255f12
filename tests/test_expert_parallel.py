"""Expert and data parallelism of MoE models (issue 51 item 5, issue 46 item 5): per-rank weights, the all-to-all's
bytes and time, the data-parallel ranks as schedulers with their own KV pools, the CLI's one-line refusals, and the
byte formula checked against DeepEP's published latencies (tests/data/published/deepep_all2all.yaml).

tiny-moe (capacity/data/models/tiny-moe.yaml): 4 layers, hidden 256, 8 heads of 32 (2 KV heads), 8 experts of 512
(2 per token, gated), bf16. One expert: gate/up 2 x 512 x 256 + down 256 x 512 = 393,216 parameters = 786,432 B.
"""
from __future__ import annotations

import json

import pytest
import yaml

from capacity.cost.factory import make_step_cost
from capacity.cost.parallel import ParallelCost, a2a_bytes_per_token, wrap
from capacity.cost.step import StepPlan
from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu
from capacity.model.weights import weight_bytes_per_rank
from tests.conftest import ROOT, run_cli, said

TINY = load_named_card("tiny-moe")
EXPERT_B = (2 * 512 * 256 + 256 * 512) * 2  # one whole expert, bf16
ALL_EXPERTS_B = 4 * 8 * EXPERT_B  # 25,165,824


def _experts(w: dict) -> float:
    return w["experts_gate_up"] + w["experts_down"]


def _attention(w: dict) -> float:
    return w["q_proj"] + w["kv_proj"] + w["o_proj"]


def test_per_rank_weights_tp8_vs_ep8_by_hand():
    """TP=8: every expert's 512 intermediate rows split 8 ways (gate/up 128 x 256, down 256 x 64 per rank);
    EP=8: one whole expert per rank. Both 4 layers x 98,304 B x 8 = 3,145,728 B of experts; attention split by
    TP=8 in both (q 32 x 256, one replicated KV head 64 x 256, o 256 x 32: 32,768 params a layer)."""
    tp8, ep8 = weight_bytes_per_rank(TINY, 8), weight_bytes_per_rank(TINY, 8, ep=8)
    assert _experts(tp8) == 4 * 8 * (128 * 256 + 256 * 64) * 2 == 3_145_728
    assert _experts(ep8) == 4 * 1 * EXPERT_B == 3_145_728
    assert _attention(tp8) == _attention(ep8) == 4 * (32 * 256 + 64 * 256 + 256 * 32) * 2 == 262_144
    # EP=4: two whole experts a rank; EP=3: ceil(8 / 3) = 3 on the fullest rank
    assert _experts(weight_bytes_per_rank(TINY, 4, ep=4)) == 4 * 2 * EXPERT_B
    assert _experts(weight_bytes_per_rank(TINY, 1, ep=3)) == 4 * 3 * EXPERT_B


def test_data_parallel_replicates_attention_and_splits_experts_over_tp_x_dp():
    """tp1 x dp8: attention whole on every rank (q 256 x 256, kv 128 x 256, o 256 x 256 = 163,840 params a
    layer); experts split over 8 ranks (FusedMoEParallelConfig.make flattens tp x dp), 1/8 of 25,165,824 B."""
    w = weight_bytes_per_rank(TINY, 1, moe_tp=8)
    assert _attention(w) == 4 * (256 * 256 + 128 * 256 + 256 * 256) * 2 == 1_310_720
    assert _experts(w) == ALL_EXPERTS_B / 8
    from capacity.engine import memory

    g = get_gpu("h100-sxm")
    b1 = memory.budget(TINY, g, EngineConfig(max_model_len=4096))
    b8 = memory.budget(TINY, g, EngineConfig(max_model_len=4096, data_parallel_size=8))
    assert b1.weights_bytes - b8.weights_bytes == pytest.approx(ALL_EXPERTS_B * 7 / 8)


def test_all2all_bytes_per_token_per_layer_by_hand():
    """allgather_reducescatter at dp 8: dispatch gathers 7 other ranks' hidden (256) and router logits (8) in bf16,
    combine reduce-scatters 7 partial outputs of 256; deepep_low_latency: 2 FP8 copies of 256 values + 2 fp32
    scales, 2 bf16 outputs back; dp 1: no all-to-all (vLLM all-reduces the MoE output over TP)."""
    assert a2a_bytes_per_token(TINY, 8, True) == (7 * (256 + 8) * 2, 7 * 256 * 2) == (3696, 3584)
    assert a2a_bytes_per_token(TINY, 8, True, "deepep_low_latency") == (2 * (256 + 2 * 4), 2 * 256 * 2)
    assert a2a_bytes_per_token(TINY, 1, True) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="deepep_low_latency: needs enable_expert_parallel"):
        a2a_bytes_per_token(TINY, 8, False, "deepep_low_latency")


def test_all2all_time_from_the_catalogue_link():
    """10 tokens on a dp8 rank over NVLink (h100-sxm 450 GB/s x comm_bw_eff 0.7) and PCIe (l40s, its catalogue
    rate): bytes / bandwidth + a dispatch and a combine latency (10 us NVLink, 30 us PCIe) per MoE layer."""
    for name, lat in (("h100-sxm", 10e-6), ("l40s", 30e-6)):
        g = get_gpu(name)
        c = wrap(make_step_cost(TINY, g, 1), TINY, 1, 8, True, None)
        assert isinstance(c, ParallelCost)
        want = 10 * (3696 + 3584) / (g.interconnect_bytes_per_s * 0.7) + 2 * lat
        assert c.a2a_s(10) == pytest.approx(want, rel=1e-12)
        plan = StepPlan(decode_contexts=(100,) * 10)
        assert c.breakdown(plan)["communication"] - c.inner.breakdown(plan)["communication"] == pytest.approx(4 * want)


def test_plain_layouts_are_the_roofline_itself():
    """TP alone, or a dense model under data parallelism (independent replicas in vLLM): no wrapper."""
    g = get_gpu("h100-sxm")
    base = make_step_cost(TINY, g, 2)
    assert wrap(base, TINY, 2, 1, False, None) is base
    dense = load_named_card("llama-3.1-8b")
    d = make_step_cost(dense, g, 1)
    assert wrap(d, dense, 1, 4, False, None) is d
    with pytest.raises(ConfigError, match="profile"):
        wrap(base, TINY, 2, 2, True, "some-profile")


def test_expert_imbalance_scales_the_busiest_ranks_expert_flops():
    """A compute-bound MoE layer (4096 tokens a rank): the busiest rank's expert GEMM is the imbalance x the mean's."""
    g = get_gpu("h100-sxm")
    inner = make_step_cost(TINY, g, 1)
    even = ParallelCost(inner, wrap(inner, TINY, 1, 8, True, None).layout, expert_imbalance=1.0)
    skew = ParallelCost(inner, even.layout, expert_imbalance=1.5)
    launch = inner.params.kernel_launch_s
    assert skew.experts_s(4096) - launch == pytest.approx(1.5 * (even.experts_s(4096) - launch), rel=1e-9)


def test_deepep_published_latencies_match_the_byte_formula():
    """DeepEP's low-latency kernels (128 tokens, hidden 7168, top-8, FP8 dispatch, BF16 combine): our bytes per
    token x 128 over the published latency gives the published bandwidth within 3% at every EP size."""
    pub = yaml.safe_load((ROOT / "tests" / "data" / "published" / "deepep_all2all.yaml").read_text())
    ll = pub["low_latency"]
    v3 = load_named_card("deepseek-v3")
    assert v3.hidden_size == ll["hidden"] and v3.moe.experts_per_token == ll["topk"]
    d, c = a2a_bytes_per_token(v3, 8, True, "deepep_low_latency")
    for _ep, d_us, d_gbps, c_us, c_gbps in ll["rows"]:
        assert ll["tokens"] * d / (d_us * 1e-6) / 1e9 == pytest.approx(d_gbps, rel=0.03)
        assert ll["tokens"] * c / (c_us * 1e-6) / 1e9 == pytest.approx(c_gbps, rel=0.03)


def test_modelled_nvlink_all2all_is_within_15_percent_below_deepeps():
    """The roofline moves all-to-all bytes at the catalogue's NVLink rate x comm_bw_eff (0.7): 140 GB/s on an H800
    and 630 GB/s on a B200, against DeepEP's 153 and 726 GB/s dispatch: conservative by 8-13%."""
    pub = yaml.safe_load((ROOT / "tests" / "data" / "published" / "deepep_all2all.yaml").read_text())
    for row in pub["nvlink"]:
        ours = get_gpu(row["gpu"]).interconnect_bytes_per_s * 0.7 / 1e9
        assert 0.85 <= ours / row["dispatch_gbps"] <= 1.0, row


def test_dp2_doubles_the_kv_pools():
    """dp 2: two schedulers, each with the budget's KV blocks (vLLM: an engine core per data-parallel rank)."""
    from capacity.pipeline import Deployment, RunOptions, prepare, run
    from capacity.workload import WorkloadSpec

    g = get_gpu("h100-sxm")
    wl = WorkloadSpec.model_validate({"arrivals": {"kind": "poisson", "rate_per_s": 50.0}, "num_requests": 80,
                                      "input_len": {"kind": "fixed", "value": 256},
                                      "output_len": {"kind": "fixed", "value": 16}})
    runs = {}
    for dp in (1, 2):
        dep = Deployment(TINY, g, EngineConfig(max_model_len=4096, data_parallel_size=dp, enable_expert_parallel=True))
        p = prepare(dep)
        r = run(dep, wl, RunOptions(ci=False), prepared=p)
        pools = sorted({int(x) for x in r.sim.timeseries[:, 4]})
        runs[dp] = (pools, r.sim.kv_blocks_total, p.budget.planning_blocks)
    assert runs[1][0] == [0] and runs[2][0] == [0, 1]
    for dp in (1, 2):  # each pool the budget's blocks but V1's null block (capacity/engine/vllm/engine.py)
        assert runs[dp][1] == runs[dp][2] - 1
    # the KV across the pools doubles; a rank's own budget is a little smaller at dp 2 (the multi-GPU non-torch
    # memory, NCCL buffers, that a single-GPU engine does not allocate: capacity/engine/vllm/nontorch.py)
    assert 0.95 < runs[2][1] / runs[1][1] < 1.0
    assert 1.9 < len(runs[2][0]) * runs[2][1] / runs[1][1] < 2.0


def test_launch_command_carries_the_flags_and_reads_back():
    from capacity.engine import get_engine
    from capacity.engine.launch import parse_launch_command

    cfg = EngineConfig(max_model_len=4096, tensor_parallel_size=2, data_parallel_size=4, enable_expert_parallel=True)
    em = get_engine("vllm")
    cmd = em.launch_command(TINY, cfg, em.budget(TINY, get_gpu("h100-sxm"), cfg))
    assert "--data-parallel-size 4" in cmd and "--enable-expert-parallel" in cmd and "--tensor-parallel-size 2" in cmd
    spec = parse_launch_command(cmd.replace("<folder-of-tiny-moe>", "x"))
    assert spec.settings["data_parallel_size"] == 4 and spec.settings["enable_expert_parallel"] is True


@pytest.mark.parametrize("args, line", [
    (["step-cost", "-m", "llama-3.1-8b", "--enable-expert-parallel", "--decode", "8x100"],
     "error: enable_expert_parallel: llama-3.1-8b has no experts (a dense model)"),
    (["step-cost", "-m", "tiny-moe", "--dp", "16", "--enable-expert-parallel", "--decode", "8x100"],
     "error: enable_expert_parallel: ep size 16 (tp 1 x dp 16) is above the 8 experts of tiny-moe"),
    (["simulate", "-m", "llama-3.1-8b", "--enable-expert-parallel", "--rate", "1", "-n", "10"],
     "enable_expert_parallel: llama-3.1-8b has no experts"),
    (["plan", "-m", "tiny-moe", "--layouts", "tp,dp3", "--layout-gpus", "8", "--target-rate", "1"],
     "error: --layouts dp3: dp 3 does not divide the 8 GPUs (--layout-gpus)"),
    (["plan", "-m", "tiny-moe", "--layouts", "zz", "--target-rate", "1"],
     "error: --layouts 'zz': use tp, ep, dpN (N dividing --layout-gpus) or auto"),
])
def test_bad_input_is_one_line_exit_1(args, line):
    r = run_cli(*args)
    assert r.returncode == 1
    lines = said(r.stderr)
    assert len(lines) == 1 and line in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_plan_layouts_compares_and_names_a_winner():
    """Two GPUs as tp2 or two data-parallel ranks of one: each layout searched; dp2 keeps two KV pools."""
    r = run_cli("plan", "-m", "tiny-moe", "--layouts", "tp,ep,dp2", "--layout-gpus", "2", "--target-rate", "5",
                "--seeds", "1", "--requests", "200", "--executor", "serial", "--no-cache", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {x["layout"]: x for x in out["layouts"]}
    assert set(rows) == {"tp2", "tp2-ep", "tp1-dp2-ep"}
    assert rows["tp1-dp2-ep"]["kv_pools"] == 2 and rows["tp2"]["kv_pools"] == 1
    assert "--data-parallel-size 2" in rows["tp1-dp2-ep"]["command"]
    assert out["winner"] == max(rows.values(), key=lambda x: x["max_rate_req_per_s"])["layout"]
