"""The engine configuration: the serving knobs every engine shares, in vLLM's names (`EngineConfig`, a strict
pydantic model), and under it each engine's class with its own knobs (`VllmConfig` in capacity/engine/vllm/config.py,
`SglangConfig`, `TrtllmConfig`), the one an `engine:` spec names. Every command, the planner, the dashboard and
validation use them. `None` means "let the engine choose": the engine model (`capacity.engine.vllm`) resolves it the
way that engine does. A setting of another engine (`max_loras` under `engine: sglang`) is an error naming it.

This module imports no engine and not the registry: the registry tells each class which specs its engine has
(`bind_specs`), and each engine's class records itself when it is defined.

Strict: a YAML `true` is not the integer 1, `8192.0` is not a token count, and an unknown knob (a typo such as
`max_num_seqz`) is an error naming the field, not a silently ignored setting.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic._internal._model_construction import ModelMetaclass
from pydantic.fields import FieldInfo

from capacity.engine.settings import ENGINE_COMMANDS, ENGINE_LABELS, ENGINES, setting
from capacity.engine.speculative import SpeculativeConfig
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.sched import POLICIES
from capacity.units import GiB

PosInt = Annotated[int, Field(gt=0, le=10**9)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
KVDtype = Literal["auto", "fp8", "int8"]


class MemoryModelParams(BaseModel):
    """Overrides for the estimated terms of the VRAM budget. `None` (the default) takes the engine release's
    own estimate (`capacity.engine.vllm`, with the logs each was checked on); a number replaces it.

    Every field can be set in a scenario, and `capacity memory` says which terms are estimates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Non-torch memory counted by the release's profiler at tp=1 (cuBLAS/attention workspaces; the CUDA
    # context too where the profiler measures device-wide). None: the release's logged value.
    non_torch_bytes: NonNegFloat | None = None
    # Extra at tp > 1 (NCCL and custom all-reduce buffers; NVLS buffers on NVSwitch boards). None: by board.
    non_torch_multi_gpu_bytes: NonNegFloat | None = None
    # ... growing with the number of peers.
    non_torch_per_peer_bytes: NonNegFloat | None = None
    # Bytes per logit of the profiling run's dummy sampler (None: derived from the release's sampler code).
    sampler_bytes_per_logit: NonNegFloat | None = None
    # vLLM's fused MoE kernel processes at most this many tokens at once (VLLM_FUSED_MOE_CHUNK_SIZE).
    fused_moe_chunk_tokens: Annotated[int, Field(gt=0)] = 32768
    # CUDA context + kernels loaded before vLLM's snapshot: outside the budget, but must physically fit.
    cuda_context_bytes: NonNegFloat = 0.5 * GiB
    # CUDA-graph memory per captured piece (one per layer + 1, per capture size). None: from the logs.
    cuda_graph_bytes_per_segment: NonNegFloat | None = None


