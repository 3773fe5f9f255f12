"""StarCoder2 (`starcoder2`), as vLLM builds it (vllm/model_executor/models/starcoder2.py).

`Starcoder2DecoderLayer`: two LayerNorms with weight and bias (input, post-attention), attention with biases on
q/k/v and o where use_bias says so (QKVParallelLinear / RowParallelLinear bias=config.use_bias), a full-width rotary
embedding and, on every layer, a sliding window of config.sliding_window tokens (`per_layer_sliding_window`: the
whole model slides where the window is shorter than max_position_embeddings), a non-gated GELU MLP (`c_fc` hidden ->
intermediate_size and `c_proj` back, with biases), a final LayerNorm with bias and an LM head tied to the embedding
where tie_word_embeddings says so (Starcoder2Config's default: true). use_bias false is refused (the published
checkpoints have biases).
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.llama import whole_model_slides
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    if text.get("use_bias") is False:
        raise ConfigError(f"{source}: use_bias false is not supported for starcoder2 (the published checkpoints "
                          "have biases)")
    act = str(text.get("hidden_act") or "gelu_pytorch_tanh")
    if not act.startswith("gelu"):
        raise ConfigError(f"{source}: hidden_act {act[:30]!r} is not supported for starcoder2 (a GELU MLP)")
    card.update(gated_mlp=False, attention_bias=True, attention_out_bias=True, norms_per_layer=4)


def _biases(card, groups: list) -> list:
    """c_fc's and c_proj's biases per layer and the final LayerNorm's bias."""
    out = list(groups)
    if card.num_dense_layers:
        out += [TensorGroup("mlp_up_bias", card.num_dense_layers, card.intermediate_size, 1, "column", None),
                TensorGroup("mlp_down_bias", card.num_dense_layers, 1, card.hidden_size, "replicated", None)]
    if card.has_lm_head:
        out.append(TensorGroup("final_norm_bias", 1, 1, card.hidden_size, "replicated", None))
    return out


register(Family("starcoder2", ("starcoder2",), "vllm/model_executor/models/starcoder2.py",
                defaults={"tie_word_embeddings": True}, shape=_shape, sliding=whole_model_slides, weights=_biases))
