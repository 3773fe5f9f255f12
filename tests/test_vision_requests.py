"""Vision-language serving (issue 47 item 1): image -> tokens per model (counts worked out by hand from each
processor's rule, docs/vision.md), images in workloads, the vision encoder's roofline in the step, and bad input
refused in one line."""
import json

import numpy as np
import pytest

from capacity.cost.encoder import EncoderRoofline
from capacity.engine.config import EngineConfig
from capacity.errors import ConfigError
from capacity.model.card import VisionTower, load_named_card
from capacity.model.gpus import get_gpu
from capacity.model.hf import from_hf_config
from capacity.model.vision_tokens import glm4v, image_tokens, llava_next, mllama_tiles, pixtral, qwen_vl
from capacity.pipeline import Deployment, RunOptions, run
from capacity.workload import WorkloadSpec, generate
from tests.conftest import ROOT, run_cli

QWEN_CFG = ROOT / "tests/data/startup_v3/hf/qwen2.5-vl-7b.json"
QWEN = from_hf_config(json.loads(QWEN_CFG.read_text()), "qwen2.5-vl-7b")
MISTRAL3 = from_hf_config(json.loads((ROOT / "tests/data/hf/mistral-small-3.1-24b.json").read_text()), "mistral-3.1")
# LLaVA-1.5-7B's tower as vLLM builds it: CLIP ViT-L/14 at 336 px, 23 of 24 layers (vision_feature_layer -2)
LLAVA15 = VisionTower(kind="clip", num_layers=23, hidden_size=1024, intermediate_size=4096, num_heads=16,
                      patch_size=14, image_size=336, post_layernorm=False, tokens_per_image=576)


# ---- image -> tokens, by hand ------------------------------------------------------------------------------------
def test_qwen25vl_1024x768_is_999_tokens():
    # smart_resize: round(768 / 28) = 27 -> 756, round(1024 / 28) = 37 -> 1036; 756 x 1036 = 783,216 pixels is
    # inside [3136, 12,845,056]; patches 54 x 74 = 3996, merged 2 x 2: 999 tokens
    t = image_tokens(QWEN.vision, 1024, 768)
    assert (t.tokens, t.encoder_seqs, t.cross) == (999, (3996,), False)


def test_qwen_resize_bounds():
    # 4000 x 3000: 2996 x 4004 = 11,995,984 pixels (under max): 214 x 286 patches / 4 = 15,301
    assert qwen_vl(4000, 3000).tokens == 15301
    # 8000 x 6000 = 48e6 pixels: beta = sqrt(48e6 / 12,845,056) = 1.93309; floor(6000 / beta / 28) = 110 -> 3080,
    # floor(8000 / beta / 28) = 147 -> 4116; 220 x 294 / 4 = 16,170
    assert qwen_vl(8000, 6000).tokens == 16170
    # 20 x 20: rounds to 28 x 28 = 784 < 3136; beta = sqrt(3136 / 400) = 2.8, ceil(20 x 2.8 / 28) = 2 -> 56 x 56:
    # 4 x 4 patches, 4 tokens
    assert qwen_vl(20, 20) == (4, (16,), False)


def test_glm45v_counts_two_frames_against_its_bounds():
    # 3000 x 2000 rounds to 2996 x 1988; Qwen: 5,956,048 pixels, under its max: 214 x 142 / 4 = 7597 tokens
    assert qwen_vl(3000, 2000).tokens == 7597
    # GLM-4.5V compares 2 x 2996 x 1988 = 11,912,096 with the shipped 28 x 28 x 2 x 6144 = 9,633,792: beta =
    # sqrt(12e6 / 9,633,792) = 125 / 112; 2000 / beta = 1792 = 64 x 28, 3000 / beta = 2688 = 96 x 28;
    # 128 x 192 / 4 = 6144 (tests/test_vision_tokens.py has more)
    assert glm4v(3000, 2000).tokens == 6144
    assert glm4v(1024, 768).tokens == 999  # small images: as Qwen2-VL


