"""GLM-4.5/4.6/4.7 (vLLM glm4_moe.py) and GLM-4.5V (glm4_1v.py over glm4_moe.py).

glm4_moe: DeepSeek-style routed and shared experts with the first first_k_dense_replace layers dense, GQA attention
(no MLA), optional q/k biases and q/k norm. The router (`Glm4MoE.__init__`): `gate = nn.Linear(hidden, n_routed_experts,
bias=False, dtype=torch.float32)` and `gate.e_score_correction_bias = nn.Parameter(torch.empty(n_routed_experts,
dtype=torch.float32))`, both replicated: the weight hook stores them in float32.

glm4v_moe (GLM-4.5V): `Glm4vMoeForConditionalGeneration` (glm4_1v.py) builds its language model from text_config as
`Glm4MoeForCausalLM` (the glm4_moe layout above) and a `Glm4vVisionTransformer`: a 3D patch embedding (a linear of
3 x temporal_patch_size x patch^2 inputs, with bias), an RMSNorm, learned position embeddings over
(image_size / patch)^2 positions, depth blocks (two RMSNorms, qkv and proj without bias, a gated MLP of
out_hidden_size without bias), an RMSNorm, a Conv2d downsample (hidden -> out_hidden_size over merge x merge
patches, with bias) and a merger (proj out x out, a LayerNorm, gate/up/down of vision intermediate_size, no biases):
the downsample and the merger are the projector.

glm4 (GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): vLLM glm4.py `Glm4DecoderLayer`: Llama's attention with q/k/v biases
(attention_bias, Glm4Config's default true), o_proj without, a gated MLP (merged gate_up_proj), and four RMSNorms a
layer (input, post_self_attn, post_attention, post_mlp). glm4v (GLM-4.1V-9B-Thinking): `Glm4vForConditionalGeneration`
builds its language model as `Glm4ForCausalLM` from the text fields (top-level in the first configs, text_config in
later ones) and the same Glm4vVisionTransformer as GLM-4.5V.

glm4_moe_lite (GLM-4.7-Flash): vLLM glm4_moe_lite.py `Glm4MoeLiteDecoderLayer`: DeepSeek-V2's MLA attention
(`Glm4MoeLiteMLAAttention(DeepseekV2MLAAttention)`: q_lora_rank, kv_lora_rank, qk_nope / qk_rope / v head dims from
the config) and glm4_moe's MoE (`Glm4MoeLite(Glm4MoE)`: the float32 router and score bias above) from
first_k_dense_replace on, the dense layers a `Glm4MoeMLP` of intermediate_size; two RMSNorms a layer. Its rotary
embedding turns qk_rope_head_dim (the MLA card's rotary width), so a partial_rotary_factor other than 1.0 is refused.
The MTP layer (num_nextn_predict_layers) is skipped by `load_weights` (`get_spec_layer_idx_from_weight_name`).

Every other GLM here rotates half of each head (partial_rotary_factor 0.5, the config classes' default): vLLM's
get_rope(rotary_dim=head_dim x 0.5) caches max_position x head_dim / 2 cos/sin values, so the family's
`partial_rotary` is 0.5 and a config stating another factor is refused, naming the field.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.deepseek import mla_moe_fields
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config, vision_config
from capacity.model.vision_tokens import GLM4V_MAX_PIXELS, GLM4V_MIN_PIXELS
from capacity.model.weights import TensorGroup

# vLLM's profiling image for GLM-4.1V/4.5V (Glm4vProcessingInfo, glm4_1v.py): get_image_size_with_most_features is
# smart_resize of a 9,999,999-pixel square at 16 frames under 28 x 28 x 2 x 30000 pixels: 61 x 28 = 1,708 pixels a
# side (14,884 patches); get_max_image_tokens, what sizes the encoder budget's items, resizes that image again under
# 28 x 28 x 2 x 6144 at 16 frames: 756 pixels, 8 x 54 x 54 patches, 5,832 tokens. The card's tokens_per_image is
# vLLM's figure (what the memory model's profile and the encoder budget read), not the largest prompt image: under
# the processor's bounds an image makes up to 6,144 tokens (1792 x 2688: 64 x 96 merged), and the simulator sizes
# the encoder budget with the larger of the card's figure and the workload's largest image (capacity.sim.vision).
PROFILE_SIDE, PROFILE_TOKENS = 1708, 5832
# the image processor's size as the GLM-4.1V / GLM-4.5V repositories ship it in preprocessor_config.json
# (shortest_edge 12,544 = 112 x 112, longest_edge 9,633,792 = 28 x 28 x 2 x 6144, the default of transformers'
# smart_resize and vLLM's get_num_image_tokens bound; Glm4vImageProcessor's class default 28 x 28 x 15000 applies
# only without one), compared with 2 frames x h x w (capacity.model.vision_tokens.glm4v)
GLM4V_PIXELS = {"min_pixels": GLM4V_MIN_PIXELS, "max_pixels": GLM4V_MAX_PIXELS}


def _half_rotary(text: dict, source: str) -> None:
    params = text.get("rope_parameters")
    rope: dict = params if isinstance(params, dict) else {}
    factor = text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
    if factor != 0.5:
        raise ConfigError(f"{source}: partial_rotary_factor {factor!r} is not supported for "
                          f"{text.get('model_type') or 'GLM'} (0.5 only: the cos/sin cache is sized for half a head)")


def _glm4(text: dict, card: dict, need: Need, source: str) -> None:
    _half_rotary(text, source)
    card.update(attention_bias=bool(text.get("attention_bias", True)), norms_per_layer=4)


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    _half_rotary(text, source)
    card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": text.get("n_shared_experts") or 0,
                   "first_dense_layers": text.get("first_k_dense_replace", 0)}
    card.update(attention_bias=bool(text.get("attention_bias")), qk_norm=bool(text.get("use_qk_norm")))


def _lite(text: dict, card: dict, need: Need, source: str) -> None:
    factor = text.get("partial_rotary_factor", 1.0)
    if factor != 1.0:
        raise ConfigError(f"{source}: partial_rotary_factor {factor!r} is not supported for glm4_moe_lite (1.0 only: "
                          "MLA rotates its qk_rope_head_dim channels)")
    mla_moe_fields(text, card, need)


def _fp32_router(card, groups: list) -> list:
    """Glm4MoE.gate (float32 nn.Linear) and gate.e_score_correction_bias (float32), replicated."""
    out = []
    for t in groups:
        if t.name == "router":  # count: the MoE layers; rows: the routed experts; cols: hidden
            out += [TensorGroup("router", t.count, t.rows, t.cols, "replicated", "fp32"),
                    TensorGroup("router_score_bias", t.count, 1, t.rows, "replicated", "fp32")]
        else:
            out.append(t)
    return out


def _glm4v_moe_text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    return text_config(cfg, mt, source), "glm4_moe"  # vLLM: architectures=["Glm4MoeForCausalLM"]


def _glm4v_text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    text = cfg.get("text_config")
    return (text if isinstance(text, dict) else cfg), "glm4"  # vLLM: architectures=["Glm4ForCausalLM"]


def _glm4v_vision(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    _, need = vision_config(cfg, mt, ("glm4v_moe_vision", "glm4v_moe", "glm4v_vision", "glm4v", None), source)
    h, out, ctx = need("hidden_size"), need("out_hidden_size"), need("intermediate_size")
    p, merge, image = need("patch_size", 14), need("spatial_merge_size", 2), need("image_size", 336)
    downsample = h * out * merge * merge + out  # Conv2d with bias
    merger = out * out + 2 * out + 3 * out * ctx  # proj, post_projection_norm (LayerNorm), gate/up and down
    return {"kind": "glm4v", "num_layers": need("depth"), "hidden_size": h, "intermediate_size": out,
            "num_heads": need("num_heads"), "patch_size": p, "image_size": PROFILE_SIDE,
            "position_embeddings": (image // p) ** 2, "projector_params": downsample + merger,
            "tokens_per_image": PROFILE_TOKENS, "merge_size": merge, **GLM4V_PIXELS}


register(Family("glm4_moe_lite", ("glm4_moe_lite",), "vllm/model_executor/models/glm4_moe_lite.py", shape=_lite,
                weights=_fp32_router),
         Family("glm4_moe", ("glm4_moe",), "vllm/model_executor/models/glm4_moe.py", shape=_shape,
                weights=_fp32_router, partial_rotary=0.5),
         Family("glm4v_moe", ("glm4v_moe",), "vllm/model_executor/models/glm4_1v.py, glm4_moe.py",
                text=_glm4v_moe_text, vision=_glm4v_vision, weights=_fp32_router, partial_rotary=0.5),
         Family("glm4", ("glm4",), "vllm/model_executor/models/glm4.py", shape=_glm4, partial_rotary=0.5),
         Family("glm4v", ("glm4v",), "vllm/model_executor/models/glm4_1v.py, glm4.py", text=_glm4v_text,
                vision=_glm4v_vision, partial_rotary=0.5))
