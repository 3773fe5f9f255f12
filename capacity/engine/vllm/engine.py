"""The vLLM engine model: its defaults, its scheduler and its launch command, for any release from 0.4 to the
current one (`capacity.engine.vllm.release` holds what changes between releases). Its start-up memory
accounting is `capacity.engine.vllm.memory` (`VllmMemory`, which `Vllm` mixes in);
`docs/memory.md` has the derivation of every term with the code it comes from and the logs it was
checked on.

Scheduling is vLLM's V1 scheduler (`capacity.sched.continuous`): token budget, batch cap, chunked prefill,
preemption by recompute, the full-input admission reserve, prefix caching; `--scheduling-policy priority`
is the priority request queue.
"""
from __future__ import annotations

from capacity.engine.budget import MemoryBudget, SchedLimits, SchedulerFactory, check_tp
from capacity.engine.config import EngineConfig, ResolvedEngine, resolve_max_model_len
from capacity.engine.launch import declared_flags, engine_flag, model_reference, with_comment
from capacity.engine.speculative import launch_flags
from capacity.engine.vllm.config import vllm_config
from capacity.engine.vllm.fallback import mode as fallback_mode
from capacity.engine.vllm.flags import (
    check,
    spelling_async,
    spelling_legacy_speculative,
    spelling_no_prefix_caching,
    v1_env,
)
from capacity.engine.vllm.layout import hybrid_block_size
from capacity.engine.vllm.memory import VllmMemory
from capacity.engine.vllm.release import Release, parse_engine, release
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.sched import make_scheduler
from capacity.units import GiB

LARGE_GPU_BYTES = 70 * GiB  # vLLM's threshold for its larger batching defaults


