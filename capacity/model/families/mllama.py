"""Llama-3.2-Vision (vLLM mllama.py): a Llama decoder with cross_attention_layers that attend to the image
(their KV holds the image's encoder output, not the text: q/k norms and two tanh gates each), 8 extra embedding
rows for the image tokens, and Mllama's tiled vision encoder."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config, vision_tower


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    cross = text.get("cross_attention_layers") or []
    if not isinstance(cross, list):
        raise ConfigError(f"{source}: text_config.cross_attention_layers {cross!r} is not a list")
    card["cross_attention_layers"] = len(cross)
    card["extra_vocab"] = 8  # the embedding holds vocab_size + 8 rows (image tokens)


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return text_config(cfg, mt, source), "mllama_text_model"


register(Family("mllama_text_model", ("mllama_text_model",), "vllm/model_executor/models/mllama.py",
                defaults={"vocab_size": 128256}, shape=_shape),
         Family("mllama", ("mllama",), "vllm/model_executor/models/mllama.py", text=_text, vision=vision_tower))
