"""Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm) and Qwen3-MoE (Qwen3's attention, every layer a MoE):
vLLM qwen2.py, qwen3.py, qwen3_moe.py. Qwen configs ship a sliding_window but leave use_sliding_window false: no
layer slides unless layer_types says so."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register


def _qwen2(text: dict, card: dict, need: Need, source: str) -> None:
    card["attention_bias"] = True


def _qwen3(text: dict, card: dict, need: Need, source: str) -> None:
    card["qk_norm"] = True


def _qwen3_moe(text: dict, card: dict, need: Need, source: str) -> None:
    card["qk_norm"] = True
    if text.get("mlp_only_layers") or text.get("decoder_sparse_step", 1) != 1:
        raise ConfigError(f"{source}: a Qwen3 MoE text model with mlp_only_layers/decoder_sparse_step != 1 is "
                          "not supported (every layer a MoE layer only)")
    card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size")}


register(Family("qwen2", ("qwen2",), "vllm/model_executor/models/qwen2.py", shape=_qwen2),
         Family("qwen3", ("qwen3",), "vllm/model_executor/models/qwen3.py", shape=_qwen3),
         Family("qwen3_moe", ("qwen3_moe",), "vllm/model_executor/models/qwen3_moe.py", shape=_qwen3_moe))
