"""All-reduce rules and CUDA-graph modes by engine and GPU topology (capacity/engine/graphs.py, cost/kernels.py;
docs/fidelity.md "All-reduce by engine", "CUDA graphs by engine"). Numbers are the engines' thresholds read from their
code and hand arithmetic, never outputs of the code under test."""
from __future__ import annotations

import json

import pytest

from capacity.cli.common import load_card
from capacity.cost.kernels import allreduce_call_s, allreduce_plan
from capacity.cost.piecewise import EAGER_OP_S, PiecewiseGraphCost, layer_eager_s
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.engine import get_engine
from capacity.engine.graphs import allreduce_rules, graph_wrap
from capacity.engine.sglang.config import SglangConfig
from capacity.engine.trtllm.config import TrtllmConfig
from capacity.model.gpus import get_gpu
from tests.conftest import run_cli


@pytest.mark.parametrize("tp,nbytes,tokens,full,algo", [
    (2, 8192, 1, True, "one-shot"),          # MIN_LATENCY at <= 2 GPUs, <= 128 tokens: one-shot
    (2, 200 * 8192, 200, True, "two-shot"),  # above kOneShotMaxToken: two-shot
    (2, 17e6, 2075, True, "nccl"),           # above the 16 MB workspace at 2 GPUs
    (2, 8192, 1, False, "nccl"),             # no NVLink: NCCL (vLLM would run its one-shot on 2 PCIe GPUs)
    (4, 100 * 8192, 100, True, "one-shot"),
    (4, 200 * 8192, 200, True, "nccl"),      # > 2 GPUs and > 128 tokens: NCCL
    (8, 9e6, 128, True, "nccl"),             # above the 8 MB workspace above 2 GPUs
])
def test_trtllm_auto_strategy(tp, nbytes, tokens, full, algo):
    assert allreduce_plan(tp, nbytes, "nvlink", "trtllm", full, tokens) == algo


@pytest.mark.parametrize("tp,nbytes,algo", [(2, 15e6, "one-shot"), (4, 900e3, "one-shot"), (4, 1.2e6, "two-shot"),
                                            (8, 400e3, "one-shot"), (8, 600e3, "two-shot"), (8, 8.5e6, "nccl")])
def test_trtllm_engine_plugin(tp, nbytes, algo):
    assert allreduce_plan(tp, nbytes, "nvlink", "trtllm-engine", True, 0) == algo


def test_sglang_follows_vllm_custom_allreduce():
    for tp, n in [(2, 8192), (4, 600 * 1024), (8, 300 * 1024), (8, 9 * 2**20), (4, 8192)]:
        for link in ("nvlink", "pcie"):
            assert allreduce_plan(tp, n, link, "sglang") == allreduce_plan(tp, n, link, "vllm")


def test_topology_per_gpu():
    h100_pcie, v100, sxm, r4090 = (get_gpu(g) for g in ("h100-pcie", "v100", "h100-sxm", "rtx-4090"))
    assert h100_pcie.topology == "pairs" and h100_pcie.topology_source
    assert h100_pcie.full_nvlink(2) and not h100_pcie.full_nvlink(4)
    assert v100.full_nvlink(4) and not v100.full_nvlink(8)
    assert sxm.full_nvlink(8) and not r4090.full_nvlink(2)
    # vLLM's CustomAllreduce: > 2 GPUs not all NVLink-connected -> NCCL; 2 bridged GPUs -> one-shot
    assert allreduce_plan(4, 8192, h100_pcie.interconnect, "vllm", h100_pcie.full_nvlink(4)) == "nccl"
    assert allreduce_plan(2, 8192, h100_pcie.interconnect, "vllm", h100_pcie.full_nvlink(2)) == "one-shot"
    # beyond the pair the ring runs over PCIe Gen5 (128 GB/s both ways: 64 GB/s a direction)
    assert h100_pcie.ring_bytes_per_s(4) == 64e9 and h100_pcie.ring_bytes_per_s(2) == 300e9
    # a DGX-1 cube-mesh closes an NVLink ring through all 8: NCCL keeps NVLink, only the custom kernel is lost
    assert v100.nvlink_ring(8) and v100.ring_bytes_per_s(8) == v100.interconnect_bytes_per_s
    assert allreduce_plan(8, 8192, v100.interconnect, "vllm", v100.full_nvlink(8)) == "nccl"
    # NCCL over PCIe hops at tp 4: 6.6 us + 6 x 1.0 us + the ring's 1.5 x bytes
    assert allreduce_call_s(4, 8192, h100_pcie.interconnect, 64e9, 8e-6, "vllm", False) == pytest.approx(
        12.6e-6 + 1.5 * 8192 / 64e9)


def test_vllm_step_unchanged_and_sglang_equal():
    card = load_card("llama-3.1-8b")
    plans = [StepPlan((), (1024,) * 8), StepPlan((PrefillChunk(512, 0),), (2048,) * 3)]
    for g in ("h100-sxm", "rtx-4090", "a100-80gb"):
        v = RooflineCost(card, get_gpu(g), 2)
        s = RooflineCost(card, get_gpu(g), 2, params=RooflineParams(allreduce_engine="sglang"))
        assert [v.step_s(p) for p in plans] == [s.step_s(p) for p in plans]


