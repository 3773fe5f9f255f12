"""Qwen's MoE and vision-language families added after Qwen3-MoE, as vLLM builds them.

qwen2_moe (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): vLLM qwen2_moe.py. Qwen2's attention (q/k/v biases, o_proj without);
layer i holds a `Qwen2MoeSparseMoeBlock` where `i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0`,
else a dense MLP of intermediate_size. The block: num_experts routed experts of moe_intermediate_size,
num_experts_per_tok per token, a router `gate` (ReplicatedLinear hidden -> num_experts), one shared expert MLP of
shared_expert_intermediate_size and its `shared_expert_gate` (ReplicatedLinear hidden -> 1, replicated): the weight
hook adds that gate, which the generic layout does not describe.

qwen3_vl / qwen3_vl_moe (Qwen3-VL-8B, Qwen3-VL-30B-A3B, -235B-A22B): vLLM qwen3_vl.py, qwen3_vl_moe.py. The
language model is text_config (qwen3_vl_text: Qwen3's layout with per-head q/k RMSNorm; qwen3_vl_moe_text:
Qwen3-MoE's, every layer a MoE without shared experts); the ViT is Qwen3-VL's (families/qwen_vl.py `_qwen_vit`:
LayerNorms, a GELU MLP, learned position embeddings, a patch merger and the deepstack mergers).

qwen3_5_moe (Qwen3.5-35B-A3B, -122B-A10B, -397B-A17B): vLLM qwen3_5.py `Qwen3_5MoeForConditionalGeneration`.
text_config (qwen3_5_moe_text) is Qwen3-Next's hybrid (families/hybrid.py `_deltanet`: gated DeltaNet layers and
every full_attention_interval-th layer full gated attention) with every layer a `Qwen3NextSparseMoeBlock`: routed
experts, one shared expert of shared_expert_intermediate_size and its shared_expert_gate (hidden -> 1). Its
configs have no intermediate_size (no layer is dense): the text hook fills it with moe_intermediate_size, which
no tensor then uses. Its attention rotates a quarter of each head (partial_rotary_factor 0.25: the cos/sin cache
is max_position x head_dim / 4; another factor is refused). The MTP layer (mtp_num_hidden_layers) is loaded only
with speculative decoding and is not counted. The ViT is Qwen3.5's (Qwen3-VL's without deepstack mergers).
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.hybrid import QUARTER, _deltanet
from capacity.model.families.qwen import _qwen3, _qwen3_moe
from capacity.model.families.qwen_vl import _qwen_vit
from capacity.model.families.registry import Family, Need, register
from capacity.model.hf_vision import text_config
from capacity.model.weights import TensorGroup


def _qwen2_moe(text: dict, card: dict, need: Need, source: str) -> None:
    card["attention_bias"] = True
    layers = card["num_layers"]
    step, only = text.get("decoder_sparse_step", 1), text.get("mlp_only_layers") or []
    if step != 1 or only:
        field, value = ("decoder_sparse_step", step) if step != 1 else ("mlp_only_layers", only)
        raise ConfigError(f"{source}: {field} {str(value)[:40]} is not supported for qwen2_moe (every layer a MoE "
                          f"of the {layers} only)")
    shared = text.get("shared_expert_intermediate_size") or 0
    card["moe"] = {"num_experts": need("num_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": 1 if shared else 0, "shared_expert_intermediate_size": shared or None}


def _shared_gate(card, groups: list) -> list:
    """`shared_expert_gate`: a hidden -> 1 linear per MoE layer, replicated (vLLM ReplicatedLinear / nn.Linear)."""
    out = []
    for t in groups:
        out.append(t)
        if t.name == "shared_down":  # count: the MoE layers; rows: hidden
            out.append(TensorGroup("shared_expert_gate", t.count, 1, t.rows, "replicated", None))
    return out


# Qwen3-VL's text models are Qwen3's and Qwen3-MoE's decoders (vllm/model_executor/models/qwen3_vl*.py reuse them)
_qwen3_vl_text, _qwen3_vl_moe_text = _qwen3, _qwen3_moe


def _qwen3_5_moe_text(text: dict, card: dict, need: Need, source: str) -> None:
    _deltanet(text, card, need, source, moe=True)  # refuses a partial_rotary_factor other than 0.25


def _nested_text(cfg: dict, mt: str, source: str) -> tuple[dict, str]:
    text = text_config(cfg, mt, source)
    tmt = text.get("model_type") or f"{mt}_text"
    if tmt == "qwen3_5_moe_text" and text.get("intermediate_size") is None and text.get("moe_intermediate_size"):
        text = {**text, "intermediate_size": text["moe_intermediate_size"]}  # no dense layer reads it
    return text, tmt


_VISION_TYPES = {"qwen3_vl": ("qwen3_vl", None), "qwen3_vl_moe": ("qwen3_vl_moe", "qwen3_vl", None),
                 "qwen3_5_moe": ("qwen3_5_moe_vision", "qwen3_5_moe", "qwen3_5", None)}


def _vision(cfg: dict, mt: str, text_hidden: int, source: str) -> dict:
    """Qwen3-VL's / Qwen3.5's ViT (families/qwen_vl.py), whose vision_config names the wrapper's model type."""
    v = cfg.get("vision_config")
    if isinstance(v, dict) and v.get("model_type") in _VISION_TYPES[mt]:
        cfg = {**cfg, "vision_config": {**v, "model_type": None}}
    return _qwen_vit(cfg, "qwen3_vl", text_hidden, source)


register(Family("qwen2_moe", ("qwen2_moe",), "vllm/model_executor/models/qwen2_moe.py", shape=_qwen2_moe,
                weights=_shared_gate),
         Family("qwen3_vl_text", ("qwen3_vl_text",), "vllm/model_executor/models/qwen3_vl.py", shape=_qwen3_vl_text),
         Family("qwen3_vl_moe_text", ("qwen3_vl_moe_text",), "vllm/model_executor/models/qwen3_vl_moe.py",
                shape=_qwen3_vl_moe_text),
         Family("qwen3_vl", ("qwen3_vl",), "vllm/model_executor/models/qwen3_vl.py", text=_nested_text,
                vision=_vision),
         Family("qwen3_vl_moe", ("qwen3_vl_moe",), "vllm/model_executor/models/qwen3_vl_moe.py", text=_nested_text,
                vision=_vision),
         Family("qwen3_5_moe_text", ("qwen3_5_moe_text",), "vllm/model_executor/models/qwen3_5.py",
                shape=_qwen3_5_moe_text, weights=_shared_gate, partial_rotary=QUARTER),
         Family("qwen3_5_moe", ("qwen3_5_moe",), "vllm/model_executor/models/qwen3_5.py", text=_nested_text,
                vision=_vision, weights=_shared_gate, partial_rotary=QUARTER))