class _PickedByEngine(ModelMetaclass):
    """`EngineConfig(engine="sglang", ...)` builds the class of the engine it names (SglangConfig; VllmConfig where
    it names none), so a caller need not know which class holds its engine's settings."""

    def __call__(cls, *args: Any, **kw: Any) -> Any:
        if cls is EngineConfig and not args:
            return type.__call__(pick(kw.get("engine", "vllm")), **kw)
        return type.__call__(cls, *args, **kw)

    def __init__(cls, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if cls.__dict__.get("ENGINE"):  # an engine's own class (EngineConfig and a test's subclass have none)
            _CLASSES[cls.__dict__["ENGINE"]] = cls  # type: ignore[assignment]


class EngineConfig(BaseModel, metaclass=_PickedByEngine):
    """The settings every engine shares (vLLM's names). `None` means "let the engine choose" (the engine model
    resolves it). Each engine's class (VllmConfig, SglangConfig, TrtllmConfig) adds its own; `EngineConfig(...)` and
    `EngineConfig.model_validate(...)` build the one the `engine` field names."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    ENGINE: ClassVar[str] = ""  # the engine whose settings a subclass holds ("": the shared ones)

    # Each setting is declared once (capacity/engine/settings.py): its description, bounds (in the type), the CLI
    # flag, the engines' own flags and the dashboard control; the commands, launch commands, dashboard and
    # docs/schema.md are generated from it.
    engine: str = setting(
        "vllm", description="Which engine model resolves defaults, memory and scheduling: `vllm` (the current release), "
        "`vllm@0.11` (the last patch of a release), `vllm@0.9.2:v0` (the V0 engine of a release that has both).",
        flag="--engine", help="Engine release: vllm (current), vllm@0.11, vllm@0.9.2:v0 (see `capacity engines`)",
        commands=(*ENGINE_COMMANDS, "fleet"), ui={"label": "Engine", "kind": "selectbox", "help": "whose defaults, "
        "start-up memory accounting and scheduler apply: vLLM (vllm = the current release), SGLang or TensorRT-LLM "
        "(`capacity engines` lists them all)"})
    tensor_parallel_size: PosInt = setting(
        1, description="GPUs per replica (heads must divide it, as vLLM requires)", flag="--tp",
        help="Tensor-parallel size", cli_default=1, commands=(*ENGINE_COMMANDS, "autoscale", "pools"), vllm="--tensor-parallel-size", sglang="--tp", trtllm="--tp_size",
        ui={"label": "Tensor parallel size", "kind": "select_slider", "options": [1, 2, 4, 8]})
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = setting(
        0.9, description="share of the GPU's memory vLLM may use for weights, activations and KV",
        flag="--gpu-memory-utilization", help="Fraction of GPU memory vLLM may use", cli_default=0.9,
        vllm="--gpu-memory-utilization", commands=(*ENGINE_COMMANDS, "fleet"),
        ui={"label": "gpu_memory_utilization", "kind": "slider", "min": 0.5, "max": 0.98, "step": 0.01})
    max_model_len: PosInt | None = setting(
        None, description="longest request (prompt + output) accepted; None: the model's max_position_embeddings",
        flag="--max-model-len", help="Max context (default: the model's)",
        commands=(*ENGINE_COMMANDS, "fleet", "autoscale", "pools", "disagg"),
        vllm="--max-model-len", sglang="--context-length", trtllm="--max_seq_len",
        ui={"label": "max_model_len", "kind": "select_slider", "value": 8192,
            "options": [2048, 4096, 8192, 16384, 32768, 65536, 131072]})
    max_num_seqs: PosInt | None = setting(
        None, description="batch cap; None: the release's default (see large_gpu_defaults)", flag="--max-num-seqs",
        help="Max batch (default: vLLM's rule)", commands=(*ENGINE_COMMANDS, "autoscale"), vllm="--max-num-seqs", sglang="--max-running-requests",
        trtllm="--max_batch_size", ui={"label": "max_num_seqs (max batch)", "kind": "select_slider", "value": 256,
                                       "options": [8, 16, 32, 64, 128, 256, 512, 1024]})
    max_num_batched_tokens: PosInt | None = setting(
        None, description="token budget per step; None: the release's default", flag="--max-num-batched-tokens",
        help="Token budget per step", vllm="--max-num-batched-tokens", sglang="--chunked-prefill-size",
        trtllm="--max_num_tokens", ui={"label": "max_num_batched_tokens", "kind": "select_slider", "value": 8192,
                                       "options": [1024, 2048, 4096, 8192, 16384]})
    enable_chunked_prefill: bool | None = setting(
        None, description="Split long prompts across steps. None: the release's default (V1: on; V0: on by itself "
        "above 32k tokens; TensorRT-LLM: off).", flag="--chunked-prefill/--no-chunked-prefill",
        help="Chunked prefill on or off (default: the engine release's)",
        vllm="--enable-chunked-prefill/--no-enable-chunked-prefill",
        ui={"label": "chunked prefill", "kind": "checkbox", "value": True})
    enable_prefix_caching: bool = setting(
        False, description="Off unless asked (vLLM's own default is on): the launch command spells the choice out, "
        "so the engine runs what was simulated. On: vLLM's block-level cache, shared prefixes and a preempted "
        "request's own blocks.", flag="--prefix-caching/--no-prefix-caching", help="Reuse shared-prefix KV blocks",
        cli_default=False, commands=("simulate", "plan"), vllm="--enable-prefix-caching/--no-enable-prefix-caching")
    async_scheduling: bool | None = setting(
        None, description="The engine schedules the next step while the last one runs (vLLM's async scheduling, "
        "SGLang's overlap scheduler), so a finished request keeps its blocks and its batch slot one step longer "
        "(vLLM: sliding-window groups also reserve two batches in flight). None: the engine's default (vLLM: on from "
        "0.14 on a GPU, its CPU build turns it off; SGLang: on).", flag="--async-scheduling/--no-async-scheduling",
        help="vLLM schedules the next step while one runs (default: the release's GPU default)",
        commands=("simulate", "plan"), vllm="--async-scheduling/--no-async-scheduling")
    block_size: Literal[1, 8, 16, 32, 64, 128, 256] | None = setting(
        None, description="tokens per KV block; None: 16 (64 for MLA models)", flag="--block-size",
        help="KV block size in tokens", vllm="--block-size", sglang="--page-size",
        ui={"label": "block size", "kind": "select_slider", "value": 16, "options": [16, 32, 64]})
    kv_cache_dtype: KVDtype = setting(
        "auto", description="auto: the model's dtype; fp8/int8 halve KV memory and the bytes attention reads",
        flag="--kv-dtype", help="KV cache dtype: auto, fp8, int8", cli_default="auto",
        commands=(*ENGINE_COMMANDS, "fleet"), vllm="--kv-cache-dtype", sglang="--kv-cache-dtype",
        ui={"label": "KV cache dtype", "kind": "selectbox", "options": ["auto", "fp8"]})
    enforce_eager: bool = setting(
        False, description="no CUDA graphs (no graph memory; steps are not replays)", flag="--enforce-eager",
        set_to=True, help="No CUDA graphs", vllm="--enforce-eager", sglang="--disable-cuda-graph")
    policy: str = setting(
        "continuous", description="continuous = vLLM's fcfs; priority = vLLM's --scheduling-policy priority; sjf = "
        "continuous batching that serves the shortest prompt first (not a vLLM policy: a what-if); static = "
        "collect-a-batch serving. one of capacity.sched.POLICIES", flag="--policy",
        help="continuous, priority, sjf or static", cli_default="continuous", commands=("simulate", "plan"),
        vllm="--scheduling-policy")
    static_max_batch: PosInt | None = setting(
        None, description="static policy: batch size (default: max_num_seqs)", flag="--max-batch",
        help="Static batching: batch size", commands=("simulate",))
    static_max_wait_s: NonNegFloat = setting(
        0.0, description="static policy: how long the first request may wait for a batch", flag="--max-wait-ms",
        help="Static batching: batching window", cli_default=0.0, scale=1e-3, commands=("simulate",))
    kv_reservation: Literal["prompt", "prompt_and_output"] | None = setting(
        None, description="KV reserved when a request is admitted. prompt: its input (vLLM; outputs take blocks as "
        "they grow, and a full cache preempts); prompt_and_output: input and every output token up front, so nothing "
        "is ever preempted (TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler, its default). None: the engine's "
        "own.", flag="--kv-reservation", help="KV reserved at admission: prompt (vLLM) or prompt_and_output "
        "(TensorRT-LLM's GUARANTEED_NO_EVICT: never preempts)", commands=("simulate", "plan"),
        ui={"label": "KV reserved at admission", "kind": "selectbox", "none_label": "engine's own",
            "options": ["prompt", "prompt_and_output"]})
    step_overhead_ms: Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)] | None = setting(
        None, description="CPU time per engine step that the GPU waits for (scheduling, input preparation, output "
        "processing), ms. None: the engine model's figure (2 ms for vLLM, not yet checked against a measured run); a "
        "measured run fits it (see docs/fidelity.md). Applies to the roofline; a calibrated profile keeps its fitted "
        "overhead.", flag="--step-overhead-ms", help="CPU time per engine step the GPU waits for (default: the engine "
        "model's, 2 ms)", commands=("simulate", "plan"), ui={"label": "step overhead (ms)", "kind": "number",
                                                             "step": 0.5})
    output_cpu_us_per_token: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = setting(
        None, description="CPU time the server spends per output token beside the engine (detokenising, streaming: "
        "vLLM's API server process, SGLang's detokenizer), overlapped with the GPU: a step lasts at least this x the "
        "tokens it emits, which caps output at 1/this tokens/s (capacity/cost/overlap.py), us. None: not modelled "
        "(the server's figure on its CPU is not known in advance; measure it).", flag="--output-cpu-us",
        help="CPU us per output token the server spends beside the GPU (detokenise, stream), overlapped: caps output "
        "at 1/this; measure it (default: not modelled)", commands=("simulate", "plan"),
        ui={"label": "output handling (us per token)", "kind": "number", "min": 1.0, "step": 5.0})
    frontend_ms: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)] | None = setting(
        None, description="The server's time per request before the engine sees it and after its first token "
        "(HTTP/OpenAI layer, IPC to the engine process, streaming), a latency in TTFT and E2E that costs no engine "
        "time, ms. None: the engine's measured figure, the conservative end (vLLM 14.4 ms; SGLang, TensorRT-LLM 0: "
        "not measured; capacity/engine/frontend.py).", flag="--frontend-ms", help="Server time per request before "
        "the engine (in TTFT), ms (default: the engine's measured figure)", commands=("simulate", "plan"))
    frontend_us_per_input_token: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)] | None = setting(
        None, description="The server's time per prompt token before the engine sees it (tokenising, on one "
        "worker thread: a burst of long prompts queues for it), us. None: the measured figure, the conservative end "
        "(1.89 us; capacity/engine/frontend.py).", flag="--frontend-us-per-token", help="Tokenising time per "
        "prompt token before the engine (one worker; in TTFT), us (default: measured, 1.89)",
        commands=("simulate", "plan"))
    frontend_ms_per_image_mpx: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)] | None = setting(
        None, description="The server's CPU time per megapixel of each image before the engine sees it (hashing, "
        "resizing, normalising, patchifying: the multimodal processor, on one worker; per megapixel of the source "
        "image plus of the processed one), ms; decoding (a thread pool in vLLM and SGLang) keeps its measured figure. 0 "
        "leaves the images' front-end work out (their decoding too). None: the measured figure, the conservative end "
        "(capacity/engine/image_cpu.py).", flag="--frontend-ms-per-image-mpx",
        help="Image processing time per megapixel before the engine (one worker; in TTFT), ms (default: measured)",
        commands=("simulate", "plan"))
    usage_context: Literal["serve", "llm"] = setting(
        "serve", description="`vllm serve` or the offline LLM class (different defaults)", flag="--usage-context",
        help="serve (vllm serve, default) or llm (the offline LLM class): different defaults")
    kv_estimate: Literal["conservative", "middle"] = setting(
        "conservative", description="Which end of the predicted KV range the planner and the simulator use: "
        "conservative (the default: the blocks the engine will have even if every estimated term is at the high end "
        "of its range) or middle.", flag="--optimistic", set_to="middle",
        help="Plan on the middle of the KV estimate, not its conservative end", commands=(*ENGINE_COMMANDS, "fleet"),
        ui={"label": "plan KV on", "kind": "radio", "options": ["conservative", "middle"],
            "help": "the end of the predicted KV range the simulation uses"})
    num_gpu_blocks_override: PosInt | None = setting(
        None, description="vLLM's --num-gpu-blocks-override: KV blocks as given", vllm="--num-gpu-blocks-override")
    activation_bytes: NonNegFloat | None = setting(
        None, description="Measured overrides for the estimated terms (bytes); None = use the estimate.",
        flag="--activation-gib", help="Measured activation peak, GiB", scale=GiB, commands=("memory",))
    non_torch_bytes: NonNegFloat | None = setting(
        None, description="measured non-torch memory, bytes", flag="--non-torch-gib",
        help="Measured non-torch memory, GiB", scale=GiB, commands=("memory",))
    cuda_graph_bytes: NonNegFloat | None = setting(
        None, description="measured CUDA-graph memory, bytes", flag="--cuda-graph-gib",
        help="Measured CUDA-graph memory, GiB", scale=GiB, commands=("memory",))
    memory_params: MemoryModelParams = MemoryModelParams()  # the estimated terms' parameters (below)
    # Speculative decoding (vLLM's --speculative-config, SGLang's --speculative-algorithm ...): method, drafts per
    # step, the acceptance assumed; None: off. See capacity/engine/speculative.py and docs/speculative.md.
    speculative: SpeculativeConfig | None = None

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}: use {', '.join(POLICIES)}")
        return v

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        name = engine_name(v)
        check = _SPECS.get(name) or next(iter(_SPECS.values()), None)  # a malformed spec: the registry says why
        try:
            if check is not None:
                check(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if name not in _SPECS:
            raise ValueError(f"unknown engine {v!r}: use {', '.join(_SPECS)} (optionally with @VERSION)")
        if name != cls.ENGINE:
            raise ValueError(f"engine {v!r}: {cls.__name__} holds {cls.ENGINE or 'no engine'}'s settings")
        return v

    @model_validator(mode="before")
    @classmethod
    def _own_settings(cls, data: Any) -> Any:
        """Another engine's setting is refused in one line naming it, its value and whose it is."""
        if isinstance(data, dict):
            for k, v in data.items():
                owners = [] if k in cls.model_fields else _owners(k)
                if owners:
                    raise ValueError(f"{k} {_short(v)}: {' and '.join(ENGINE_LABELS.get(o, o) for o in owners)} only "
                                     f"(engine {data.get('engine', cls.ENGINE)} does not have this setting)")
        return data

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kw: Any) -> Self:
        """EngineConfig.model_validate({...}) validates into the class of the engine the data names."""
        if cls is EngineConfig and isinstance(obj, dict):
            return pick(obj.get("engine", "vllm")).model_validate(obj, *args, **kw)  # type: ignore[return-value]
        return super().model_validate(obj, *args, **kw)

    def pp_size(self) -> int:
        """Pipeline stages (1 but for an engine that models them: vLLM's pipeline_parallel_size)."""
        return 1

    def dp_size(self) -> int:
        """Data-parallel ranks per replica (1 but for an engine that models them: vLLM's data_parallel_size)."""
        return 1

    def expert_parallel(self) -> bool:
        """MoE experts split whole over tp x dp ranks (False but for vLLM's enable_expert_parallel)."""
        return False


