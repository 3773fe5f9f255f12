"""The TensorRT-LLM engine model (`Trtllm`, `get_engine("trtllm")`): the PyTorch backend of `trtllm-serve` 1.x (the
engine (C++) backend's start-up memory: `cpp_memory.py`, `trtllm_backend: engine`),
its defaults, how it sizes its KV cache at start-up, its capacity scheduler and its launch command.

Read in TensorRT-LLM's code (NVIDIA/TensorRT-LLM, 1.x; docs/trtllm.md has the hand checks):

- **KV memory** (`tensorrt_llm/_torch/pyexecutor/_util.py`, `KvCacheCreator`): after the weights load, the
  executor runs dummy requests of `max_num_tokens` prompt tokens in all (CUDA-graph warm-up and the autotuner
  first), then takes the peak = torch's peak allocated + everything else the device reports in use (the CUDA
  context, NCCL, CUDA graphs, the temporary KV pool of the dummy requests) and gives the KV cache
  `(total - peak + temporary pool) x free_gpu_memory_fraction` (0.9 by default: `KvCacheConfig`,
  `trtllm-serve --kv_cache_free_gpu_memory_fraction`). So the fraction is a share of what is *free* after the
  profile, not of the device (vLLM's gpu_memory_utilization). Tokens = int(memory // bytes per token), at most
  `kv_cache_config.max_tokens` where given; blocks = ceil(tokens / tokens_per_block) (32): the count is rounded
  *up* (`resource_manager.py`, `calculate_max_num_blocks`). Bytes per token: 2 x layers x kv_heads / TP x
  head_dim x dtype bytes (MLA: latent + rope, no split).
- **Max length**: a pool smaller than max_seq_len does not stop the server: it lowers max_seq_len to the pool
  ("Adjusted max_seq_len to N").
- **Defaults** (`llm_args.py`, `BuildConfig`): max_batch_size 2048, max_num_tokens 8192, max_seq_len the model's,
  tokens_per_block 32, chunked prefill off (a prompt longer than max_num_tokens is rejected), block reuse on, the
  overlap scheduler on, CUDA graphs of decode batches up to 128.
- **Scheduling**: the capacity scheduler's default policy GUARANTEED_NO_EVICT
  (`cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`): running requests keep their blocks to completion,
  and a new request is admitted, first come first served, only if the blocks of its prompt *and* its maximum
  output fit in what is left; the first that does not fit stops admission. Nothing is ever evicted. The step's
  token budget (the micro-batch scheduler) is max_num_tokens, decode tokens included. This is the continuous
  scheduler with `reserve_output` (capacity.sched.continuous). The other policy, MAX_UTILIZATION
  (`kv_reservation: prompt`), admits while the blocks of a request's next step fit and pauses requests when the
  cache fills, to be recomputed: vLLM's admission and preemption.

Checked against real start-up logs (tests/data/trtllm_startup/logs.yaml): given a log's own profile readings,
the formula gives its KV memory, its token count within the rounding of the printed GiB figures, and, rounded up
to whole blocks, its allocation exactly. The terms of the peak are *estimated* (no TensorRT-LLM
log of a model with a card here shows them): the weights are counted; the activation peak of a max_num_tokens
forward is vLLM's derivation (`VllmMemory.activation_phases`, the forward phases only: the dummy requests ask
for one output token each); the CUDA context, NCCL and CUDA graphs are the vLLM model's terms for the same
libraries, with wider ranges. The planner uses the conservative end, every term at its high end.

EngineConfig maps onto TensorRT-LLM's names: kv_reservation = the capacity scheduler's policy (prompt_and_output:
GUARANTEED_NO_EVICT, the default; prompt: MAX_UTILIZATION), max_num_seqs = max_batch_size, max_num_batched_tokens =
max_num_tokens, max_model_len = max_seq_len, block_size = tokens_per_block, num_gpu_blocks_override x block =
kv_cache_config.max_tokens (TensorRT-LLM takes the smaller of it and the profiled pool), async_scheduling = the
overlap scheduler, enable_prefix_caching = enable_block_reuse. The fraction is TensorRT-LLM's default (there is no
EngineConfig field for it: a gpu_memory_utilization other than 0.9 is refused), as are vLLM-only knobs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from capacity.engine.budget import MemoryBudget, SchedLimits, SchedulerFactory, check_tp
from capacity.engine.config import EngineConfig, MemoryModelParams, ResolvedEngine, resolve_max_model_len
from capacity.engine.launch import declared_flags, engine_flag, model_reference, with_comment
from capacity.engine.trtllm import cpp_memory, kv_estimate, vswa
from capacity.engine.trtllm.config import trtllm_attention_dp, trtllm_backend, trtllm_vswa
from capacity.engine.trtllm.parallel import kv_tp, moe_layout, weights_per_rank
from capacity.engine.trtllm.release import DEFAULT_BACKEND, TrtllmRelease, parse_trtllm
from capacity.engine.vllm.engine import STEP_OVERHEAD_S, Vllm
from capacity.engine.vllm.memory import GRAPH_SEGMENT_MIB
from capacity.engine.vllm.nontorch import NON_TORCH_MULTI, NON_TORCH_PER_PEER_GIB
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.sched.continuous import ContinuousConfig, ContinuousScheduler
from capacity.sched.trt_dynamic import TrtDynamicBatchScheduler
from capacity.units import GiB, MiB

RELEASE = "1.1"  # the rules read (PyTorch backend, 1.x)
FREE_GPU_MEMORY_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction / --kv_cache_free_gpu_memory_fraction
MAX_BATCH_SIZE = 2048  # BuildConfig.max_batch_size
MAX_NUM_TOKENS = 8192  # BuildConfig.max_num_tokens
TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block
# CudaGraphConfig's default batch sizes with padding (the 1.1.0rc3 log in tests/data/trtllm_startup): 1, 2, 4, then
# steps of 8 to max_batch_size 128; whole-model decode graphs
CUDA_GRAPH_SIZES = (1, 2, 4, *range(8, 129, 8))
# The estimated terms' ranges, GiB (middle, low, high). TensorRT-LLM's CUDA context holds its own kernel libraries
# beside torch's: read as vLLM's 0.5 GiB context at the low end, up to 2 GiB at the high end. None of these has
# been seen in a TensorRT-LLM log of a discrete GPU: they are wide on purpose, and a plan takes the high end.
CONTEXT_GIB = (1.0, 0.5, 2.0)
ACTIVATION_SPREAD = (0.75, 1.5)  # x vLLM's derived forward peak (kernels, the autotuner's workspaces differ)
ACTIVATION_EXTRA_HIGH_GIB = 0.25  # plus this at the high end (the autotuner's and attention's workspaces)


def kv_tokens(total_bytes: float, peak_bytes: float, bytes_per_token: float, fraction: float = FREE_GPU_MEMORY_FRACTION,
              tmp_kv_bytes: float = 0.0, max_tokens: int | None = None,
              tokens_per_block: int = TOKENS_PER_BLOCK) -> tuple[float, int]:
    """TensorRT-LLM's KV memory and token count from its profile: (total - peak + temporary pool) x fraction;
    tokens = int(memory // bytes per token), at most max_tokens, rounded up to whole blocks."""
    mem = max(0.0, (total_bytes - peak_bytes + tmp_kv_bytes) * fraction)
    tokens = int(mem // bytes_per_token)
    if max_tokens is not None:
        tokens = min(tokens, max_tokens)
    return mem, -(-tokens // tokens_per_block) * tokens_per_block


@dataclass
class TrtllmPeak:
    """The profile's peak on one rank, by term (bytes: middle, low, high)."""

    weights: tuple[float, float, float]
    activation: tuple[float, float, float]
    context: tuple[float, float, float]  # CUDA context + NCCL (tp > 1)
    cuda_graphs: tuple[float, float, float]
    notes: list[str] = field(default_factory=list)

    def total(self, end: int) -> float:
        return self.weights[end] + self.activation[end] + self.context[end] + self.cuda_graphs[end]

    def as_dict(self) -> dict:
        return asdict(self)


class Trtllm:
    """The TensorRT-LLM engine model (PyTorch backend; see the module docstring)."""

    name = "trtllm"

    def __init__(self, rel: TrtllmRelease | None = None) -> None:
        self.rel = rel or parse_trtllm("trtllm")
        self.release = self.rel.version

    @classmethod
    def from_spec(cls, spec: str) -> Trtllm:
        """The model of the release and backend a spec names (`trtllm@0.20`, `trtllm@1.1:tensorrt`)."""
        return cls(parse_trtllm(spec))

    @property
    def label(self) -> str:
        return self.rel.label

    def _rel(self, cfg: EngineConfig) -> TrtllmRelease:
        """The release with the backend `trtllm_backend` picks (None: the spec's); a spec that names the other,
        non-default backend and a setting that disagrees are refused in one line."""
        rel = self.rel.with_backend(trtllm_backend(cfg))
        if rel.backend != self.rel.backend and self.rel.backend != DEFAULT_BACKEND[self.rel.version]:
            raise ConfigError(f"trtllm_backend {trtllm_backend(cfg)}: engine {self.label} names the "
                              f"{self.rel.backend} backend")
        return rel

    # ---- configuration -------------------------------------------------------------------------------
    def _check(self, cfg: EngineConfig) -> None:
        """Refuse, in one line, the shared knobs that have no TensorRT-LLM meaning (rather than ignore them); vLLM's own
        (max_loras, pipeline/data/expert parallelism, paged_kv ...) are not TrtllmConfig fields at all."""
        if cfg.gpu_memory_utilization != EngineConfig.model_fields["gpu_memory_utilization"].default:
            raise ConfigError(f"gpu_memory_utilization {cfg.gpu_memory_utilization}: no TensorRT-LLM meaning (its "
                              f"free_gpu_memory_fraction is the default {FREE_GPU_MEMORY_FRACTION} of the memory free "
                              "after its profile); cap the KV cache with num_gpu_blocks_override (kv_cache_config."
                              "max_tokens, in blocks)")
        if cfg.policy != "continuous":
            raise ConfigError(f"policy {cfg.policy}: the TensorRT-LLM model schedules first come first served "
                              "(its capacity scheduler) only; use policy continuous")
        other = [f"memory_params.{k}" for k, v in cfg.memory_params.model_dump().items()
                  if k != "cuda_context_bytes" and v != MemoryModelParams.model_fields[k].default]
        if cfg.usage_context != "serve":
            other.append("usage_context")
        if other:
            raise ConfigError(f"{', '.join(other)}: vLLM settings with no TensorRT-LLM meaning (engine {self.label})")
        rel = self._rel(cfg)
        if rel.engine_backend and cfg.async_scheduling:
            raise ConfigError(f"async_scheduling {cfg.async_scheduling}: the overlap scheduler is the PyTorch "
                              f"backend's; {rel.label} runs the TensorRT engine backend (use "
                              f"trtllm@{rel.version}:pytorch)")
        if cfg.kv_cache_dtype == "int8":
            raise ConfigError(f"kv_cache_dtype {cfg.kv_cache_dtype}: the TensorRT-LLM model's are auto and fp8")

    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        """Every knob the configuration leaves to TensorRT-LLM, as it fills them in: max_seq_len (the model's),
        max_batch_size 2048, max_num_tokens 8192, tokens_per_block 32, chunked prefill off."""
        self._check(cfg)
        tp = cfg.tensor_parallel_size
        check_tp(card, tp)
        if card.state is not None:
            raise ConfigError(f"model {card.name}: TensorRT-LLM's pools for {card.state.kind} state layers are not "
                              "modelled (use --engine vllm or sglang)")
        used: list[str] = []
        rel = self._rel(cfg)
        vswa.check(card, cfg, rel)  # sliding-window layers: one pool at full attention unless trtllm_vswa (vswa.py)
        moe_layout(card, cfg, tp, rel.engine_backend)  # refuses an expert-parallel size the ranks cannot hold
        ctx = resolve_max_model_len(cfg, card, used)
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = False
            used.append("enable_chunked_prefill")
        seqs = cfg.max_num_seqs
        if seqs is None:
            seqs = rel.max_batch_size
            used.append("max_num_seqs")
        mnbt = cfg.max_num_batched_tokens
        if mnbt is None:
            mnbt = rel.max_num_tokens
            used.append("max_num_batched_tokens")
        block: int = rel.tokens_per_block if cfg.block_size is None else cfg.block_size
        if cfg.block_size is None:
            used.append("block_size")
        kv_dtype = card.dtype if cfg.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
        return ResolvedEngine(cfg, tp, ctx, seqs, mnbt, block, kv_dtype, tuple(used), chunked_prefill=chunked,
                              cuda_graphs_in_budget=not cfg.enforce_eager, release=rel.label)

    def default_max_num_batched_tokens(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> int:
        return self.rel.max_num_tokens

    # ---- start-up memory -----------------------------------------------------------------------------
    def peak(self, card: ModelCard, gpu: GPU, eng: ResolvedEngine) -> TrtllmPeak:
        """The terms of the profile's peak on one rank (see the module docstring for what is estimated)."""
        cfg = eng.cfg
        w = weights_per_rank(card, cfg, eng.tp)  # experts whole over ep ranks (parallel.py)
        plain = card.is_dense and card.weight_format in ("bf16", "fp16", "fp8", "int8") and not card.weight_formats
        weights = (w, w, max(w * (1.002 if plain else 1.01), cpp_memory.experts_only_high(card, cfg, eng.tp)))
        # vLLM's derivation of a max_num_tokens forward (the dummy requests' prompts), its forward phases only
        probe = EngineConfig(tensor_parallel_size=kv_tp(cfg, eng.tp), max_model_len=eng.max_model_len, max_num_seqs=1,
                             max_num_batched_tokens=eng.max_num_batched_tokens, enable_chunked_prefill=True,
                             kv_cache_dtype=cfg.kv_cache_dtype)
        vm = Vllm()
        phases, _ = vm.activation_phases(card, vm.resolve(probe, card, gpu), gpu)
        fwd = max(v for k, v in phases.items() if k.startswith("forward"))
        lo_f, hi_f = ACTIVATION_SPREAD
        act = ((cfg.activation_bytes,) * 3 if cfg.activation_bytes is not None
               else (fwd, fwd * lo_f, fwd * hi_f + ACTIVATION_EXTRA_HIGH_GIB * GiB))
        if self._rel(cfg).kv_profile == "forward" and cfg.activation_bytes is None:  # 0.17: one copy read device
            act = (act[0], act[1], act[2] + fwd * hi_f)  # use before empty_cache, counting torch's cached blocks twice
        c_mid, c_lo, c_hi = (x * GiB for x in CONTEXT_GIB)
        if cfg.memory_params.cuda_context_bytes != MemoryModelParams().cuda_context_bytes:
            c_mid = c_lo = c_hi = cfg.memory_params.cuda_context_bytes
        if eng.tp > 1:
            link = "nvls" if gpu.nvls else ("nvlink" if gpu.interconnect.startswith("nvlink") else "pcie")
            peers = (eng.tp - 2) * NON_TORCH_PER_PEER_GIB
            n_mid, n_lo, n_hi = ((x + peers) * GiB for x in NON_TORCH_MULTI[link])
            c_mid, c_lo, c_hi = c_mid + n_mid, c_lo + n_lo, c_hi + n_hi
        context = (c_mid, c_lo, c_hi)
        if cfg.non_torch_bytes is not None:
            context = (cfg.non_torch_bytes,) * 3
        graphs_lo, graphs_hi = self._rel(cfg).cuda_graphs_default  # the release's default: off, on or either
        if cfg.enforce_eager:
            graphs = (0.0, 0.0, 0.0)
        elif cfg.cuda_graph_bytes is not None:  # given: graphs captured (use_cuda_graph / cuda_graph_config set)
            graphs = (cfg.cuda_graph_bytes,) * 3
        elif not graphs_hi:
            graphs = (0.0, 0.0, 0.0)
        else:  # whole-model graphs: one piece per layer and size, as vLLM's V0 graphs cost; the largest's activations
            sizes = [s for s in CUDA_GRAPH_SIZES if s <= min(128, eng.max_num_seqs)]
            segs = len(sizes) * (card.num_layers + 1)
            act_g = max(sizes) * fwd / eng.max_num_batched_tokens
            g_mid, g_lo, g_hi = (act_g + segs * x * MiB for x in GRAPH_SEGMENT_MIB)
            graphs = (g_mid, g_lo if graphs_lo else 0.0, g_hi)
        return TrtllmPeak(weights, act, context, graphs)

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """TensorRT-LLM's start-up memory as a MemoryBudget: usable = the whole device; the KV budget =
        0.9 x (total - peak). With check_fit, no pool at all raises DoesNotFit; a pool smaller than max_model_len
        lowers max_model_len (as TensorRT-LLM does), with a warning."""
        eng = self.resolve(cfg, card, gpu)
        rel = self._rel(cfg)
        if rel.engine_backend:  # the C++ executor: no profile (capacity/engine/trtllm/cpp_memory.py)
            return cpp_memory.budget(card, gpu, cfg, eng, rel.label, check_fit=check_fit)
        pk = self.peak(card, gpu, eng)
        total = gpu.usable_memory_bytes
        bpt = kv_estimate.pool_bytes_per_token(card, eng.kv_dtype, kv_tp(cfg, eng.tp), rel.version)  # DSA: kv_estimate
        cap = cfg.num_gpu_blocks_override * eng.block_size if cfg.num_gpu_blocks_override is not None else None
        ends = {}
        for name, end in (("mid", 0), ("lo", 2), ("hi", 1)):  # the conservative KV end has every term high
            ends[name] = kv_tokens(total, pk.total(end), bpt, max_tokens=cap, tokens_per_block=eng.block_size)
        (kv_mid, tok_mid), (kv_lo, tok_lo), (kv_hi, tok_hi) = ends["mid"], ends["lo"], ends["hi"]
        block = eng.block_size
        blocks, blocks_lo, blocks_hi = tok_mid // block, tok_lo // block, tok_hi // block
        planning = blocks_lo if cfg.kv_estimate == "conservative" else blocks
        warnings: list[str] = list(card.notes)
        ctx = eng.max_model_len
        plan_tokens = planning * block
        if 0 < plan_tokens < ctx:
            warnings.append(f"the KV pool holds {plan_tokens:,} tokens, less than max_model_len {ctx:,}: TensorRT-LLM "
                            f"lowers max_seq_len to the pool ('Adjusted max_seq_len to {plan_tokens}')")
            ctx = plan_tokens
        if not eng.chunked_prefill and eng.max_num_batched_tokens < ctx:
            warnings.append(f"chunked prefill off (TensorRT-LLM's default): prompts longer than max_num_tokens "
                            f"{eng.max_num_batched_tokens:,} are rejected; enable_chunked_prefill to serve them")
        if cap is not None and cap > tok_mid:
            warnings.append(f"num_gpu_blocks_override {cfg.num_gpu_blocks_override:,} is more than the pool TensorRT-"
                            "LLM would profile: it keeps the smaller (kv_cache_config.max_tokens)")
        estimates = ["activation", "non_torch", "cuda_context"] + ([] if cfg.enforce_eager else ["cuda_graphs"])
        used = [*eng.defaults_used, "free_gpu_memory_fraction"]
        b = MemoryBudget(
            model=card.name, gpu=gpu.name, tp=eng.tp, total_bytes=total, gpu_memory_utilization=1.0, usable_bytes=total,
            weights_bytes=pk.weights[0], activation_bytes=pk.activation[0], non_torch_bytes=pk.context[0],
            cuda_graph_bytes=pk.cuda_graphs[0], cuda_graphs_in_budget=True, kv_budget_bytes=kv_mid,
            kv_dtype=eng.kv_dtype, kv_bytes_per_token=bpt, block_size=block, num_blocks=blocks, kv_tokens=tok_mid,
            max_model_len=ctx, max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens,
            max_concurrency=tok_mid / ctx, paged_kv=True, contiguous_max_seqs=tok_mid // ctx,
            outside_budget_bytes=0.0, estimates=estimates, defaults_used=used, warnings=warnings, engine=self.name,
            release=rel.label, release_checked=False,
            ranges={"weights": [pk.weights[1], pk.weights[2]], "activation": [pk.activation[1], pk.activation[2]],
                    "non_torch": [pk.context[1], pk.context[2]], "cuda_graphs": [pk.cuda_graphs[1], pk.cuda_graphs[2]],
                    "kv_budget": [kv_lo, kv_hi]},
            num_blocks_range=[blocks_lo, blocks_hi], kv_estimate=cfg.kv_estimate, planning_blocks=planning,
            block_bytes=block * bpt, chunked_prefill=eng.chunked_prefill)
        vswa.apply(b, card, cfg, eng, rel, {"mid": kv_mid, "lo": kv_lo, "hi": kv_hi}, cap)
        if trtllm_attention_dp(cfg):
            b.warnings.append(f"attention DP: every figure is one rank's; each of the {eng.tp} ranks holds its own KV "
                              "pool and batch (simulate: the ranks in lock step, capacity/engine/lockstep.py)")
        why = None
        if pk.total(0) >= total:
            why = (f"weights {pk.weights[0] / GiB:.1f} GiB + activation {pk.activation[0] / GiB:.2f} + context "
                   f"{pk.context[0] / GiB:.2f} + CUDA graphs {pk.cuda_graphs[0] / GiB:.2f} per rank leave nothing of "
                   f"{gpu.name}'s {total / GiB:.1f} GiB at tp={eng.tp}; raise tp")
        elif blocks == 0:
            why = f"no KV blocks: 0.9 x the {(total - pk.total(0)) / GiB:.2f} GiB free after the profile at tp={eng.tp}"
        elif kv_estimate.pool_request_fails(rel.version, kv_mid, free := total - pk.total(0) + pk.activation[0],
                                            f := kv_estimate.inflation(card, eng.kv_dtype, kv_tp(cfg, eng.tp), bpt)):
            why = (f"TensorRT-LLM {rel.version} sizes the pool from max_tokens counted at {card.num_kv_heads} KV heads / "
                   f"tp {eng.tp} of a head per rank, the pool keeps a whole head: {kv_mid * f / GiB:.1f} GiB asked of "
                   f"{free / GiB:.1f} free ('could not be created: KV cache'); tp <= {card.num_kv_heads} or 1.1+")
        b.fits, b.reason = why is None, why or ""
        if check_fit and why:
            raise DoesNotFit(why)
        return b

    # ---- scheduling ----------------------------------------------------------------------------------
    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> SchedulerFactory:
        """A builder of one replica's scheduler: GUARANTEED_NO_EVICT admission (prompt + output reserved), the
        max_num_tokens step budget, the overlap scheduler; checks the settings now."""
        self._check(cfg)
        # attention DP: this is one rank's scheduler (its own pool and batch); the pipeline steps tp of them in lock
        # step (capacity/engine/lockstep.py)
        if limits.kv_groups is not None:
            raise ConfigError("sliding-window KV groups: TensorRT-LLM's pools for them are not modelled")
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = limits.chunked_prefill if limits.chunked_prefill is not None else False
        overlap = self.async_scheduling(cfg)
        max_util = cfg.kv_reservation == "prompt"
        # MAX_UTILIZATION admits a request when the blocks of its next step fit (its whole prompt, or its chunk with
        # chunked prefill) and pauses requests when the cache fills, recomputing them later: vLLM's preemption
        def conf() -> ContinuousConfig:  # FCFS, as make_scheduler("continuous") builds it
            return ContinuousConfig(
                max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
                block_size=limits.block_size, num_blocks=limits.num_blocks, chunked_prefill=chunked,
                prefix_caching=cfg.enable_prefix_caching, queue="fcfs", max_model_len=limits.max_model_len,
                reserve_output=not max_util, reserve_full_input=not chunked, async_scheduling=overlap)

        if self._rel(cfg).dynamic_batch_tuning:  # the engine backend: the runtime batch size follows the KV capacity
            TrtDynamicBatchScheduler(conf())
            return lambda: TrtDynamicBatchScheduler(conf())
        ContinuousScheduler(conf())
        return lambda: ContinuousScheduler(conf())

    def async_scheduling(self, cfg: EngineConfig) -> bool:
        """The overlap scheduler (PyTorch backend: on unless disable_overlap_scheduler; the engine backend has
        none)."""
        rel = self._rel(cfg)
        if rel.engine_backend:
            return False
        if cfg.async_scheduling is None:
            return rel.overlap_scheduler_default
        return cfg.async_scheduling

    def step_overhead_s(self, cfg: EngineConfig) -> float:
        """The configured figure, else vLLM's STEP_OVERHEAD_S (2 ms): not measured for TensorRT-LLM."""
        return STEP_OVERHEAD_S if cfg.step_overhead_ms is None else cfg.step_overhead_ms / 1e3

    def overhead_overlaps(self, cfg: EngineConfig) -> bool:
        """The overlap scheduler (`_torch/pyexecutor/py_executor.py`, `_executor_loop_overlap`) enqueues the next
        batch's forward pass before it processes the previous batch's outputs: a step lasts the longer of the GPU
        step and the CPU's work (capacity.cost.overlap)."""
        return self.async_scheduling(cfg)

    # ---- launch command ------------------------------------------------------------------------------
    def launch_command(self, card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str:
        """`trtllm-serve` with the plan's limits, after writing the options file (one YAML flow mapping) for what
        has no flag. The KV cache is
        pinned to the planned pool (kv_cache_config.max_tokens: TensorRT-LLM keeps the smaller of it and what it
        profiles), so the engine never holds more than was simulated."""
        win = f", max_attention_window: {vswa.launch_vector(card, b.max_model_len)}" if trtllm_vswa(cfg) else ""
        extra = [f"kv_cache_config: {{max_tokens: {b.planning_tokens}, tokens_per_block: {b.block_size}, "
                 f"enable_block_reuse: {str(cfg.enable_prefix_caching).lower()}{win}"
                 + (", dtype: fp8" if cfg.kv_cache_dtype == "fp8" else "") + "}",
                 f"enable_chunked_prefill: {str(b.chunked_prefill).lower()}"]
        rel = self._rel(cfg)
        if not rel.engine_backend:
            extra.append(f"disable_overlap_scheduler: {str(not self.async_scheduling(cfg)).lower()}")
        if trtllm_attention_dp(cfg):
            extra.append("enable_attention_dp: true")
        if cfg.kv_reservation == "prompt":
            extra.append("scheduler_config: {capacity_scheduler_policy: MAX_UTILIZATION}")
        if cfg.enforce_eager:
            extra.append("cuda_graph_config: null")
        f = engine_flag  # the flag names: EngineConfig's declarations
        ref = model_reference(card, "trtllm")
        cmd = " ".join([f"trtllm-serve {ref.model}", f"--backend {rel.backend}",
                        f"{f('trtllm', 'tensor_parallel_size')} {b.tp}", f"{f('trtllm', 'max_num_seqs')} {b.max_num_seqs}",
                        f"{f('trtllm', 'max_num_batched_tokens')} {b.max_num_batched_tokens}",
                        f"{f('trtllm', 'max_model_len')} {b.max_model_len}",
                        f"--kv_cache_free_gpu_memory_fraction {FREE_GPU_MEMORY_FRACTION}",
                        "--extra_llm_api_options extra.yaml", *declared_flags("trtllm", cfg)])
        return with_comment(ref, "echo '{" + ", ".join(extra) + "}' > extra.yaml && " + cmd)

    def launch_notes(self, cfg: EngineConfig) -> list[str]:
        rel = self._rel(cfg)
        notes = [f"memory and defaults modelled on TensorRT-LLM {self.release} ({rel.backend} backend), read "
                 "from its code; the estimated terms are not yet checked on a TensorRT-LLM log of this GPU: the "
                 "plan uses the conservative end"]
        if rel.engine_backend:
            notes.append("TensorRT engine backend: memory from the C++ executor's start-up (engine, execution "
                         "context, runtime and decoder buffers, then 0.9 of what is free; docs/trtllm.md); its "
                         "dynamic batch size tuning is simulated")
        return notes


__all__ = ["CUDA_GRAPH_SIZES", "FREE_GPU_MEMORY_FRACTION", "MAX_BATCH_SIZE", "MAX_NUM_TOKENS", "TOKENS_PER_BLOCK",
           "Trtllm", "TrtllmPeak", "kv_tokens"]
