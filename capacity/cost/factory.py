"""The one cost factory: (model card, GPU, TP size, KV dtype, profile) -> the step cost a run uses.

A step-cost source is either used or refused, never silently swapped: with a profile, the calibrated cost
is built for exactly this model shape, GPU and TP size, or the profile is refused with one line saying
why (`--allow-profile-mismatch` turns a mismatch into a warning). A profile measured with the model's own
KV dtype is refused for another KV dtype (fp8/int8 KV reads half the bytes in attention, which the profile
did not measure). Without a profile, the roofline of the GPU's datasheet, with the KV dtype's bytes.
"""
from __future__ import annotations

import warnings

from capacity.cost.calibrated import CalibratedCost
from capacity.cost.profile import load_profile, profile_label, resolve_profile
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import StepCost
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.compute import gemm_dtypes
from capacity.model.gpus import GPU, get_gpu

DEFAULT_GPU = "h100-sxm"
_ROOFLINES: dict[tuple, RooflineCost] = {}  # roofline_cost's, most recently used last
ROOFLINES_KEPT = 16


def roofline_cost(card: ModelCard, gpu: GPU, tp: int, kv_dtype: str | None,
                  step_overhead_s: float | None, allreduce: str = "vllm") -> RooflineCost:
    """The roofline step cost of these inputs, one per process for equal inputs (the card and the GPU compared
    by value, every field): a plan's simulations of one model on one GPU share it and with it the memo of step
    terms it fills as it is asked (`RooflineCost._terms`), which each simulation otherwise rebuilt from
    nothing. Nothing writes to a RooflineCost after it is built (the wrappers of `capacity.pipeline.prepare`
    hold it; only a calibrated cost's `overhead_s` is ever set), so sharing one changes no step time
    (tests/test_cost_factory_cache.py). The ROOFLINES_KEPT most recently used are kept."""
    key = (type(card), card.model_dump_json(), type(gpu), gpu.model_dump_json(), tp, kv_dtype, step_overhead_s, allreduce)
    got = _ROOFLINES.pop(key, None)
    if got is None:
        fields: dict[str, object] = {} if allreduce == "vllm" else {"allreduce_engine": allreduce}
        if step_overhead_s is not None:
            fields["step_overhead_s"] = step_overhead_s
        got = (RooflineCost(card, gpu, tp, kv_dtype=kv_dtype) if not fields else
               RooflineCost(card, gpu, tp, kv_dtype=kv_dtype, params=RooflineParams.model_validate(fields)))
        while len(_ROOFLINES) >= ROOFLINES_KEPT:
            del _ROOFLINES[next(iter(_ROOFLINES))]
    _ROOFLINES[key] = got
    return got


def profile_gpu(profile: str) -> str:
    """The catalogue GPU a profile (file or bundled name) was measured on (a CPU profile: the default GPU, whose
    memory then sizes the KV cache)."""
    return load_profile(resolve_profile(profile)).provenance.gpu or DEFAULT_GPU


def make_step_cost(card: ModelCard, gpu: GPU | str | None, tp: int = 1, *, kv_dtype: str | None = None,
                   profile: str | None = None, allow_mismatch: bool = False, step_overhead_s: float | None = None,
                   overhead_given: bool = False, allreduce: str = "vllm") -> StepCost:
    """The step cost for one replica (see module docstring). `gpu` None: the profile's own GPU, or h100-sxm.
    `kv_dtype`: the resolved KV cache dtype (None or "auto": the card's dtype). `step_overhead_s`: the engine
    model's CPU time per step (the roofline's fixed term; a profile keeps its fitted one unless `overhead_given`).
    `allreduce`: whose all-reduce rules the roofline follows (RooflineParams.allreduce_engine)."""
    kv = None if kv_dtype in (None, "auto") else kv_dtype
    if profile is None:
        g = gpu if isinstance(gpu, GPU) else get_gpu(gpu or DEFAULT_GPU)
        return roofline_cost(card, g, tp, kv, step_overhead_s, allreduce)
    path = resolve_profile(profile)
    prof = load_profile(path)
    label = profile_label(path)
    if kv is not None and kv != card.dtype:
        msg = (f"{label}: measured with {card.dtype} KV; kv_cache_dtype {kv} reads fewer bytes in attention than "
               "the profile measured: use the roofline (no --profile) or --allow-profile-mismatch")
        if not allow_mismatch:
            raise ConfigError(msg)
        warnings.warn(msg.split(": use the roofline")[0] + " (used anyway: attention is costed at the measured dtype)",
                      stacklevel=2)

    g = gpu if isinstance(gpu, GPU) else get_gpu(gpu or prof.provenance.gpu or DEFAULT_GPU)
    measured = prof.provenance.gemm_dtype or prof.provenance.dtype
    other = sorted({d for d in gemm_dtypes(card, g).values()} - {measured})
    if other:
        msg = (f"{label}: measured {measured} GEMMs; {card.name} multiplies in {', '.join(other)} on "
               f"{g.name} (weight format {card.weight_format}): use the roofline (no --profile) or "
               "--allow-profile-mismatch")
        if not allow_mismatch:
            raise ConfigError(msg)
        warnings.warn(msg.split(": use the roofline")[0] + " (used anyway: GEMMs are costed at the measured dtype)",
                      stacklevel=2)
    gpu_name = gpu.name if isinstance(gpu, GPU) else (get_gpu(gpu).name if gpu else None)
    cost = CalibratedCost(prof, card, gpu=gpu_name, tp=tp, allow_mismatch=allow_mismatch, profile_path=label)
    if overhead_given and step_overhead_s is not None:
        cost.overhead_s = step_overhead_s
    return cost
