"""gpt-oss (vLLM gpt_oss.py): alternating sliding-window layers (layer_types), attention sinks, biases on q/k/v,
o_proj, the router and the experts, MXFP4 experts (the quantisation config)."""
from __future__ import annotations

from capacity.model.families.registry import Family, Need, register


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    card["moe"] = {"num_experts": need("num_local_experts"),
                   "experts_per_token": text.get("num_experts_per_tok") or need("experts_per_token"),
                   "moe_intermediate_size": need("intermediate_size")}
    card.update(attention_bias=True, attention_out_bias=True, attention_sinks=True, expert_bias=True)


register(Family("gpt_oss", ("gpt_oss",), "vllm/model_executor/models/gpt_oss.py", shape=_shape))
