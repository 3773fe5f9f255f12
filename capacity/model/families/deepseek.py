"""DeepSeek-V2/V3 (vLLM deepseek_v2.py): multi-head latent attention (the KV cache holds one latent of kv_lora_rank
plus the rope key per token and layer), routed and shared experts, the first first_k_dense_replace layers dense."""
from __future__ import annotations

from capacity.model.families.registry import Family, Need, register


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": text.get("n_shared_experts") or 0,
                   "first_dense_layers": text.get("first_k_dense_replace", 0)}
    card["mla"] = {"q_lora_rank": text.get("q_lora_rank"), "kv_lora_rank": need("kv_lora_rank"),
                   "qk_nope_head_dim": need("qk_nope_head_dim"), "qk_rope_head_dim": need("qk_rope_head_dim"),
                   "v_head_dim": need("v_head_dim")}


register(Family("deepseek", ("deepseek_v3", "deepseek_v2"), "vllm/model_executor/models/deepseek_v2.py",
                shape=_shape))
