"""IBM Granite 3.x dense and MoE (`granite`, `granitemoe`, `granitemoeshared`), as vLLM builds them.

granite (Granite-3.0/3.1/3.3 2B and 8B): vLLM granite.py `GraniteForCausalLM`: Llama's layout (q/k/v/o, a gated
MLP, two RMSNorms a layer) with q/k/v biases where attention_bias says so, and four scalar multipliers
(embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling) that scale activations and hold
no weights: they change nothing here. mlp_bias true (biases on the MLP) is refused, naming the field.

granitemoe (Granite-3.0/3.1 1B-A400M, 3B-A800M): vLLM granitemoe.py: the same attention, every layer a
`GraniteMoeMoE` of num_local_experts experts of intermediate_size, num_experts_per_tok per token, and a router
`gate` (ReplicatedLinear hidden -> experts); granitemoeshared adds, per layer, a `shared_mlp` (input_linear hidden ->
2 x shared_intermediate_size, output_linear back: one always-on gated expert).
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.llama import attention_bias
from capacity.model.families.registry import Family, Need, register


def _dense(text: dict, card: dict, need: Need, source: str) -> None:
    if text.get("mlp_bias"):
        raise ConfigError(f"{source}: mlp_bias true is not supported for granite (the published checkpoints "
                          "have none)")
    attention_bias(text, card, need, source)


def _moe(text: dict, card: dict, need: Need, source: str) -> None:
    _dense(text, card, need, source)
    shared = text.get("shared_intermediate_size") or 0
    if shared and text.get("model_type") != "granitemoeshared":
        raise ConfigError(f"{source}: shared_intermediate_size {shared!r} needs model_type granitemoeshared")
    card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("intermediate_size"),
                   "num_shared_experts": 1 if shared else 0, "shared_expert_intermediate_size": shared or None}


register(Family("granite", ("granite",), "vllm/model_executor/models/granite.py", shape=_dense),
         Family("granitemoe", ("granitemoe", "granitemoeshared"),
                "vllm/model_executor/models/granitemoe.py, granitemoeshared.py", shape=_moe))
