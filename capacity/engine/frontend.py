"""The serving front end: what the server does for a request before its first token reaches the engine, beside
the engine's steps (docs/fidelity.md, "The server's front end").

Two terms, each an engine setting (`EngineConfig.frontend_ms`, `frontend_us_per_input_token`; None: the engine's
figure below):

- per request: the HTTP/OpenAI layer, the request's trip to the engine process and back (vLLM V1: the API server's
  `OpenAIServing` -> `AsyncLLM.add_request` -> `InputProcessor`/`Processor.process_inputs` -> ZMQ to `EngineCore`;
  the first token back through `OutputProcessor` and the streamed response), a pure latency (requests overlap in
  it: asyncio);
- per input token: tokenising the prompt. vLLM's API server tokenises on one thread (`OpenAIServing.
  _tokenizer_executor = ThreadPoolExecutor(max_workers=1)`; later releases' `AsyncMicrobatchTokenizer`, a
  "single-thread ThreadPoolExecutor"), SGLang's `TokenizerManager` in its event loop, trtllm-serve in its own: one
  FIFO worker, so a burst of long prompts queues for it (the simulator's `Delay.put(work_s=...)`).

Per output token (detokenising, streaming) is `output_cpu_us_per_token` (capacity/cost/overlap.py), not here; per
image (decoding, the multimodal processor) is capacity.engine.image_cpu, on the same serial worker.

The figures are MEASURED, never fitted to the published runs the project scores, and given as a range (host CPUs
differ); the engine uses the range's conservative (higher-latency) end, as the KV estimate plans on its
conservative end:

- per input token: a Hugging Face fast tokenizer (`tokenizers` 0.23, a 65k-vocab byte-level BPE) on this project's
  host (AMD EPYC, busy): 1.03 us/token on `vllm bench serve`'s random-token text, 1.89 us/token on prose, fastest of
  50 calls up to 1024 tokens (bench/frontend_cost.py -> bench/results/frontend.json). The same library serves all
  three engines.
- per request: the calibration recipe's fits on real vLLM 0.32 servers (CPU build, this host class):
  13.4, 14.1, 14.4 ms (bench/results/recipe_fidelity-vllm.json). SGLang and TensorRT-LLM have no measured figure
  yet: 0 (their TTFT keeps the engine's own time only), until a recipe run on them gives one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from capacity.engine import image_cpu

if TYPE_CHECKING:
    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard

# (low, high) of each measured range; the engine uses the high (conservative) end
TOKENISE_US_PER_TOKEN = (1.03, 1.89)  # bench/results/frontend.json, "tokenisation", fastest <= 1024 tokens
PER_REQUEST_MS = {"vllm": (13.4, 14.4), "sglang": (0.0, 0.0), "trtllm": (0.0, 0.0)}  # recipe fits (vLLM only)


class SimTerms(TypedDict, total=False):
    """The SimConfig fields of the front end (`frontend_images` only for a workload with images)."""
    frontend_s: float
    frontend_s_per_input_token: float
    frontend_images: image_cpu.ImageFrontEnd


def family(engine: str) -> str:
    """The engine family of an `engine` setting (`vllm@0.11:v0` -> vllm)."""
    return engine.split("@", 1)[0].split(":", 1)[0]


def defaults(engine: str, end: str = "conservative") -> tuple[float, float]:
    """(per request ms, per input token us) of an engine's front end, at one end of its measured range
    (`conservative`: the high end; `middle`)."""
    lo, hi = PER_REQUEST_MS.get(family(engine), (0.0, 0.0))
    tlo, thi = TOKENISE_US_PER_TOKEN
    if end == "middle":
        return (lo + hi) / 2, (tlo + thi) / 2
    return hi, thi


def terms(cfg: EngineConfig) -> tuple[float, float]:
    """(per request s, per input token s) for a configuration: its settings, else the engine's defaults."""
    ms, us = defaults(cfg.engine)
    if cfg.frontend_ms is not None:
        ms = cfg.frontend_ms
    if cfg.frontend_us_per_input_token is not None:
        us = cfg.frontend_us_per_input_token
    return ms / 1e3, us / 1e6


def sim_terms(cfg: EngineConfig, extra_s: float = 0.0, card: ModelCard | None = None, workload: Any = None) -> SimTerms:
    """The SimConfig fields of the front end: the engine's, plus `extra_s` of the deployment's own (a proxy), and
    with a model `card` and a `workload` with images, the per-image work (capacity.engine.image_cpu)."""
    per_req, per_tok = terms(cfg)
    out = SimTerms(frontend_s=extra_s + per_req, frontend_s_per_input_token=per_tok)
    if card is not None:
        out.update(image_cpu.sim_terms(cfg, card, workload))  # type: ignore[typeddict-item]
    return out


def note(cfg: EngineConfig, card: ModelCard | None = None, workload: Any = None) -> list[str]:
    """The run's lines on its front end where the engine's default (not the user's setting) adds to TTFT, and on
    its per-image work where the workload has images (capacity.engine.image_cpu)."""
    img = image_cpu.note(cfg, card) if card is not None and getattr(workload, "images", None) is not None else ""
    return _note(cfg) + ([img] if img else [])


def _note(cfg: EngineConfig) -> list[str]:
    if cfg.frontend_ms is not None and cfg.frontend_us_per_input_token is not None:
        return []
    per_req, per_tok = terms(cfg)
    if per_req == 0 and per_tok == 0:
        return []
    name = family(cfg.engine)
    lo, hi = PER_REQUEST_MS.get(name, (0.0, 0.0))
    measured = f"measured {lo:.3g}-{hi:.3g}" if hi > 0 else "not measured for this engine"
    return [f"TTFT includes {name}'s front end (tokenising, the API server): {per_req * 1e3:.3g} ms per request "
            f"({measured}) + {per_tok * 1e6:.3g} us per prompt token (measured "
            f"{TOKENISE_US_PER_TOKEN[0]:.3g}-{TOKENISE_US_PER_TOKEN[1]:.3g}), the high ends; "
            "--frontend-ms / --frontend-us-per-token set them (docs/fidelity.md)"]


__all__ = ["PER_REQUEST_MS", "SimTerms", "TOKENISE_US_PER_TOKEN", "defaults", "family", "note", "sim_terms", "terms"]
