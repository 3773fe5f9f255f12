"""Images in the server's front end (capacity/engine/image_cpu.py): each image's decoding on a pool (a latency of
its own) and its processing on the server's one serial worker, FIFO with tokenising; an identical image skips the
processor where the engine has a processor cache (vLLM); the engine setting that overrides the figure."""
import dataclasses
import json

import numpy as np
import pytest
import simpy

from capacity.cost.step import LinearCost
from capacity.engine import frontend, image_cpu
from capacity.engine.config import EngineConfig
from capacity.engine.image_cpu import RULES, ImageFrontEnd
from capacity.sched import make_scheduler
from capacity.sim.routing import Delay
from capacity.sim.simulator import SimConfig, simulate
from capacity.workload import Request
from tests.conftest import ROOT, run_cli

CB = dict(max_num_seqs=8, max_num_batched_tokens=8192, block_size=16, num_blocks=10_000)
COST = LinearCost(fixed_s=0.01, per_token_s=1e-5, per_seq_s=0.0)
# by hand: decode 10 ms/Mpx, process 100 ms/Mpx (source + processed), hash 5 ms/Mpx, 14-pixel patches
FE = dict(decode_s_per_px=10e-9, process_s_per_px=100e-9, hash_s_per_px=5e-9, px_per_patch=196)
PATCHES = 100  # 100 patches x 196 = 19,600 processed pixels
SERIAL = 100e-9 * (1_000_000 + 19_600)  # 0.10196 s for a 1000 x 1000 image
DECODE = 0.01  # s for 1 Mpx


def _req(i: int, t: float, key: int = -1) -> Request:
    """A request with one 1000 x 1000 image (100 placeholder tokens, 100 encoder patches)."""
    return Request(i, t, 300, 4, images=((0, 100, PATCHES, 1, key),), image_px=(1_000_000,))


def test_one_image_by_hand():
    fe = ImageFrontEnd(**FE, rules=RULES["vllm"])
    assert fe.work(_req(0, 0.0), set()) == pytest.approx((DECODE, SERIAL))
    trt = ImageFrontEnd(**FE, rules=RULES["trtllm"])  # decoding on its event loop: serial too
    assert trt.work(_req(0, 0.0), set()) == pytest.approx((0.0, DECODE + SERIAL))


def test_burst_queues_on_one_worker():
    """N requests with one image each at t=0: all decode side by side (10 ms), then the k-th (from 1) leaves the
    serial worker at 10 ms + k x 101.96 ms, plus the 5 ms per-request latency (by hand)."""
    env = simpy.Environment()
    got: list[tuple[int, float]] = []
    d = Delay(env, 0.005, lambda x: got.append((x, env.now)))
    fe = ImageFrontEnd(**FE, rules=RULES["vllm"])
    seen: set[int] = set()
    for i in range(4):
        lag, work = fe.work(_req(i, 0.0), seen)
        d.put(i, work, 0.0, lag)
    env.run()
    assert [g[0] for g in got] == [0, 1, 2, 3]
    np.testing.assert_allclose([g[1] for g in got], [0.01 + k * SERIAL + 0.005 for k in (1, 2, 3, 4)],
                               rtol=0, atol=1e-12)


def test_identical_images_skip_the_processor_with_a_cache():
    """vLLM (a processor cache): the first request processes the picture, the next ones only hash it (5 ms);
    SGLang (none): every request processes it."""
    seen: set[int] = set()
    v = ImageFrontEnd(**FE, rules=RULES["vllm"])
    assert [v.work(_req(i, 0.0, key=0), seen)[1] for i in range(3)] == pytest.approx([SERIAL, 0.005, 0.005])
    seen = set()
    s = ImageFrontEnd(**FE, rules=RULES["sglang"])
    assert [s.work(_req(i, 0.0, key=0), seen)[1] for i in range(3)] == pytest.approx([SERIAL] * 3)


def _sim(reqs, fe, fast=True):
    return simulate(reqs, COST, lambda: make_scheduler("continuous", **CB), np.random.default_rng(0),
                    SimConfig(frontend_images=fe, fast_forward=fast))