class DataParallelConfig(EngineConfig):
    """Data parallelism, which vLLM and SGLang have and TensorRT-LLM has not: both classes derive from this one, so
    the setting is declared once."""

    data_parallel_size: Annotated[int, Field(gt=0, le=1024)] = setting(
        1, description="vLLM's --data-parallel-size (engines of their own, attention replicated) and "
        "--enable-expert-parallel (experts split whole over tensor x data parallel ranks instead of sharded by TP); "
        "SGLang's --dp with enable_dp_attention (attention data-parallel inside the tensor_parallel_size GPUs)",
        flag="--dp", help="Data-parallel ranks per replica, each --tp GPUs with its own scheduler and KV (vLLM "
        "--data-parallel-size; docs/parallelism.md)", cli_default=1, vllm="--data-parallel-size")

    def dp_size(self) -> int:
        return self.data_parallel_size


# ---- each engine's class ------------------------------------------------------------------------------------
# An engine's configuration class (`capacity/engine/<name>/config.py`) derives from EngineConfig, names its engine
# in ENGINE and declares its own settings; the registry tells it which specs its engine has (`bind_specs`).
_CLASSES: dict[str, type[EngineConfig]] = {}  # engine name -> its configuration class, as each is defined
_SPECS: dict[str, Callable[[str], object]] = {}  # engine name -> the registry's check of a spec (raises ConfigError)
# The classes whose fields are the declared engine settings: every generated surface (the commands' options, the
# dashboard's controls, the schema reference) reads them through settings_classes(), so a test can declare more.
# Empty: the engines' own classes, in capacity.engine.settings.ENGINES order.
SETTINGS_CLASSES: tuple[type[EngineConfig], ...] = ()


