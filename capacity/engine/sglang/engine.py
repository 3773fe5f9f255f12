"""The SGLang engine model (`Sglang`): its defaults, its scheduler (`capacity.sched.sglang`) and its launch
command; and `launch_command`, the vLLM plan's configuration translated into an SGLang command. Its start-up
memory accounting, read from SGLang's code and checked on its start-up logs, is `capacity.engine.sglang.memory`
(`SglangMemory`, which `Sglang` mixes in);
docs/sglang.md has the hand checks.

`Sglang` (`get_engine("sglang")`, `get_engine("sglang@0.4.6")`) maps the vLLM-named EngineConfig onto SGLang's
flags: max_model_len = --context-length, max_num_seqs = --max-running-requests (default: SGLang's rule from the
pool), max_num_batched_tokens = --chunked-prefill-size (--max-prefill-tokens with chunking off), block_size =
--page-size (default 1), num_gpu_blocks_override x page = --max-total-tokens (SGLang takes the smaller of it
and the profiled pool), memory_params.cuda_context_bytes = everything taken before T0 (SGLang's free memory at
start-up). F (--mem-fraction-static) is SglangConfig's mem_fraction_static, else the release's default: a
gpu_memory_utilization other than 0.9 is refused, as are the other vLLM-only knobs. Scheduling follows v0.5.5
for every release (older ones differ in details: 0.4.3 retracts until the kept requests have 20 decode steps of
room).

The translation (`launch_command`) reads the vLLM plan by meaning: vLLM's `--gpu-memory-utilization U` bounds
everything the engine allocates to U x total memory; F must hold weights + the planned pool out of T0, and
`--max-total-tokens` pins the pool to the planned number of tokens. The other knobs map one to one
(`--max-running-requests` = max_num_seqs, `--context-length` = max_model_len, `--chunked-prefill-size` =
max_num_batched_tokens, -1 to disable chunking). SGLang's radix (prefix) cache is on by default; it is disabled
when the plan runs without prefix caching.
"""
from __future__ import annotations

import math
from typing import Any

from capacity.engine.budget import MemoryBudget, SchedLimits, SchedulerFactory, check_tp
from capacity.engine.config import EngineConfig, MemoryModelParams, ResolvedEngine, resolve_max_model_len
from capacity.engine.launch import declared_flags, engine_flag, model_reference, with_comment
from capacity.engine.served import check_served
from capacity.engine.sglang.config import deepep as sglang_deepep
from capacity.engine.sglang.config import dp_attention as sglang_dp_attention
from capacity.engine.sglang.config import ep_size as sglang_ep_size
from capacity.engine.sglang.config import lora as sglang_lora
from capacity.engine.sglang.config import mem_fraction
from capacity.engine.sglang.dpattn import chunk_divisor, dp_chunk
from capacity.engine.sglang.dsa import DSA_PAGE, is_dsa
from capacity.engine.sglang.memory import (
    CURRENT,
    RELEASES,
    MiB,
    SglangBudget,
    SglangMemory,
    default_chunked_prefill_size,
    parse_release,
    sglang_budget,
    version_key,
)
from capacity.engine.sglang.mm import runner_mm_factor
from capacity.engine.sglang.releases import SPEC_ALGORITHM
from capacity.engine.sglang.rocm import aiter_cut
from capacity.engine.sglang.swa import hybrid_swa_layers, swa_pin
from capacity.engine.speculative import launch_flags
from capacity.engine.vllm.engine import STEP_OVERHEAD_S
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU, get_gpu
from capacity.sched import make_scheduler
from capacity.sched.sglang import MAX_PREFILL_TOKENS

KV_DTYPE = {"auto": "auto", "fp8": "fp8_e4m3", "int8": "auto"}


