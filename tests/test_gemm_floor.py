"""The measured floor under the roofline's dense GEMMs (capacity/data/gemm_latency.json: NVIDIA aiconfigurator's
TensorRT-LLM 1.3.0rc20 GEMM tables, github.com/ai-dynamo/aiconfigurator@095f58a, Apache-2.0) and the engine's CPU
work overlapped with the GPU (capacity.cost.overlap, EngineModel.overhead_overlaps)."""
import math

import pytest

from capacity.cli.common import load_card
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.engine.config import EngineConfig
from capacity.model.compute import gemm_latency_table
from capacity.model.gpus import get_gpu
from capacity.pipeline import Deployment, prepare

# Rows of aiconfigurator's h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet, gemm_dtype fp8 (latency in us)
H100_FP8 = {(1, 6144, 4096): 21.822, (1, 4096, 4096): 18.491, (2, 6144, 4096): 21.204, (4, 6144, 4096): 21.954,
            (256, 16384, 4096): 46.256, (256, 51200, 4096): 110.784}


def cost(model="llama-3.1-8b", weight="fp8", gpu="h100-sxm", tp=1, floor=True):
    return RooflineCost(load_card(model, weight), get_gpu(gpu), tp, params=RooflineParams(measured_gemm_floor=floor))


def test_the_floor_is_nvidias_measured_latency_at_a_grid_point():
    """Llama-3.1-8B FP8 on an H100 SXM, one token: the attention projections are a 4096 -> 6144 (q, k, v) and a
    4096 -> 4096 (o) GEMM. Measured: 21.822 + 18.491 = 40.313 us. The roofline says (4096 x 6144 + 4096 x 4096)
    bytes at 80% of 3.35 TB/s + 4 us = 19.6 us: the measured figure is the floor, and the family costs it."""
    c = cost()
    roof = (4096 * 6144 + 4096 * 4096) / (3.35e12 * 0.8) + 4e-6
    assert roof == pytest.approx(19.65e-6, rel=1e-3)
    measured = (H100_FP8[1, 6144, 4096] + H100_FP8[1, 4096, 4096]) * 1e-6
    assert c._gemm(1, c._attn_w, 4 * 4096, "attention") == pytest.approx(measured, rel=1e-3)
    assert cost(floor=False)._gemm(1, c._attn_w, 4 * 4096, "attention") == pytest.approx(roof, rel=0.01)


def test_between_grid_points_it_interpolates_log_log():
    """m = 3 lies between the measured m = 2 and 4; n = 28,672 (the 8B's gate/up) between 16,384 and 51,200:
    both log-linear, worked here from the table's rows."""
    from capacity.model.compute import gemm_floor_curve, gemm_floor_s

    table = gemm_latency_table(get_gpu("h100-sxm"), "fp8")
    qkv = gemm_floor_curve(table, 6144, 4096)
    f = math.log2(3) - 1
    want = math.exp((1 - f) * math.log(H100_FP8[2, 6144, 4096]) + f * math.log(H100_FP8[4, 6144, 4096]))
    assert gemm_floor_s(qkv, 3) * 1e6 == pytest.approx(want, rel=1e-3)
    assert gemm_floor_s(qkv, 1) * 1e6 == pytest.approx(H100_FP8[1, 6144, 4096], rel=1e-3)
    gate_up = gemm_floor_curve(table, 28672, 4096)
    f = math.log(28672 / 16384) / math.log(51200 / 16384)
    want = math.exp((1 - f) * math.log(H100_FP8[256, 16384, 4096]) + f * math.log(H100_FP8[256, 51200, 4096]))
    assert gemm_floor_s(gate_up, 256) * 1e6 == pytest.approx(want, rel=1e-3)  # 71.6 us
    # past the grid's largest m: in proportion to m (compute-bound)
    assert gemm_floor_s(qkv, 32768) == pytest.approx(2 * gemm_floor_s(qkv, 16384))


@pytest.mark.parametrize("model,weight,gpu,tp", [("llama-3.1-8b", "fp8", "h100-sxm", 1),
                                                 ("llama-3.1-70b", "fp8", "h200", 2),
                                                 ("llama-3.1-8b", None, "h100-sxm", 1),
                                                 ("llama-2-70b", "nvfp4", "b200", 1),
                                                 ("mixtral-8x7b", None, "h100-pcie", 2)])
def test_the_floor_only_ever_adds_time(model, weight, gpu, tp):
    with_, without = cost(model, weight, gpu, tp), cost(model, weight, gpu, tp, floor=False)
    for n in (1, 3, 8, 100, 256, 700, 4096, 20000):
        for plan in (StepPlan(decode_contexts=(512,) * n), StepPlan(prefills=(PrefillChunk(n, 0),))):
            assert with_.step_s(plan) >= without.step_s(plan)