def bind_specs(cls: type[EngineConfig], check: Callable[[str], object]) -> None:
    """The registry's check of `cls`'s engine specs (`sglang@0.4.6`): EngineConfig's `engine` field calls it."""
    _SPECS[cls.ENGINE] = check


def engine_name(spec: str) -> str:
    """The engine a spec names: `vllm@0.11` -> vllm, `trtllm:pytorch` -> trtllm (the name before `@` or `:`)."""
    return re.split(r"[@:]", spec.strip().lower(), maxsplit=1)[0]


def settings_classes() -> tuple[type[EngineConfig], ...]:
    """The engines' configuration classes the surfaces are generated from (a test's subclasses where it sets them)."""
    if SETTINGS_CLASSES:
        return SETTINGS_CLASSES
    order = {n: i for i, n in enumerate(ENGINES)}
    return tuple(sorted(_CLASSES.values(), key=lambda c: order.get(c.ENGINE, len(order))))


def settings_fields() -> dict[str, FieldInfo]:
    """Every engine setting, once: the shared ones, then each engine's own (in settings_classes() order)."""
    out: dict[str, FieldInfo] = {}
    for c in settings_classes():
        for name, f in c.model_fields.items():
            out.setdefault(name, f)
    return out


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _owners(name: str) -> list[str]:
    return [c.ENGINE for c in settings_classes() if name in c.model_fields]