def test_llava15_is_576_tokens_at_any_size():
    for w, h in ((1024, 768), (336, 336), (4000, 100)):
        assert image_tokens(LLAVA15, w, h) == (576, (577,), False)  # 24 x 24 patches; the encoder adds CLS


def test_llava_next_anyres():
    # 1024 x 768: pinpoint 672 x 672 keeps the most (672 x 504 after scaling) -> 2 x 2 tiles; 48 x 48 features
    # unpadded to the 4:3 aspect: round(768 x 48 / 1024) = 36 rows; 36 x 48 + 36 newlines + 576 base = 2340
    assert llava_next(1024, 768) == (2340, (577,) * 5, False)
    # 336 x 336: first best pinpoint 336 x 672 (1 x 2 tiles); 24 x 48 unpadded to square: 24 x 24 + 24 + 576
    assert llava_next(336, 336) == (1176, (577,) * 3, False)


def test_pixtral_and_mistral3_row_breaks():
    # Pixtral-12B, 16-px patches, no merge: 64 columns x 48 rows, one [IMG_BREAK]/[IMG_END] per row: 65 x 48
    assert pixtral(1024, 768) == (3120, (3072,), False)
    # Mistral-3.1: 14-px patches merged 2 x 2 (28 px), longest edge 1540: 37 x 28 grid, (37 + 1) x 28 = 1064
    assert MISTRAL3.vision.merge_size == 2 and MISTRAL3.vision.longest_edge == 1540
    assert image_tokens(MISTRAL3.vision, 1024, 768) == (1064, (37 * 28 * 4,), False)
    # 3080 x 1540 is scaled to 1540 x 770: 55 x 28 -> 56 x 28 = 1568
    assert image_tokens(MISTRAL3.vision, 3080, 1540).tokens == 1568


def test_gemma3_and_mllama():
    gemma = load_named_card("gemma-3-27b")
    # 896 / 14 = 64, 64^2 pooled to 256, inside 4 marker tokens (Gemma3Processor.full_image_sequence)
    assert image_tokens(gemma.vision, 1024, 768) == (260, (4096,), False)
    mllama = load_named_card("llama-3.2-11b-vision")
    # 1024 x 768: only the 2 x 2 canvas (1120 x 1120) needs no downscaling -> 4 tiles of 40^2 + 1 = 1601
    assert mllama_tiles(1024, 768) == 4 and mllama_tiles(560, 560) == 1
    assert image_tokens(mllama.vision, 1024, 768) == (1, (1601,) * 4, True)


# ---- the encoder roofline ----------------------------------------------------------------------------------------
def test_encoder_roofline_by_hand():
    # Qwen2.5-VL-7B ViT, 3996 patches: per token per layer 4 x 1280^2 + 3 x 1280 x 3420 = 19,686,400, x 32 layers,
    # + patch embedding 3 x 2 x 14^2 x 1280 = 1,505,280; merger 44,574,464 params over 999 tokens;
    # attention: 4 full layers x 3996^2 + 28 window layers x 3996 x 64 pairs, x 4 x 1280 FLOPs
    linear = 2 * 3996 * (32 * 19_686_400 + 1_505_280) + 2 * 999 * 44_574_464
    attn = 4 * (4 * 3996 ** 2 + 28 * 3996 * 64) * 1280
    peak = 989.4e12  # H100 SXM dense BF16
    want = linear / (peak * 0.70) + attn / (peak * 0.50) + 32 * 8 * 4e-6  # + a launch per op per layer
    enc = EncoderRoofline(QWEN.vision, get_gpu("h100-sxm"))
    assert enc.weight_bytes / (3.35e12 * 0.8) < want / 5  # compute bound: the weights' read is not the term
    assert enc.images_s([(3996, 1)]) == pytest.approx(want, rel=1e-9)
    assert 8e-3 < want < 10e-3


# ---- workloads ---------------------------------------------------------------------------------------------------
def _spec(images, n=40, prompt=200, rate=0.5, **kw):
    return WorkloadSpec.model_validate({"arrivals": {"kind": "constant", "rate_per_s": rate},
                                        "input_len": {"kind": "fixed", "value": prompt},
                                        "output_len": {"kind": "fixed", "value": 50}, "num_requests": n,
                                        "images": images, **kw})


