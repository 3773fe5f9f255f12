"""Llama-like dense decoders: Llama, Seed-OSS (vLLM seed_oss.py: Llama's layout, q/k/v biases where the config's
attention_bias says so), Mistral and Phi-3/Phi-4 (vLLM llama.py / phi3.py: Llama's layout; the whole model slides
where sliding_window is shorter than the context: Mistral-7B v0.1, Phi-3-mini-4k). Phi-3's longrope scaling
(Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini) keeps three cos/sin caches (families/phi.py `longrope_caches`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity.model.families.phi import longrope_caches
from capacity.model.families.registry import Family, Need, register


def attention_bias(text: dict, card: dict, need: Need, source: str) -> None:
    if text.get("attention_bias"):
        card["attention_bias"] = True


def whole_model_slides(text: dict, layers: int, window: Any, defaults: Mapping[str, Any]) -> int:
    if window and not text.get("use_sliding_window", True):
        return 0
    return layers if window and window < (text.get("max_position_embeddings") or 0) else 0


def _phi3(text: dict, card: dict, need: Need, source: str) -> None:
    longrope_caches(text, card, source)


register(Family("llama", ("llama", "seed_oss"), "vllm/model_executor/models/llama.py, seed_oss.py",
                shape=attention_bias),
         Family("mistral", ("mistral",), "vllm/model_executor/models/llama.py",
                defaults={"max_position_embeddings": 32768}, sliding=whole_model_slides),
         Family("phi3", ("phi3",), "vllm/model_executor/models/phi3.py", shape=_phi3, sliding=whole_model_slides))