def pick(spec: Any) -> type[EngineConfig]:
    """The configuration class of the engine a spec names (the first engine's where it names none it knows: its
    `engine` field then says the spec is unknown)."""
    classes = settings_classes()
    name = engine_name(spec) if isinstance(spec, str) else ""
    return next((c for c in classes if c.ENGINE == name), classes[0])


def own_settings(data: dict[str, Any]) -> dict[str, Any]:
    """`data` less the settings the engine it names does not have that are at their declared default (a command's
    options pass every default; a value other than the default is kept, and refused when validated)."""
    cls, fields = pick(data.get("engine", "vllm")), settings_fields()
    return {k: v for k, v in data.items()
            if k in cls.model_fields or k not in fields or v != fields[k].get_default(call_default_factory=True)}


@dataclass(frozen=True)
class ResolvedEngine:
    """EngineConfig with every default filled in for one model on one GPU."""

    cfg: EngineConfig
    tp: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_dtype: str  # bf16/fp16/fp8/int8
    defaults_used: tuple[str, ...]  # which knobs took an engine default
    chunked_prefill: bool = True  # as resolved (the release's default where the config says None)
    cuda_graphs_in_budget: bool = False
    large_gpu_defaults: bool = False  # whether the large-GPU batching defaults applied
    release: str = "vllm"  # the engine release that resolved it


def resolve_max_model_len(cfg: EngineConfig, card: ModelCard, used: list[str]) -> int:
    """max_model_len as every engine fills it in: the configured one (at most the model's
    max_position_embeddings), else the model's whole context (recorded in `used`)."""
    if cfg.max_model_len is None:
        used.append("max_model_len")
        return card.max_position_embeddings
    if cfg.max_model_len > card.max_position_embeddings:
        raise ConfigError(f"max_model_len {cfg.max_model_len} exceeds the model's max_position_embeddings "
                          f"{card.max_position_embeddings} ({card.name})")
    return cfg.max_model_len