def mem_fraction_static(b: MemoryBudget, card: ModelCard, cfg: EngineConfig,
                        gpu: GPU | None = None) -> tuple[float, int]:
    """F for the plan's pool, and the pool SGLang holds at it (the conservative end of SGLang's own model,
    `sglang_budget`'s kv_tokens_low, clamped to the plan's): the smallest F in steps of 0.01 whose pool holds
    the tokens the plan simulated, starting from weights + pool over T0 (the free memory after the CUDA context),
    and at most what leaves the reserve T0 x (1 - F) room for the activation peak and the CUDA graphs the
    vLLM budget counted. Where no F does both, the pool is what the largest such F holds, fewer tokens than
    simulated (the caller says so). `gpu` is the planned GPU (a user's GPU YAML has no catalogue name to look
    up); without it, the catalogue's part of the budget's name."""
    gpu = (gpu or get_gpu(b.gpu)).model_copy(update={"usable_memory_bytes": b.total_bytes})
    t0 = b.total_bytes - cfg.memory_params.cuda_context_bytes
    f = math.ceil((b.weights_bytes + b.planning_tokens * b.kv_bytes_per_token) / t0 * 100 - 1e-9) / 100
    top = math.floor((1 - (b.activation_bytes + b.cuda_graph_bytes) / t0) * 100 + 1e-9) / 100
    chunk = b.max_num_batched_tokens if cfg.enable_chunked_prefill is not False else -1
    held, pin = 0, _pin(card, CURRENT, gpu.arch or "", b.planning_tokens, 1)
    for step in range(int(round(max(f, 0.01) * 100)), int(round(min(top, 0.99) * 100)) + 1):
        f = step / 100
        held = sglang_budget(card, gpu, b.tp, mem_fraction_static=f, context_len=b.max_model_len,
                             kv_cache_dtype=cfg.kv_cache_dtype if cfg.kv_cache_dtype == "fp8" else "auto",
                             chunked_prefill_size=chunk, max_running=b.max_num_seqs,
                             max_total_tokens=pin).kv_tokens_low
        if held >= b.planning_tokens:
            break
    return f, held


def _pin(card: ModelCard, release: str, arch: str, tokens: int, page: int) -> int:
    """--max-total-tokens for a pool of `tokens`: itself, or for a hybrid SWA pool the count over every layer that
    SGLang splits into an SWA pool of at least `tokens` (sglang/swa.py)."""
    split = hybrid_swa_layers(card, version_key(release), arch)
    return tokens if split is None else swa_pin(tokens, *split, page)


def _arch(name: str) -> str:
    """The architecture of the budget's GPU (a user's GPU YAML, not in the catalogue: unknown, i.e. not SM100)."""
    try:
        return get_gpu(name).arch or ""
    except ConfigError:
        return ""


def launch_command(card: ModelCard, cfg: EngineConfig, b: MemoryBudget, gpu: GPU | None = None) -> str:
    """The plan's vLLM configuration as an SGLang command, memory translated by meaning: F such that SGLang's
    own model holds the simulated pool, pinned with --max-total-tokens (mem_fraction_static). A configuration with
    DP attention is SGLang's own plan: its command is the engine's (`Sglang.launch_command`), not a translation."""
    if sglang_dp_attention(cfg) > 1:
        return ("# SGLang with DP attention: the plan's own SGLang command is the one above (a vLLM plan has no DP "
                "attention to translate)")
    g = gpu or get_gpu(b.gpu)
    frac, held = mem_fraction_static(b, card, cfg, g)
    ref = model_reference(card, "sglang")
    pool = min(held, b.planning_tokens)
    f = engine_flag  # the flag names: EngineConfig's declarations
    parts = [f"python -m sglang.launch_server --model-path {ref.model}", *ref.flags,
             f"{f('sglang', 'tensor_parallel_size')} {b.tp}", f"{f('sglang', 'max_num_seqs')} {b.max_num_seqs}",
             f"{f('sglang', 'max_model_len')} {b.max_model_len}",
             f"--mem-fraction-static {frac:.2f}", f"--max-total-tokens {_pin(card, CURRENT, g.arch or '', pool, 1)}",
             f"{f('sglang', 'max_num_batched_tokens')} "
             f"{b.max_num_batched_tokens if cfg.enable_chunked_prefill is not False else -1}",
             f"{f('sglang', 'kv_cache_dtype')} {KV_DTYPE[cfg.kv_cache_dtype]}"]
    if not cfg.enable_prefix_caching:
        parts.append("--disable-radix-cache")
    if cfg.enforce_eager:
        parts.append("--disable-cuda-graph")
    if cfg.policy == "priority":
        parts.append("--enable-priority-scheduling")
    cmd = " ".join(parts + declared_flags("sglang", cfg))
    if pool < b.planning_tokens:
        cmd = (f"# SGLang's pool here holds {pool:,} tokens, fewer than the {b.planning_tokens:,} simulated for "
               "vLLM: plan with --engine sglang for its own figures\n" + cmd)
    return with_comment(ref, cmd)


