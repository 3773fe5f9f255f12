"""Benchmark datasets as images in requests (issue 47 item 1; capacity/vision_datasets.py, docs/vision_datasets.md):
the synthetic datasets reproduce the load generators' parameters exactly (counts and sizes read from vLLM's
RandomMultiModalDataset and SGLang's sample_image_requests), the real-image datasets give a bracket whose
conservative end is chosen per model, and bad specs are refused in one line. Token counts are worked out by hand
from each processor's rule (transformers' Qwen2-VL smart_resize; Pixtral's longest edge and row breaks)."""
import json

import numpy as np
import pytest

from capacity.errors import ConfigError
from capacity.model.hf import from_hf_config
from capacity.model.vision_tokens import pixtral
from capacity.vision_datasets import alternatives, expand
from capacity.vision_requests import ImageRequests
from capacity.workload import WorkloadSpec, generate
from tests.conftest import ROOT, run_cli

QWEN_CFG = ROOT / "tests/data/startup_v3/hf/qwen2.5-vl-7b.json"
QWEN = from_hf_config(json.loads(QWEN_CFG.read_text()), "qwen2.5-vl-7b")
MISTRAL3 = from_hf_config(json.loads((ROOT / "tests/data/hf/mistral-small-3.1-24b.json").read_text()), "mistral-3.1")

# Qwen2.5-VL (14-px patches, 2 x 2 merge, factor 28), by hand:
#   256 x 256: round(256 / 28) = 9 -> 252 x 252, 18 x 18 patches = 324, / 4 = 81 tokens
#   1280 x 720: round(45.71) = 46 -> 1288, round(25.71) = 26 -> 728; 92 x 52 = 4784 patches, 1196 tokens
#   1920 x 1080: round(68.57) = 69 -> 1932, round(38.57) = 39 -> 1092; 138 x 78 = 10,764 patches, 2691 tokens
#   1024 x 768: 37 -> 1036, 27 -> 756; 74 x 54 = 3996 patches, 999 tokens
QWEN_TOKENS = {"256x256": 81, "1280x720": 1196, "1920x1080": 2691, "1024x768": 999}


def _bound(images: dict, card=QWEN, n: int = 2000, seed: int = 0):
    from capacity.sim.vision import image_shape

    spec = WorkloadSpec.model_validate({"arrivals": {"kind": "constant", "rate_per_s": 1.0},
                                        "input_len": {"kind": "fixed", "value": 100},
                                        "output_len": {"kind": "fixed", "value": 10}, "num_requests": n,
                                        "images": images})
    assert spec.images is not None
    bound = spec.images.bind(image_shape(card))
    reqs = generate(spec.model_copy(update={"images": bound}), np.random.default_rng(seed))
    return bound, reqs


def test_hand_counts_through_the_processor():
    from capacity.sim.vision import image_shape

    shape = image_shape(QWEN)
    for size, tokens in QWEN_TOKENS.items():
        w, h = (int(x) for x in size.split("x"))
        assert shape(w, h)[0] == tokens, size


# ---- vLLM random-mm ------------------------------------------------------------------------------------------------
def test_random_mm_defaults_one_image_half_256_half_720p():
    # DEFAULT_BASE_ITEMS_PER_REQUEST 1, range ratio 0: exactly one image; DEFAULT_MM_ITEM_BUCKET_CONFIG
    # {(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}: the video bucket dropped (probability 0),
    # keys are (height, width, frames): 720 high, 1280 wide
    assert expand("random-mm") == {"share": 1.0, "per_request": {"kind": "fixed", "value": 1},
                                   "sizes": ["256x256", "1280x720"]}
    _, reqs = _bound({"dataset": "random-mm"}, n=4000)
    extra = np.array([r.prompt_tokens - 100 for r in reqs])
    assert set(extra) == {81, 1196}
    assert abs((extra == 81).mean() - 0.5) < 0.03


def test_random_mm_count_range_and_limit():
    # base 2, ratio 0.5: [floor(1), ceil(3)] = 1..3, each a third
    assert expand("random-mm:base=2,ratio=0.5")["per_request"] == {"kind": "uniform", "low": 1, "high": 3}
    # base 2, ratio 1: [0, 4], limit 3 clamps the top: 0..3 equally likely -> share 3/4, then 1..3
    got = expand("random-mm:base=2,ratio=1,limit=3")
    assert got["share"] == 0.75 and got["per_request"] == {"kind": "uniform", "low": 1, "high": 3}
    # the limit as vLLM's JSON mapping, the flags under their own names
    assert expand('random-mm:random-mm-base-items-per-request=2,random-mm-num-mm-items-range-ratio=1,'
                  'random-mm-limit-mm-per-prompt={"image": 3}') == got
    # drawn: 0..4 images (base 2, ratio 1, default limit 255), each count 1/5 -> mean 2 images, share 0.8
    _, reqs = _bound({"dataset": "random-mm:base=2,ratio=1,buckets={(720, 1280, 1): 1}"}, n=5000)
    counts = np.array([len(r.images) for r in reqs])
    assert set(counts) == {0, 1, 2, 3, 4}
    assert abs(counts.mean() - 2.0) < 0.08 and abs((counts > 0).mean() - 0.8) < 0.02
    assert all(r.prompt_tokens == 100 + 1196 * len(r.images) for r in reqs)


