"""Measure the CPU work a serving engine's API server does per IMAGE before the engine sees a vision-language
request (capacity.engine.image_cpu, docs/fidelity.md "Images in the server's front end"), one stage at a time, on
this host, one thread (the way vLLM's API server runs its multimodal processor: on its asyncio thread):

- `b64`: the data URL's payload -> bytes (`base64.b64decode`; vLLM `MediaConnector._load_data_url`);
- `decode`: bytes -> an RGB PIL image (`Image.open(...)`, `.load()`, `.convert("RGB")`; vLLM `ImageMediaIO.load_bytes`,
  run on the media thread pool, `VLLM_MEDIA_LOADING_THREAD_COUNT` = 8);
- `hash`: vLLM's processor-cache / prefix-cache key of the image (`MultiModalHasher.serialize_item`: the image as
  RGBA bytes, blake3), on the API server's thread;
- `process`: the Hugging Face Qwen2-VL image processor (`Qwen2VLImageProcessor`: smart_resize, rescale, normalise,
  patchify), on the API server's thread; skipped on a processor-cache hit.

Images are synthetic photos (smooth gradients + texture + noise: a JPEG of a random-noise image decodes far slower
than a photo's), encoded as JPEG (quality 90) and PNG, at sizes from 256x256 to 3840x2160. Each stage is timed
`--reps` times after a warm-up; the table gives the fastest wall time (ms; the JSON has the median and the fastest
CPU time too). `minimal` is the processor's work done plainly (PIL bicubic resize, float32 normalise, patchify in
numpy), a stand-in for a vectorised processor. The figures per megapixel (`per_mpx`) are from CPU time: this host is
shared, and its wall time adds the wait for a core (several times the CPU time when other jobs run).
Writes bench/results/image_preprocess.json with the host (CPU model, cores) and the time.

The processor needs `transformers` (and numpy, Pillow; blake3 for the hash, else sha256 stands in, said in the
JSON). Without torchvision transformers 5 runs the PIL backend of the processor (`Qwen2VLImageProcessorPil`, the
numpy path vLLM <= 0.10's transformers 4.x ran by default); with torchvision the default is the torch ("fast")
one, which this host could not load (the PyPI torchvision wheels do not match its CPU torch build). Run:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install transformers pillow numpy blake3
    /tmp/tfvenv/bin/python bench/image_preprocess.py            # about 1-2 minutes
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIZES = ((256, 256), (512, 512), (1024, 768), (1280, 720), (1920, 1080), (2560, 1440), (3840, 2160))
FORMATS = ("jpeg", "png")


def host_cpu() -> str:
    return next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), platform.processor() or "unknown CPU")


def photo(w: int, h: int, rng: np.random.Generator):
    """A photo-like RGB image: low-frequency gradients, some texture and a little noise ([h, w, 3] uint8)."""
    from PIL import Image

    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(1, 4, 3)
        img[..., c] = (128 + 60 * np.sin(2 * np.pi * fx * x / w + ph) * np.cos(2 * np.pi * fy * y / h)
                       + 25 * np.sin(x / 7.0 + c) * np.sin(y / 11.0))
    img += rng.normal(0, 6, img.shape).astype(np.float32)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def data_url(im, fmt: str) -> str:
    buf = io.BytesIO()
    im.save(buf, format=fmt.upper(), **({"quality": 90} if fmt == "jpeg" else {}))
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode()


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float, float]:
    """(fastest, median) wall seconds of `fn` over `reps` calls after one warm-up call, and its fastest CPU
    seconds (this process's: on a shared host the wall time includes waiting for a core)."""
    fn()
    ts, cs = [], []
    for _ in range(reps):
        c, t = time.process_time(), time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        cs.append(time.process_time() - c)
    return min(ts), statistics.median(ts), min(cs)


def minimal(img, grid: tuple[int, int, int], patch: int, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The processor's work done plainly (a stand-in for a vectorised, "fast" processor): resize to the grid's
    pixels (bicubic), rescale and normalise in float32, cut into [patches, 3 x 2 x patch x patch] (Qwen2-VL's
    temporal patch of 2 repeats the frame)."""
    from PIL import Image

    _, gh, gw = grid
    x = np.asarray(img.resize((gw * patch, gh * patch), Image.Resampling.BICUBIC), np.float32)
    x = (x * (1 / 255) - mean) / std  # [H, W, 3]
    x = x.reshape(gh, patch, gw, patch, 3).transpose(0, 2, 4, 1, 3).reshape(gh * gw, 3, 1, patch, patch)
    return np.ascontiguousarray(np.repeat(x, 2, axis=2)).reshape(gh * gw, -1)


def hasher() -> tuple[str, Callable[[bytes | memoryview], object]]:
    try:
        import blake3  # vLLM's default (VLLM_MM_HASHER_ALGORITHM)
        return "blake3", lambda b: blake3.blake3(b).hexdigest()
    except ImportError:
        return "sha256 (blake3 not installed)", lambda b: hashlib.sha256(b).hexdigest()


def per_mpx(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """The figures capacity.engine.image_cpu takes, each a (low, high) range in ms per megapixel over the images of
    512x512 and up (smaller ones are all fixed cost), from CPU time (the work a core of this host does; the wall
    time of this shared host adds the wait for a core, which says how busy it was, not what an image costs: it is
    in the JSON as `wall`): `decode` (pool threads): base64 + PIL decode per source Mpx; `serial` (the API server's
    thread): hash + the processor per (source + processed) Mpx, low from the plain numpy pipeline (a stand-in for a
    vectorised "fast" processor), high from the HF processor; `cached` (a processor-cache hit): the hash alone per
    source Mpx. `wall_*`: the same from the fastest wall times."""
    out: dict[str, tuple[float, float]] = {}
    for fmt in FORMATS:
        rs = [r for r in rows if r["format"] == fmt and r["source_px"] >= 512 * 512]
        src = [r["source_px"] / 1e6 for r in rs]
        both = [(r["source_px"] + r["processed_px"]) / 1e6 for r in rs]
        for i, clock in ((2, ""), (0, "wall_")):
            dec = [(r["b64_s"][i] + r["decode_s"][i]) * 1e3 / m for r, m in zip(rs, src)]
            hf = [(r["hash_s"][i] + r["process_s"][i]) * 1e3 / m for r, m in zip(rs, both)]
            plain = [(r["hash_s"][i] + r["minimal_s"][i]) * 1e3 / m for r, m in zip(rs, both)]
            hsh = [r["hash_s"][i] * 1e3 / m for r, m in zip(rs, src)]
            out[f"{clock}{fmt}_decode_ms_per_source_mpx"] = (min(dec), max(dec))
            out[f"{clock}{fmt}_serial_ms_per_mpx"] = (min(plain), max(hf))
            out[f"{clock}{fmt}_cached_ms_per_source_mpx"] = (min(hsh), max(hsh))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/image_preprocess.json")
    args = ap.parse_args()
    if args.reps < 1:
        sys.exit(f"--reps {args.reps}: must be at least 1")
    from PIL import Image
    try:
        import transformers
        from transformers import Qwen2VLImageProcessor
        # Qwen2-VL-7B-Instruct's preprocessor_config.json: min_pixels 3136, max_pixels 12845056 (the class's own
        # default caps at 28 x 28 x 1280 pixels; the released models ship this)
        proc = Qwen2VLImageProcessor(size={"shortest_edge": 3136, "longest_edge": 12845056})
        proc_name = f"{type(proc).__name__} (transformers {transformers.__version__})"
    except Exception as exc:  # the table still has the decode and hash stages
        proc, proc_name = None, f"not run: {type(exc).__name__}: {exc}"
    hname, hfn = hasher()
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'format':6} {'size':>10} {'MB':>6} {'b64':>7} {'decode':>8} {'hash':>7} {'process':>8} "
          f"{'minimal':>8} {'grid':>10}   (ms, fastest wall of {args.reps}; medians and CPU times in the JSON)")
    for w, h in SIZES:
        src = photo(w, h, rng)
        for fmt in FORMATS:
            url = data_url(src, fmt)
            payload = url.split(",", 1)[1]
            raw = base64.b64decode(payload)

            def decode(raw: bytes = raw):
                im = Image.open(io.BytesIO(raw))
                im.load()
                return im.convert("RGB")
            img = decode()
            b64 = timed(lambda p=payload: base64.b64decode(p), args.reps)
            dec = timed(decode, args.reps)
            hsh = timed(lambda im=img: hfn(np.asarray(im.convert("RGBA")).data), args.reps)
            row = {"format": fmt, "width": w, "height": h, "source_px": w * h, "bytes": len(raw),
                   "b64_s": b64, "decode_s": dec, "hash_s": hsh}
            if proc is not None:
                out = proc(images=[img], return_tensors="np")
                t, gh, gw = (int(v) for v in out["image_grid_thw"][0])
                row["processed_px"] = t * gh * gw * proc.patch_size ** 2
                row["grid_thw"] = [t, gh, gw]
                row["process_s"] = timed(lambda im=img: proc(images=[im], return_tensors="np"), args.reps)
                mean = np.asarray(proc.image_mean, np.float32)
                std = np.asarray(proc.image_std, np.float32)
                row["minimal_s"] = timed(lambda im=img, g=(t, gh, gw), m=mean, sd=std: minimal(im, g, proc.patch_size,
                                                                                                m, sd), args.reps)
            rows.append(row)
            p = row.get("process_s", (float("nan"),))[0] * 1e3
            m = row.get("minimal_s", (float("nan"),))[0] * 1e3
            print(f"{fmt:6} {f'{w}x{h}':>10} {len(raw) / 1e6:6.2f} {b64[0] * 1e3:7.2f} {dec[0] * 1e3:8.2f} "
                  f"{hsh[0] * 1e3:7.2f} {p:8.2f} {m:8.2f} {str(row.get('grid_thw', '-')):>10}")
    fits = per_mpx(rows) if proc is not None else {}
    print("\nper megapixel, images of 512x512 and up (CPU time; wall_: the busy host's wall time):")
    for k, (lo, hi) in fits.items():
        print(f"  {k:34} {lo:6.1f} - {hi:6.1f} ms/Mpx")
    result = {
        "what": "per-image CPU work of a serving API server before the engine (bench/image_preprocess.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpu": host_cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                 "numpy": np.__version__, "pillow": Image.__version__ if hasattr(Image, "__version__") else
                 __import__("PIL").__version__, "processor": proc_name, "hash": hname,
                 "note": "shared host: other jobs ran at the same time; the fastest of the reps is the figure"},
        "reps": args.reps, "rows": rows, "fits": fits,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