def test_bf16_on_hopper_barely_moves():
    """NVIDIA's bf16 kernels reach what the roofline assumes (80% of HBM bandwidth, 70% of peak): the floor adds
    at most a few percent to a bf16 8B step on an H100 (where the kernels dip below the ridge, m = 128-256)."""
    with_, without = cost(weight=None), cost(weight=None, floor=False)
    ratios = [with_.decode_step_s(b, b * 1000) / without.decode_step_s(b, b * 1000) for b in (1, 16, 128, 256, 2048)]
    assert max(ratios) < 1.05 and min(ratios) >= 1.0


def test_which_table_bounds_which_gpu():
    """A GPU's own table; else one of its architecture that is no slower in bandwidth and that dtype's rate (so its
    latencies are lower bounds there too); else none."""
    own = gemm_latency_table(get_gpu("h200"), "fp8")
    assert own is not None and own is not gemm_latency_table(get_gpu("h100-sxm"), "fp8")
    assert gemm_latency_table(get_gpu("h100-pcie"), "fp8") is gemm_latency_table(get_gpu("h100-sxm"), "fp8")
    assert gemm_latency_table(get_gpu("b200"), "fp4") is not None
    for name in ("a100-80gb", "l40s", "mi300x"):
        assert gemm_latency_table(get_gpu(name), "bf16") is None
    assert gemm_latency_table(get_gpu("h100-sxm"), "int8") is None
    # weight-only formats (Marlin W4A16) and MoE experts are not bounded: their kernels are not in the tables
    assert cost(weight="int4")._floors == {}
    assert set(cost("mixtral-8x7b", None)._floors) == {"attention"}  # experts: grouped GEMMs


def step(engine: str, plan: StepPlan, **kw) -> float:
    dep = Deployment(load_card("llama-3.1-8b", "fp8"), get_gpu("h100-sxm"), EngineConfig(engine=engine, **kw))
    return prepare(dep).cost.step_s(plan)


def test_an_overlap_scheduler_hides_the_cpu_step_behind_the_gpu():
    """TensorRT-LLM enqueues the next step before it processes this one's outputs: a step lasts max(GPU, CPU 2 ms),
    not the sum (vLLM's and SGLang's models keep the sum: docs/fidelity.md). A 1-token decode of the 8B takes
    longer than 2 ms on the GPU, so it costs the GPU's time alone; with the overlap scheduler off, GPU + 2 ms."""
    gpu_only = cost()
    one = StepPlan(decode_contexts=(100,))
    g = gpu_only.step_s(one) - 2e-3  # the roofline's own 2 ms out
    assert g > 2e-3
    assert step("trtllm", one) == pytest.approx(g, rel=1e-9)
    assert step("trtllm", one, async_scheduling=False) == pytest.approx(g + 2e-3, rel=1e-9)
    for engine in ("vllm", "sglang"):
        assert step(engine, one) == pytest.approx(g + 2e-3, rel=1e-9)
    # a CPU slower than the GPU sets the pace: 10 ms a step
    assert step("trtllm", one, step_overhead_ms=10) == pytest.approx(10e-3, rel=1e-9)
    dep = Deployment(load_card("llama-3.1-8b", "fp8"), get_gpu("h100-sxm"),
                     EngineConfig(engine="trtllm", step_overhead_ms=10))
    c = prepare(dep).cost
    assert sum(c.breakdown(one).values()) == pytest.approx(10e-3, rel=1e-9)
    assert "engine CPU 10 ms a step overlapped" in c.source


def test_a_profiles_fitted_overhead_moves_into_the_overlap():
    """With a measured profile, TensorRT-LLM's overlap takes the profile's fitted per-step overhead out of the step
    (the GPU's) and makes a step last the longer of the two; vLLM's model keeps it inside, summed."""
    def prepared(engine):
        dep = Deployment(load_card("llama-3.1-8b"), get_gpu("h200"), EngineConfig(engine=engine),
                         profile="llama-3.1-8b-h200")
        return prepare(dep).cost

    summed, overlapped = prepared("vllm"), prepared("trtllm")
    fitted = summed.overhead_s
    assert fitted > 0 and overlapped.per_step_s == fitted and overlapped.inner.overhead_s == 0.0
    for plan in (StepPlan(decode_contexts=(100,)), StepPlan(decode_contexts=(2000,) * 64),
                 StepPlan(prefills=(PrefillChunk(4096, 0),))):
        gpu = summed.step_s(plan) - fitted
        assert overlapped.step_s(plan) == pytest.approx(max(gpu, fitted), rel=1e-9)
