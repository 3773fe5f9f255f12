"""Qwen2-VL and Qwen2.5-VL (vLLM qwen2_vl.py, qwen2_5_vl.py: a Qwen2 language model whose fields sit at the top of
the config, a ViT with a patch merger) and Qwen3.5 (qwen3_5.py: text_config is a qwen3_5_text hybrid, families/
hybrid.py; a Qwen3-VL-style ViT)."""
from __future__ import annotations

from capacity.model.families.registry import Family, register
from capacity.model.hf_vision import text_config, vision_tower


def _qwen2(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return cfg, "qwen2"


def _qwen3_5(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    text = text_config(cfg, mt, source)
    return text, text.get("model_type") or "llama"


register(Family("qwen2_vl", ("qwen2_5_vl", "qwen2_vl"), "vllm/model_executor/models/qwen2_vl.py, qwen2_5_vl.py",
                text=_qwen2, vision=vision_tower),
         Family("qwen3_5", ("qwen3_5",), "vllm/model_executor/models/qwen3_5.py", text=_qwen3_5, vision=vision_tower))
