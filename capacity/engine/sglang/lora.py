"""SGLang's LoRA adapter buffers (`--enable-lora --max-loras-per-batch N --max-lora-rank R --lora-target-modules ...`):
the bytes `LoRAMemoryPool` allocates on one rank, taken before the KV pool is sized.

Read in the PyPI wheels of 0.4.4, 0.4.10, 0.5.1, 0.5.2, 0.5.3, 0.5.6, 0.5.9, 0.5.18 and 0.5.23:

- when: `ModelRunner.initialize` calls `init_lora_manager()` after `load_model()` and before `init_memory_pool()`
  (0.3.6 to 0.5.23; `maybe_init_lora_manager` in 0.5.23), so the buffers are gone from the free memory A that
  `profile_max_num_token` reads: they cost the pool as weights do (rest = A - T0 x (1 - F));
- what (`lora/mem_pool.py` `LoRAMemoryPool.init_buffers`, `get_lora_A_shape` / `get_lora_B_shape`, from 0.5.1): per
  target module and per layer (num_hidden_layers), in the model's dtype, A = (N, R x c, input_dim) and
  B = (N, output_dim, R), c = 3 for qkv_proj, 2 for gate_up_proj, else 1; the input of the row-parallel o_proj and
  down_proj and the output of the others divided by tp (`divide`, which asserts it divides). Dims
  (`lora/utils.py` `get_hidden_dim`, the fallback the dense models use): qkv_proj hidden -> head_dim x (heads + 2 x
  kv_heads); o_proj head_dim x heads -> hidden; gate_up_proj hidden -> 2 x intermediate; down_proj intermediate ->
  hidden. From 0.5.9 embed_tokens (vocab -> hidden) and lm_head (hidden -> vocab) are targets too, one buffer each
  (not per layer, not split over tp: "Have not imp self.tp_size > 1 yet");
- target modules: q/k/v_proj name qkv_proj and gate/up_proj gate_up_proj (`get_normalized_target_modules`);
  `all` is SUPPORTED_LORA_TARGET_MODULES (the four linear ones; from 0.5.9 embed_tokens and lm_head too). Not given,
  SGLang infers them from --lora-paths, which capacity does not read: it takes `all` (the most memory).

0.4.x keeps B as (c, N, output_dim, R) and older shapes (not modelled: refused before the 0.5.2 rules line, which is
the first whose releases all have the layout above; 0.5.1 shares the 0.4.9.post3 line). MoE and MLA models get
expert and latent buffers in later releases (`_moe` keys, q_a/kv_a/q_b/kv_b_proj): refused, not modelled.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.units import DTYPE_BYTES

Line = tuple[int, int, int, int]
FIRST_LINE: Line = (0, 5, 2, 0)
EMBED_LINE: Line = (0, 5, 8, 0)  # 0.5.9 (the 0.5.8 line): embed_tokens and lm_head targets (taken for the line)
LINEAR = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
EMBEDDING = ("embed_tokens", "lm_head")
NORMALISED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
              "up_proj": "gate_up_proj", **{m: m for m in LINEAR + EMBEDDING}}


def target_modules(given: list[str] | None, line: Line) -> list[str]:
    """The normalised target modules (None or `all`: every supported one of the release)."""
    supported = LINEAR + (EMBEDDING if line >= EMBED_LINE else ())
    if not given or "all" in given:
        return list(supported)
    out = []
    for name in given:
        norm = NORMALISED.get(name.split(".")[-1])
        if norm is None or norm not in supported:
            raise ConfigError(f"lora_target_modules: {name!r} is not a LoRA target of this SGLang release (its "
                              f"modules: {', '.join(supported)}, or all)")
        if norm not in out:
            out.append(norm)
    return out


def _split(dim: int, tp: int, what: str) -> int:
    if dim % tp:
        raise ConfigError(f"enable_lora: SGLang's LoRA buffer of {what} ({dim}) does not divide by tp {tp} (its "
                          "divide() asserts)")
    return dim // tp


def lora_buffer_bytes(card: ModelCard, tp: int, slots: int, rank: int, modules: list[str]) -> float:
    """Bytes of LoRAMemoryPool's A and B buffers on one rank (see the module docstring for the shapes)."""
    h, hd, heads, kv, inter = (card.hidden_size, card.head_dim_, card.num_attention_heads, card.num_kv_heads,
                               card.intermediate_size)
    per_layer = {  # elements of A + B for one adapter slot and one layer
        "qkv_proj": 3 * rank * h + _split(hd * (heads + 2 * kv), tp, "qkv_proj") * rank,
        "o_proj": rank * _split(hd * heads, tp, "o_proj") + h * rank,
        "gate_up_proj": 2 * rank * h + _split(2 * inter, tp, "gate_up_proj") * rank,
        "down_proj": rank * _split(inter, tp, "down_proj") + h * rank,
    }
    once = {"embed_tokens": rank * card.vocab_size + h * rank, "lm_head": rank * h + card.vocab_size * rank}
    elements = sum(card.num_layers * per_layer[m] for m in modules if m in per_layer)
    elements += sum(once[m] for m in modules if m in once)
    return float(slots * elements * DTYPE_BYTES[card.dtype])


def sglang_lora_bytes(card: ModelCard, tp: int, line: Line, slots: int, rank: int | None,
                      modules: list[str] | None, dp_attention: int = 1) -> tuple[float, str]:
    """The LoRA buffers of one rank and a note, or a one-line refusal where the layout was not read."""
    if rank is None:
        raise ConfigError("lora_rank: needed with enable_lora (SGLang's --max-lora-rank; it infers it from "
                          "--lora-paths, which capacity does not read)")
    if line < FIRST_LINE:
        raise ConfigError("enable_lora: SGLang's LoRA buffers are modelled from the 0.5.2 rules line (0.4.x keeps "
                          "another layout)")
    if card.moe is not None or card.mla is not None or card.state is not None:
        raise ConfigError(f"enable_lora: SGLang's LoRA buffers of {card.name} (MoE, MLA or state layers) are not "
                          "modelled, only dense attention models'")
    if dp_attention > 1:
        raise ConfigError("enable_lora: with enable_dp_attention SGLang's LoRA buffers are not modelled")
    mods = target_modules(modules, line)
    b = lora_buffer_bytes(card, tp, slots, rank, mods)
    return b, (f"LoRA: {slots} adapter slots of rank {rank} on {', '.join(mods)}"
               + ("" if modules else " (all: SGLang would infer them from --lora-paths)")
               + f": {b / 2**30:.2f} GiB a rank, allocated before the pool is sized")


__all__ = ["EMBEDDING", "LINEAR", "lora_buffer_bytes", "sglang_lora_bytes", "target_modules"]