@pytest.mark.parametrize("fast", [True, False])
def test_idle_engine_ttft_grows_by_decode_plus_serial(fast):
    """Requests 5 s apart (no queue): each TTFT grows by 10 ms + 101.96 ms; TPOT is untouched. A text-only
    request (no images) passes the front end unchanged."""
    reqs = [_req(0, 0.0), _req(1, 5.0), Request(2, 10.0, 300, 4)]
    base = simulate([Request(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs], COST,
                    lambda: make_scheduler("continuous", **CB), np.random.default_rng(0), SimConfig(fast_forward=fast))
    got = _sim(reqs, ImageFrontEnd(**FE, rules=RULES["vllm"]), fast)
    d = (got.records.first_token - got.records.arrival) - (base.records.first_token - base.records.arrival)
    np.testing.assert_allclose(d, [DECODE + SERIAL, DECODE + SERIAL, 0.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.records.finish - got.records.first_token,
                               base.records.finish - base.records.first_token, rtol=0, atol=1e-12)


def test_each_run_starts_with_a_cold_cache():
    """The simulator owns the processed-image keys: a second run's first identical image is processed again."""
    fe = ImageFrontEnd(**FE, rules=RULES["vllm"])
    a, b = (_sim([_req(0, 0.0, key=0)], fe) for _ in range(2))
    assert a.records.first_token[0] == b.records.first_token[0]


def test_defaults_are_the_recorded_measurement():
    """The constants are the CPU-time ranges bench/image_preprocess.py recorded (JPEG decoding; processing over
    both formats: the plain pipeline's low end, the HF processor's high end), not numbers typed beside them."""
    fits = json.loads((ROOT / "bench/results/image_preprocess.json").read_text())["fits"]
    assert image_cpu.DECODE_MS_PER_MPX == pytest.approx(tuple(fits["jpeg_decode_ms_per_source_mpx"]), abs=0.005)
    lo = min(fits["jpeg_serial_ms_per_mpx"][0], fits["png_serial_ms_per_mpx"][0])
    hi = max(fits["jpeg_serial_ms_per_mpx"][1], fits["png_serial_ms_per_mpx"][1])
    assert image_cpu.PROCESS_MS_PER_MPX == pytest.approx((lo, hi), abs=0.005)
    assert image_cpu.HASH_MS_PER_MPX == pytest.approx(tuple(fits["jpeg_cached_ms_per_source_mpx"]), abs=0.005)
    assert image_cpu.defaults() == (image_cpu.DECODE_MS_PER_MPX[1], image_cpu.PROCESS_MS_PER_MPX[1],
                                    image_cpu.HASH_MS_PER_MPX[1])


def test_override_and_text_only():
    """The setting replaces the processing figure (and scales the hash with it); a text-only workload or model
    gets no per-image term, and the run's notes keep their text-only lines."""
    from capacity.model.card import load_model_card
    from capacity.model.hf import from_hf_config

    qwen = from_hf_config(json.loads((ROOT / "tests/data/startup_v3/hf/qwen2.5-vl-7b.json").read_text()), "q")
    fe = image_cpu.front_end(EngineConfig(frontend_ms_per_image_mpx=50.0), qwen)
    assert fe is not None and fe.process_s_per_px == pytest.approx(50e-9) and fe.px_per_patch == 14 * 14
    assert fe.hash_s_per_px == pytest.approx(image_cpu.HASH_MS_PER_MPX[1] * 50 / image_cpu.PROCESS_MS_PER_MPX[1] * 1e-9)
    llama = load_model_card(ROOT / "models/llama-3.1-8b.yaml")
    assert image_cpu.front_end(EngineConfig(), llama) is None
    assert image_cpu.front_end(EngineConfig(frontend_ms_per_image_mpx=0.0), qwen) is None
    assert image_cpu.sim_terms(EngineConfig(), qwen, object()) == {}
    assert frontend.note(EngineConfig(), qwen, object()) == frontend.note(EngineConfig())


QWEN = str(ROOT / "tests/data/startup_v3/hf/qwen2.5-vl-7b.json")


def test_cli_shift_is_the_image_front_end_by_hand():
    """One request at a time (constant arrivals 100 s apart) with one 1000x1000 image on Qwen2.5-VL: smart_resize
    keeps 1008x1008, 72 x 72 = 5,184 patches of 14 px (1,016,064 processed pixels), so the default adds the decode's
    high end x 1 Mpx (the pool) + the processing's x (1,000,000 + 1,016,064) pixels (the worker) to the TTFT that
    `--frontend-ms-per-image-mpx 0` (the images' front-end work left out) gives; a setting of 10 ms/Mpx adds the
    decode + 10 ms x 2.016064."""
    def ttft(*extra: str) -> float:
        r = run_cli("simulate", "-m", QWEN, "--rate", "0.01", "--arrival", "constant", "-n", "10", "--input-len",
                    "100", "--output-len", "8", "--image-size", "1000x1000", "--json", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["summary"]["ttft_s"]["mean"]

    off = ttft("--frontend-ms-per-image-mpx", "0")
    dec = image_cpu.DECODE_MS_PER_MPX[1] * 1e-3
    assert ttft() - off == pytest.approx(dec + image_cpu.PROCESS_MS_PER_MPX[1] * 1e-3 * 2.016064, abs=1e-9)
    assert ttft("--frontend-ms-per-image-mpx", "10") - off == pytest.approx(dec + 10e-3 * 2.016064, abs=1e-9)


@pytest.mark.parametrize("value", ["-1", "nan", "20000"])
def test_bad_override_is_one_line(value):
    r = run_cli("simulate", "-m", QWEN, "--rate", "1", "-n", "10", "--image-size", "1000x1000",
                "--frontend-ms-per-image-mpx", value)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [ln for ln in (r.stderr + r.stdout).strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "frontend_ms_per_image_mpx" in lines[0], lines


def test_fast_forward_is_exact_with_image_work():
    """Bursts of requests with images of varied size (pool lag and worker time per request) and text-only ones:
    the fast path's horizon (arrival + the per-request latency, a lower bound of any entry) keeps it identical to
    one step at a time."""
    rng = np.random.default_rng(5)
    reqs = []
    for i in range(120):
        t = (i // 6) * 0.4 + float(rng.uniform(0, 0.05))
        n = int(rng.integers(0, 3))
        px = tuple(int(v) for v in rng.integers(200_000, 3_000_000, n))
        imgs = tuple((0, 100, int(p) // 196 // 4, 1, -1) for p in px)
        reqs.append(Request(i, t, 300 + 100 * n, int(rng.integers(4, 60)), images=imgs, image_px=px))
    fe = ImageFrontEnd(**FE, rules=RULES["vllm"])
    cfg = dict(frontend_s=0.003, frontend_s_per_input_token=2e-6, frontend_images=fe)
    reqs.sort(key=lambda r: r.arrival_s)
    fast, slow = (simulate([dataclasses.replace(r) for r in reqs], COST, lambda: make_scheduler("continuous", **CB),
                           np.random.default_rng(0), SimConfig(fast_forward=f, **cfg)) for f in (True, False))
    assert fast.steps == slow.steps and fast.events < slow.events
    for attr in ("arrival", "first_token", "finish"):  # the same times (to rounding: the clocks add differently)
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)
    assert (fast.records.first_token - fast.records.arrival).max() > 0.3  # the worker queued (by construction)
