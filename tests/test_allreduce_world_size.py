"""The custom all-reduce's cost by world size ((c') in capacity/cost/kernels.py) against published kernel timings
(capacity/data/allreduce_published.yaml), hand-computed calls, and the GPU catalogue's P2P fact."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from capacity.cost import kernels
from capacity.cost.kernels import (
    CUSTOM_AR_PULL_BYTES_PER_S,
    CUSTOM_AR_TWO_SHOT_SYNC_S,
    allreduce_call_s,
    allreduce_plan,
)
from capacity.model.gpus import catalogue, get_gpu

DATA = Path(__file__).resolve().parents[1] / "capacity" / "data" / "allreduce_published.yaml"
MiB = 1 << 20
H200_LINK = 450e9 * 0.70  # interconnect_bytes_per_s x RooflineParams.comm_bw_eff


@pytest.fixture(autouse=True)
def _pull_on(monkeypatch):
    """(c') is off by default (capacity/cost/kernels.py CUSTOM_AR_PULL): this file checks the model itself."""
    monkeypatch.setattr(kernels, "CUSTOM_AR_PULL", True)


def tables() -> dict:
    return yaml.safe_load(DATA.read_text())["tables"]


def rows(name: str) -> dict[tuple[int, int], float]:
    return {(ws, n): us for ws, n, us in tables()[name]["rows"]}


def test_constants_recomputed_from_the_published_h100_table():
    t = rows("sglang-2904-h100-vllm")
    pull = MiB / ((t[(2, MiB)] - t[(2, 512)]) * 1e-6)  # one-shot at TP 2 pulls the one other buffer
    assert pull == pytest.approx(CUSTOM_AR_PULL_BYTES_PER_S, rel=1e-9)
    assert pull == pytest.approx(61.32e9, rel=1e-3)  # 1,048,576 B / 17.1 us
    sync = t[(8, MiB)] - t[(2, 512)] - 2 * 7 / 8 * MiB / pull * 1e6  # two-shot at TP 8: its extra barrier
    assert sync * 1e-6 == pytest.approx(CUSTOM_AR_TWO_SHOT_SYNC_S, rel=1e-9)
    assert sync == pytest.approx(5.575, abs=1e-6)  # 45.0 - 9.5 - 1.75 x 17.1


def mape(name: str, with_pull: bool = True) -> float:
    """The model against one table (vLLM's rules on an NVLink H200-class link): its smallest TP 2 entry is the fixed
    term (the eager launch differs by harness). `with_pull` False: the link-rate model that (c') replaces, the bytes
    at 450 GB/s x 0.7 and no two-shot barrier."""
    t = rows(name)
    rate = CUSTOM_AR_PULL_BYTES_PER_S if with_pull else H200_LINK

    def model_us(ws: int, n: int, base_s: float) -> float:
        if with_pull:
            return allreduce_call_s(ws, n, "nvlink", H200_LINK, base_s) * 1e6
        one = allreduce_plan(ws, n, "nvlink") == "one-shot"
        return (base_s + ((ws - 1) if one else 2 * (ws - 1) / ws) * n / rate) * 1e6

    base_s = t[(2, 512)] * 1e-6 - 512 / rate
    errs = [abs(model_us(ws, n, base_s) - us) / us for (ws, n), us in t.items()]
    return 100 * sum(errs) / len(errs)


@pytest.mark.parametrize("name, limit, before", [("sglang-2904-h100-vllm", 7.0, 28.0),
                                                 ("sglang-2904-h100-sglang", 11.0, 41.0),
                                                 ("sglang-2688-a100-vllm", 7.5, 24.0)])
def test_model_matches_each_published_table(name, limit, before):
    assert mape(name) < limit
    assert mape(name, with_pull=False) > before  # the link-rate model misses by 3-4x as much


def test_the_published_latency_grows_with_world_size_through_the_pulled_bytes():
    t = rows("sglang-2904-h100-vllm")
    # at 512 B the three world sizes are within 1 us; at 32 KiB TP 8 pulls 7 x 32 KiB: +3.1 us over TP 2
    assert max(t[(ws, 512)] for ws in (2, 4, 8)) - min(t[(ws, 512)] for ws in (2, 4, 8)) <= 1.0
    assert t[(8, 32768)] - t[(2, 32768)] == pytest.approx(3.1, abs=1e-9)
    assert (7 - 1) * 32768 / CUSTOM_AR_PULL_BYTES_PER_S * 1e6 == pytest.approx(3.21, abs=0.01)


def test_hand_computed_calls_on_h200():
    n = 64 * 2048 * 2  # 64 tokens of a 2048-wide bf16 hidden state: 256 KiB, a quarter of 1 MiB
    assert allreduce_plan(2, n, "nvlink") == "one-shot"
    assert allreduce_call_s(2, n, "nvlink", H200_LINK, 8e-6) == pytest.approx(8e-6 + 0.25 * 17.1e-6)  # 12.275 us
    assert allreduce_plan(4, n, "nvlink") == "one-shot"
    assert allreduce_call_s(4, n, "nvlink", H200_LINK, 8e-6) == pytest.approx(8e-6 + 0.75 * 17.1e-6)  # 20.825 us
    assert allreduce_plan(8, n, "nvlink") == "two-shot"  # not below 256 KiB
    assert allreduce_call_s(8, n, "nvlink", H200_LINK, 8e-6) == pytest.approx(
        8e-6 + 5.575e-6 + 2 * 7 / 8 * 0.25 * 17.1e-6)  # 21.05625 us
    # SGLang: the same kernel; TensorRT-LLM's kernels keep the link rate and no extra barrier
    assert allreduce_call_s(4, n, "nvlink", H200_LINK, 8e-6, "sglang") == pytest.approx(20.825e-6)
    assert allreduce_call_s(2, n, "nvlink", H200_LINK, 8e-6, "trtllm", tokens=64) == pytest.approx(
        8e-6 + n / H200_LINK)


def test_a_pcie_link_slower_than_the_pull_rate_still_bounds_the_kernel():
    link = 32e9 * 0.70  # RTX A6000: PCIe Gen4 per direction x comm_bw_eff
    assert allreduce_call_s(2, MiB, "pcie", link, 8e-6) == pytest.approx(8e-6 + MiB / link)


def test_geforce_cards_have_no_p2p_and_run_nccl():
    geforce = {"rtx-3080", "rtx-3090", "rtx-4060-ti-16gb", "rtx-4080", "rtx-4090", "rtx-5080", "rtx-5090"}
    for name, gpu in catalogue().items():
        assert gpu.p2p is (name not in geforce), name
        assert bool(gpu.p2p_source) is (name in geforce), name
    g = get_gpu("rtx-4090")
    assert "sglang#4814" in g.p2p_source
    for engine in ("vllm", "sglang", "trtllm", "trtllm-engine"):
        assert allreduce_plan(2, 4096, g.interconnect, engine, g.full_nvlink(2), 1, g.p2p) == "nccl"
    assert allreduce_plan(2, 4096, "pcie", "vllm", False, 1, True) == "one-shot"  # RTX A6000 pair: P2P over PCIe
    # NCCL's ring in LL over PCIe at TP 2: 6.6 us + 2 hops of 1.0 us + the ring's bytes
    link = 32e9 * 0.70
    assert allreduce_call_s(2, 4096, "pcie", link, 8e-6, "vllm", False, 1, False, p2p=False) == pytest.approx(
        6.6e-6 + 2e-6 + 4096 / link)


def test_amd_parts_keep_the_link_rate():
    """MI300X, SGLang's ROCm custom all-reduce at TP 4: the NVIDIA pull rate misses the table by more than the link
    rate does (45% against 28% MAPE), so AMD parts keep the link rate (`amd`)."""
    t = rows("sglang-6619-mi300x-tp4")
    link = 448e9 * 0.70  # MI300X interconnect_bytes_per_s x comm_bw_eff
    base_s = t[(4, 2048)] * 1e-6

    def err(amd: bool) -> float:
        e = [abs(allreduce_call_s(4, n, "nvlink/infinity-fabric", link, base_s, "sglang", amd=amd) * 1e6 - us) / us
             for (_, n), us in t.items()]
        return 100 * sum(e) / len(e)

    assert err(amd=True) < 30 < 44 < err(amd=False)
    assert allreduce_call_s(4, MiB, "nvlink/infinity-fabric", link, 8e-6, amd=True) == pytest.approx(
        8e-6 + 1.5 * MiB / link)  # two-shot: the ring's bytes at the link rate, no extra barrier


def test_roofline_charges_the_pull_rate_on_nvidia_only():
    from capacity.cli.common import load_card
    from capacity.cost.roofline import RooflineCost
    from capacity.cost.step import StepPlan

    card = load_card("llama-3.1-8b")
    plan = StepPlan((), (1024,) * 16)  # 16 decode tokens: 16 x 4096 x 2 B = 128 KiB a call, one-shot at TP 4
    n = 16 * 4096 * 2
    h100 = RooflineCost(card, get_gpu("h100-sxm"), 4).breakdown(plan)["communication"]
    assert h100 == pytest.approx(32 * 2 * (8e-6 + 3 * n / (MiB / 17.1e-6)))
    mi300 = RooflineCost(card, get_gpu("mi300x"), 4).breakdown(plan)["communication"]
    assert mi300 == pytest.approx(32 * 2 * (8e-6 + 3 * n / (448e9 * 0.70)))
