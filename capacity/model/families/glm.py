"""GLM-4.5/4.6/4.7 (vLLM glm4_moe.py): DeepSeek-style routed and shared experts with the first
first_k_dense_replace layers dense, GQA attention (no MLA), optional q/k biases and q/k norm."""
from __future__ import annotations

from capacity.model.families.registry import Family, Need, register


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": text.get("n_shared_experts") or 0,
                   "first_dense_layers": text.get("first_k_dense_replace", 0)}
    card.update(attention_bias=bool(text.get("attention_bias")), qk_norm=bool(text.get("use_qk_norm")))


register(Family("glm4_moe", ("glm4_moe",), "vllm/model_executor/models/glm4_moe.py", shape=_shape))
