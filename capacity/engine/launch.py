"""What a launch command names as its model (`model_reference`), and a launch command read back into the settings
the memory model takes (`parse_launch_command`): every command a plan prints must be one the memory model itself
fits, on the planned GPU and TP (tests/test_launch.py reads each one back).

The model a command names stores the card's weight format:
- the card's own Hugging Face id where no override changed the format;
- else a published checkpoint of that format the card lists (`checkpoints:`, e.g. nvidia's ModelOpt FP8 or an AWQ
  int4 repository), for an engine that loads it;
- else, for FP8 weights on vLLM and SGLang, the unquantised checkpoint with `--quantization fp8`: both engines
  quantise a bf16/fp16 checkpoint's linear weights to FP8 as they load it (vLLM's `Fp8LinearMethod` for a
  checkpoint that is not serialised in FP8, SGLang's `fp8` method alike), so the weights held are FP8;
- else a placeholder in angle brackets and a comment line saying what to put there: no engine makes int4/int8
  weights of a given group from a bf16 checkpoint at load time, and TensorRT-LLM's PyTorch backend reads
  pre-quantised (ModelOpt) checkpoints only. A command with a placeholder cannot start as printed, and says so.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from capacity.engine.config import EngineConfig, settings_fields
from capacity.engine.settings import declared, meta, value_type
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard, load_named_card
from capacity.model.gpus import GPU

ONLINE_FP8 = ("vllm", "sglang")  # engines that quantise an unquantised checkpoint to FP8 as they load it


@dataclass(frozen=True)
class ModelRef:
    model: str  # what the command names
    flags: list[str] = field(default_factory=list)  # what the command adds for it (--quantization fp8)
    comment: str = ""  # a line to print above the command where the user must fill something in


def model_reference(card: ModelCard, engine: str) -> ModelRef:
    """The model a launch command for `engine` names for this card (see the module docstring)."""
    if card.hf_id is None:  # a config.json without _name_or_path: its folder is the checkpoint
        return ModelRef(f"<folder-of-{card.name.replace(' ', '-')}>", comment=f"# the model's config names no Hugging Face id "
                        f"(_name_or_path): put the folder holding {card.name}'s checkpoint in place of <...>")
    hit = card.checkpoint_for(engine)
    if hit is not None:
        return ModelRef(hit)
    fmt = card.weight_format
    if fmt == "fp8" and card.hf_format in ("bf16", "fp16") and engine in ONLINE_FP8:
        return ModelRef(card.hf_id, ["--quantization fp8"])
    group = f", group {card.quant_group_size}" if card.quant_group_size and fmt == "int4" else ""
    return ModelRef(f"<{fmt}-checkpoint-of-{card.hf_id}>",
                    comment=f"# no published {fmt}{group} checkpoint of {card.hf_id} that {engine} loads is known "
                            f"here: quantise one (e.g. llm-compressor, AutoAWQ, ModelOpt) and put it in place of <...>")


def with_comment(ref: ModelRef, cmd: str) -> str:
    return f"{ref.comment}\n{cmd}" if ref.comment else cmd


# ---- the engines' flags, from the settings' declarations (capacity/engine/settings.py) ------------------------
# The settings each engine's launch command translates itself (engine/vllm.py, sglang.py, trtllm.py): resolved
# values, defaults spelled out, options files. Any other setting declared with a flag for the engine is added as
# declared (declared_flags), so a new setting reaches the launch commands from its declaration alone.
SPELLED = {
    "vllm": frozenset({"tensor_parallel_size", "max_num_seqs", "max_model_len", "gpu_memory_utilization",
                       "max_num_batched_tokens", "kv_cache_dtype", "block_size", "enable_chunked_prefill",
                       "enable_prefix_caching", "kv_offloading_size", "async_scheduling", "enforce_eager", "max_loras",
                       "max_lora_rank", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
                       "policy", "num_gpu_blocks_override"}),
    "sglang": frozenset({"tensor_parallel_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens",
                         "kv_cache_dtype", "block_size", "enforce_eager", "mem_fraction_static"}),
    "trtllm": frozenset({"tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"}),
}


def engine_flag(engine: str, name: str, on: bool = True) -> str:
    """The engine's own flag for setting `name`, as declared on EngineConfig (`--max-num-seqs` for vLLM,
    `--max-running-requests` for SGLang); of a pair `--x/--no-x`, the half for `on`."""
    flag = meta(settings_fields()[name], "launch")[engine]
    on_flag, _, off_flag = flag.partition("/")
    return on_flag if on or not off_flag else off_flag


def declared_flags(engine: str, cfg: EngineConfig, spelled: Iterable[str] | None = None) -> list[str]:
    """`--flag value` for each setting of `cfg` declared with a flag for `engine` that its launch command does not
    translate itself (SPELLED) and that differs from its default: a boolean gives its flag (or the off half of a
    pair), a list its values joined by commas."""
    skip = SPELLED[engine] if spelled is None else frozenset(spelled)
    out = []
    for name, (f, launch) in declared(type(cfg), "launch").items():
        flag = launch.get(engine)
        value = getattr(cfg, name)
        if flag is None or name in skip or value is None or value == f.get_default(call_default_factory=True):
            continue
        on, _, off = flag.partition("/")
        if isinstance(value, bool):
            if value or off:
                out.append(on if value else off)
        else:
            out.append(f"{on} {','.join(map(str, value)) if isinstance(value, list) else value}")
    return out


def _declared_tables(engine: str) -> tuple[dict[str, tuple[str | None, type]], dict[str, tuple[str | None, object]]]:
    """The reader's flag and switch tables for the settings declared with a flag for `engine`."""
    flags: dict[str, tuple[str | None, type]] = {}
    switches: dict[str, tuple[str | None, object]] = {}
    for name, (f, launch) in declared(settings_fields(), "launch").items():
        flag = launch.get(engine)
        if flag is None:
            continue
        typ = value_type(f)[0]
        on, _, off = flag.partition("/")
        if off:
            switches[on], switches[off] = (name, True), (name, False)
        elif typ is bool:
            switches[on] = (name, True)
        else:
            flags[on] = ("tp" if name == "tensor_parallel_size" else name, typ)
    return flags, switches


