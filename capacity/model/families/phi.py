"""Phi-1.5 / Phi-2 (`phi`, vllm/model_executor/models/phi.py) and Phi-3.5-MoE (`phimoe`, phimoe.py).

A parallel block (`PhiLayer`: one LayerNorm with weight and bias feeds both the attention and the MLP), attention
with biases on q/k/v (QKVParallelLinear bias=True) and on its output `dense` (RowParallelLinear: the bias whole on
every rank), a non-gated GELU MLP (`PhiMLP`: fc1 hidden -> intermediate_size and fc2 back, both with biases), a
final LayerNorm with bias and an LM head with a bias (ParallelLMHead bias=True). The rotary embedding turns
partial_rotary_factor of each head (Phi-2: 0.4 x 80 = 32 channels): its cos/sin cache is max_position x 32, the
family's `partial_rotary`; a config with another factor, or with qk_layernorm, is refused, naming the field.

phimoe (Phi-3.5-MoE): `PhiMoEDecoderLayer`: attention with biases on q/k/v and o (bias=True), two LayerNorms with
weight and bias, every layer a MoE of num_local_experts experts of intermediate_size (top num_experts_per_tok,
a replicated router `gate` without bias, no shared expert), a final LayerNorm with bias and an LM head with a bias.
The published config states attention_bias and lm_head_bias true (PhimoeConfig defaults both false): a config
stating either false is refused. Its longrope scaling builds vLLM's `Phi3LongRoPEScaledRotaryEmbedding`, which keeps
three cos/sin caches: short (original_max_position_embeddings), long (max_position_embeddings) and their
concatenation (`long_short_cos_sin_cache`): `longrope_caches`, which Phi-3's family reads too.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup, mlp_and_final_norm_biases

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


def longrope_caches(text: dict, card: dict, source: str) -> None:
    """vLLM Phi3LongRoPEScaledRotaryEmbedding: short, long and long_short cos/sin caches."""
    rope = text.get("rope_scaling")
    if not isinstance(rope, dict) or (rope.get("rope_type") or rope.get("type")) != "longrope":
        return
    orig = text.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    if not isinstance(orig, int) or isinstance(orig, bool) or orig <= 0:
        raise ConfigError(f"{source}: original_max_position_embeddings {orig!r} must be a positive token count "
                          "(longrope keeps a cos/sin cache of that length)")
    longest = card["max_position_embeddings"]
    card["rope_caches"] = [orig, longest, orig + longest]


def _phimoe(text: dict, card: dict, need: Need, source: str) -> None:
    for key in ("attention_bias", "lm_head_bias"):
        if not text.get(key):
            raise ConfigError(f"{source}: {key} {text.get(key)!r} is not supported for phimoe (Phi-3.5-MoE has "
                              "both true)")
    card.update(attention_bias=True, attention_out_bias=True, norms_per_layer=4)  # two LayerNorms with bias
    card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("intermediate_size")}
    longrope_caches(text, card, source)


def _biases(card, groups: list) -> list:
    """fc1 and fc2 biases per layer, the final LayerNorm's bias and the LM head's bias."""
    out = [*groups, *mlp_and_final_norm_biases(card)]
    if card.has_lm_head:
        out.append(TensorGroup("lm_head_bias", 1, card.vocab_size, 1, "vocab", None))
    return out


register(Family("phi", ("phi",), "vllm/model_executor/models/phi.py", defaults={"partial_rotary_factor": 0.5},
                shape=_shape, weights=_biases, partial_rotary=PARTIAL),
         Family("phimoe", ("phimoe",), "vllm/model_executor/models/phimoe.py", shape=_phimoe, weights=_biases))