def test_random_mm_buckets_weighted():
    got = expand("random-mm:buckets={(512, 512, 1): 1, (720, 1280, 1): 3, (720, 1280, 16): 0}")
    assert got["sizes"] == ["512x512", "1280x720"] and got["weights"] == [0.25, 0.75]


# ---- SGLang image / random-image -------------------------------------------------------------------------------------
def test_sglang_image_two_1080p_images():
    # --image-count 2 at the default --image-resolution 1080p = (1920, 1080): 2 x 2691 = 5382 image tokens each
    bound, reqs = _bound({"dataset": "sglang-image:count=2"}, n=50)
    assert bound.sizes == ["1920x1080"] and not bound.identical
    assert {r.prompt_tokens for r in reqs} == {100 + 2 * 2691}


def test_sglang_image_against_a_published_count():
    # SGLang PR #9812: Qwen2.5-VL-7B, --dataset-name image --image-count 1 --image-resolution 1120x700 (height 1120,
    # width 700), 768 requests: "Total input vision tokens: 769536" = 1002 a request, the image's 25 x 40 = 1000
    # placeholder tokens plus <|vision_start|> and <|vision_end|> (the chat template's, counted with the text here)
    assert expand("sglang-image:count=1,resolution=1120x700")["sizes"] == ["700x1120"]
    _, reqs = _bound({"dataset": "sglang-image:count=1,resolution=1120x700"}, n=20)
    assert {r.prompt_tokens - 100 for r in reqs} == {769536 // 768 - 2}


def test_mmmu_small_end_is_the_measured_mean():
    # SGLang PR #9812, --dataset-name mmmu on Qwen2.5-VL-7B: all 505 requests of MMMU Math test, "Total input
    # vision tokens: 169941" = 336.5 a request, 334.5 without the two structural tokens; 588 x 448 is 21 x 16 = 336
    bound, reqs = _bound({"dataset": "mmmu:small"}, n=10)
    assert bound.sizes == ["588x448"] and {r.prompt_tokens - 100 for r in reqs} == {336}
    assert abs(336 - (169941 / 505 - 2)) < 2
    assert _bound({"dataset": "mmmu"}, n=10)[0].sizes == ["1024x768"]  # the conservative end for Qwen2.5-VL


def test_sglang_resolution_forms():
    # a custom resolution is HEIGHTxWIDTH (parse_image_resolution); presets as written
    assert expand("sglang-image:resolution=720x1280")["sizes"] == ["1280x720"]
    assert expand("sglang-image:image-resolution=360p")["sizes"] == ["640x360"]
    assert expand("image:image_count=3,random_image_count")["per_request"] == {"kind": "uniform", "low": 1, "high": 3}
    assert expand("sglang-random-image:random-image-num-images=2,random-image-resolution=4k") == {
        "share": 1.0, "per_request": {"kind": "fixed", "value": 2}, "sizes": ["3840x2160"], "identical": False}
    # --image-content blank: the same white picture everywhere, shared by the caches
    assert expand("sglang-image:content=blank")["identical"] is True


# ---- datasets of real images ----------------------------------------------------------------------------------------
def test_visionarena_one_image_conservative_end_per_model():
    assert alternatives("visionarena") == [["1024x768"], ["1920x1080"]]
    assert alternatives("visionarena:small") == [] and alternatives("random-mm") == []
    # Qwen2.5-VL: 1920 x 1080 (2691 tokens) over 1024 x 768 (999)
    bound, reqs = _bound({"dataset": "lmarena-ai/VisionArena-Chat"}, n=20)
    assert bound.sizes == ["1920x1080"] and {r.prompt_tokens for r in reqs} == {100 + 2691}
    bound, reqs = _bound({"dataset": "visionarena:small"}, n=20)
    assert {r.prompt_tokens for r in reqs} == {100 + 999}
    # Pixtral-12B (16-px patches, longest edge 1024): 1920 x 1080 is scaled to 1024 x 576 -> 64 x 36, (64 + 1) x
    # 36 = 2340 tokens; 1024 x 768 is not scaled -> 64 x 48, 65 x 48 = 3120: the small end is the conservative one
    assert pixtral(1920, 1080).tokens == 2340 and pixtral(1024, 768).tokens == 3120
    spec = ImageRequests.model_validate({"dataset": "visionarena"})

    def shape(w, h):
        t = pixtral(w, h)
        return t.tokens, t.encoder_seqs[0], 1
    assert spec.bind(shape).sizes == ["1024x768"]
    # Mistral-3.1 (28 px a token, longest edge 1540): 1920 x 1080 -> 1540 x 866 -> 55 x 31, 56 x 31 = 1736 over
    # 1024 x 768 -> 37 x 28, 38 x 28 = 1064
    from capacity.sim.vision import image_shape
    assert image_shape(MISTRAL3)(1920, 1080)[0] == 1736
    assert spec.bind(image_shape(MISTRAL3)).sizes == ["1920x1080"]


def test_fields_given_override_the_dataset():
    spec = ImageRequests.model_validate({"dataset": "random-mm:buckets={(512, 512, 1): 1, (720, 1280, 1): 3}",
                                         "sizes": ["640x480"], "share": 0.5})
    assert spec.sizes == ["640x480"] and spec.weights is None and spec.share == 0.5
    # sizes given: no bracket switch at bind
    assert ImageRequests.model_validate({"dataset": "mmmu", "sizes": ["800x600"]}).bind(pixtral).sizes == ["800x600"]
    # a round trip (the CLI dumps and revalidates) keeps the dataset's fields
    s = ImageRequests.model_validate({"dataset": "random-mm:buckets={(512, 512, 1): 1, (720, 1280, 1): 3}"})
    assert ImageRequests.model_validate(s.model_dump()) == s


@pytest.mark.parametrize("spec, says", [
    ("nope", "'nope' is not a known benchmark dataset"),
    ("visionarena" * 200, "a spec of 2,200 characters"),
    ("mmvu", "video is not modelled"),
    ("random-mm:ratio=1.5", "num_mm_items_range_ratio 1.5 must be in [0, 1]"),
    ("random-mm:buckets={(720, 1280, 16): 1}", "is a video"),
    ("random-mm:buckets={(256, 256, 1): 0}", "every bucket has probability 0"),
    ("random-mm:base=x", "base_items_per_request 'x' is not a whole number"),
    ("random-mm:base=100", "at most 64"),
    ("sglang-image:resolution=1080P", "resolution '1080P'"),
    ("sglang-image:count=0", "image count 0 must be at least 1"),
    ("sglang-image:count=2,random_count,content=blank", "needs a fixed count"),
    ("visionarena:colour=red", "'colour' is not a parameter of visionarena"),
    ("random-mm:large", "applies to datasets of real images"),
])
def test_bad_specs_one_line(spec, says):
    r = run_cli("simulate", "-m", str(QWEN_CFG), "--rate", "1", "-n", "10", "--image-dataset", spec)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and says in lines[0], r.stderr
    assert (f"--image-dataset {spec!r}" in lines[0] or "images.per_request" in lines[0]
            or (len(spec) > 2000 and len(lines[0]) < 200)), lines[0]  # an over-long spec is not echoed whole


def test_bad_spec_in_a_workload_file(tmp_path):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"arrivals": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 10,
                              "images": {"dataset": "random-mm:ratio=2"}}))
    r = run_cli("simulate", "-m", str(QWEN_CFG), "--workload", str(wl))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "images.dataset" in r.stderr, r.stderr
    with pytest.raises(ConfigError, match="images.dataset"):
        ImageRequests.model_validate({"dataset": "random-mm:ratio=2"})


