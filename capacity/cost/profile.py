"""Calibration profiles: measured step-cost tables with provenance (written by `calibrate/`, read here).

A profile is JSON. It records where it was measured (device, torch/CUDA/driver versions, CPU threads,
dtype, date, the command), which model shape it was measured for (a fingerprint of every card field that
changes timing), the TP rank shapes, the grids, and per-op tables in seconds:

- `linear[family][i]`: one layer's op `family` (qkv, o, gate_up, down, elementwise, router, ...) over
  `tokens[i]` tokens, and `layer`/`layer_moe`: a whole non-attention layer body timed in one piece; `embed` and `lm_head` (final norm + LM head + greedy sampling) once per step;
- `expert[i]`: one routed expert's FFN over `expert_tokens[i]` tokens (MoE cards);
- `prefill_attn[c][k]`: one prefill chunk of `prefill_chunk[c]` new tokens on top of `prefill_cached[k]`;
- `decode_attn[b][x]`: one batched decode attention over `decode_batch[b]` sequences of context
  `decode_context[x]` (uniform lengths; `decode_layout` says how mixed lengths are laid out);
- `steps`: whole-step timings of the real decoder stack (role "fit" or "holdout");
- `fit`: step = sum of per-component scale x op-table time + overhead_s, fitted on the "fit" steps only.
A `null` in a table is a point that could not be measured (out of memory, or over the context limit).

Loading checks the schema version and the shape; using a profile for another model, TP size or device is an
error unless the caller explicitly allows it (then it warns).
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from capacity.cost.step import PrefillChunk, StepPlan
from capacity.errors import ConfigError
from capacity.files import format_validation_error, read_text
from capacity.model.card import ModelCard

SCHEMA_VERSION = 1
MAX_PROFILE_BYTES = 32 * 1024 * 1024

# Every number is finite and plausible, refused on load with its field (issue 49): an `Infinity` in a fitted
# scale made `simulate` run forever, a 1e300 op time printed a 300-digit step cost.
MAX_OP_S = 3600.0  # a measured op or step of more than an hour is not a measurement
MIN_OP_S = 1e-9  # nor one under a nanosecond (a kernel launch alone takes microseconds)
Secs = Annotated[float, Field(ge=MIN_OP_S, le=MAX_OP_S, allow_inf_nan=False)]
# strict: a count is a JSON integer: `true` is not 1 token, 10.7 is not cut to 10, "10" is not a number (issue 49)
PosInt = Annotated[int, Field(gt=0, le=10**9, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, le=10**9, strict=True)]
# a fitted scale multiplies op-table times into step times: real ones are 0.5-1.5; outside [0.01, 100] the
# tables and the steps disagree a hundredfold, and the profile is not one to plan with
Scale = Annotated[float, Field(ge=0.01, le=100, allow_inf_nan=False)]

# Card fields that change the time of a step (name and hf_id do not).
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim_", "intermediate_size",
                "vocab_size", "tie_word_embeddings", "attention_bias", "qk_norm", "dtype", "weight_format", "moe", "mla")


def model_shape(card: ModelCard) -> dict:
    out = {}
    for f in SHAPE_FIELDS:
        v = getattr(card, f)
        out[f.rstrip("_")] = v.model_dump() if isinstance(v, BaseModel) else v
    return out


def shape_fingerprint(shape: dict) -> str:
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Provenance(_Strict):
    device: str  # as given: cpu, cuda:0
    device_name: str  # torch.cuda.get_device_name or the CPU model
    gpu: str | None = None  # catalogue name the device maps to (None for CPUs and unknown parts)
    torch_version: str
    cuda_version: str | None = None
    driver_version: str | None = None
    cpu_threads: PosInt
    dtype: str
    gemm_dtype: str | None = None  # the dtype the dense GEMMs ran in (None: dtype; fp8: torch._scaled_mm)
    date: str  # ISO 8601, UTC
    host: str = ""
    command: str = ""
    quick: bool = False
    cuda_graphs: bool = False  # timed as replays of captured CUDA graphs (what engines run), not eagerly
    attention_kernel: Literal["sdpa", "flash", "reference"] | None = None  # calibrate/paged.py; None: before it
    compiled: bool = False  # each layer's work around attention through torch.compile (calibrate/fusion.py)
    notes: list[str] = []


class ModelIdentity(_Strict):
    name: str
    shape: dict
    fingerprint: str


class StepShape(_Strict):
    prefills: list[tuple[PosInt, NonNegInt]] = []  # (new tokens, cached tokens)
    decodes: list[NonNegInt] = []  # context length of each decoding sequence
    measured_s: Secs
    spread: float = Field(0.0, ge=0, le=1e6, allow_inf_nan=False)  # (p90 - p10) / median over the repeats
    role: Literal["fit", "holdout"]


FIT_COMPONENTS = ("layers", "prefill_attn", "decode_attn")


class Fit(_Strict):
    """step = sum over components of scale[c] x (op-table sum of c) + overhead_s. Per-component scales absorb
    what isolated op timings miss in a real step (caches evicted by the other ops, allocator traffic)."""

    scales: dict[Literal["layers", "prefill_attn", "decode_attn"], Scale]
    overhead_s: float = Field(ge=0, le=1, allow_inf_nan=False)  # per step, s: past a second it is no overhead
    median_abs_rel_err: float = Field(ge=0, le=1e6, allow_inf_nan=False)  # on the fit steps
    n_fit: PosInt


Table1D = list[Secs | None]
Table2D = list[list[Secs | None]]


class Profile(_Strict):
    schema_version: Annotated[int, Field(strict=True)]
    provenance: Provenance
    model: ModelIdentity
    tp: PosInt = 1
    decode_layout: Literal["padded", "paged"] = "padded"
    prefill_layout: Literal["per_sequence", "dense_packed"] = "per_sequence"
    tokens: list[PosInt]
    linear: dict[str, Table1D]
    embed: Table1D
    lm_head: Table1D
    expert_tokens: list[PosInt] = []
    expert: Table1D = []
    prefill_chunk: list[PosInt]
    prefill_cached: list[NonNegInt]
    prefill_attn: Table2D
    decode_batch: list[PosInt]
    decode_context: list[PosInt]
    decode_attn: Table2D
    allreduce_tokens: list[PosInt] = []
    allreduce: Table1D = []
    steps: list[StepShape] = []
    fit: Fit | None = None

    @model_validator(mode="after")
    def _shapes(self) -> Profile:
        def increasing(name, xs):
            if any(b <= a for a, b in zip(xs, xs[1:])):
                raise ValueError(f"{name} must be strictly increasing (got {xs})")

        for name in ("tokens", "expert_tokens", "prefill_chunk", "prefill_cached", "decode_batch", "decode_context",
                     "allreduce_tokens"):
            increasing(name, getattr(self, name))
        for fam, col in [*self.linear.items(), ("embed", self.embed), ("lm_head", self.lm_head)]:
            if len(col) != len(self.tokens):
                raise ValueError(f"table {fam} has {len(col)} entries for {len(self.tokens)} token counts")
        if len(self.expert) != len(self.expert_tokens):
            raise ValueError(f"table expert has {len(self.expert)} entries for {len(self.expert_tokens)} token counts")
        if len(self.allreduce) != len(self.allreduce_tokens):
            raise ValueError("table allreduce does not match allreduce_tokens")
        for name, table, rows, cols in (("prefill_attn", self.prefill_attn, self.prefill_chunk, self.prefill_cached),
                                        ("decode_attn", self.decode_attn, self.decode_batch, self.decode_context)):
            if len(table) != len(rows) or any(len(r) != len(cols) for r in table):
                raise ValueError(f"table {name} must be {len(rows)} x {len(cols)}")
        return self


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile; every failure is one ConfigError line naming the file."""
    p = Path(path)
    text = read_text(p, "profile", MAX_PROFILE_BYTES)
    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{p}: profile nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg} "
                          "(truncated or corrupt profile?)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object at the top level, got {type(data).__name__}")
    version = data.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # `true` == 1 in Python
        raise ConfigError(f"{p}: schema_version {version!r} is not supported (this capacity reads version "
                          f"{SCHEMA_VERSION}); re-run `capacity calibrate` to measure a new profile")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(p))) from None


