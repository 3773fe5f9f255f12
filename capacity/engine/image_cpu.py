"""Images in the server's front end: the CPU work an engine's API server does per image of a vision-language request
before the engine sees it (docs/fidelity.md, "Images in the server's front end"; docs/vision.md).

Per image, two parts, as the engines' code runs them:

- decoding (the data URL's base64 -> bytes -> an RGB PIL image): vLLM on its media thread pool
  (`MediaConnector.load_from_url_async` -> `loop.run_in_executor(global_thread_pool, self._load_data_url, ...)`,
  vllm/multimodal/utils.py in 0.11-0.12, vllm/multimodal/media/connector.py later; `VLLM_MEDIA_LOADING_THREAD_COUNT`
  = 8 threads), SGLang on its `io_executor` threads (`BaseMultimodalProcessor._load_single_item`,
  python/sglang/srt/multimodal/processors/base_processor.py): a pool, so requests decode side by side, a latency
  each (`lag_s`); trtllm-serve decodes in the request's coroutine (`async_load_image` -> `load_base64_image`,
  tensorrt_llm/inputs/utils.py), on its event loop: serial.
- processing (hashing, resizing to the processor's resolution, rescaling, normalising, patchifying): vLLM runs the
  multimodal processor synchronously on the API server's asyncio thread (`AsyncLLM.add_request` ->
  `Processor`/`InputProcessor.process_inputs` -> `InputPreprocessor._process_multimodal` -> `mm_processor.apply`
  in 0.11-0.12; `BaseRenderer.process_for_engine` -> `_process_multimodal` later), one per API server process;
  SGLang's `TokenizerManager` calls `process_mm_data` (the HF processor's `__call__`) in its event loop
  (`mm_processor_worker_num` 1 by default); trtllm-serve's `BaseLLM.generate_async` calls `self.input_processor`
  in its. One serial worker each: the work queues FIFO (`work_s`), on the same worker as tokenising
  (capacity.engine.frontend; in vLLM two threads, so summing them on one is the conservative side).

vLLM's processor cache (`--mm-processor-cache-gb`, 4 GiB by default; `BaseMultiModalProcessor._cached_apply_hf_processor`)
keys an image by its content hash (`MultiModalHasher.hash_kwargs`: the image as RGBA bytes, blake3), so an image
seen before (`images.identical`) skips the processor but is still decoded and hashed. SGLang and trtllm-serve have
no processor cache in the front end: every image is processed.

The figures are MEASURED (bench/image_preprocess.py -> bench/results/image_preprocess.json: Qwen2-VL's processor
with the released models' max_pixels, JPEG and PNG from 512x512 to 3840x2160, on this project's host), per megapixel,
as a range of CPU time (the work of one core; the shared host's wall time, which adds the wait for a core, is in the
JSON too): decoding's over the image sizes; processing's from a plain numpy pipeline (a stand-in for a vectorised
"fast" processor) to the HF processor; the engine uses the high end. Host CPUs differ: a server whose API server
shares its cores with other work is slower (the same images took 2-4x their CPU time in wall time on this busy
host); `--frontend-ms-per-image-mpx` sets a measured figure. Processing is counted per megapixel of the source image plus of the processed image (the
resize reads the one, the normalise and patchify write the other), with the processed pixels the model's encoder
patches x patch_size^2 (capacity.model.vision_tokens). Decoding is a JPEG's (what `vllm bench serve` sends: `process_image`,
vllm/benchmarks/datasets.py, encodes its images as JPEG); a PNG decodes about 3x slower (the JSON). SGLang's fast
image processors run their tensor ops on the GPU (`process_mm_data` passes `device="cuda"`), so the CPU figure is
its upper end there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capacity.draws import Request
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard

# (low, high) ms per megapixel of CPU time; bench/results/image_preprocess.json, "fits" (images of 512x512 and up)
DECODE_MS_PER_MPX = (4.95, 7.16)  # base64 + PIL decode of a JPEG, per source Mpx
PROCESS_MS_PER_MPX = (17.19, 28.07)  # hash + processor per (source + processed) Mpx: plain numpy .. HF Qwen2-VL
HASH_MS_PER_MPX = (2.31, 3.65)  # a processor-cache hit: the hash alone, per source Mpx (vLLM)


@dataclass(frozen=True)
class EngineRules:
    """Where an engine's API server does each part of an image's work (module docstring)."""
    decode_pool: bool  # decoding on a thread pool (a latency per request) rather than the serial worker
    processor_cache: bool  # an image seen before skips the processor (its hash is still computed)


RULES = {"vllm": EngineRules(decode_pool=True, processor_cache=True),
         "sglang": EngineRules(decode_pool=True, processor_cache=False),
         "trtllm": EngineRules(decode_pool=False, processor_cache=False)}


@dataclass(frozen=True)
class ImageFrontEnd:
    """One run's per-image front-end work: `work(req, seen)` -> (lag_s, work_s) of a request's images: `lag_s` on a
    pool (in parallel with other requests), `work_s` on the server's serial worker. `seen`: the identical images'
    keys processed so far in this run (the simulator's, so each run starts cold)."""
    decode_s_per_px: float
    process_s_per_px: float  # per source + processed pixel
    hash_s_per_px: float
    px_per_patch: int  # the encoder's patch_size^2
    rules: EngineRules

    def image_s(self, src_px: int, patches: int, cached: bool) -> tuple[float, float]:
        """(decode s, serial s) of one image of `src_px` source pixels and `patches` encoder patches."""
        dec = self.decode_s_per_px * src_px
        proc = self.hash_s_per_px * src_px if cached else self.process_s_per_px * (src_px + patches * self.px_per_patch)
        return dec, proc

    def work(self, req: Request, seen: set[int]) -> tuple[float, float]:
        lag = serial = 0.0
        for (_, _, seq, seqs, key), px in zip(req.images, req.image_px):
            cached = self.rules.processor_cache and key >= 0 and key in seen
            if key >= 0:
                seen.add(key)
            dec, proc = self.image_s(px, seq * seqs, cached)
            if self.rules.decode_pool:
                lag = max(lag, dec)  # a request's images decode side by side on the pool (gathered)
            else:
                serial += dec
            serial += proc
        return lag, serial


def family(engine: str) -> str:
    return engine.split("@", 1)[0].split(":", 1)[0]


def defaults(end: str = "conservative") -> tuple[float, float, float]:
    """(decode, process, hash) ms per megapixel at one end of the measured ranges (`conservative`: high; `middle`)."""
    rs = (DECODE_MS_PER_MPX, PROCESS_MS_PER_MPX, HASH_MS_PER_MPX)
    if end == "middle":
        return tuple((lo + hi) / 2 for lo, hi in rs)  # type: ignore[return-value]
    return tuple(hi for _, hi in rs)  # type: ignore[return-value]


def front_end(cfg: EngineConfig, card: ModelCard) -> ImageFrontEnd | None:
    """The run's per-image term for a model with a vision tower (None for a text-only model, or with the setting
    at 0: the images' front-end work left out, their decoding too)."""
    v = card.vision
    if v is None:
        return None
    dec, proc, hsh = defaults()
    if cfg.frontend_ms_per_image_mpx == 0:  # the engine alone: no per-image work in the front end
        return None
    if cfg.frontend_ms_per_image_mpx is not None:  # the user's figure replaces the processing (the hash scales too)
        proc, hsh = cfg.frontend_ms_per_image_mpx, hsh * cfg.frontend_ms_per_image_mpx / proc
    return ImageFrontEnd(dec * 1e-9, proc * 1e-9, hsh * 1e-9, v.patch_size ** 2,
                         RULES.get(family(cfg.engine), RULES["vllm"]))


def sim_terms(cfg: EngineConfig, card: ModelCard, workload: Any) -> dict[str, Any]:
    """The SimConfig field of the per-image front end: none unless the workload's requests carry images."""
    if getattr(workload, "images", None) is None:
        return {}
    fe = front_end(cfg, card)
    return {} if fe is None else {"frontend_images": fe}


def note(cfg: EngineConfig, card: ModelCard) -> str:
    """A line on the per-image term, for a run with images."""
    fe = front_end(cfg, card)
    if fe is None:
        return ""
    at = "its pool" if fe.rules.decode_pool else "its one worker"
    cache = ", skipped for an image seen before (the processor cache)" if fe.rules.processor_cache else ""
    (dlo, dhi), (plo, phi) = DECODE_MS_PER_MPX, PROCESS_MS_PER_MPX
    given = "set" if cfg.frontend_ms_per_image_mpx is not None else f"measured {plo:.3g}-{phi:.3g}"
    return (f"TTFT includes {family(cfg.engine)}'s per-image CPU work before the engine: decoding "
            f"{fe.decode_s_per_px * 1e9:.3g} ms/Mpx on {at} (measured {dlo:.3g}-{dhi:.3g}), processing "
            f"{fe.process_s_per_px * 1e9:.3g} ms per Mpx of source + processed image ({given}) on its one "
            f"worker{cache}; --frontend-ms-per-image-mpx sets it, 0 leaves it out (docs/fidelity.md)")


__all__ = ["DECODE_MS_PER_MPX", "HASH_MS_PER_MPX", "PROCESS_MS_PER_MPX", "RULES", "EngineRules", "ImageFrontEnd",
           "defaults", "front_end", "note", "sim_terms"]
