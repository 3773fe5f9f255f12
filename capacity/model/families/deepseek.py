"""DeepSeek-V2/V3 (vLLM deepseek_v2.py): multi-head latent attention (the KV cache holds one latent of kv_lora_rank
plus the rope key per token and layer), routed and shared experts, the first first_k_dense_replace layers dense.

The router: `DeepseekV2MoE.gate` (ReplicatedLinear, later GateLinear: replicated, the compute dtype) and, where the
config's topk_method is "noaux_tc" (DeepSeek-V3, R1, Kimi-K2: transformers' DeepseekV3Config default; DeepSeekV2Config
defaults to "greedy"), `gate.e_score_correction_bias`, a plain `nn.Parameter(torch.empty(n_routed_experts,
dtype=torch.float32))`: not sharded, so every TP rank holds all of it. The card has no topk_method, so the bias
follows the architecture (a YAML card naming deepseek_v3 gets it too) and a config whose topk_method disagrees with
its model type's is refused in one line."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup

_TOPK = {"deepseek_v3": "noaux_tc", "deepseek_v2": "greedy"}  # transformers' config-class defaults


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    mt = str(text.get("model_type") or "")
    topk = text.get("topk_method") or _TOPK.get(mt)
    if mt in _TOPK and (topk == "noaux_tc") != (_TOPK[mt] == "noaux_tc"):
        raise ConfigError(f"{source}: topk_method {topk!r} is not supported for model_type {mt} (the score "
                          "correction bias follows the model type: noaux_tc for deepseek_v3 only)")
    card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": text.get("n_shared_experts") or 0,
                   "first_dense_layers": text.get("first_k_dense_replace", 0)}
    card["mla"] = {"q_lora_rank": text.get("q_lora_rank"), "kv_lora_rank": need("kv_lora_rank"),
                   "qk_nope_head_dim": need("qk_nope_head_dim"), "qk_rope_head_dim": need("qk_rope_head_dim"),
                   "v_head_dim": need("v_head_dim")}


def _score_bias(card, groups: list) -> list:
    """gate.e_score_correction_bias: n_routed_experts float32 values per MoE layer, replicated on every rank."""
    out = []
    for t in groups:
        out.append(t)
        if t.name == "router":  # count: the MoE layers; rows: the routed experts
            out.append(TensorGroup("router_score_bias", t.count, 1, t.rows, "replicated", "fp32"))
    return out


register(Family("deepseek_v3", ("deepseek_v3",), "vllm/model_executor/models/deepseek_v2.py", shape=_shape,
                weights=_score_bias),
         Family("deepseek_v2", ("deepseek_v2",), "vllm/model_executor/models/deepseek_v2.py", shape=_shape))
