"""Kimi-K2.5 (`kimi_k25`, moonshotai/Kimi-K2.5), as vLLM builds it (vllm/model_executor/models/kimi_k25.py
`KimiK25ForConditionalGeneration.__init__`, kimi_k25_vit.py `MoonViTEncoderLayer`, `MLP2`, `MoonVision3dPatchEmbed`).

The language model is `DeepseekV2Model` over text_config (a deepseek_v3 config: MLA, 384 routed experts and one
shared, one dense layer), so the deepseek_v3 family reads the text part and its float32 score-correction bias is
added here too (the weights hook is looked up by the card's architecture, kimi_k25). The checkpoint's experts are
int4 (compressed-tensors pack-quantized, group 32); attention, shared experts, the dense MLP and lm_head stay bf16
(its `ignore` list, capacity.model.hf_quant).

The MoonViT tower (`MoonViT3dPretrainedModel`, 27 blocks of 1152: LayerNorms norm0 / norm1, `wqkv`
(QKVParallelLinear) and `wo` (RowParallelLinear), an MLP2 of fc0 (ColumnParallelLinear) and fc1 (RowParallelLinear),
all with biases; a final LayerNorm; a Conv2d patch projection with bias; a learned 64 x 64 position table) and the
`mm_projector` (a LayerNorm over 1152, proj.0 of 4 x 1152 -> 4608 and proj.2 4608 -> text hidden, with biases): the
tower's linears split over the TP ranks like vLLM's (unless mm_encoder_tp_mode is data: then whole on every rank,
which this card does not model), the rest replicated, in the compute dtype, at the published sizes (a config with
others is refused). The encoder's start-up profiling activations (a 3000 x 3000 dummy image or video chunk) are
not modelled.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.deepseek import _score_bias
from capacity.model.families.registry import Family, register
from capacity.model.hf_vision import text_config
from capacity.model.weights import TensorGroup

# moonshotai/Kimi-K2.5 vision_config: the tower and projector sizes the weights hook counts
HIDDEN, MLP, BLOCKS, PATCH, POS_SIDE, MERGE = 1152, 4304, 27, 14, 64, 2
VISION: dict[str, object] = {
    "vt_hidden_size": HIDDEN, "vt_intermediate_size": MLP, "vt_num_hidden_layers": BLOCKS, "patch_size": PATCH,
    "init_pos_emb_height": POS_SIDE, "init_pos_emb_width": POS_SIDE, "mm_hidden_size": HIDDEN,
    "merge_kernel_size": [MERGE, MERGE], "pos_emb_type": "divided_fixed", "mm_projector_type": "patchmerger"}


def _text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        raise ConfigError(f"{source}: vision_config is missing (model_type {mt})")
    for key, want in VISION.items():
        if v.get(key) != want:
            raise ConfigError(f"{source}: vision_config.{key} {v.get(key)!r} is not supported for kimi_k25 "
                              f"({want!r} only: the published MoonViT tower)")
    text = text_config(cfg, mt, source)
    if text.get("model_type") != "deepseek_v3":
        raise ConfigError(f"{source}: text_config.model_type {text.get('model_type')!r} is not supported for "
                          "kimi_k25 (deepseek_v3 only)")
    return text, "deepseek_v3"


def tower_groups(text_hidden: int) -> list[TensorGroup]:
    h, i, n, p, pos = HIDDEN, MLP, BLOCKS, PATCH, POS_SIDE * POS_SIDE
    merged = h * MERGE * MERGE  # the projector's input: merge_kernel_size 2 x 2 patches
    return [TensorGroup("vision_linears", n, 3 * h * h + h * h + 2 * h * i, 1, "column", None),  # wqkv, wo, fc0, fc1
            TensorGroup("vision_biases", n, 3 * h + h + i + h, 1, "replicated", None),
            TensorGroup("vision_norms", 2 * n + 1, 2 * h, 1, "replicated", None),  # norm0, norm1 a block, the final
            TensorGroup("vision_patch_pos", 1, 3 * p * p * h + h + pos * h, 1, "replicated", None),
            TensorGroup("mm_projector", 1, 2 * h + merged * merged + merged + text_hidden * merged + text_hidden, 1,
                        "replicated", None)]


def _weights(card, groups: list) -> list:
    return _score_bias(card, groups) + tower_groups(card.hidden_size)


register(Family("kimi_k25", ("kimi_k25",), "vllm/model_executor/models/kimi_k25.py, kimi_k25_vit.py", text=_text,
                weights=_weights))
