"""How SGLang releases before 0.4.9 lower `--mem-fraction-static` for a multimodal model in the model runner
(`runner_mm_factor`), whether F was given or defaulted.

Read from the PyPI wheels, `python/sglang/srt/model_executor/model_runner.py`, `ModelRunner.__init__` (0.4.3.post2,
0.4.4.post1-post3) and `ModelRunner.model_specific_adjustment` (0.4.5-0.4.8.post1), with the model list of
`python/sglang/srt/configs/model_config.py` (`multimodal_model_archs`, `is_multimodal_model`, and from 0.4.6
`ModelConfig.__init__`'s `mm_disabled_models`):

- up to 0.4.4.post3: `if self.is_multimodal: self.mem_fraction_static *= 0.95`
  ("Automatically reduce --mem-fraction-static to ... because this is a multimodal model.");
- 0.4.5 to 0.4.8.post1: the same with x 0.90;
- from 0.4.6 Gemma-3 and Llama-4 (`Gemma3ForConditionalGeneration`, `Llama4ForConditionalGeneration`) run
  text-only unless `--enable-multimodal`, so they keep F (the family's `sglang_text_only`: families/gemma.py,
  families/llama4.py) (0.4.4.post2 to 0.4.5.post3 list Gemma-3 as multimodal;
  0.4.4.post1 and earlier cannot load it);
- from 0.4.9 the reduction moved to `ServerArgs.__post_init__` and applies to the default F only
  (`vlm_fraction_factor` in `capacity.engine.sglang.memory`); the runner no longer touches F.

The pool is then sized with the lowered F: rest = A - T0 x (1 - F x factor) (`profile_max_num_token`), and
`init_memory_pool` raises "Not enough memory. Please try to increase --mem-fraction-static." when it is <= 0.
"""
from __future__ import annotations

from capacity.model.card import ModelCard
from capacity.model.families.registry import traits


def runner_mm_factor(card: ModelCard, line: tuple[int, int, int, int]) -> float:
    """The factor the model runner of a release before 0.4.9 applies to F (given or default) for a model with a
    vision tower; 1.0 for a text model and from 0.4.9. `line`: the release as (major, minor, patch, post)."""
    if card.vision is None or line >= (0, 4, 9, 0):
        return 1.0
    if line >= (0, 4, 6, 0) and traits(card.architecture).sglang_text_only:
        return 1.0
    return 0.95 if line < (0, 4, 5, 0) else 0.90
