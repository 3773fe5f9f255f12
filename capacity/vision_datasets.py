"""Benchmark datasets as images in requests: what vLLM's and SGLang's load generators send, as an `images:` mapping.

Published vision-language serving runs name a benchmark dataset (`vllm bench serve --dataset-name hf
--dataset-path lmarena-ai/VisionArena-Chat`, `--dataset-name random-mm ...`, `sglang.bench_serving --dataset-name
image` or `mmmu`) and not the images it sends. `expand(spec)` turns the dataset's name (and, for the synthetic
ones, the benchmark's own parameters) into the `images:` fields (`capacity.vision_requests.ImageRequests`):
`share`, `per_request`, `sizes`, `weights`, `identical`. Each rule is read from the benchmark's code
(docs/vision_datasets.md names the file and function):

- synthetic datasets (vLLM `random-mm`, SGLang `image` / `random-image`) are reproduced exactly: the count of
  images per request and each image's size follow the benchmark's parameters;
- datasets of real images (VisionArena, MMMU, MMStar) send one image per request at its own resolution, which no
  source tabulates: their sizes are a bracket (`small`, `large`); without a chosen end the run takes the end that
  gives the model more image tokens (`conservative`), resolved when the spec is bound to a model.

Spec grammar: NAME[:ARG[,ARG...]], ARG being KEY=VALUE or, for the real-image datasets, `small` / `large`. Keys
take the benchmark's flag names with or without their prefix (`base_items_per_request`,
`random-mm-base-items-per-request`) or short names (`base`, `ratio`, `limit`, `buckets`; `count`, `resolution`,
`random_count`, `content`). A comma inside brackets or braces does not split (`buckets={(256, 256, 1): 0.5, ...}`).
"""
from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass

from capacity.errors import ConfigError

FIELD = "images.dataset"


@dataclass(frozen=True)
class RealImages:
    """A dataset of real images: one image per request, sizes a bracket (WxH strings) with its sources."""

    benchmark: str  # the load generator's command line that sends it
    small: tuple[str, ...]
    large: tuple[str, ...]
    output_len: str  # the benchmark's default output length (words: where it comes from)


# the real-image datasets (docs/vision_datasets.md gives each bracket's reasoning and source)
VISIONARENA = RealImages("vllm bench serve --dataset-name hf --dataset-path lmarena-ai/VisionArena-Chat",
                         ("1024x768",), ("1920x1080",), "128 (VisionArenaDataset.DEFAULT_OUTPUT_LEN; --hf-output-len)")
REAL: dict[str, RealImages] = {
    "visionarena": VISIONARENA,
    "vision-arena-bench": RealImages(
        "vllm bench serve --dataset-name hf --dataset-path lmarena-ai/vision-arena-bench-v0.1",
        VISIONARENA.small, VISIONARENA.large, VISIONARENA.output_len),
    # small: the size of the whole split's measured mean (Qwen2.5-VL 336 tokens; SGLang PR #9812: 334.5)
    "mmmu": RealImages("python -m sglang.bench_serving --dataset-name mmmu", ("588x448",), ("1024x768",),
                       "--random-output-len (sglang's default 1024; 256 where it is None)"),
    "mmstar": RealImages("vllm bench serve --dataset-name hf --dataset-path Lin-Chen/MMStar", ("588x448",),
                         ("1024x768",), "128 (MMStarDataset.DEFAULT_OUTPUT_LEN; --hf-output-len)"),
    # MMMU-Pro's vision subset (vLLM's benchmark_serving.py before the datasets module): a published average, one point
    "mmmu-pro-vision": RealImages(
        "python benchmarks/benchmark_serving.py --dataset-path MMMU/MMMU_Pro --hf-subset vision",
        ("1700x1600",), ("1700x1600",), "the dataset's own (--hf-output-len)"),
}
ALIASES = {
    "lmarena-ai/visionarena-chat": "visionarena", "visionarena-chat": "visionarena", "vision-arena": "visionarena",
    "lmarena-ai/vision-arena-bench-v0.1": "vision-arena-bench", "mmmu/mmmu": "mmmu", "lin-chen/mmstar": "mmstar",
    "mmmu/mmmu_pro": "mmmu-pro-vision", "random_mm": "random-mm", "image": "sglang-image",
    "random-image": "sglang-random-image", "sglang-mmmu": "mmmu",
}
VIDEO = {"mmvu": "yale-nlp/MMVU sends a video per request (MMVUDataset: process_video)",
         "yale-nlp/mmvu": "yale-nlp/MMVU sends a video per request (MMVUDataset: process_video)"}
