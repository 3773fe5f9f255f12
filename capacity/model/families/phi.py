"""Phi-1.5 / Phi-2 (`phi`), as vLLM builds it (vllm/model_executor/models/phi.py).

A parallel block (`PhiLayer`: one LayerNorm with weight and bias feeds both the attention and the MLP), attention
with biases on q/k/v (QKVParallelLinear bias=True) and on its output `dense` (RowParallelLinear: the bias whole on
every rank), a non-gated GELU MLP (`PhiMLP`: fc1 hidden -> intermediate_size and fc2 back, both with biases), a
final LayerNorm with bias and an LM head with a bias (ParallelLMHead bias=True). The rotary embedding turns
partial_rotary_factor of each head (Phi-2: 0.4 x 80 = 32 channels): its cos/sin cache is max_position x 32, the
family's `partial_rotary`; a config with another factor, or with qk_layernorm, is refused, naming the field.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup

PARTIAL = 0.4  # Phi-2's and Phi-1.5's partial_rotary_factor


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    factor = need("partial_rotary_factor")
    if factor != PARTIAL:
        raise ConfigError(f"{source}: partial_rotary_factor {factor!r} is not supported for phi ({PARTIAL} only)")
    if text.get("qk_layernorm"):
        raise ConfigError(f"{source}: qk_layernorm true is not supported for phi (Phi-2 has none)")
    act = str(text.get("hidden_act") or "gelu_new")
    if not act.startswith("gelu"):
        raise ConfigError(f"{source}: hidden_act {act[:30]!r} is not supported for phi (a GELU MLP)")
    card.update(gated_mlp=False, attention_bias=True, attention_out_bias=True, norms_per_layer=2)


def _biases(card, groups: list) -> list:
    """fc1 and fc2 biases per layer, the final LayerNorm's bias and the LM head's bias."""
    out = list(groups)
    if card.num_dense_layers:
        out += [TensorGroup("mlp_up_bias", card.num_dense_layers, card.intermediate_size, 1, "column", None),
                TensorGroup("mlp_down_bias", card.num_dense_layers, 1, card.hidden_size, "replicated", None)]
    if card.has_lm_head:
        out += [TensorGroup("final_norm_bias", 1, 1, card.hidden_size, "replicated", None),
                TensorGroup("lm_head_bias", 1, card.vocab_size, 1, "vocab", None)]
    return out


register(Family("phi", ("phi",), "vllm/model_executor/models/phi.py", defaults={"partial_rotary_factor": 0.5},
                shape=_shape, weights=_biases, partial_rotary=PARTIAL))
