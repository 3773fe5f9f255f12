"""Llama-3.2-Vision (vLLM mllama.py): a Llama decoder with cross_attention_layers that attend to the image
(their KV holds the image's encoder output, not the text: q/k norms and two tanh gates each), 8 extra embedding
rows for the image tokens, and Mllama's tiled vision encoder."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config, vision_config, vit_fields


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    cross = text.get("cross_attention_layers") or []
    if not isinstance(cross, list):
        raise ConfigError(f"{source}: text_config.cross_attention_layers {cross!r} is not a list")
    card["cross_attention_layers"] = len(cross)
    card["extra_vocab"] = 8  # the embedding holds vocab_size + 8 rows (image tokens)


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return text_config(cfg, mt, source), "mllama_text_model"


def _tiled(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    """Mllama's tiled encoder: local layers, gated global layers, kept intermediate outputs, aspect-ratio
    embeddings per tile; the projector maps vision_output_dim to the language model."""
    v, need = vision_config(cfg, mt, ("mllama_vision_model",), source)
    out = vit_fields(v, need, heads_key="attention_heads")
    layers = need("num_hidden_layers")
    ratios = v.get("supported_aspect_ratios") or []
    out_dim = need("vision_output_dim")
    kept = v.get("intermediate_layers_indices") or []
    out.update(kind="mllama", num_layers=layers, num_global_layers=v.get("num_global_layers", 8),
               kept_layer_outputs=len(kept) if isinstance(kept, list) else 0,
               max_num_tiles=need("max_num_tiles", 4), num_aspect_ratios=len(ratios) + 1,
               projector_params=out_dim * text_hidden + text_hidden,
               tokens_per_image=need("max_num_tiles", 4) * ((out["image_size"] // out["patch_size"]) ** 2 + 1))
    return out


register(Family("mllama_text_model", ("mllama_text_model",), "vllm/model_executor/models/mllama.py",
                defaults={"vocab_size": 128256}, shape=_shape),
         Family("mllama", ("mllama",), "vllm/model_executor/models/mllama.py", text=_text, vision=_tiled))
