"""StarCoder2 (`starcoder2`, vllm/model_executor/models/starcoder2.py) and GPT-BigCode (`gpt_bigcode`: StarCoder,
SantaCoder, WizardCoder; gpt_bigcode.py), as vLLM builds them.

`Starcoder2DecoderLayer`: two LayerNorms with weight and bias (input, post-attention), attention with biases on
q/k/v and o where use_bias says so (QKVParallelLinear / RowParallelLinear bias=config.use_bias), a full-width rotary
embedding and, on every layer, a sliding window of config.sliding_window tokens (`per_layer_sliding_window`: the
whole model slides where the window is shorter than max_position_embeddings), a non-gated GELU MLP (`c_fc` hidden ->
intermediate_size and `c_proj` back, with biases), a final LayerNorm with bias and an LM head tied to the embedding
where tie_word_embeddings says so (Starcoder2Config's default: true). use_bias false is refused (the published
checkpoints have biases).

gpt_bigcode: GPT-2 key names (n_embd, n_layer, n_head, n_positions, n_inner: the text hook maps them onto the
standard ones; n_inner absent is 4 x n_embd as GPTBigCodeConfig has it), multi-query attention where multi_query
says so (`GPTBigCodeAttention`: c_attn makes q of all heads and one shared k/v head, with bias; c_proj with bias),
learned positions (`wpe`, an nn.Embedding of n_positions x n_embd, whole on every rank, and no rotary embedding),
LayerNorms with bias (ln_1, ln_2, ln_f), a non-gated GELU MLP with biases (c_fc, c_proj) and the LM head tied to
`wte` where tie_word_embeddings says so (the config class's default: true).
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.llama import whole_model_slides
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup, mlp_and_final_norm_biases


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
    return [*groups, *mlp_and_final_norm_biases(card)]


_GPT2_KEYS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_positions": "max_position_embeddings", "n_inner": "intermediate_size"}


def _bigcode_text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    for key, std in _GPT2_KEYS.items():
        if key != "n_inner" and cfg.get(key) is None and cfg.get(std) is None:
            raise ConfigError(f"{source}: field {key!r} is missing (model_type {mt})")
    text = {**cfg, **{std: cfg[key] for key, std in _GPT2_KEYS.items() if cfg.get(key) is not None}}
    if text.get("intermediate_size") is None and isinstance(text.get("hidden_size"), int):
        text["intermediate_size"] = 4 * text["hidden_size"]  # GPTBigCodeConfig: n_inner None is 4 x n_embd
    multi = cfg.get("multi_query", True)
    if text.get("num_key_value_heads") is None:
        text["num_key_value_heads"] = 1 if multi else text.get("num_attention_heads")
    return text, "gpt_bigcode"


def _bigcode(text: dict, card: dict, need: Need, source: str) -> None:
    act = str(text.get("activation_function") or "gelu_pytorch_tanh")
    if not act.startswith("gelu"):
        raise ConfigError(f"{source}: activation_function {act[:30]!r} is not supported for gpt_bigcode (GELU)")
    card.update(gated_mlp=False, attention_bias=True, attention_out_bias=True, norms_per_layer=4)


def _bigcode_weights(card, groups: list) -> list:
    """starcoder2's biases plus the learned position embeddings (wpe), whole on every rank."""
    out = _biases(card, groups)
    if card.has_embedding:
        out.append(TensorGroup("position_embeddings", 1, card.max_position_embeddings, card.hidden_size,
                               "replicated", None))
    return out


register(Family("gpt_bigcode", ("gpt_bigcode",), "vllm/model_executor/models/gpt_bigcode.py",
                defaults={"tie_word_embeddings": True}, text=_bigcode_text, shape=_bigcode,
                weights=_bigcode_weights, rotary=False),
         Family("starcoder2", ("starcoder2",), "vllm/model_executor/models/starcoder2.py",
                defaults={"tie_word_embeddings": True}, shape=_shape, sliding=whole_model_slides, weights=_biases))
