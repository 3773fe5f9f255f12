"""SGLang on AMD GPUs: the aiter attention backend's cut of --mem-fraction-static.

Read in the PyPI wheels: `model_executor/model_runner.py` `ModelRunner.__init__` (the default backend) and
`model_specific_adjustment` (0.4.7, 0.4.7.post1, 0.4.8, 0.4.8.post1, 0.4.9, 0.5.0rc0), then `server_args.py`
`_handle_attention_backend_compatibility` (0.5.5, 0.5.10) and `arg_groups/attention_hook.py` (0.5.20):

- with no --attention-backend, ROCm takes `aiter` for a non-MLA model, and for an MLA model when
  `model_config.get_num_kv_heads(tp_size)` (the config's num_key_value_heads / tp) is 16 or 128 (else `triton`;
  0.4.x also requires no speculative decoding, not modelled);
- with aiter and `model_config.context_len` (--context-length, else the config's) over 8,192:
  `mem_fraction_static *= 0.85`, whether F was given or defaulted (0.5.20 keeps a given F only under the opt-in
  SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION, not modelled);
- 0.4.6.post5 already defaults to aiter on ROCm but has no cut; 0.4.6.post2 and earlier neither.

So the pool is sized at 0.85 F: rest = A - T0 x (1 - 0.85 F). sglang#7691 (0.4.8.post1, MI300X-class, DeepSeek-R1
at TP 8) logs a pool that needs F about 0.69 = 0.812 (the default) x 0.85 (tests/test_sglang_startup_v3.py).
"""
from __future__ import annotations

from capacity.model.card import ModelCard

AITER_CUT = 0.85
AITER_CUT_LINE = (0, 4, 7, 0)  # the first release line with the cut (memory.RELEASES has a 0.4.7 line)
AITER_MIN_CONTEXT = 8192  # the cut applies above this context_len


def aiter_backend(card: ModelCard, tp: int) -> bool:
    """Whether SGLang on ROCm picks the aiter attention backend by default for this model at this TP."""
    if card.mla is None:
        return True
    return max(1, card.num_kv_heads // tp) in (16, 128)


def aiter_cut(card: ModelCard, tp: int, line: tuple[int, int, int, int], context_len: int, amd: bool) -> float:
    """The factor SGLang applies to F on an AMD GPU under the release `line`: 0.85 with the aiter backend and a
    context over 8,192 tokens, else 1.0."""
    if not amd or line < AITER_CUT_LINE or context_len <= AITER_MIN_CONTEXT or not aiter_backend(card, tp):
        return 1.0
    return AITER_CUT


def apply_aiter_cut(card: ModelCard, tp: int, line: tuple[int, int, int, int], context_len: int, amd: bool,
                    f: float, notes: list[str]) -> float:
    """F after the aiter cut (`aiter_cut`), with a note in `notes` when it applies."""
    cut = aiter_cut(card, tp, line, context_len, amd)
    if cut != 1.0:
        notes.append(aiter_note(f * cut, context_len))
    return f * cut


def aiter_note(f: float, context_len: int) -> str:
    return (f"AMD GPU with the aiter attention backend (SGLang's default on ROCm) and context_len {context_len:,} > "
            f"{AITER_MIN_CONTEXT:,}: SGLang lowers F by x{AITER_CUT} to {f:.3f}")


__all__ = ["AITER_CUT", "AITER_CUT_LINE", "AITER_MIN_CONTEXT", "aiter_backend", "aiter_cut", "aiter_note", "apply_aiter_cut"]