def test_trtllm_on_pcie_pays_nccl():
    card, g = load_card("llama-3.1-8b"), get_gpu("rtx-4090")
    plan = StepPlan((), (1024,))
    v = RooflineCost(card, g, 2).breakdown(plan)["communication"]
    t = RooflineCost(card, g, 2, params=RooflineParams(allreduce_engine="trtllm")).breakdown(plan)["communication"]
    bw = g.interconnect_bytes_per_s * 0.70
    msg = 4096 * 2  # one token's hidden state in bf16
    # GeForce has no P2P (GPU.p2p): vLLM's custom all-reduce disables itself too, both run NCCL
    assert v == pytest.approx(32 * 2 * (6.6e-6 + 2 * 1.0e-6 + msg / bw))
    assert t == pytest.approx(32 * 2 * (6.6e-6 + 2 * 1.0e-6 + msg / bw))  # TRT-LLM: no NVLink -> NCCL
    a6000 = get_gpu("rtx-a6000")  # a workstation card: P2P over PCIe, vLLM's one-shot on 2 GPUs
    v = RooflineCost(card, a6000, 2).breakdown(plan)["communication"]
    assert v == pytest.approx(32 * 2 * (8e-6 + msg / (a6000.interconnect_bytes_per_s * 0.70)))


def test_layer_eager_by_hand():
    # Llama at tp 2: 6 attention kernels + 4 MLP kernels + 2 all-reduces, each at the stack's eager op less its
    # views (12 a layer at 5 us, the view range's high end), + 29 dispatches that launch nothing at 5 us
    # (tests/test_eager_step.py)
    call = (42 * 19.308e-3 / (32 * 42) - 12 * 5e-6) / 42
    assert layer_eager_s(load_card("llama-3.1-8b"), 2) == pytest.approx(12 * call + 29 * 5e-6)
    assert EAGER_OP_S == pytest.approx(19.308e-3 / (32 * 42))


def test_sglang_decode_above_graph_max_bs_runs_eager():
    card, g = load_card("llama-3.1-8b"), get_gpu("h100-sxm")
    inner = RooflineCost(card, g, 1)
    w = graph_wrap(inner, get_engine("sglang@0.5.5"), SglangConfig(engine="sglang@0.5.5"), card, 2e-3, None)
    assert isinstance(w, PiecewiseGraphCost) and w.decode_line is None
    eager = 32 * (10 * (19.308e-3 / 32 - 60e-6) / 42 + 25 * 5e-6)  # 10 calls + 25 other dispatches a layer, tp 1
    small, big = StepPlan((), (64,) * 256), StepPlan((), (64,) * 257)  # SGLang 0.5.5, 79 GiB, tp 1: max bs 256
    assert w.step_s(small) == inner.step_s(small)
    assert w.step_s(big) == pytest.approx(max(inner.step_s(big), 2e-3 + eager))
    pre = StepPlan((PrefillChunk(16, 0),), ())  # 0.5.5: extend runs eagerly
    assert w.step_s(pre) == pytest.approx(max(inner.step_s(pre), 2e-3 + eager))
    new = graph_wrap(inner, get_engine("sglang@0.5.10"), SglangConfig(engine="sglang@0.5.10"), card, 2e-3, None)
    assert not new.prefill_eager and new.cpu_s < eager  # 0.5.10: piecewise prefill graphs


def test_trtllm_graph_sizes_and_backends():
    card, g = load_card("llama-3.1-8b"), get_gpu("h100-sxm")
    inner = RooflineCost(card, g, 1)
    em = get_engine("trtllm@1.0")
    cfg = TrtllmConfig(engine="trtllm@1.0")
    w = graph_wrap(inner, em, cfg, card, 0.0, None)
    assert allreduce_rules(em, cfg) == "trtllm"
    eager = 32 * (10 * (19.308e-3 / 32 - 60e-6) / 42 + 25 * 5e-6)
    for n, graphed in [(31, True), (32, True), (33, False), (64, True), (65, False), (128, True), (129, False)]:
        plan = StepPlan((), (16,) * n)
        want = inner.step_s(plan) if graphed else max(inner.step_s(plan), eager)
        assert w.step_s(plan) == pytest.approx(want), n
    eng = get_engine("trtllm@0.21")
    ecfg = TrtllmConfig(engine="trtllm@0.21")
    if eng._rel(ecfg).engine_backend:
        assert graph_wrap(inner, eng, ecfg, card, 0.0, None) is inner
        assert allreduce_rules(eng, ecfg) == "trtllm-engine"


def test_step_cost_engine_cli():
    r = run_cli("step-cost", "-m", "llama-3.1-8b", "--decode", "40x1024", "--engine", "trtllm@1.0")
    assert r.returncode == 0 and "decode graphs at 1-32, 64, 128" in r.stdout
    r = run_cli("step-cost", "-m", "llama-3.1-8b", "--decode", "1x1024", "--engine", "nope@1")
    assert r.returncode == 1 and "--engine 'nope@1'" in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert len((r.stderr + r.stdout).strip().splitlines()) == 1
    # vLLM: the all-reduce and every step term as without --engine (the graphs term shows only where the CPU waits)
    base = json.loads(run_cli("step-cost", "-m", "llama-3.1-8b", "--tp", "2", "--decode", "8x1024", "--json").stdout)
    v11 = json.loads(run_cli("step-cost", "-m", "llama-3.1-8b", "--tp", "2", "--decode", "8x1024", "--json",
                             "--engine", "vllm@0.11").stdout)
    assert base["breakdown_s"]["communication"] == v11["breakdown_s"]["communication"]
    assert base["step_s"] == v11["step_s"]
