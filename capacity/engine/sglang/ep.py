"""SGLang's expert parallelism (`--ep-size E`; `--enable-ep-moe` in 0.4.1-0.5.2), as it lays out one rank's MoE
weights. Read in the PyPI wheels (`python/sglang/srt/server_args.py`, `layers/moe/fused_moe_triton/layer.py`,
`layers/moe/ep_moe/layer.py`) of 0.4.0, 0.4.1, 0.4.4, 0.4.6, 0.4.10, 0.5.1-0.5.3, 0.5.5 and 0.5.10:

- 0.4.0 and earlier: no expert parallelism (no ep_size field);
- 0.4.1-0.5.2: `--enable-ep-moe` sets ep_size = tp_size (`__post_init__`) and the model takes `EPMoE`; ep_size
  alone changes nothing (the fused MoE stays TP). So the only EP layout is E = T: every rank holds
  num_experts / T whole experts; 0.5.1-0.5.2 keep the flag as deprecated ("set --ep-size to the same value as
  --tp-size");
- from 0.5.3 (0.5.1's `FusedMoE` already reads it): `--ep-size E` with E dividing T: `moe_ep_size` = E,
  `moe_tp_size` = T / E; a rank holds num_experts / E experts (`assert num_experts % self.moe_ep_size == 0`), each
  expert's intermediate dimension split over T / E (`intermediate_size_per_partition = intermediate_size //
  self.moe_tp_size`). `--moe-a2a-backend deepep` / `mooncake` force E = T (`_handle_a2a_moe`);
- attention, dense MLPs, the embedding and the LM head are as without EP (TP over T, or DP attention's layout).

Not modelled: redundant experts (`--ep-num-redundant-experts`) and EPLB. DeepEP's communication buffers (allocated
after the pool is sized, so in the reserve T0 x (1 - F)) are capacity/engine/sglang/deepep.py's, counted when
`moe_a2a_backend` is deepep; the 2 GiB more that 0.5.15+ keeps out of the default F for them is
`capacity.engine.sglang.releases.deepep_reserve_mib`. The KV cell is attention's, as without EP.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.weights import weight_bytes_per_rank

Line = tuple[int, int, int, int]


def check_ep(card: ModelCard, tp: int, ep: int, line: Line) -> None:
    """One line naming the field where this release cannot run this EP size (see the module docstring)."""
    if ep == 1:
        return
    if card.moe is None:
        raise ConfigError(f"ep_size: {ep} for {card.name}, which has no MoE experts (SGLang's --ep-size splits "
                          "experts)")
    if tp % ep:
        raise ConfigError(f"ep_size: {ep} must divide tensor_parallel_size {tp}")
    if line < (0, 4, 1, 0):
        raise ConfigError(f"ep_size: {ep}: SGLang before 0.4.1 has no expert parallelism (no --ep-size)")
    if line < (0, 5, 3, 0) and ep != tp:
        raise ConfigError(f"ep_size: {ep}: SGLang 0.4.1-0.5.2 runs experts in parallel only with --enable-ep-moe, "
                          f"which sets ep_size to tensor_parallel_size ({tp})")
    if card.moe.num_experts % ep:
        raise ConfigError(f"ep_size: {ep} must divide the {card.moe.num_experts} experts of {card.name} (SGLang "
                          "asserts num_experts % ep_size == 0)")


def ep_weights(card: ModelCard, tp: int, ep: int, base: dict[str, float]) -> dict[str, float]:
    """`base` (one rank's tensor groups at TP tp, or DP attention's layout) with the experts laid out by EP: whole
    experts over ep ranks, each split over tp / ep."""
    if ep == 1:
        return base
    out = dict(base)
    moe_tp = tp // ep
    for name, b in weight_bytes_per_rank(card, tp, ep=ep).items():
        if name.startswith("experts_"):
            out[name] = b / moe_tp
    return out


def ep_note(tp: int, ep: int, card: ModelCard) -> str:
    n = card.moe.num_experts if card.moe is not None else 0
    split = f", each expert split over {tp // ep} ranks" if ep < tp else ""
    return (f"expert parallelism: {n // ep} of the {n} experts on each rank (ep_size {ep} of tp {tp}{split}); "
            "attention and dense layers TP over tp; redundant experts not counted")


__all__ = ["check_ep", "ep_note", "ep_weights"]