# ---- reading a command back -------------------------------------------------------------------------------
@dataclass
class LaunchSpec:
    """A launch command read back: the engine, the model it names, the TP and the engine settings (EngineConfig
    field names), and the KV pool it pins (SGLang --max-total-tokens, TensorRT-LLM max_tokens)."""
    engine: str
    model: str
    tp: int
    settings: dict[str, object]
    quantization: str | None = None
    pinned_kv_tokens: int | None = None


_Flags = dict[str, tuple[str | None, type]]
_Switches = dict[str, tuple[str | None, object]]
# What the declarations do not say (read beside the declared flags, _declared_tables): the model's quantisation,
# the pools the translations pin, SGLang's chunk size (-1: off), flags the commands write with no setting behind them
_VLLM: _Flags = {"--quantization": ("quantization", str)}
_VLLM_SWITCH: _Switches = {"--enable-lora": (None, None)}
_SGLANG: _Flags = {"--chunked-prefill-size": ("chunk", int), "--quantization": ("quantization", str),
           "--max-total-tokens": ("pinned", int), "--mem-fraction-static": ("mem_fraction_static", float),
           "--max-prefill-tokens": ("max_num_batched_tokens", int), "--schedule-policy": (None, str)}
_SGLANG_SWITCH: _Switches = {"--disable-radix-cache": ("enable_prefix_caching", False),
                  "--disable-overlap-schedule": ("async_scheduling", False),
                  "--enable-priority-scheduling": ("policy", "priority")}
_TRTLLM: _Flags = {"--kv_cache_free_gpu_memory_fraction": (None, float), "--backend": (None, str),
           "--extra_llm_api_options": (None, str)}
_KV = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "auto": "auto", "fp8": "fp8", "bf16": "auto"}