def test_images_add_to_the_prompt_after_the_prefix():
    from capacity.sim.vision import image_shape

    spec = _spec({"per_request": {"kind": "fixed", "value": 2}, "sizes": ["1024x768", "20x20"], "share": 0.5},
                 n=400, prefix={"tokens": 100})
    spec = spec.model_copy(update={"images": spec.images.bind(image_shape(QWEN))})
    reqs = generate(spec, np.random.default_rng(1))
    with_img = [r for r in reqs if r.images]
    assert 150 < len(with_img) < 250  # share 0.5 of 400
    for r in with_img:
        assert len(r.images) == 2 and r.images[0][0] == 100  # right after the shared prefix
        assert {i[1] for i in r.images} <= {999, 4}
        assert r.images[1][0] == 100 + r.images[0][1]
        assert r.prompt_tokens == 200 + sum(i[1] for i in r.images)
    assert all(r.prompt_tokens == 200 for r in reqs if not r.images)


def test_images_raise_ttft_by_the_encoder_and_the_longer_prefill():
    """One request at a time (0.5/s, each done in well under 2 s): TTFT with a 1024 x 768 image minus text-only
    TTFT = (TTFT of a 200 + 999-token text prompt - TTFT at 200) + the encoder's time, hand-computed above."""
    dep = Deployment(QWEN, get_gpu("h100-sxm"), EngineConfig(frontend_ms_per_image_mpx=0.0))  # the engine's part
    opts = RunOptions(seed=0, capacity_check=False)  # (the server's CPU work per image: tests/test_image_cpu.py)
    ttft = {k: run(dep, _spec(img, prompt=p), opts).summary.ttft_s.p50
            for k, img, p in (("text", None, 200), ("long", None, 1199), ("image", {"sizes": ["1024x768"]}, 200))}
    linear = 2 * 3996 * (32 * 19_686_400 + 1_505_280) + 2 * 999 * 44_574_464
    encoder = linear / (989.4e12 * 0.7) + 4 * (4 * 3996 ** 2 + 28 * 3996 * 64) * 1280 / (989.4e12 * 0.5) + 32 * 8 * 4e-6
    assert ttft["image"] - ttft["text"] == pytest.approx(ttft["long"] - ttft["text"] + encoder, rel=0.01)
    assert ttft["image"] > ttft["long"] > ttft["text"]


def test_prefix_cache_shares_only_identical_images():
    """A 512-token system prompt, one 1024 x 768 image (999 tokens) right after it, 16-token blocks: distinct images
    leave the 32 prompt blocks shared (512 tokens); the same picture in every request extends the shared prefix to
    512 + 999 = 1511 tokens, 94 full blocks = 1504 tokens, and its encoder output is cached: a later request
    computes 2023 - 1504 = 519 tokens and runs no encoder."""
    dep = Deployment(QWEN, get_gpu("h100-sxm"), EngineConfig(enable_prefix_caching=True, block_size=16, frontend_ms=0.0,
                                                              frontend_us_per_input_token=0.0))  # the engine alone
    opts = RunOptions(seed=0, capacity_check=False, warmup_fraction=0.0)
    got = {}
    for identical in (False, True):
        spec = _spec({"sizes": ["1024x768"], "identical": identical}, n=10, prompt=1024, prefix={"tokens": 512})
        res = run(dep, spec, opts)
        rec = res.sim.records
        assert set(rec.prompt_tokens) == {1024 + 999}
        got[identical] = (sorted(set(rec.cached_tokens[1:])), res.summary.ttft_s.p50)
    assert got[False][0] == [512] and got[True][0] == [1504]
    assert got[True][1] < got[False][1] / 2


@pytest.mark.parametrize("images", [{"identical": True, "sizes": ["640x480", "1024x768"]},
                                    {"identical": True, "per_request": {"kind": "uniform", "low": 1, "high": 3}}])
