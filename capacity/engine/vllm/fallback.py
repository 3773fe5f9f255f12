"""Which vLLM engine and graph mode a model gets in a release: the V1 -> V0 fallback for architectures V1 did not
support, and CUDA graphs turned off by the release for a model (issue 47). Read from each release's code (the
sdists on PyPI, 0.6.0-0.11.0; docs/vllm-releases.md, "Engine and graph mode by model"):

- V0 fallback. `EngineArgs._is_v1_supported_oracle` (vllm/engine/arg_utils.py, 0.8.0-0.10.2) calls
  `_raise_or_fallback(model_config.architectures)` when `ModelConfig.is_v1_compatible` is false, i.e. the model
  class carries `SupportsV0Only` (`ModelRegistry.is_v1_compatible`, model_executor/models/registry.py): with
  VLLM_USE_V1 unset the V0 engine runs it, with VLLM_USE_V1=1 it raises "VLLM_USE_V1=1 is not supported with
  [...]". Before 0.8 V0 is the default anyway (0.7's opt-in V1 has no encoder-decoder models). `V0_ONLY` lists the classes capacity has a card family for.
- Removal. 0.11.0 deletes V0 and the V0-only encoder-decoder models: `_PREVIOUSLY_SUPPORTED_MODELS`
  (model_executor/models/registry.py) names MllamaForConditionalGeneration "0.10.2" (its last release).
- Eager by the release. `ModelConfig._verify_cuda_graph` (vllm/config.py) sets `enforce_eager = True` for
  `MODEL_NOT_SUPPORT_CUDA_GRAPH = ['mllama']` in 0.7.0-0.8.1 (absent in 0.6.2-0.6.6, where mllama arrived; 0.8.2
  drops the list, 0.8.3 keeps mllama eager on ROCm only). Elsewhere V0's `EncoderDecoderModelRunner` captures and
  replays full decode graphs (`_use_captured_graph`, with the captured max_encoder_seq_len =
  max_seq_len_to_capture, so the graph holds the cross-attention layers).

`mode` returns the Release the model runs on and whether the release forces eager execution; a runner the
release cannot run for the model (`vllm@0.9:v1` with mllama) or a release without the model is a one-line error.
"""
from __future__ import annotations

from dataclasses import dataclass

from capacity.engine.vllm.release import Release, Version, fmt
from capacity.errors import ConfigError
from capacity.model.card import ModelCard


@dataclass(frozen=True)
class V0Only:
    """A model class marked SupportsV0Only in releases first..last (V1 default releases), removed from `removed`."""

    architecture: str  # capacity's card.architecture
    vllm_class: str
    first: Version
    last: Version
    removed: Version | None = None
    vision_only: bool = False  # only the vision-language card of this architecture (gemma3's text model is V1)


# grep SupportsV0Only vllm/model_executor/models/*.py in 0.8.0 ... 0.10.2 (the sdists). Hybrid (Mamba-style) models
# (bamba, jamba, mamba2, zamba2, falcon_h1, granitemoehybrid, minimax_text_01, plamo2, phi4flash) are V0-only in
# some of these releases too, but capacity models hybrids from 0.10.2 only (Vllm.resolve refuses them before).
V0_ONLY: tuple[V0Only, ...] = (
    # 0.7's opt-in V1 has no encoder-decoder path at all (v1/engine/processor.py: "TODO(woosuk): Support
    # encoder-decoder models"): V0-only from 0.7 too
    V0Only("mllama", "MllamaForConditionalGeneration", (0, 7, 0), (0, 10, 2), removed=(0, 11, 0)),
    V0Only("gemma3", "Gemma3ForConditionalGeneration", (0, 8, 0), (0, 8, 0), vision_only=True),
)
# ModelConfig._verify_cuda_graph: MODEL_NOT_SUPPORT_CUDA_GRAPH = ['mllama'] (on every platform)
EAGER_BY_RELEASE: dict[str, tuple[Version, Version]] = {"mllama": ((0, 7, 0), (0, 8, 1))}


def _v0_only(rel: Release, card: ModelCard) -> V0Only | None:
    for m in V0_ONLY:
        if card.architecture == m.architecture and (not m.vision_only or card.vision is not None) \
                and (m.first <= rel.version <= m.last or (m.removed is not None and rel.version >= m.removed)):
            return m
    return None


def mode(rel: Release, card: ModelCard, runner_given: str | None, pinned: bool = True) -> tuple[Release, bool]:
    """(the Release `card` runs on, whether the release forces eager execution). `runner_given`: the spec's
    `:v0`/`:v1`, None when the release's default was taken; `pinned`: the spec named a version (`vllm` alone, the
    current release, is kept as the what-if it was for a model the release dropped)."""
    m = _v0_only(rel, card)
    if m is not None and m.removed is not None and rel.version >= m.removed:
        if pinned:
            raise ConfigError(f"engine {rel.label}: {m.vllm_class} ({card.name}) was removed in vLLM {fmt(m.removed)} "
                              f"with the V0 engine (registry _PREVIOUSLY_SUPPORTED_MODELS: last {fmt(m.last)}); "
                              f"pin vllm@{fmt(m.last)[:4]}")
        m = None
    if m is not None and rel.runner == "v1":
        if runner_given == "v1":
            raise ConfigError(f"engine {rel.label}:v1: {m.vllm_class} ({card.name}) is V0-only in vLLM "
                              f"{fmt(m.first)}-{fmt(m.last)} (SupportsV0Only; VLLM_USE_V1=1 raises); "
                              f"use {rel.label} (its V0 engine)")
        rel = Release(rel.version, "v0")
    span = EAGER_BY_RELEASE.get(card.architecture)
    eager = span is not None and span[0] <= rel.version <= span[1] and rel.runner == "v0"
    return rel, eager


__all__ = ["EAGER_BY_RELEASE", "V0_ONLY", "V0Only", "mode"]