# ---- the engine model --------------------------------------------------------------------------------------
class Sglang(SglangMemory):
    """The SGLang engine model of one release's memory rules (see the module docstring); scheduling is v0.5.5's
    (`capacity.sched.sglang`)."""

    name = "sglang"

    def __init__(self, release: str = CURRENT) -> None:
        if release not in RELEASES:
            raise ConfigError(f"SGLang release {release!r}: modelled ones are {', '.join(RELEASES)}")
        self.release = release
        self.spec = ""  # the spec's own `sglang@X.Y.Z` (from_spec), whose version served.py checks the model against

    @classmethod
    def from_spec(cls, spec: str) -> Sglang:
        """The model of the release a spec names (`sglang@0.4.6`: capacity.engine.sglang.memory.parse_release); a
        release not modelled is an unknown engine, said in one line."""
        try:
            rel = parse_release(spec)
        except ConfigError as exc:
            raise ConfigError(f"unknown engine {spec!r}: {str(exc).split(': ', 1)[-1]}") from None
        got = cls(rel)
        got.spec = spec if "@" in spec else ""
        return got

    def _served(self, card: ModelCard) -> None:
        """A `sglang@X.Y.Z` whose models lack the card's model type: one line (capacity/engine/served.py)."""
        if self.spec:
            check_served(self.spec, "sglang", version_key(self.spec.split("@", 1)[1]), card)

    def startup_memory(self, card: ModelCard, gpu: GPU, tp: int, **kw: Any) -> SglangBudget:
        self._served(card)
        return super().startup_memory(card, gpu, tp, **kw)

    @property
    def label(self) -> str:
        return f"sglang@{self.release}"

    # ---- configuration -------------------------------------------------------------------------------
    def _check(self, cfg: EngineConfig) -> None:
        """Refuse, in one line, the shared knobs that have no SGLang meaning (rather than ignore them); vLLM's own
        (max_loras, pipeline/data/expert parallelism, paged_kv ...) are not SglangConfig fields at all."""
        if cfg.gpu_memory_utilization != EngineConfig.model_fields["gpu_memory_utilization"].default:
            raise ConfigError(f"gpu_memory_utilization {cfg.gpu_memory_utilization}: no SGLang meaning; set SGLang's "
                              "--mem-fraction-static as mem_fraction_static, or size the KV pool with "
                              "num_gpu_blocks_override (SGLang's --max-total-tokens, in pages)")
        if cfg.policy != "continuous":
            raise ConfigError(f"policy {cfg.policy}: the SGLang model schedules FCFS (SGLang's default "
                              "--schedule-policy fcfs) only; use policy continuous")
        vllm_only = [k for k in ("activation_bytes", "non_torch_bytes", "cuda_graph_bytes", "kv_reservation")
                     if getattr(cfg, k) is not None]
        vllm_only += [f"memory_params.{k}" for k, v in cfg.memory_params.model_dump().items()
                      if k != "cuda_context_bytes" and v != MemoryModelParams.model_fields[k].default]
        if cfg.dp_size() != 1 and self.dp_attention(cfg) == 1:
            vllm_only.append("data_parallel_size (SGLang's data parallelism is modelled with enable_dp_attention)")
        if vllm_only:
            raise ConfigError(f"{', '.join(vllm_only)}: vLLM settings with no SGLang meaning (engine {self.label})")
        if cfg.kv_cache_dtype == "int8":
            raise ConfigError(f"kv_cache_dtype {cfg.kv_cache_dtype}: SGLang's are auto and fp8 here")

    def _context_bytes(self, cfg: EngineConfig) -> float | None:
        c = cfg.memory_params.cuda_context_bytes
        return None if c == MemoryModelParams().cuda_context_bytes else c

    def _resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> tuple[ResolvedEngine, SglangBudget]:
        self._check(cfg)
        self._served(card)
        tp = cfg.tensor_parallel_size
        check_tp(card, tp)
        used: list[str] = []
        ctx = resolve_max_model_len(cfg, card, used)
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = True
            used.append("enable_chunked_prefill")
        gpu_mib = gpu.usable_memory_bytes / MiB
        mnbt = cfg.max_num_batched_tokens
        if mnbt is None:
            mnbt = default_chunked_prefill_size(gpu_mib, self.release) if chunked else MAX_PREFILL_TOKENS
            used.append("max_num_batched_tokens")
        page: int = DSA_PAGE if is_dsa(card) else (cfg.block_size or 1)  # DeepSeek-V3.2: 64 (sglang/dsa.py)
        if cfg.block_size is None:
            used.append("block_size")
        override = cfg.num_gpu_blocks_override
        sb = sglang_budget(card, gpu, tp, release=self.release, context_len=ctx, kv_cache_dtype=cfg.kv_cache_dtype,
                           chunked_prefill_size=mnbt if (cfg.max_num_batched_tokens is not None or not chunked) else None,
                           max_total_tokens=override * page if override is not None else None,
                           max_running=cfg.max_num_seqs, page_size=page, context_bytes=self._context_bytes(cfg),
                           dp_attention=self.dp_attention(cfg), ep_size=sglang_ep_size(cfg),
                           mem_fraction_static=mem_fraction(cfg), lora=sglang_lora(cfg), deepep=sglang_deepep(cfg),
                           speculative=SPEC_ALGORITHM[cfg.speculative.method] if cfg.speculative else None)
        if chunked and sb.dp_attention > 1:  # SGLang's _handle_data_parallelism: the chunk is per attention group
            mnbt = dp_chunk(mnbt, sb.dp_attention, version_key(self.release))
        if cfg.max_num_seqs is None:
            used.append("max_num_seqs")
        kv_dtype = card.dtype if cfg.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
        eng = ResolvedEngine(cfg, tp, ctx, sb.max_running_requests, mnbt, page, kv_dtype, tuple(used),
                             chunked_prefill=chunked, release=self.label)
        return eng, sb

    @staticmethod
    def dp_attention(cfg: EngineConfig) -> int:
        """DP attention's dp size (`--dp N --enable-dp-attention`; sglang/dpattn.py), 1 when off."""
        return sglang_dp_attention(cfg)

    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        """Every knob the configuration leaves to SGLang, as SGLang fills it in: context_len (the model's),
        chunked_prefill_size (by GPU memory and release), max_running_requests (from the pool), page_size 1."""
        return self._resolve(cfg, card, gpu)[0]

    def default_max_num_batched_tokens(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> int:
        """SGLang's default --chunked-prefill-size on this GPU (--max-prefill-tokens with chunking off)."""
        if cfg.enable_chunked_prefill is False:
            return MAX_PREFILL_TOKENS
        return default_chunked_prefill_size(gpu.usable_memory_bytes / MiB, self.release)

    # ---- scheduling ----------------------------------------------------------------------------------
    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> SchedulerFactory:
        """A builder of one replica's SGLang scheduler; checks the settings now, so a bad one fails with the
        field named and not inside a simulation."""
        self._check(cfg)
        # DP attention: this is one attention rank's scheduler (its pool and caps: memory.py); the pipeline steps dp
        # of them in lock step (capacity/engine/lockstep.py)
        if limits.kv_groups is not None:
            raise ConfigError("sliding-window KV groups: SGLang's split of the pool is not modelled")
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = limits.chunked_prefill if limits.chunked_prefill is not None else True
        kw = dict(max_total_tokens=limits.num_blocks * limits.block_size, page_size=limits.block_size,
                  max_running_requests=limits.max_num_seqs,
                  chunked_prefill_size=limits.max_num_batched_tokens if chunked else None,
                  max_prefill_tokens=MAX_PREFILL_TOKENS if chunked else limits.max_num_batched_tokens,
                  context_len=limits.max_model_len, overlap_schedule=self.overlap_schedule(cfg))
        make_scheduler("sglang", **kw)
        return lambda: make_scheduler("sglang", **kw)

    @staticmethod
    def overlap_schedule(cfg: EngineConfig) -> bool:
        """EngineConfig.async_scheduling for SGLang: its overlap scheduler (the CPU forms step n+1 before it
        processes step n's output), on by default; `--disable-overlap-schedule` turns it off."""
        # off with speculative decoding: SGLang v0.5.5 disables the overlap scheduler for EAGLE/MTP
        # (ServerArgs._handle_speculative_decoding, python/sglang/srt/server_args.py, unless SGLANG_ENABLE_SPEC_V2)
        return cfg.async_scheduling is not False and cfg.speculative is None

    def step_overhead_s(self, cfg: EngineConfig) -> float:
        """CPU time per step the GPU waits for: the configured figure, else vLLM's STEP_OVERHEAD_S (2 ms), which
        has not been measured for SGLang."""
        return STEP_OVERHEAD_S if cfg.step_overhead_ms is None else cfg.step_overhead_ms / 1e3

    def overhead_overlaps(self, cfg: EngineConfig) -> bool:
        """False: the per-step overhead adds to the GPU step. SGLang's overlap scheduler (`managers/scheduler.py`,
        `event_loop_overlap`) runs the CPU's work for the next batch while the GPU runs this one, as TensorRT-LLM's
        does, but on SGLang's published runs (bench/sglang_published.py, 9 points) the overlapped step raised the
        throughput error (MAPE 15.8% -> 17.6% output, 20.4% -> 24.7% input, both over-estimates): the sum stays,
        the safe side, until a measured run says how much it hides."""
        return False

    # ---- launch command ------------------------------------------------------------------------------
    def launch_command(self, card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str:
        """`python -m sglang.launch_server` with every knob that decides the simulated configuration spelled
        out: F (the release's default the budget used), the pool pinned to the simulated one (--max-total-tokens:
        SGLang keeps the smaller of it and what it profiles), FCFS. The radix cache stays on (SGLang's default):
        with it, SGLang admits every request by the new_token_ratio rule modelled here (with it off, requests
        sent with ignore_eos take a stricter path)."""
        t0 = b.total_bytes - b.non_torch_bytes
        # the reserve is T0 x (1 - F); before 0.4.9 the model runner cuts a multimodal model's flag again (sglang/mm.py),
        # and on AMD the aiter backend cuts any flag past 8k tokens (sglang/rocm.py), so the flag is F / cut, rounded
        # up so that the pool SGLang profiles is not below the one pinned
        line = version_key(self.release)
        cut = runner_mm_factor(card, line) * aiter_cut(card, b.tp, line, b.max_model_len, "cdna" in _arch(b.gpu).lower())
        f = round(1 - b.activation_bytes / t0, 4) if cut == 1.0 else math.ceil((1 - b.activation_bytes / t0) / cut * 1e4) / 1e4

        dp = self.dp_attention(cfg)  # SGLang divides the chunk and the request cap by dp: the flags are the totals
        div = chunk_divisor(dp, version_key(self.release)) if dp > 1 else 1
        chunk = b.max_num_batched_tokens * div if b.chunked_prefill else -1
        ref = model_reference(card, "sglang")
        parts = [f"python -m sglang.launch_server --model-path {ref.model}", *ref.flags,
                 f"{engine_flag('sglang', 'tensor_parallel_size')} {b.tp}", *([f"--dp {dp}"] if dp > 1 else []),
                 f"{engine_flag('sglang', 'max_model_len')} {b.max_model_len}",
                 f"{engine_flag('sglang', 'max_num_seqs')} {b.max_num_seqs * dp}",
                 f"--mem-fraction-static {f}",
                 f"--max-total-tokens {_pin(card, self.release, _arch(b.gpu), b.planning_blocks * b.block_size, b.block_size)}",
                 f"{engine_flag('sglang', 'max_num_batched_tokens')} {chunk}"]
        if not b.chunked_prefill:
            parts.append(f"--max-prefill-tokens {b.max_num_batched_tokens}")
        if b.block_size != 1:
            parts.append(f"{engine_flag('sglang', 'block_size')} {b.block_size}")
        parts += [f"{engine_flag('sglang', 'kv_cache_dtype')} {KV_DTYPE[cfg.kv_cache_dtype]}", "--schedule-policy fcfs"]
        if not self.overlap_schedule(cfg):
            parts.append("--disable-overlap-schedule")
        if cfg.enforce_eager:
            parts.append("--disable-cuda-graph")

        parts += launch_flags("sglang", cfg.speculative) + declared_flags("sglang", cfg)
        cmd = with_comment(ref, " ".join(parts))
        if cfg.usage_context == "llm":
            return "# offline: sglang.Engine(model_path=..., same keyword arguments); as a server:\n" + cmd
        return cmd

    def launch_notes(self, cfg: EngineConfig) -> list[str]:
        """What the simulation leaves out, and what the command cannot express."""
        notes = [f"SGLang modelled: memory by {self.label}'s rules; scheduling by v0.5.5's (new_token_ratio admission, "
                 "the batch-full mark, prefill and decode as separate steps, retraction to the back of the queue, "
                 "the overlap scheduler's one-step-late output processing unless async_scheduling is false)",
                 "not modelled: the radix cache's prefix reuse (no prefix is shared: shared prefixes run better than "
                 "simulated), mixed chunked prefill, the CPU time the overlap scheduler hides (in the step overhead), "
                 "speculative draft trees (top-k > 1), priority scheduling",
                 "activations, CUDA graphs and the request table must fit in SGLang's reserve T0 x (1 - F), which it "
                 "does not check at start-up: an OOM shows at graph capture or the first long prefill",
                 "gpu_memory_utilization has no SGLang meaning: F is mem_fraction_static or the release's default, "
                 "spelled out in the command"]
        if cfg.enable_prefix_caching:
            notes.append("enable_prefix_caching: the command keeps SGLang's radix cache on, but the simulation shares "
                         "no prefix")
        if cfg.step_overhead_ms is None:
            notes.append("step overhead: vLLM's 2 ms per step, not measured for SGLang")
        return notes


__all__ = ["KV_DTYPE", "Sglang", "launch_command", "mem_fraction_static"]
