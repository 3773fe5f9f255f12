"""Gemma-2 and Gemma-3 (vLLM gemma2.py, gemma3.py, gemma3_mm.py): four RMSNorms a layer (input, post-attention,
pre- and post-feedforward), tied embeddings, a final logit soft-cap (Gemma-2); sliding-window layers (Gemma-2:
every other layer from the first; Gemma-3: all but every sliding_window_pattern-th), Gemma-3's q/k norm and its
sliding layers' own unscaled rotary cache. Gemma-3 with images wraps gemma3_text with a SigLIP tower.

Gemma 1 (`gemma`, vLLM gemma.py `GemmaForCausalLM`): two RMSNorms a layer, a gated GELU MLP (GeluAndMul over a
merged gate_up_proj), head_dim from the config (256), no biases, no sliding window, and the LM head always the
embedding (vLLM builds no lm_head: `logits_processor(self.model.embed_tokens, ...)`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config, vision_config, vit_fields


def _norms(text: dict, card: dict, need: Need, source: str) -> None:
    card["norms_per_layer"] = 4  # input, post-attention, pre- and post-feedforward
    tie = text.get("tie_word_embeddings")
    card["tie_word_embeddings"] = True if tie is None else bool(tie)
    if text.get("final_logit_softcapping"):
        card["final_logit_softcap"] = text["final_logit_softcapping"]


def _gemma1(text: dict, card: dict, need: Need, source: str) -> None:
    if text.get("attention_bias"):
        raise ConfigError(f"{source}: attention_bias true is not supported for gemma (the published checkpoints "
                          "have none)")
    card["tie_word_embeddings"] = True  # vLLM's GemmaForCausalLM has no lm_head of its own


def _gemma3(text: dict, card: dict, need: Need, source: str) -> None:
    card["qk_norm"] = True
    _norms(text, card, need, source)


def _gemma2_sliding(text: dict, layers: int, window: Any, defaults: Mapping[str, Any]) -> int:
    return (layers + 1) // 2  # even layers (0, 2, ...) slide


def _gemma3_sliding(text: dict, layers: int, window: Any, defaults: Mapping[str, Any]) -> int:
    pattern = text.get("sliding_window_pattern") or defaults["sliding_window_pattern"]
    return layers - layers // pattern  # every pattern-th layer is global


def _gemma3_text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return text_config(cfg, mt, source), "gemma3_text"


def _siglip(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    """Gemma-3's SigLIP tower; its projector (an RMSNorm and one linear) pools to mm_tokens_per_image tokens."""
    v, need = vision_config(cfg, mt, ("siglip_vision_model",), source)
    out = vit_fields(v, need)
    h = out["hidden_size"]
    out.update(kind="siglip", num_layers=need("num_hidden_layers"), projector_params=h * text_hidden + h,
               tokens_per_image=cfg.get("mm_tokens_per_image", 256))
    return out


register(Family("gemma", ("gemma",), "vllm/model_executor/models/gemma.py",
                defaults={"tie_word_embeddings": True, "head_dim": 256}, shape=_gemma1),
         Family("gemma2", ("gemma2",), "vllm/model_executor/models/gemma2.py",
                defaults={"tie_word_embeddings": True}, shape=_norms, sliding=_gemma2_sliding),
         Family("gemma3_text", ("gemma3_text",), "vllm/model_executor/models/gemma3.py",
                defaults={"vocab_size": 262208, "max_position_embeddings": 131072, "head_dim": 256,
                          "sliding_window": 4096, "num_attention_heads": 8, "num_key_value_heads": 4,
                          "tie_word_embeddings": True, "sliding_window_pattern": 6},
                shape=_gemma3, sliding=_gemma3_sliding, local_rope=True),
         Family("gemma3", ("gemma3",), "vllm/model_executor/models/gemma3_mm.py", text=_gemma3_text,
                vision=_siglip, sglang_text_only=True))
