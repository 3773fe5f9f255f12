"""LLaVA-1.5 and LLaVA-NeXT (vLLM llava.py, llava_next.py: a CLIP or SigLIP tower, a two-layer projector; NeXT's
anyres tiles) and Mistral-3 (mistral3.py: a Pixtral tower, a patch merger) over a Llama, Mistral or Qwen2
language model (text_config)."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, register
from capacity.model.hf_vision import text_config, vision_tower


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    text = text_config(cfg, mt, source)
    tmt = text.get("model_type") or "llama"
    if tmt not in ("llama", "mistral", "qwen2"):
        raise ConfigError(f"{source}: text_config.model_type {tmt!r} is not supported for {mt}")
    return text, tmt


register(Family("llava", ("llava", "llava_next", "mistral3"), "vllm/model_executor/models/llava.py, llava_next.py, "
                "mistral3.py", text=_text, vision=vision_tower))