def test_cli_dataset_is_the_same_run_as_the_explicit_flags():
    base = ["simulate", "-m", str(QWEN_CFG), "--rate", "2", "-n", "30", "--input-len", "64", "--output-len", "16",
            "--json"]
    a = run_cli(*base, "--image-dataset", "sglang-image:count=2,resolution=720p")
    b = run_cli(*base, "--images-per-request", "2", "--image-size", "1280x720")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["summary"] == json.loads(b.stdout)["summary"]
    # another image flag applies over the dataset
    c = run_cli(*base, "--image-dataset", "visionarena", "--image-share", "0")
    d = run_cli(*base)
    assert c.returncode == 0 and d.returncode == 0, c.stderr + d.stderr
    assert json.loads(c.stdout)["summary"] == json.loads(d.stdout)["summary"]


def test_plan_takes_the_dataset():
    base = ["plan", "-m", str(QWEN_CFG), "-g", "h100-sxm", "--target-rate", "2", "--input-len", "200",
            "--output-len", "100", "--requests", "100", "--seeds", "1", "--executor", "serial", "--tp", "1",
            "--max-num-seqs", "64", "--max-model-len", "8192", "--no-cache", "--json"]
    got = {}
    # SGLang's custom resolution is HEIGHTxWIDTH: 768x1024 is the 1024-wide, 768-high image of --image-size 1024x768
    for name, flags in (("dataset", ["--image-dataset", "sglang-image:resolution=768x1024"]),
                        ("flags", ["--image-size", "1024x768"])):
        r = run_cli(*base, *flags, timeout=300)
        assert r.returncode == 0, r.stderr
        got[name] = json.loads(r.stdout)["recommended"]["stats"]["ttft"]
    assert got["dataset"] == got["flags"]
    r = run_cli(*base, "--image-dataset", "random-mm:ratio=-1")
    assert r.returncode == 1 and "--image-dataset 'random-mm:ratio=-1'" in r.stderr
