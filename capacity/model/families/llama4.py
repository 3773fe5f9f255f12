"""Llama-4 Scout and Maverick (`llama4`, its language model `llama4_text`): vLLM llama4.py and mllama4.py.

Language model (vLLM llama4.py `Llama4DecoderLayer`): layer i is a MoE where (i + 1) % interleave_moe_layer_step == 0
(Scout: step 1, every layer; Maverick: step 2, every other layer), else a dense `LlamaMLP` of intermediate_size_mlp.
`Llama4MoE`: a replicated router (hidden -> num_local_experts, no bias), `FusedMoE` experts of intermediate_size,
num_experts_per_tok per token, and one always-on `shared_expert` (a `LlamaMLP` of intermediate_size). Attention has
no biases; its q/k norm (`use_qk_norm`) is an RMSNorm with has_weight=False, so it holds no parameters. A layer whose
no_rope_layers entry is 0 has no rotary embedding (NoPE, global attention); the others rotate and attend within
chunks of attention_chunk_size tokens (transformers Llama4TextConfig: no_rope_layers empty means every
no_rope_layer_interval-th layer (4) is NoPE). One cos/sin cache of max_position_embeddings x head_dim (llama3 rope
scaling keeps the unscaled length), 2.5 GiB for Scout's 10,485,760 positions.

KV cache: every layer keeps one. The chunked layers are counted as full-attention layers: vLLM turns the hybrid KV
cache manager off for a model with attention_chunk_size (unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE),
so each of their blocks is allocated like a full-attention layer's (and with max_model_len <= the chunk, it holds
as many tokens). This is the safe side: never more KV tokens than the engine has (the Scout log at vLLM 0.19, TP 4:
16.75 GiB for 365,968 tokens, 48 layers x 2 KV heads x 128 x 2 x 2 bytes a token).

Vision tower (vLLM mllama4.py `Llama4VisionModel`): a ViT laid out as CLIP's (an unfolded patch linear without bias,
a class embedding, (patches + 1) learned positions, pre and post LayerNorms, encoder layers of LayerNorms, q/k/v/o
with biases and a GELU MLP with biases), so it is sized as the `clip` kind; the pixel-shuffle adapter
(`Llama4VisionPixelShuffleMLP`: intermediate_size -> projector_input_dim -> projector_output_dim, no biases) and the
projector (`Llama4MultiModalProjector`: vision_output_dim -> text hidden, no bias) are the projector parameters. An
image is up to 16 tiles of image_size plus a global tile (the processor's max_patches 16), each 144 tokens after the
2x2 pixel shuffle (336 / 14 = 24, 576 patches x 0.5 x 0.5). The card's tokens_per_image, 17 x 144 = 2,448, is the
encoder's output rows for vLLM's profiling image (`get_image_size_with_most_features`: 16 x 336 by 336, 16 tiles and
the global one), what vLLM V1's encoder budget and cache count (`Request.get_num_encoder_embeds`, the <|patch|>
positions `PromptUpdateDetails.select_text` marks); that image's prompt string holds 2,467 tokens with the tile
separators and image markers. What a prompt's image becomes: capacity.model.vision_tokens.llama4 (the tile canvas of
Llama4ImageProcessorFast `get_best_fit`, Llama4Processor `_prompt_split_image`).
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config, vision_config, vit_fields

_NOPE_INTERVAL = 4  # transformers Llama4TextConfig no_rope_layer_interval
_MAX_TILES = 16  # Llama4ImageProcessor max_patches (vLLM mllama4.py reads it as the tile limit)


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    layers = card["num_layers"]
    step = text.get("interleave_moe_layer_step", 1)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ConfigError(f"{source}: text_config.interleave_moe_layer_step {step!r} must be a non-negative integer")
    moe_layers = sum(1 for i in range(layers) if step > 0 and (i + 1) % step == 0)
    nope = text.get("no_rope_layers")
    if nope and (not isinstance(nope, list) or len(nope) != layers):
        raise ConfigError(f"{source}: text_config.no_rope_layers must have one entry per layer ({layers})")
    if text.get("attention_bias"):
        raise ConfigError(f"{source}: text_config.attention_bias true is not supported for llama4 (vLLM builds its "
                          "attention without biases)")
    moe = need("intermediate_size", label="text_config.")
    card["intermediate_size"] = need("intermediate_size_mlp", label="text_config.") if moe_layers < layers else moe
    card["moe_layers"], card["dense_mlp_layers"] = moe_layers, layers - moe_layers
    if moe_layers:
        card["moe"] = {"num_experts": need("num_local_experts", label="text_config."),
                       "experts_per_token": need("num_experts_per_tok", label="text_config."),
                       "moe_intermediate_size": moe, "num_shared_experts": 1, "shared_expert_intermediate_size": moe}


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return text_config(cfg, mt, source), "llama4_text"


def _vision(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    v, need = vision_config(cfg, mt, ("llama4_vision_model",), source)
    out = vit_fields(v, need)
    ratio = v.get("pixel_shuffle_ratio", 0.5)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
        raise ConfigError(f"{source}: vision_config.pixel_shuffle_ratio {ratio!r} must be a number in (0, 1]")
    if v.get("multi_modal_projector_bias"):
        raise ConfigError(f"{source}: vision_config.multi_modal_projector_bias true is not supported (the published "
                          "Llama-4 checkpoints have none)")
    proj_in, proj_out = need("projector_input_dim"), need("projector_output_dim")
    adapter = need("intermediate_size") * proj_in + proj_in * proj_out  # pixel-shuffle MLP: fc1, fc2, no biases
    patches = (out["image_size"] // out["patch_size"]) ** 2
    per_tile = int(patches * ratio * ratio)
    out.update(kind="clip", num_layers=need("num_hidden_layers"), post_layernorm=True,
               projector_params=adapter + need("vision_output_dim") * text_hidden,
               max_num_tiles=_MAX_TILES + 1, tokens_per_image=(_MAX_TILES + 1) * per_tile)
    return out


register(Family("llama4_text", ("llama4_text",), "vllm/model_executor/models/llama4.py", shape=_shape),
         # SGLang serves Llama4ForConditionalGeneration text-only unless --enable-multimodal (model_config.py
         # mm_disabled_models), as Gemma-3
         Family("llama4", ("llama4",), "vllm/model_executor/models/mllama4.py", text=_text, vision=_vision,
                sglang_text_only=True))
