"""Measured GEMM efficiency (capacity/data/gemm_efficiency.yaml) against the rows it was taken from (NVIDIA
aiconfigurator's TensorRT-LLM GEMM tables, the subset in tests/data/published/aiconfigurator_gemm.csv), and how the
roofline uses it: a GEMM dtype never runs faster than measured on that GPU; bf16 on Hopper keeps the default."""
import csv

import numpy as np
import pytest
import yaml

from capacity.cli.common import load_card
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.model.compute import measured_gemm_efficiency
from capacity.model.gpus import get_gpu
from tests.conftest import ROOT

PEAK = {("h100_sxm", "bfloat16"): 989.4e12, ("h100_sxm", "fp8"): 1978.9e12, ("h100_sxm", "fp8_block"): 1978.9e12,
        ("h200_sxm", "bfloat16"): 989.4e12, ("h200_sxm", "fp8"): 1978.9e12, ("h200_sxm", "fp8_block"): 1978.9e12,
        ("b200_sxm", "bfloat16"): 2.25e15, ("b200_sxm", "fp8"): 4.5e15, ("b200_sxm", "fp8_block"): 4.5e15,
        ("b200_sxm", "nvfp4"): 9e15}  # the datasheets' dense rates
NAMES = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
OURS = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}


def rows() -> list[dict]:
    with (ROOT / "tests/data/published/aiconfigurator_gemm.csv").open() as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def test_the_stored_medians_are_the_measured_rows_medians():
    data = yaml.safe_load((ROOT / "capacity/data/gemm_efficiency.yaml").read_text())["gpus"]
    got: dict = {}
    for r in rows():
        m, n, k, lat = int(r["m"]), int(r["n"]), int(r["k"]), float(r["latency_ms"]) * 1e-3
        got.setdefault((r["system"], r["gemm_dtype"]), []).append(2 * m * n * k / lat / PEAK[r["system"], r["gemm_dtype"]])
    assert len(got) == 10
    for (system, dt), e in got.items():
        assert len(e) == 8 * 8 * 3  # n and k: the 8 grid sizes from 4,096 to 16,384; m: 2,048, 4,096, 8,192
        assert data[NAMES[system]][OURS[dt]] == pytest.approx(np.median(e), abs=0.005)


def test_one_row_by_hand():
    """H100, FP8, 4096 x 4096 x 4096: 2 x 4096^3 = 137.4 GFLOP in the row's latency is 0.46 of 1,979 TFLOP/s."""
    r = next(r for r in rows() if (r["system"], r["gemm_dtype"], r["m"], r["n"], r["k"]) ==
             ("h100_sxm", "fp8", "4096", "4096", "4096"))
    assert 2 * 4096**3 / (float(r["latency_ms"]) * 1e-3) / 1978.9e12 == pytest.approx(0.46, abs=0.01)


def test_the_roofline_never_runs_a_dtype_above_its_measurement():
    h100 = get_gpu("h100-sxm")
    fp8 = RooflineCost(load_card("llama-3.1-8b", "fp8", None, None), h100)
    assert set(fp8._fam_eff.values()) == {0.59}  # measured FP8 on the H100 SXM, below the default 0.70
    bf16 = RooflineCost(load_card("llama-3.1-8b", None, None, None), h100)
    assert set(bf16._fam_eff.values()) == {0.70}  # measured 0.80: the default stays (the safe side)
    off = RooflineCost(load_card("llama-3.1-8b", "fp8", None, None), h100, params=RooflineParams(measured_gemm_eff=False))
    assert set(off._fam_eff.values()) == {0.70}
    # a compute-bound prefill's GEMMs take 0.70 / 0.59 as long
    from capacity.cost.step import PrefillChunk, StepPlan

    plan = StepPlan(prefills=(PrefillChunk(8192, 0),))
    no_floor = RooflineParams(measured_gemm_floor=False)  # the rates alone (the floor: tests/test_gemm_floor.py)
    fp8 = RooflineCost(load_card("llama-3.1-8b", "fp8", None, None), h100, params=no_floor)
    off = RooflineCost(load_card("llama-3.1-8b", "fp8", None, None), h100,
                       params=no_floor.model_copy(update={"measured_gemm_eff": False}))
    g_on, g_off = fp8.breakdown(plan)["gemm"], off.breakdown(plan)["gemm"]
    assert g_on / g_off == pytest.approx(0.70 / 0.59, rel=0.02)


def test_gpus_without_a_measurement_take_their_architectures_or_none():
    assert measured_gemm_efficiency(get_gpu("h100-pcie"), "fp8") == 0.59  # Hopper: the H100 SXM's
    assert measured_gemm_efficiency(get_gpu("h200"), "fp8") == 0.61
    assert measured_gemm_efficiency(get_gpu("h200"), "fp8", block_scaled=True) == 0.56
    assert measured_gemm_efficiency(get_gpu("b200"), "fp4") == 0.38
    assert measured_gemm_efficiency(get_gpu("l40s"), "fp8") is None  # Ada: nothing measured
    assert measured_gemm_efficiency(get_gpu("a100-80gb"), "bf16") is None


def test_the_fp4_note_appears_only_where_the_headroom_does_not_cover_the_table():
    """With FP4 GEMMs at their measured efficiency the B200 FP4 table came out at most 1.12x the published: the
    default headroom (0.8, 1.25x) covers it, 0.9 (1.11x) does not (1.12x with the measured floor), and then the plan says which one would."""
    from capacity.plan.roofline_level import ROOFLINE_VS_TRTLLM_FP4, roofline_notes

    card, b200 = load_card("llama-3.1-70b", "nvfp4", None, None), get_gpu("b200")
    hi = ROOFLINE_VS_TRTLLM_FP4[2]
    assert 1 / 0.9 < hi < 1 / 0.8
    assert not [n for n in roofline_notes(card, b200, 0.8) if n.startswith("FP4 GEMMs")]
    fp4 = [n for n in roofline_notes(card, b200, 0.9) if n.startswith("FP4 GEMMs")]
    assert len(fp4) == 1 and f"--headroom {int(100 / hi) / 100:.2f} covers the highest" in fp4[0]
    assert not [n for n in roofline_notes(load_card("llama-3.1-70b", "fp8", None, None), b200, 0.9)
                if n.startswith("FP4 GEMMs")]