def test_identical_images_need_one_fixed_set(images):
    with pytest.raises(ValueError, match="images.identical"):
        _spec(images)


@pytest.mark.parametrize("per_request", [{"kind": "fixed", "value": 65}, {"kind": "lognormal", "mean": 2, "cv": 1},
                                         {"kind": "uniform", "low": 1, "high": 100}])
def test_at_most_64_images(per_request):
    with pytest.raises(ValueError, match="images.per_request: up to"):
        _spec({"per_request": per_request})


# ---- bad input: one line naming the field, exit 1 ----------------------------------------------------------------
@pytest.mark.parametrize("flags, says", [
    (["--images-per-request", "-1"], "--images-per-request '-1'"),
    (["--images-per-request", "0"], "--images-per-request '0'"),
    (["--image-size", "0x0"], "--image-size: '0x0'"),
    (["--image-size", "1024"], "--image-size: '1024' is not WxH"),
    (["--image-share", "1.5"], "--image-share 1.5"),
    (["--image-share", "-0.1"], "--image-share -0.1"),
])
def test_bad_image_flags(flags, says):
    r = run_cli("simulate", "-m", str(QWEN_CFG), "--rate", "1", "-n", "20", *flags)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_text_only_model_given_images():
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "20", "--image-size", "1024x768")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "images: llama-3.1-8b is a text-only model" in r.stderr


def test_images_that_push_every_request_past_max_model_len_are_one_line():
    """Qwen2.5-VL at 1024x768: 999 image tokens (hand count above); 100 + 999 + 10 = 1,109 > 1,024, so no request
    could be served; at share 0.5 half of them can, and the run goes ahead."""
    args = ("simulate", "-m", str(QWEN_CFG), "--rate", "1", "-n", "20", "--input-len", "100", "--output-len", "10",
            "--max-model-len", "1024", "--image-size", "1024x768")
    r = run_cli(*args)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "max_model_len 1,024: every request of the workload is longer with its images (at least 1,109 tokens: " \
           "prompt + 999 image tokens + output)" in r.stderr
    assert run_cli(*args, "--image-share", "0.5").returncode == 0


