"""Mixtral (vLLM mixtral.py): Mistral's attention, every layer a MoE of num_local_experts experts of
intermediate_size."""
from __future__ import annotations

from capacity.model.families.registry import Family, Need, register


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    card["moe"] = {"num_experts": need("num_local_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("intermediate_size")}


register(Family("mixtral", ("mixtral",), "vllm/model_executor/models/mixtral.py", shape=_shape))