class ProfileMismatchWarning(UserWarning):
    """A profile was used for another model, TP size or device because the caller allowed it."""


def check_profile(profile: Profile, card: ModelCard, tp: int = 1, gpu: str | None = None,
                  allow_mismatch: bool = False, source: str = "profile") -> None:
    """Raise ConfigError if the profile was measured for another model shape, TP size or GPU."""
    problems = []
    shape = model_shape(card)
    if shape_fingerprint(shape) != profile.model.fingerprint:
        diff = [f"{k}: profile {profile.model.shape.get(k)!r} vs card {v!r}" for k, v in shape.items()
                if profile.model.shape.get(k) != v]
        problems.append(f"measured for model {profile.model.name!r}, not {card.name!r} ({'; '.join(diff) or 'shape differs'})")
    if profile.tp != tp:
        problems.append(f"measured at tp={profile.tp}, scenario has tp={tp}")
    if gpu is not None and profile.provenance.gpu != gpu:
        problems.append(f"measured on {profile.provenance.device_name} "
                        f"({profile.provenance.gpu or 'not a catalogue GPU'}), scenario gpu is {gpu}")
    if not problems:
        return
    msg = f"{source}: " + "; ".join(problems)
    if not allow_mismatch:
        raise ConfigError(msg + " (pass --allow-profile-mismatch to use it anyway)")
    warnings.warn(msg + " (used anyway: --allow-profile-mismatch)", ProfileMismatchWarning, stacklevel=2)