def parse_launch_command(text: str) -> LaunchSpec:
    """Read a `vllm serve`, `python -m sglang.launch_server` or `trtllm-serve` line (with the options file this
    project writes before it) back into the settings the memory model takes. Raises ConfigError naming what it
    cannot read: an unknown flag is an error, never ignored."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise ConfigError(f"launch command: expected one command line, got {len(lines)}")
    line, extra = lines[0], ""
    if line.startswith("echo '") and "&&" in line:  # TensorRT-LLM: the options file, then the command
        head, line = line.split("&&", 1)
        extra = head.split("'", 2)[1]
    words = [w for w in shlex.split(line) if "=" not in w or w.startswith("--")]  # drop leading VAR=value
    if words[:2] == ["vllm", "serve"]:
        engine, model, rest, table, switches = "vllm", words[2], words[3:], _VLLM, _VLLM_SWITCH
    elif words[:3] == ["python", "-m", "sglang.launch_server"] and words[3:4] == ["--model-path"]:
        engine, model, rest, table, switches = "sglang", words[4], words[5:], _SGLANG, _SGLANG_SWITCH
    elif words[:1] == ["trtllm-serve"]:
        engine, model, rest, table, switches = "trtllm", words[1], words[2:], _TRTLLM, dict[str, tuple[str | None, object]]()
    else:
        raise ConfigError(f"launch command {line[:60]!r}: not a vllm serve, sglang.launch_server or trtllm-serve line")
    flags, switched = _declared_tables(engine)
    table, switches = {**flags, **table}, {**switched, **switches}  # the hand entries win (SGLang's chunk size)
    spec = LaunchSpec(engine, model, 1, {})
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag in switches:
            key, value = switches[flag]
            if key is not None:
                spec.settings[key] = value
            i += 1
            continue
        if flag not in table or i + 1 >= len(rest):
            raise ConfigError(f"launch command: {flag!r} is not a flag this reader knows (or has no value)")
        key, kind = table[flag]
        try:
            value = kind(rest[i + 1])
        except ValueError:
            raise ConfigError(f"launch command: {flag} {rest[i + 1]!r} is not a {kind.__name__}") from None
        i += 2
        if key == "tp":
            spec.tp = int(value)
        elif key == "quantization":
            spec.quantization = str(value)
        elif key == "pinned":
            spec.pinned_kv_tokens = int(value)
        elif key == "chunk":
            if int(value) > 0:
                spec.settings["max_num_batched_tokens"] = int(value)
                spec.settings["enable_chunked_prefill"] = True
            else:
                spec.settings["enable_chunked_prefill"] = False
        elif key == "kv_cache_dtype":
            spec.settings[key] = _KV.get(str(value), str(value))
        elif key is not None:
            spec.settings[key] = value
    if extra:
        _read_trtllm_options(extra, spec)
    return spec


def _read_trtllm_options(extra: str, spec: LaunchSpec) -> None:
    import yaml

    opts = yaml.safe_load(extra)
    if not isinstance(opts, dict):
        raise ConfigError("launch command: the TensorRT-LLM options file is not a mapping")
    kv = opts.get("kv_cache_config") or {}
    if "max_tokens" in kv:
        spec.pinned_kv_tokens = int(kv["max_tokens"])
    if "tokens_per_block" in kv:
        spec.settings["block_size"] = int(kv["tokens_per_block"])
    if kv.get("dtype") == "fp8":
        spec.settings["kv_cache_dtype"] = "fp8"
    if "enable_block_reuse" in kv:
        spec.settings["enable_prefix_caching"] = bool(kv["enable_block_reuse"])
    if "enable_chunked_prefill" in opts:
        spec.settings["enable_chunked_prefill"] = bool(opts["enable_chunked_prefill"])


@dataclass(frozen=True)
class LaunchFit:
    """What the memory model says of a launch command on a GPU: whether it starts with room for one request of
    its max_model_len, and the KV tokens it holds (the conservative end) against the pool the command pins."""
    fits: bool
    kv_tokens: int
    pinned_kv_tokens: int | None
    why: str = ""

    @property
    def holds_pinned_pool(self) -> bool:
        return self.pinned_kv_tokens is None or self.kv_tokens >= self.pinned_kv_tokens


def _int(value: object, name: str) -> int:
    """A setting read back as an int (parse_launch_command converts each flag to its declared type)."""
    if isinstance(value, int):
        return value
    raise ConfigError(f"launch command: {name} {value!r} is not an int")


def _opt_int(value: object, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _opt_float(value: object, name: str) -> float | None:
    if value is None or isinstance(value, float):
        return value
    return float(_int(value, name))


def launch_fit(spec: LaunchSpec, gpu: GPU, engine_release: str | None = None) -> LaunchFit:
    """The memory model on a command read back (parse_launch_command) on `gpu` (a capacity.model.gpus.GPU):
    the card is the one its model names (a published checkpoint's id gives its format; `--quantization fp8` FP8
    weights), the settings are the command's. `engine_release` pins the release (`vllm@0.10.2`, `sglang@0.5.5`)."""
    if spec.model.startswith("<"):
        raise ConfigError(f"launch command: {spec.model} is a placeholder to fill in, not a model")
    card = load_named_card(spec.model)
    if spec.quantization is not None:
        if spec.quantization != "fp8":
            raise ConfigError(f"launch command: --quantization {spec.quantization}: only fp8 (online) is read here")
        card = card.with_overrides(weight_dtype="fp8")
    release = engine_release or spec.engine
    if spec.engine == "sglang":  # the engines' modules import this one (their launch commands): imported here
        from capacity.engine.sglang.memory import parse_release, sglang_budget

        s = spec.settings
        chunk = _opt_int(s.get("max_num_batched_tokens"), "max_num_batched_tokens") \
            if s.get("enable_chunked_prefill", True) else -1
        sb = sglang_budget(card, gpu, spec.tp, release=parse_release(release),
                           mem_fraction_static=_opt_float(s.get("mem_fraction_static"), "mem_fraction_static"),
                           context_len=_opt_int(s.get("max_model_len"), "max_model_len"),
                           kv_cache_dtype=str(s.get("kv_cache_dtype", "auto")), chunked_prefill_size=chunk,
                           max_running=_opt_int(s.get("max_num_seqs"), "max_num_seqs"),
                           max_total_tokens=spec.pinned_kv_tokens, page_size=_int(s.get("block_size", 1), "block_size"))
        return LaunchFit(sb.fits, sb.kv_tokens_low, spec.pinned_kv_tokens, "" if sb.fits else "SGLang's pool")
    from capacity.engine.registry import get_engine

    settings = {k: v for k, v in spec.settings.items() if k != "mem_fraction_static"}
    cfg = EngineConfig(engine=release, tensor_parallel_size=spec.tp, **settings)
    em = get_engine(cfg.engine)
    try:
        b = em.budget(card, gpu, cfg)
    except DoesNotFit as exc:
        return LaunchFit(False, 0, spec.pinned_kv_tokens, str(exc))
    return LaunchFit(True, b.planning_tokens, spec.pinned_kv_tokens)


__all__ = ["SPELLED", "declared_flags", "engine_flag", "LaunchFit", "LaunchSpec", "launch_fit", "ModelRef", "model_reference", "parse_launch_command", "with_comment"]
