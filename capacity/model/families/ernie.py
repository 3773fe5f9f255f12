"""ERNIE-4.5 text models (Baidu), dense and MoE, as vLLM builds them.

ernie4_5 (ERNIE-4.5-0.3B): vLLM ernie45.py `Ernie4_5ForCausalLM` subclasses LlamaForCausalLM (only the rotary
style changes, interleaved instead of NeoX): Llama's layout, no biases.

ernie4_5_moe (ERNIE-4.5-21B-A3B, -300B-A47B): vLLM ernie45_moe.py. Attention as Llama's (QKVParallelLinear with
bias=use_bias, o_proj without bias, full-width rotary). Layer i holds a MoE where
`(i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <= moe_layer_end_index` (end defaults to the last
layer), else a dense gated MLP of intermediate_size (`Ernie4_5_MoeDecoderLayer`). A MoE layer (`Ernie4_5_MoeMoE`):
moe_num_experts routed experts of moe_intermediate_size, moe_k per token, one shared MLP of
moe_intermediate_size x moe_num_shared_experts, a router `gate` kept in float32 (`params_dtype=torch.float32`) and
an `e_score_correction_bias` of moe_num_experts float32 values. Both float32 tensors are this family's weight hook:
the generic layout stores a router in the compute dtype and has no correction bias.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup


def _no_bias(text: dict, source: str) -> None:
    if text.get("use_bias"):  # vLLM would add q/k/v and MLP biases the card does not describe
        raise ConfigError(f"{source}: use_bias true is not supported for ERNIE-4.5 (the published checkpoints have "
                          "none)")


def _dense(text: dict, card: dict, need: Need, source: str) -> None:
    _no_bias(text, source)


def _moe(text: dict, card: dict, need: Need, source: str) -> None:
    _no_bias(text, source)
    layers = card["num_layers"]
    start, interval = text.get("moe_layer_start_index", 0), text.get("moe_layer_interval", 1)
    end = text.get("moe_layer_end_index")
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < layers:
        raise ConfigError(f"{source}: moe_layer_start_index {start!r} must be a layer index below {layers}")
    if interval != 1 or end not in (None, layers - 1):
        # MoE layers that are not one run to the last layer: the card's first_dense_layers cannot say where they are
        field, value = ("moe_layer_interval", interval) if interval != 1 else ("moe_layer_end_index", end)
        raise ConfigError(f"{source}: {field} {value!r} is not supported (MoE layers from moe_layer_start_index to "
                          "the last layer only)")
    card["moe"] = {"num_experts": need("moe_num_experts"), "experts_per_token": need("moe_k"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": text.get("moe_num_shared_experts") or 0,
                   "first_dense_layers": start}


def _fp32_router(card, groups: list) -> list:
    out = []
    for t in groups:
        if t.name == "router":  # Ernie4_5_MoeMoE.gate (float32) and gate.e_score_correction_bias (float32)
            out += [TensorGroup("router", t.count, t.rows, t.cols, "replicated", "fp32"),
                    TensorGroup("router_score_bias", t.count, 1, t.rows, "replicated", "fp32")]
        else:
            out.append(t)
    return out


register(Family("ernie4_5", ("ernie4_5",), "vllm/model_executor/models/ernie45.py", shape=_dense),
         Family("ernie4_5_moe", ("ernie4_5_moe",), "vllm/model_executor/models/ernie45_moe.py", shape=_moe,
                weights=_fp32_router))