@pytest.mark.parametrize("images, says", [
    ({"share": 2}, "images.share"),
    ({"sizes": ["0x0"]}, "images.sizes"),
    ({"per_request": {"kind": "fixed", "value": -2}}, "images.per_request.value"),
    ({"sizes": ["640x480"], "weights": [1, 2]}, "images.weights"),
])
def test_bad_image_yaml(tmp_path, images, says):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"arrivals": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 20, "images": images}))
    r = run_cli("simulate", "-m", str(QWEN_CFG), "--workload", str(wl))
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_images_run():
    r = run_cli("simulate", "-m", str(QWEN_CFG), "--rate", "1", "-n", "40", "--input-len", "200", "--output-len", "20",
                "--images-per-request", "1-3", "--image-size", "1024x768:3,640x480", "--image-share", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "vision encoder roofline" in out["step_cost_source"]


def test_flags_override_the_workload_files_images():
    base = ["simulate", "-m", str(QWEN_CFG), "--workload", str(ROOT / "examples/vision-chat.yaml"), "-n", "200",
            "--json"]
    ttft = {}
    for name, flags in (("file", []), ("none", ["--image-share", "0"]), ("small", ["--image-size", "640x480"])):
        r = run_cli(*base, *flags)
        assert r.returncode == 0, r.stderr
        ttft[name] = json.loads(r.stdout)["summary"]["ttft_s"]["p50"]
    # 640 x 480 -> 644 x 476 -> 46 x 34 patches = 23 x 17 = 391 merged tokens, under half of 1024 x 768's 999
    assert qwen_vl(640, 480).tokens == 23 * 17
    assert ttft["none"] < ttft["small"] < ttft["file"]


def test_encoder_scheduling_traced_by_hand():
    """Two images at [10, 20) and [20, 40) of a 50-token prompt, 15-token chunks: the first chunk [0, 15) reaches
    image 0 only, the second [15, 30) image 1 (image 0 is cached), the third none; a preemption (computed back
    to 0, after or during its prefill) encodes them again; a prefix-cache hit past image 0 ([25, 40)) encodes
    image 1 alone."""
    from capacity.cost.step import PrefillChunk, StepPlan
    from capacity.sched.base import Seq, Step
    from capacity.sim.vision import EncoderScheduling
    from capacity.workload import Request

    class Fixed:  # a scheduler that schedules what it is told
        def __init__(self):
            self.next: list = []

        def schedule(self, now):
            return Step(StepPlan(tuple(PrefillChunk(n, s.computed) for s, n in self.next)), list(self.next))

    class Enc:  # one unit of time per encoder token
        def images_s(self, work):
            return float(sum(a * b for a, b in work))

    inner = Fixed()
    sched = EncoderScheduling(inner, Enc())
    req = Request(0, 0.0, 50, 5, images=((10, 10, 40, 1, -1), (20, 20, 80, 1, -1)))
    seq = Seq(req)

    def step(computed, n):
        seq.computed = computed
        inner.next = [(seq, n)]
        return sched.schedule(0.0).plan.encoder_s

    assert [step(0, 15), step(15, 15), step(30, 15)] == [40.0, 80.0, 0.0]
    assert step(0, 15) == 40.0 and step(15, 30) == 80.0  # recomputed after its prefill: encoded again
    assert step(0, 15) == 40.0 and step(0, 15) == 40.0  # preempted mid-prefill (back to 0): image 0 again
    assert step(15, 15) == 80.0 and step(30, 20) == 0.0
    other = Seq(Request(1, 0.0, 50, 5, images=req.images))
    other.computed, inner.next = 25, [(other, 15)]
    assert sched.schedule(0.0).plan.encoder_s == 80.0
    assert not sched.encoded  # every image prefilled: nothing held
    assert sched.next is inner.next  # every other attribute is the wrapped scheduler's


def test_plan_with_images():
    base = ["plan", "-m", str(QWEN_CFG), "-g", "h100-sxm", "--target-rate", "2", "--input-len", "200",
            "--output-len", "100", "--requests", "100", "--seeds", "1", "--executor", "serial", "--tp", "1",
            "--max-num-seqs", "64", "--max-model-len", "8192", "--no-cache", "--json"]
    got = {}
    for name, flags in (("text", []), ("images", ["--image-size", "1024x768"])):
        r = run_cli(*base, *flags, timeout=300)
        assert r.returncode == 0, r.stderr
        got[name] = json.loads(r.stdout)["recommended"]["stats"]["ttft"]["p50"]
    assert got["images"] > got["text"] + 0.009  # at least the encoder's 9.2 ms more


# LLaVA-NeXT (llava-v1.6-mistral-7b-hf's shape, written for this test): Mistral-7B-Instruct-v0.2 text, CLIP ViT-L/14
# at 336 px, the five default pinpoints
LLAVA_NEXT_CFG = {
    "model_type": "llava_next", "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "torch_dtype": "bfloat16",
    "text_config": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32064,
                    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-05},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                      "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14, "image_size": 336}}


def test_llava_next_loads_from_its_config():
    card = from_hf_config(LLAVA_NEXT_CFG, "llava-next-test")
    v = card.vision
    assert v.grid_pinpoints == [(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)]
    # the largest: 672 x 672, 2 x 2 tiles, 48 x 48 features (square: nothing unpadded) + 48 newlines + 576 base
    assert v.tokens_per_image == 48 * 48 + 48 + 576
    assert v.max_num_tiles == 5 and v.encoder_tokens_per_image == 5 * 577  # 4 tiles + the base image
    assert v.num_layers == 23  # vision_feature_layer -2
    assert image_tokens(v, 1024, 768) == (2340, (577,) * 5, False)
    bad = {**LLAVA_NEXT_CFG, "image_grid_pinpoints": [[336, 0]]}
    with pytest.raises(ConfigError, match="image_grid_pinpoints"):
        from_hf_config(bad, "bad")
