"""TensorRT-LLM's expert parallelism (`moe_expert_parallel_size`, trtllm-serve `--ep_size`) as memory: which
weights one rank holds, and the values refused.

Read in NVIDIA/TensorRT-LLM (1.x; docs/trtllm.md, "Expert parallelism"):

- `tensorrt_llm/mapping.py`, `Mapping.__init__`: the MoE layers' ranks are tp_size (x cp_size); with
  moe_ep_size given and moe_tp_size not, moe_tp_size = tp_size // (moe_ep_size x moe_cluster_size), and
  moe_tp_size x moe_ep_size x moe_cluster_size != tp_size is a ValueError; neither given: moe_tp_size = tp_size,
  moe_ep_size = 1 (experts sharded by TP). moe_cluster_size defaults to 1 (not modelled: refused elsewhere as no
  setting).
- `_torch/modules/fused_moe` (`MoE.__init__`): each rank keeps `expert_size_per_partition = num_experts //
  ep_size` whole experts, each of them split over moe_tp_size along the intermediate dimension; the router,
  attention, embeddings and dense layers stay tensor parallel over tp_size.
- Attention data parallelism (`enable_attention_dp`, `trtllm_attention_dp`; memory only): the attention modules
  and the KV cache at tp 1 (`KVCacheManager.__init__`: `if mapping.enable_attention_dp: tp_size = 1`), the dense
  MLPs too (`_compute_mlp_tp_size`: "If using attention DP, the MLP also uses DP instead of TP. mlp_tp_size = 1",
  DeepSeek-V3, GLM, Exaone), the embedding unsplit (`Qwen3MoEModel.__init__`: "we don't do parallelism here") and
  the LM head replicated unless `enable_lm_head_tp_in_adp` (off by default); the routed experts split over the
  ranks as above. Everything but the routed experts is counted at tp 1 (shared experts and routers included: the
  conservative end where a family splits them).
"""
from __future__ import annotations

from capacity.engine.config import EngineConfig
from capacity.engine.trtllm.config import trtllm_attention_dp, trtllm_ep_size
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.weights import weight_bytes_per_rank


def moe_layout(card: ModelCard, cfg: EngineConfig, tp: int, engine_backend: bool) -> tuple[int, int]:
    """(moe_ep_size, moe_tp_size) for `cfg` at tensor parallel size `tp`; bad values refused in one line."""
    if trtllm_attention_dp(cfg) and (card.moe is None or engine_backend):
        raise ConfigError(f"trtllm_attention_dp true: modelled for MoE models on the PyTorch backend ({card.name}"
                          f"{', a dense model: run data-parallel replicas' if card.moe is None else ''})")
    ep = trtllm_ep_size(cfg)
    if ep == 1:
        return 1, tp
    if card.moe is None:
        raise ConfigError(f"moe_expert_parallel_size {ep}: {card.name} has no experts (a dense model)")
    if engine_backend:
        raise ConfigError(f"moe_expert_parallel_size {ep}: the engine backend's MoE is not modelled; use "
                          "trtllm_backend pytorch")
    if tp % ep:
        raise ConfigError(f"moe_expert_parallel_size {ep}: does not divide tensor_parallel_size {tp} (TensorRT-LLM's "
                          "Mapping needs moe_tp x moe_ep = tp)")
    if card.moe.num_experts % ep:
        raise ConfigError(f"moe_expert_parallel_size {ep}: does not divide {card.name}'s {card.moe.num_experts} "
                          "experts (each rank keeps num_experts // ep whole experts)")
    return ep, tp // ep


def weights_per_rank(card: ModelCard, cfg: EngineConfig, tp: int, engine_backend: bool = False) -> float:
    """Bytes of weights on one rank: tensor parallel over tp, the routed experts num_experts / ep whole experts
    per rank, each split over moe_tp = tp / ep."""
    ep, moe_tp = moe_layout(card, cfg, tp, engine_backend)
    if ep == 1:
        out = weight_bytes_per_rank(card, tp)
    else:
        out = {name: b / moe_tp if name in ("experts_gate_up", "experts_down") else b  # num_experts / ep whole ones
               for name, b in weight_bytes_per_rank(card, tp, ep=ep).items()}
    if trtllm_attention_dp(cfg):  # everything but the routed experts whole on every rank
        whole = weight_bytes_per_rank(card, 1)
        out = {name: b if name.startswith("experts_") else whole[name] for name, b in out.items()}
    return sum(out.values())


def kv_tp(cfg: EngineConfig, tp: int) -> int:
    """The tp the KV pool splits heads over: 1 under attention data parallelism (a whole pool per rank)."""
    return 1 if trtllm_attention_dp(cfg) else tp


__all__ = ["kv_tp", "moe_layout", "weights_per_rank"]
