"""bench/decode_floor.py (docs/fidelity.md, "Decode at small batch"): the figures the analysis rests on, computed
by hand from the stored measurements and vLLM's rules."""
from __future__ import annotations

import pytest

from bench.decode_floor import DSV3_LAYER, QWEN3_DENSE_LAYER, analyse, count, measured_figures


def test_measured_figures_are_the_stored_measurements_over_the_counted_kernels():
    t_small, t_eager = measured_figures()
    # linear.elementwise at 1 token (graph replay) 53.6 us / 32 kernels of Layer.elementwise
    assert t_small == pytest.approx(53.6e-6 / 32, rel=2e-3)
    # eager "decode 1 @ 1k" 19.308 ms / (32 layers x 42 ops)
    assert t_eager == pytest.approx(19.308e-3 / (32 * 42), rel=1e-3)


def test_kernel_counts():
    assert count(DSV3_LAYER["graph"]) == 25  # 22 names, grouped_topk counted as 4
    assert count(DSV3_LAYER["eager"]) == 8
    assert count(QWEN3_DENSE_LAYER["graph"]) == 12


def test_the_cost_codes_counts_are_the_listed_kernels():
    """capacity/cost/kernels.py counts a layer's kernels less the two all-reduces, which (c) costs."""
    from capacity.cli.common import load_card
    from capacity.cost.kernels import attention_kernels, mlp_kernels

    ds, q3 = load_card("deepseek-v3"), load_card("tests/data/hf/qwen3-4b.json")
    assert attention_kernels(ds) + mlp_kernels(ds, True) == count(DSV3_LAYER["graph"]) + 8 - 2
    assert attention_kernels(q3) + mlp_kernels(q3, False) == count(QWEN3_DENSE_LAYER["graph"])


def test_deepseek_batch_one_rows():
    op = 19.308e-3 / (32 * 42)
    rows = {r["case"]: r for r in analyse(53.6e-6 / 32, op)}
    ds = rows["DeepSeek-R1-0528-AWQ, 8 x H100, vLLM 0.9"]
    # (a) 0: one token's k = 8 experts are bandwidth-bound even padded to 8 rows each
    assert ds["a_moe_padding_ms"] == 0.0
    # (b) 1,858 kernels x 1.676 us - 421 roofline ops x 4 us over the 61 layers (tests/test_cost_kernels.py)
    assert ds["b_kernel_floors_ms"] == pytest.approx((1858 * 53.632e-6 / 32 - 421 * 4e-6) * 1e3, rel=1e-6)
    # (c) at batch 1 the one-shot kernel: the latency is the same 8 us, each rank reads 7 x 14 KiB instead of
    # the ring's 1.75 x: 2 x 61 x 5.25 x 14,336 B / (450 GB/s x 0.7) ((c'), the kernel's pull rate, is off by default)
    assert ds["c_allreduce_ms"] == pytest.approx(2 * 61 * 5.25 * 14336 / (450e9 * 0.7) * 1e3, rel=1e-6)
    # (c) at the top of the one-shot latency range, 20 us: 2 all-reduces x 61 layers x (20 - 8) us
    assert ds["c_allreduce_top_of_range_ms"] == pytest.approx(2 * 61 * 12e-3)
    # (e) CPU, views free: 61 layers x (7 eager calls + 1 graph replay) x 14.37 us
    assert ds["e_piecewise_cpu_ms"][0] == pytest.approx(61 * 8 * op * 1e3, rel=1e-6)
    # views at 5 us: a call is (603.4 - 12 x 5) / 42 = 12.94 us; a layer 8 x 12.94 + 19 x 5 = 198.5 us
    per_call = (19.308e3 / 32 - 12 * 5) / 42
    assert ds["e_piecewise_cpu_ms"][2] == pytest.approx(61 * (8 * per_call + 19 * 5) * 1e-3, rel=1e-6)
    # the step: 2 ms overhead + max(GPU, CPU), CPU-bound at every view cost
    for cpu, total in zip(ds["e_piecewise_cpu_ms"], (ds["now_range_ms"][0], ds["now_ms"], ds["now_range_ms"][1])):
        assert cpu > ds["gpu_with_floors_ms"]
        assert total == pytest.approx(2.0 + cpu)
    # a full decode graph (vLLM 0.11) has no eager attention
    assert rows["Qwen3-4B, RTX 4090, vLLM 0.11"]["e_piecewise_extra_ms"] == (0.0, 0.0, 0.0)
    # even at the top of every range the step stays below the published 16.1 ms
    assert ds["now_range_ms"][1] < 16.1
