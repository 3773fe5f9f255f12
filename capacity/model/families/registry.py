"""The registry of model families: which `model_type`s each family reads, and its hooks.

A family module (any module of this package but this one) calls `register(Family(...))` at import; the registry
imports every module of the package the first time it is asked (`family`, `supported`), so a new family is one
new module and nothing else. The generic code dispatches through the hooks instead of branching on model_type:

- `capacity.model.hf.from_hf_config` (config.json -> card): `defaults` (transformers' config-class defaults for
  fields configs leave out), `text` (a vision-language wrapper's text config and its model type), `shape` (the
  family's own card fields: MoE, MLA, state layers, cross-attention, biases, norms), `sliding` (how many layers
  slide where the config has no `layer_types`), `local_rope` (a second, unscaled rotary cache), `vision` (the
  vision tower), `fallback` (a model type no family claims).
- `capacity.model.weights.tensor_groups` (weight layout): `weights`, tensors the card's generic layout does not
  describe (looked up by the card's `architecture`, so a YAML card naming the model type gets them too).

The KV layout (full, sliding, MLA, cross-attention, state cache) and the step-cost shape follow from the card
fields a family sets (`mla`, `sliding_window`/`num_sliding_layers`, `cross_attention_layers`, `state`), so they
need no hook. NVIDIA aiconfigurator keeps one module per model family too (its sdk/models folder); nothing of
its code is used here.
"""
from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Need = Callable[..., Any]  # need(key, where=None, label=""): the field, or the family default, or an error naming it
# shape(text config, card fields, need, source): adds the family's own fields to the card mapping
Shape = Callable[[dict, dict, Need, str], None]
# sliding(text config, layers, window, defaults) -> layers that slide, where the config has no layer_types
Sliding = Callable[[dict, int, Any, Mapping[str, Any]], int]
TextOf = Callable[[dict, str, str], tuple[dict, str]]  # (config, model_type, source) -> (text config, its type)
VisionOf = Callable[[dict, str, int, str], dict]  # (config, model_type, text hidden size, source) -> card["vision"]
Fallback = Callable[[dict, Any, str], list[str]]  # (config, model_type, source) -> notes; raises where it cannot
Weights = Callable[[Any, list], list]  # (card, tensor groups) -> tensor groups


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    source: str = ""  # the engine code its layout follows (vLLM model file)
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    shape: Shape | None = None
    sliding: Sliding | None = None
    local_rope: bool = False
    text: TextOf | None = None
    vision: VisionOf | None = None
    fallback: Fallback | None = None
    weights: Weights | None = None
    # Engine facts that follow the family, read by capacity.engine instead of branching on model_type:
    # SGLang runs it text-only unless --enable-multimodal (model_config.py `mm_disabled_models`, from 0.4.6)
    sglang_text_only: bool = False
    # SGLang sets aside max_running_requests' state slots before the KV pool, radix cache off (NemotronH's path in
    # model_runner.py), instead of splitting the pools by mamba_full_memory_ratio
    sglang_states_per_request: bool = False
    # vLLM from 0.13: the SSM state dtype is the config's mamba_ssm_cache_dtype (MambaStateDtypeCalculator's
    # model-specific branch, capacity.engine.vllm.layout.state_dtype_bytes)
    ssm_dtype_from_config: bool = False
    # vLLM builds no rotary embedding (and so no cos/sin cache) for its attention: Kimi-Linear's MLA (mla_use_nope)
    rotary: bool = True
    # The share of head_dim the rotary embedding turns where the family's attention rotates part of each head
    # (vLLM get_rope(rotary_dim=head_dim x partial_rotary_factor): GLM-4 0.5, Qwen3.5-MoE 0.25): its cos/sin
    # cache is max_position x that width. The shape hook refuses a config stating another factor.
    partial_rotary: float = 1.0
    # Bytes per token and layer of a cache the engine allocates beside the KV cache, whatever the KV dtype:
    # DeepSeek-V3.2's lightning-indexer keys (vLLM deepseek_v2.py `DeepseekV32IndexerCache`)
    side_cache_bytes: int = 0


PLAIN = Family("plain", ())  # a text config of a model type no family claims, inside a known wrapper: no hooks
_BY_TYPE: dict[str, Family] = {}
_FALLBACK: list[Family] = []
_LOADED: list[bool] = []
_LOCK = threading.RLock()


def register(*families: Family) -> None:
    for fam in families:
        for mt in fam.model_types:
            if mt in _BY_TYPE and _BY_TYPE[mt] is not fam:
                raise RuntimeError(f"model_type {mt!r} is registered by {_BY_TYPE[mt].name} and {fam.name}")
            _BY_TYPE[mt] = fam
        if fam.fallback is not None:
            _FALLBACK.append(fam)


def _load() -> None:
    if _LOADED:
        return
    with _LOCK:  # threads asking at once wait for the whole package, not a half-registered one
        if _LOADED:
            return
        package = __name__.rsplit(".", 1)[0]
        for mod in pkgutil.iter_modules(importlib.import_module(package).__path__):
            if mod.name != "registry":
                importlib.import_module(f"{package}.{mod.name}")
        _LOADED.append(True)


def family(model_type: Any) -> Family | None:
    """The family registered for a model_type, or None."""
    _load()
    return _BY_TYPE.get(model_type) if isinstance(model_type, str) else None


def traits(model_type: Any) -> Family:
    """The family registered for a model_type (a card's `architecture`), else PLAIN: what engine code reads a
    family's engine facts from."""
    return family(model_type) or PLAIN


def fallback() -> Family:
    """The family that reads a model type no family claims (families/generic.py)."""
    _load()
    return _FALLBACK[0]


def supported() -> list[str]:
    _load()
    return sorted(_BY_TYPE)