# ---- profiles shipped with the repository ------------------------------------------------------------
BUNDLED_DIR = Path(__file__).resolve().parents[1] / "data" / "profiles"  # package data: works from a wheel


def bundled_profiles(model: str | None = None, gpu: str | None = None) -> list[tuple[str, Path, Profile]]:
    """(name, path, profile) of every readable profile in calibrate/profiles, optionally only those measured
    for `model` on catalogue GPU `gpu`. Interrupted runs (*.partial.json) are not profiles."""
    out = []
    for f in sorted(BUNDLED_DIR.glob("*.json")) if BUNDLED_DIR.is_dir() else []:
        if f.name.endswith(".partial.json"):
            continue
        try:
            prof = load_profile(f)
        except ConfigError:
            continue
        if (model is None or prof.model.name == model) and (gpu is None or prof.provenance.gpu == gpu):
            out.append((f.stem, f, prof))
    return out


def profile_label(path: str | Path) -> str:
    """How a profile is named in messages and sources: a bundled one by its name, another by its path."""
    p = Path(path)
    try:
        if p.resolve().parent == BUNDLED_DIR.resolve():
            return f"{p.stem} (bundled)"
    except OSError:
        pass
    return str(path)


def resolve_profile(name_or_path: str) -> str:
    """A profile file path as given, or the name of a bundled profile (`llama-3.1-8b-h200`) as its path."""
    p = Path(name_or_path)
    if p.is_file():
        return str(p)
    if p.name == name_or_path:  # a bare name: look among the bundled profiles
        cand = BUNDLED_DIR / (name_or_path if name_or_path.endswith(".json") else name_or_path + ".json")
        if cand.is_file():
            return str(cand)
    names = ", ".join(n for n, _, _ in bundled_profiles()) or "none"
    raise ConfigError(f"profile {name_or_path!r}: no such file and no bundled profile of that name "
                      f"(bundled: {names}; `capacity profiles` lists them)")


def to_plan(prefills, decodes):
    """A profile step's shapes ([(new, cached)...], [context...]) as a StepPlan."""
    return StepPlan(tuple(PrefillChunk(int(c), int(k)) for c, k in prefills), tuple(int(d) for d in decodes))