class Vllm(VllmMemory):
    """The vLLM engine model of one release (see module docstring)."""

    name = "vllm"

    def __init__(self, rel: Release | None = None, runner_given: str | None = None, pinned: bool = False,
                 forced_eager: bool = False) -> None:
        self.release = rel or release(None)
        self.runner_given = runner_given  # the spec's :v0 / :v1 (None: the release's default engine)
        self.pinned = pinned  # the spec named a version
        self.forced_eager = forced_eager  # the release turns CUDA graphs off for this model (fallback.py)
        self.fell_back = False  # the release runs the model on V0 where the spec's default was V1
        self._by_card: dict[tuple[str, bool], Vllm] = {}

    @classmethod
    def from_spec(cls, spec: str) -> Vllm:
        """The model of the release a spec names (`vllm@0.11`, `vllm@0.9.2:v0`: capacity.engine.vllm.release)."""
        _, version, runner = parse_engine(spec)
        return cls(release(version, runner), runner, version not in (None, "current", "latest"))

    def for_card(self, card: ModelCard) -> Vllm:
        """The engine model `card` runs on in this release: V0 where the release falls back to it for the model's
        architecture, eager where the release turns CUDA graphs off (capacity/engine/vllm/fallback.py)."""
        key = (card.architecture, card.vision is not None)
        got = self._by_card.get(key)
        if got is None:
            rel, eager = fallback_mode(self.release, card, self.runner_given, self.pinned)
            if rel == self.release and not eager:
                got = self
            else:
                got = Vllm(rel, self.runner_given, self.pinned, eager)
                got.fell_back = rel.runner != self.release.runner
            got._by_card[key] = got
            self._by_card[key] = got
        return got

    def effective(self, cfg: EngineConfig) -> EngineConfig:
        """`cfg` as the engine runs it: enforce_eager set where the release forces it for the model."""
        return cfg.model_copy(update={"enforce_eager": True}) if self.forced_eager and not cfg.enforce_eager else cfg

    # ---- defaults ------------------------------------------------------------------------------------
    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        own = self.for_card(card)
        if own is not self:
            return own.resolve(cfg, card, gpu)
        cfg = self.effective(cfg)
        vc = vllm_config(cfg)  # vLLM's own settings
        rel = self.release
        check(rel, vc)  # a setting this release has no flag for (capacity/engine/vllm/flags.py)
        tp = cfg.tensor_parallel_size
        check_tp(card, tp)
        used: list[str] = []

        max_model_len = resolve_max_model_len(cfg, card, used)
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = rel.default_chunked_prefill(max_model_len, card.vision is not None, card.num_sliding_layers > 0)
            used.append("enable_chunked_prefill")
        elif not chunked and rel.runner == "v1" and rel.version < (0, 10, 0):
            raise ConfigError(f"enable_chunked_prefill false: the V1 engine of {rel.label} always chunks "
                              "(use a V0 engine, e.g. vllm@0.9:v0, or vllm@0.10+)")
        seqs_d, mnbt_d, large = rel.default_limits(
            chunked=chunked, max_model_len=max_model_len, usage=cfg.usage_context,
            gpu_gib=gpu.usable_memory_bytes / GiB, device_name=gpu.device_name or gpu.name,
            large=vc.large_gpu_defaults, multimodal=card.vision is not None)
        max_num_seqs = cfg.max_num_seqs
        if max_num_seqs is None:
            max_num_seqs = seqs_d
            used.append("max_num_seqs")
        mnbt = cfg.max_num_batched_tokens
        if mnbt is None:
            mnbt = mnbt_d
            if rel.runner == "v1" and rel.version >= (0, 10, 2) and chunked:
                mnbt = min(mnbt, max_num_seqs * max_model_len)  # SchedulerConfig clamps the default
            used.append("max_num_batched_tokens")
        if not chunked and mnbt < max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({max_model_len}) with chunked "
                "prefill off: a full-length prompt could never be scheduled; raise it or enable chunked prefill"
            )
        if mnbt < max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({max_num_seqs}), as vLLM requires"
            )

        block_size: int
        if cfg.block_size is None:
            block_size = 64 if card.mla is not None and rel.runner == "v1" else 16
            used.append("block_size")
        else:
            block_size = cfg.block_size
        kv_dtype = card.dtype if cfg.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
        if vc.pipeline_parallel_size > 1 and rel.version < (0, 5, 1):
            raise ConfigError(f"pipeline_parallel_size {vc.pipeline_parallel_size}: {rel.label} has no pipeline "
                              "parallelism (from vLLM 0.5.1)")
        if vc.cpu_offload_gb and rel.version < (0, 5, 3):
            raise ConfigError(f"cpu_offload_gb {vc.cpu_offload_gb}: {rel.label} has no --cpu-offload-gb (from vLLM 0.5.3)")
        if vc.kv_cache_memory_bytes is not None and (rel.runner != "v1" or rel.version < (0, 11, 0)):
            raise ConfigError(f"kv_cache_memory_bytes {vc.kv_cache_memory_bytes}: {rel.label} has no "
                              "--kv-cache-memory-bytes (V1 from vLLM 0.11)")
        if (vc.data_parallel_size > 1 or vc.enable_expert_parallel) and (rel.runner != "v1" or rel.version < (0, 8, 0)):
            raise ConfigError(f"{'data_parallel_size' if vc.data_parallel_size > 1 else 'enable_expert_parallel'}: "
                              f"{rel.label} has no --data-parallel-size / --enable-expert-parallel (V1 from vLLM 0.8)")
        if vc.enable_expert_parallel:
            ep = tp * vc.data_parallel_size
            if card.moe is None:
                raise ConfigError(f"enable_expert_parallel: {card.name} has no experts")
            if ep > card.moe.num_experts:
                raise ConfigError(f"enable_expert_parallel: {ep} ranks (tp x data parallel) for the "
                                  f"{card.moe.num_experts} experts of {card.name}: at least one expert per rank")
        if card.state is not None:
            if rel.runner != "v1" or rel.version < (0, 10, 2):
                raise ConfigError(f"engine {rel.label}: hybrid models ({card.state.kind} layers) are modelled from vLLM "
                                  "0.10.2 (the V1 hybrid allocator); V0's MambaCacheManager is not")
            block_size = hybrid_block_size(card, rel, tp, kv_dtype, block_size)
        graphs_in = vc.cuda_graphs_in_budget
        if graphs_in is None:
            graphs_in = rel.cuda_graphs_in_budget_default
        elif graphs_in and not rel.cuda_graphs_in_budget_possible:
            raise ConfigError(f"cuda_graphs_in_budget: {rel.label} has no CUDA-graph memory estimate "
                              "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS exists from vLLM 0.18, V1)")
        return ResolvedEngine(cfg, tp, max_model_len, max_num_seqs, mnbt, block_size, kv_dtype, tuple(used),
                              chunked_prefill=chunked, cuda_graphs_in_budget=graphs_in and not cfg.enforce_eager,
                              large_gpu_defaults=large, release=rel.label)

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        own = self.for_card(card)
        if own is not self:
            return own.budget(card, gpu, cfg, check_fit=check_fit)
        return super().budget(card, gpu, self.effective(cfg), check_fit=check_fit)

    def default_max_num_batched_tokens(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> int:
        """The token budget this engine would pick for `cfg` on `gpu` (whatever cfg says about it)."""
        probe = cfg.model_copy(update={"max_num_batched_tokens": None, "max_num_seqs": 1})
        return self.resolve(probe, card, gpu).max_num_batched_tokens

    # ---- scheduling ----------------------------------------------------------------------------------
    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> SchedulerFactory:
        """A builder of one replica's scheduler for this configuration; checks the settings now, so a bad one
        fails with the field named and not inside a simulation."""
        kw: dict
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = (limits.chunked_prefill if limits.chunked_prefill is not None
                       else self.release.default_chunked_prefill(limits.max_model_len or 0))
        if cfg.policy == "static":
            kw = dict(max_batch=cfg.static_max_batch or limits.max_num_seqs, max_wait_s=cfg.static_max_wait_s,
                      block_size=limits.block_size, num_blocks=limits.num_blocks, max_model_len=limits.max_model_len,
                      kv_groups=limits.kv_groups)
        else:
            # V1's block pool takes block 0 as the null block (a placeholder for skipped sliding-window blocks,
            # never handed to a request: vllm/v1/core/block_pool.py, BlockPool.__init__, 0.11-0.19; get_usage
            # divides by num_gpu_blocks - 1): a request can use one block fewer than the log's "# GPU blocks"
            usable = limits.num_blocks - 1 if self.release.runner == "v1" and limits.num_blocks > 1 else limits.num_blocks
            kw = dict(max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
                      block_size=limits.block_size, num_blocks=usable,
                      chunked_prefill=chunked, prefix_caching=self.prefix_caching(cfg),
                      max_model_len=limits.max_model_len, kv_groups=limits.kv_groups,
                      reserve_output=cfg.kv_reservation == "prompt_and_output",
                      async_scheduling=self.async_scheduling(cfg),
                      inflight_tokens=limits.max_num_batched_tokens * self.inflight_batches(cfg))
        make_scheduler(cfg.policy, **kw)
        return lambda: make_scheduler(cfg.policy, **kw)

    def prefix_caching(self, cfg: EngineConfig) -> bool:
        return cfg.enable_prefix_caching

    def async_scheduling(self, cfg: EngineConfig) -> bool:
        """As the config says, else the release's GPU default; never with static batching or TensorRT-LLM-style
        full reservation (not vLLM's scheduler)."""
        if cfg.policy == "static" or cfg.kv_reservation == "prompt_and_output":
            return False
        return cfg.async_scheduling if cfg.async_scheduling is not None else self.release.default_async_scheduling

    # ---- launch command ------------------------------------------------------------------------------
    def launch_command(self, card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str:
        """`vllm serve` with every knob that decides the simulated configuration spelled out."""
        own = self.for_card(card)
        if own is not self:
            return own.launch_command(card, cfg, b)
        vc = vllm_config(cfg)  # vLLM's own settings
        f = engine_flag  # the flag names: EngineConfig's declarations
        rel = self.release
        ref = model_reference(card, "vllm")
        parts = [f"vllm serve {ref.model}", *ref.flags, f"{f('vllm', 'tensor_parallel_size')} {b.tp}",
                 f"{f('vllm', 'max_num_seqs')} {b.max_num_seqs}", f"{f('vllm', 'max_model_len')} {b.max_model_len}",
                 f"{f('vllm', 'gpu_memory_utilization')} {cfg.gpu_memory_utilization}",
                 f"{f('vllm', 'max_num_batched_tokens')} {b.max_num_batched_tokens}",
                 f"{f('vllm', 'kv_cache_dtype')} {cfg.kv_cache_dtype}"]
        if cfg.block_size is not None:
            parts.append(f"{f('vllm', 'block_size')} {b.block_size}")
        chunked = cfg.enable_chunked_prefill
        if chunked is False:
            parts.append(f("vllm", "enable_chunked_prefill", False))
        elif chunked and rel.runner == "v0":
            parts.append(f("vllm", "enable_chunked_prefill"))
        if self.prefix_caching(cfg) or spelling_no_prefix_caching(rel):  # off is the old releases' default
            parts.append(f("vllm", "enable_prefix_caching", self.prefix_caching(cfg)))
        if vc.kv_offloading_size is not None:  # the native OffloadingConnector (capacity/engine/offload.py)
            parts.append(f"{f('vllm', 'kv_offloading_size')} {vc.kv_offloading_size:g} "
                         "--kv-offloading-backend native")
        if (cfg.async_scheduling is not None or rel.default_async_scheduling) and spelling_async(rel):
            parts.append(f("vllm", "async_scheduling", self.async_scheduling(cfg)))
        if cfg.enforce_eager:
            parts.append(f("vllm", "enforce_eager"))
        if vc.max_loras:
            parts.append(f"--enable-lora {f('vllm', 'max_loras')} {vc.max_loras} "
                         f"{f('vllm', 'max_lora_rank')} {vc.max_lora_rank}")
        if vc.pipeline_parallel_size > 1:
            parts.append(f"{f('vllm', 'pipeline_parallel_size')} {vc.pipeline_parallel_size}")
        if vc.data_parallel_size > 1:
            parts.append(f"{f('vllm', 'data_parallel_size')} {vc.data_parallel_size}")
        if vc.enable_expert_parallel:
            parts.append(f("vllm", "enable_expert_parallel"))
        if cfg.policy == "priority":
            parts.append(f"{f('vllm', 'policy')} priority")
        if cfg.num_gpu_blocks_override is not None:
            parts.append(f"{f('vllm', 'num_gpu_blocks_override')} {cfg.num_gpu_blocks_override}")

        parts += launch_flags("vllm", cfg.speculative, spelling_legacy_speculative(rel)) + declared_flags("vllm", cfg)
        env = []
        graphs_in = vc.cuda_graphs_in_budget
        if graphs_in is not None and graphs_in != rel.cuda_graphs_in_budget_default:
            env.append(f"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS={int(graphs_in)}")
        env += [] if self.fell_back else v1_env(rel)  # the release's own fallback to V0 needs no VLLM_USE_V1=0
        cmd = with_comment(ref, " ".join(env + parts))
        if cfg.usage_context == "llm":
            return "# offline: LLM(model=..., same keyword arguments); as a server:\n" + cmd
        return cmd

    def step_overhead_s(self, cfg: EngineConfig) -> float:
        """CPU time per step the GPU waits for: the configured figure, else STEP_OVERHEAD_S."""
        return STEP_OVERHEAD_S if cfg.step_overhead_ms is None else cfg.step_overhead_ms / 1e3

    def overhead_overlaps(self, cfg: EngineConfig) -> bool:
        """False: the per-step overhead adds to the GPU step. Async scheduling (0.32's GPU default) overlaps part
        of it; how much has not been measured, and the sum is the safe side (docs/fidelity.md)."""
        return False

    def launch_notes(self, cfg: EngineConfig) -> list[str]:
        """What the launch command cannot express about the simulated configuration."""
        notes = []
        if cfg.policy in ("sjf", "static"):
            notes.append(f"policy {cfg.policy} is not a vLLM scheduling policy: the command runs vLLM's fcfs")
        if not vllm_config(cfg).paged_kv:
            notes.append("contiguous KV (paged_kv false) is a what-if: vLLM always pages its KV cache")
        if cfg.kv_reservation == "prompt_and_output":
            notes.append("kv_reservation prompt_and_output (TensorRT-LLM's GUARANTEED_NO_EVICT) is a what-if: vLLM "
                         "reserves the prompt only and preempts when the cache fills")
        if self.fell_back:
            notes.append(f"{self.release.label}: this model's architecture is V0-only in this release, so vLLM falls "
                         "back to its V0 engine (capacity/engine/vllm/fallback.py)")
        if self.forced_eager:
            notes.append(f"{self.release.label} runs this model without CUDA graphs (ModelConfig._verify_cuda_graph)")
        notes.append(f"memory and defaults modelled on {self.release.label}; pin that release (pip install "
                     f"vllm=={'.'.join(map(str, self.release.version))}) or re-plan for the one you deploy")
        return notes


VllmV1 = Vllm  # the name earlier code and tests use
# Per-step CPU overhead the GPU waits for. The figure the roofline always used; it has not been checked against a
# measured vLLM run (async scheduling, from 0.11, overlaps most of it with the GPU step): set
# EngineConfig.step_overhead_ms from a measured run (docs/fidelity.md) where it matters (small batches, TPOT).
STEP_OVERHEAD_S = 2e-3

__all__ = ["LARGE_GPU_BYTES", "STEP_OVERHEAD_S", "Vllm", "VllmV1"]