SYNTHETIC = ("random-mm", "sglang-image", "sglang-random-image")
NAMES = tuple(REAL) + SYNTHETIC

# vLLM RandomMultiModalDataset (vllm/benchmarks/datasets.py): its defaults; bucket keys are (height, width, frames)
VLLM_BUCKETS = {(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}
VLLM_IMAGE_LIMIT = 255  # DEFAULT_LIMIT_MM_PER_PROMPT["image"]
# SGLang parse_image_resolution (python/sglang/benchmark/datasets/image.py; bench_serving.py before): (width, height)
SGLANG_PRESETS = {"4k": (3840, 2160), "1080p": (1920, 1080), "720p": (1280, 720), "360p": (640, 360)}
SGLANG_DEFAULT_RESOLUTION = "1080p"


def _split(text: str) -> list[str]:
    """Split on commas outside brackets and braces."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in out + [cur] if p.strip()]


MAX_SPEC_CHARS = 2000  # a dataset spec with every parameter and a few dozen buckets is far shorter


def parse(spec: str) -> tuple[str, dict[str, str], str | None]:
    """'random-mm:base=2,ratio=0.5' -> ('random-mm', {'base': '2', 'ratio': '0.5'}, None); a bare `small` or
    `large` is the bracket end (the third item)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{FIELD}: {spec!r} is not a dataset name (one of {', '.join(NAMES)})")
    if len(spec) > MAX_SPEC_CHARS:  # a user's string: bounded before it is split or echoed
        raise ConfigError(f"{FIELD}: a spec of {len(spec):,} characters ({spec[:40]!r}...); at most {MAX_SPEC_CHARS:,}")
    name, _, rest = spec.strip().partition(":")
    key = name.strip().lower()
    if key in VIDEO:
        raise ConfigError(f"{FIELD}: {spec!r}: {VIDEO[key]}, not images: video is not modelled")
    key = ALIASES.get(key, key)
    if key not in NAMES:
        raise ConfigError(f"{FIELD}: {name.strip()!r} is not a known benchmark dataset (one of {', '.join(NAMES)})")
    args: dict[str, str] = {}
    end = None
    for part in _split(rest):
        k, eq, v = part.partition("=")
        k = k.strip().lower().replace("-", "_")
        if not eq:
            if k in ("small", "large", "conservative"):
                end = None if k == "conservative" else k
                continue
            if k in ("random_count", "random_image_count"):
                v = "true"
            else:
                raise ConfigError(f"{FIELD}: {spec!r}: {part!r} is not KEY=VALUE")
        if k == "bracket":
            if v.strip() not in ("small", "large", "conservative"):
                raise ConfigError(f"{FIELD}: {spec!r}: bracket {v.strip()!r} is not small, large or conservative")
            end = None if v.strip() == "conservative" else v.strip()
            continue
        args[k] = v.strip()
    if end is not None and key not in REAL:
        raise ConfigError(f"{FIELD}: {spec!r}: `{end}` applies to datasets of real images ({', '.join(REAL)})")
    return key, args, end


def _take(args: dict[str, str], spec: str, names: tuple[str, ...]) -> str | None:
    got = [args.pop(n) for n in names if n in args]
    if len(got) > 1:
        raise ConfigError(f"{FIELD}: {spec!r}: {names[0]} given twice")
    return got[0] if got else None


def _int(v: str, what: str, spec: str, low: int = 0) -> int:
    try:
        n = int(v)
    except ValueError:
        raise ConfigError(f"{FIELD}: {spec!r}: {what} {v!r} is not a whole number") from None
    if n < low:
        raise ConfigError(f"{FIELD}: {spec!r}: {what} {n} must be at least {low}")
    return n


def _counts(lo: int, hi: int) -> dict:
    """Uniform whole counts in [lo, hi] (lo may be 0) as `share` and `per_request` (each count equally likely)."""
    if hi == 0:
        return {"share": 0.0, "per_request": {"kind": "fixed", "value": 1}}
    first = max(lo, 1)
    share = 1.0 if lo >= 1 else hi / (hi + 1)  # P(count >= 1) with hi + 1 equally likely counts 0..hi
    per = {"kind": "fixed", "value": hi} if first == hi else {"kind": "uniform", "low": first, "high": hi}
    return {"share": share, "per_request": per}


def _buckets(v: str, spec: str) -> dict[tuple[int, int, int], float]:
    try:
        parsed = ast.literal_eval(v)
    except (ValueError, SyntaxError):
        raise ConfigError(f"{FIELD}: {spec!r}: bucket_config {v!r} is not a dict like "
                          "{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"{FIELD}: {spec!r}: bucket_config {v!r} is not a non-empty dict")
    out: dict[tuple[int, int, int], float] = {}
    for k, p in parsed.items():
        if isinstance(k, str):  # vLLM's _parse_mm_bucket_config also takes string keys "(h, w, t)"
            try:
                k = ast.literal_eval(k)
            except (ValueError, SyntaxError):
                pass
        if not (isinstance(k, tuple) and len(k) == 3 and all(isinstance(x, int) for x in k)):
            raise ConfigError(f"{FIELD}: {spec!r}: bucket key {k!r} is not (height, width, frames)")
        if not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise ConfigError(f"{FIELD}: {spec!r}: bucket {k} probability {p!r} must be a number >= 0")
        out[k] = float(p)
    return out


def random_mm(args: dict[str, str], spec: str) -> dict:
    """vLLM `--dataset-name random-mm` (RandomMultiModalDataset, vllm/benchmarks/datasets.py): the count of items
    per request is uniform over [floor(n (1 - r)), min(limit, ceil(n (1 + r)))] (`get_mm_item_sampling_params`,
    `get_mm_item_iterator`: rng.integers(lo, hi + 1)); each item's (height, width, frames) is drawn from the
    bucket config, zero-probability buckets dropped and the rest renormalised (`normalize_bucket_config`)."""
    n = _take(args, spec, ("base_items_per_request", "random_mm_base_items_per_request", "base"))
    r = _take(args, spec, ("num_mm_items_range_ratio", "random_mm_num_mm_items_range_ratio", "ratio"))
    lim = _take(args, spec, ("limit_mm_per_prompt", "random_mm_limit_mm_per_prompt", "limit"))
    b = _take(args, spec, ("bucket_config", "random_mm_bucket_config", "buckets"))
    base = 1 if n is None else _int(n, "base_items_per_request", spec)
    try:
        ratio = 0.0 if r is None else float(r)
    except ValueError:
        raise ConfigError(f"{FIELD}: {spec!r}: num_mm_items_range_ratio {r!r} is not a number") from None
    if not 0.0 <= ratio <= 1.0:  # vLLM: "num_mm_items_range_ratio must be in [0, 1]."
        raise ConfigError(f"{FIELD}: {spec!r}: num_mm_items_range_ratio {ratio:g} must be in [0, 1]")
    limit = VLLM_IMAGE_LIMIT
    if lim is not None:
        if lim.lstrip().startswith("{"):
            try:
                d = json.loads(lim)
            except json.JSONDecodeError:
                raise ConfigError(f"{FIELD}: {spec!r}: limit_mm_per_prompt {lim!r} is not JSON "
                                  '(e.g. {"image": 3})') from None
            if not isinstance(d, dict) or not isinstance(d.get("image"), int):
                raise ConfigError(f"{FIELD}: {spec!r}: limit_mm_per_prompt {lim!r} has no whole `image` count")
            limit = d["image"]
        else:
            limit = _int(lim, "limit_mm_per_prompt", spec)
    buckets = VLLM_BUCKETS if b is None else _buckets(b, spec)
    live = {k: p for k, p in buckets.items() if p > 0}
    if not live:  # vLLM: "Bucket config values must be non-zero."
        raise ConfigError(f"{FIELD}: {spec!r}: every bucket has probability 0")
    video = [k for k in live if k[2] != 1]
    if video:
        raise ConfigError(f"{FIELD}: {spec!r}: bucket {video[0]} is a video ({video[0][2]} frames): video is not "
                          "modelled (images are frames = 1)")
    hi = min(limit, math.ceil(base * (1 + ratio)))
    lo = max(0, math.floor(base * (1 - ratio)))
    if lo > hi:  # vLLM: "Min num mm items is greater than max mm items"
        raise ConfigError(f"{FIELD}: {spec!r}: at least {lo} items per request but the limit is {hi}")
    total = sum(live.values())
    sizes = [f"{w}x{h}" for h, w, _ in live]  # (height, width, frames) -> WxH
    weights = [p / total for p in live.values()]
    out = _counts(lo, hi) | {"sizes": sizes}
    if len(set(weights)) > 1:
        out["weights"] = weights
    return out


def _sglang_resolution(v: str, spec: str) -> str:
    """SGLang `parse_image_resolution`: a preset (4k, 1080p, 720p, 360p; matched as written) or HEIGHTxWIDTH."""
    if v in SGLANG_PRESETS:
        w, h = SGLANG_PRESETS[v]
        return f"{w}x{h}"
    parts = v.strip().lower().split("x")
    if len(parts) == 2 and all(p.isdigit() for p in parts) and int(parts[0]) > 0 and int(parts[1]) > 0:
        return f"{int(parts[1])}x{int(parts[0])}"  # SGLang's custom form is height x width
    raise ConfigError(f"{FIELD}: {spec!r}: resolution {v!r} is not 4k, 1080p, 720p, 360p or HEIGHTxWIDTH")


def _bool(v: str, what: str, spec: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{FIELD}: {spec!r}: {what} {v!r} is not true or false")


def sglang_image(args: dict[str, str], spec: str, newer: bool) -> dict:
    """SGLang `--dataset-name image` (`sample_image_requests`, python/sglang/benchmark/datasets/image.py, and
    bench_serving.py before the split): `--image-count` N images per request (default 1), or with
    `--random-image-count` np.random.randint(1, N + 1); every image at `--image-resolution` (default 1080p);
    `--image-content blank` makes every image the same white picture. `--dataset-name random-image`
    (`RandomImageLoader`): `--random-image-num-images` (default 1) at `--random-image-resolution` (default 1080p)."""
    if newer:
        count = _take(args, spec, ("random_image_num_images", "num_images", "count"))
        res = _take(args, spec, ("random_image_resolution", "resolution"))
        rand, content = None, None
    else:
        count = _take(args, spec, ("image_count", "count"))
        res = _take(args, spec, ("image_resolution", "resolution"))
        rand = _take(args, spec, ("random_image_count", "random_count"))
        content = _take(args, spec, ("image_content", "content"))
    n = 1 if count is None else _int(count, "image count", spec, low=1)
    size = _sglang_resolution(res or SGLANG_DEFAULT_RESOLUTION, spec)
    randomised = rand is not None and _bool(rand, "random_image_count", spec)
    blank = False
    if content is not None:
        if content not in ("random", "blank"):
            raise ConfigError(f"{FIELD}: {spec!r}: image_content {content!r} is not random or blank")
        blank = content == "blank"
    if blank and randomised and n > 1:
        raise ConfigError(f"{FIELD}: {spec!r}: blank images with a random count: the same picture in every "
                          "request needs a fixed count")
    out = _counts(1, n) if randomised else {"share": 1.0, "per_request": {"kind": "fixed", "value": n}}
    return out | {"sizes": [size], "identical": blank}


def expand(spec: str) -> dict:
    """The `images:` fields a benchmark dataset sends (module docstring). A real-image dataset without a chosen
    end gives its large end here; `alternatives` gives both ends for the bound model to choose from."""
    key, args, end = parse(spec)
    if key == "random-mm":
        out = random_mm(args, spec)
    elif key in ("sglang-image", "sglang-random-image"):
        out = sglang_image(args, spec, newer=key == "sglang-random-image")
    else:
        d = REAL[key]
        out = {"share": 1.0, "per_request": {"kind": "fixed", "value": 1},
               "sizes": list(d.small if end == "small" else d.large)}
    if args:
        raise ConfigError(f"{FIELD}: {spec!r}: {sorted(args)[0]!r} is not a parameter of {key}")
    return out


def alternatives(spec: str | None) -> list[list[str]]:
    """The bracket's ends (each a sizes list) when the spec leaves the choice to the model (conservative), else []."""
    if not spec:
        return []
    key, _, end = parse(spec)
    if key not in REAL or end is not None or REAL[key].small == REAL[key].large:
        return []
    return [list(REAL[key].small), list(REAL[key].large)]
