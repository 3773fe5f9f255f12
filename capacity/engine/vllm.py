"""The vLLM v1 engine model: its defaults, its start-up memory accounting, its scheduler and its launch command.

Defaults mirror vLLM's `EngineArgs` (v0.10+ V1 engine): on a GPU that reports >= 70 GiB and is not an A100,
`vllm serve` uses max_num_batched_tokens 8192 and max_num_seqs 1024 (the LLM class: 16384/1024); elsewhere
2048/256 (LLM class 8192/256). With chunked prefill off, max_num_batched_tokens is max(max_model_len, 2048).
Block size is 16 (64 for MLA, which FlashMLA needs). Prefix caching is on by default in V1.

Memory mirrors the V1 worker's start-up (`determine_available_memory`): a snapshot, weight loading, one
profiling forward pass of max_num_batched_tokens tokens plus a dummy sampler pass over max_num_seqs rows of
logits, and then
    requested  = total_gpu_memory x gpu_memory_utilization
    KV budget  = requested - weights - torch activation peak - non-torch increase
    num_blocks = floor(KV budget / (block_size x kv_bytes_per_token))       (per rank, all layers)
CUDA graphs are captured after the KV cache is allocated, so by default they sit outside the budget
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 moves them inside). Weights are computed exactly from the card;
activation peak, non-torch memory and CUDA-graph memory are estimates (see MemoryModelParams) unless the
configuration gives measured values.

Scheduling is the V1 scheduler (`capacity.sched.continuous`): token budget, batch cap, chunked prefill,
preemption by recompute, the full-input admission reserve, prefix caching; `--scheduling-policy priority`
is the priority request queue.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from capacity.engine.budget import MemoryBudget, SchedLimits, check_fits, kv_bytes_per_token
from capacity.engine.config import EngineConfig, ResolvedEngine, check_tp
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES, GiB

LARGE_GPU_BYTES = 70 * GiB  # vLLM's threshold for its larger batching defaults


def cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then steps of 8 to 256, then steps of 16, up to
    min(2 x max_num_seqs, 512)."""
    top = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return [s for s in sizes if s <= top]


def activation_peak_bytes(card: ModelCard, eng: ResolvedEngine) -> dict[str, float]:
    """Torch peak increase of vLLM's profiling run, per rank, by phase (see module docstring).

    Forward pass over N = max_num_batched_tokens tokens: the largest set of tensors alive at once in one
    layer (residual + normed hidden + the stage's intermediates). Then the sampler phase: the final
    hidden states stay alive while R = min(max_num_seqs, N) rows of full-vocabulary logits are sampled.
    """
    p = eng.cfg.memory_params
    b = DTYPE_BYTES[card.dtype]
    n, tp, h = eng.max_num_batched_tokens, eng.tp, card.hidden_size
    r = min(eng.max_num_seqs, n)
    ar_out = h if tp > 1 else 0  # out-of-place all-reduce result
    if card.mla is None:
        hd = card.head_dim_
        q = card.num_attention_heads // tp * hd
        kv = 2 * max(1, card.num_kv_heads // tp) * hd
        attn = 2 * h + (q + kv) + q + h + ar_out
    else:
        m = card.mla
        heads = card.num_attention_heads // tp
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        attn = (2 * h + (m.q_lora_rank or 0) + heads * qk + (m.kv_lora_rank + m.qk_rope_head_dim)
                + heads * (qk + m.v_head_dim) + heads * m.v_head_dim + h + ar_out)
    phases = {"forward_attention": n * b * attn}
    if card.num_dense_layers:
        i = math.ceil(card.intermediate_size / tp)
        phases["forward_mlp"] = n * b * (2 * h + 3 * i + ar_out)
    if card.moe is not None:
        moe = card.moe
        chunk = min(n, p.fused_moe_chunk_tokens)
        mi = math.ceil(moe.moe_intermediate_size / tp)
        si = math.ceil(moe.shared_intermediate / tp)
        per_tok = 2 * h + moe.num_experts + (h if si else 0) + ar_out  # hidden, router logits, shared out
        phases["forward_moe"] = (n * b * per_tok + chunk * moe.experts_per_token * b * (3 * mi + h)
                                 + n * moe.experts_per_token * 8 + (n * b * 3 * si if si else 0))
    phases["sampler"] = n * h * b + r * h * b + r * card.vocab_size * (b + p.sampler_bytes_per_logit)
    return phases


def cuda_graph_bytes(card: ModelCard, eng: ResolvedEngine, act_per_token: float) -> float:
    p = eng.cfg.memory_params
    sizes = cudagraph_capture_sizes(eng.max_num_seqs)
    segments = len(sizes) * (card.num_layers + 1) + len(sizes)  # piecewise segments + full decode graphs
    return max(sizes) * act_per_token + segments * p.cuda_graph_bytes_per_segment


class VllmV1:
    """The vLLM v1 engine model (see module docstring)."""

    name = "vllm"

    # ---- defaults ------------------------------------------------------------------------------------
    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        tp = cfg.tensor_parallel_size
        check_tp(card, tp)
        used: list[str] = []
        large = gpu.usable_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower()

        max_model_len = cfg.max_model_len
        if max_model_len is None:
            max_model_len = card.max_position_embeddings
            used.append("max_model_len")
        elif max_model_len > card.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                f"{card.max_position_embeddings} ({card.name})"
            )

        max_num_seqs = cfg.max_num_seqs
        if max_num_seqs is None:
            max_num_seqs = 1024 if large else 256
            used.append("max_num_seqs")

        mnbt = cfg.max_num_batched_tokens
        if mnbt is None:
            used.append("max_num_batched_tokens")
            if cfg.enable_chunked_prefill:
                mnbt = {("serve", True): 8192, ("llm", True): 16384, ("serve", False): 2048, ("llm", False): 8192}[
                    (cfg.usage_context, large)
                ]
            else:
                mnbt = max(max_model_len, 2048)
        if not cfg.enable_chunked_prefill and mnbt < max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({max_model_len}) with chunked "
                "prefill off: a full-length prompt could never be scheduled; raise it or enable chunked prefill"
            )
        if mnbt < max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({max_num_seqs}), as vLLM requires"
            )

        block_size = cfg.block_size
        if block_size is None:
            block_size = 64 if card.mla is not None else 16
            used.append("block_size")
        kv_dtype = card.dtype if cfg.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
        return ResolvedEngine(cfg, tp, max_model_len, max_num_seqs, mnbt, block_size, kv_dtype, tuple(used))

    def default_max_num_batched_tokens(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> int:
        """The token budget this engine would pick for `cfg` on `gpu` (whatever cfg says about it)."""
        probe = cfg.model_copy(update={"max_num_batched_tokens": None, "max_num_seqs": 1})
        return self.resolve(probe, card, gpu).max_num_batched_tokens

    # ---- start-up memory -----------------------------------------------------------------------------
    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """The VRAM budget. With check_fit, a model or max_model_len that does not fit raises DoesNotFit."""
        eng = self.resolve(cfg, card, gpu)
        p = cfg.memory_params
        estimates: list[str] = []
        total = gpu.usable_memory_bytes
        usable = total * cfg.gpu_memory_utilization
        weights = sum(weight_bytes_per_rank(card, eng.tp).values())

        phases = activation_peak_bytes(card, eng)
        if cfg.activation_bytes is not None:
            act = cfg.activation_bytes
        else:
            act = max(phases.values())
            estimates.append("activation")
        if cfg.non_torch_bytes is not None:
            non_torch = cfg.non_torch_bytes
        else:
            non_torch = p.non_torch_bytes + (
                p.non_torch_multi_gpu_bytes + (eng.tp - 1) * p.non_torch_per_peer_bytes if eng.tp > 1 else 0.0)
            estimates.append("non_torch")
        if cfg.enforce_eager:
            graphs = 0.0
        elif cfg.cuda_graph_bytes is not None:
            graphs = cfg.cuda_graph_bytes
        else:
            fwd_per_token = max(v for k, v in phases.items() if k.startswith("forward")) / eng.max_num_batched_tokens
            graphs = cuda_graph_bytes(card, eng, fwd_per_token)
            estimates.append("cuda_graphs")
        estimates.append("cuda_context")

        in_budget = graphs if cfg.cuda_graphs_in_budget else 0.0
        kv_budget = usable - weights - act - non_torch - in_budget
        kvpt = kv_bytes_per_token(card, eng.kv_dtype, eng.tp)
        block_bytes = eng.block_size * kvpt
        num_blocks = max(0, math.floor(kv_budget / block_bytes)) if kv_budget > 0 else 0
        warnings = []
        if cfg.num_gpu_blocks_override is not None:  # vLLM uses the override instead of what it profiled
            if cfg.num_gpu_blocks_override > num_blocks:
                warnings.append(f"num_gpu_blocks_override {cfg.num_gpu_blocks_override:,} is more than the "
                                f"{num_blocks:,} blocks the memory budget holds: the engine may run out of memory")
            num_blocks = cfg.num_gpu_blocks_override
        kv_tokens = num_blocks * eng.block_size
        contiguous = max(0, math.floor(kv_budget / (eng.max_model_len * kvpt))) if kv_budget > 0 else 0
        outside = p.cuda_context_bytes + (graphs - in_budget)

        b = MemoryBudget(
            model=card.name, gpu=gpu.name, tp=eng.tp, total_bytes=total,
            gpu_memory_utilization=cfg.gpu_memory_utilization, usable_bytes=usable, weights_bytes=weights,
            activation_bytes=act, non_torch_bytes=non_torch, cuda_graph_bytes=graphs,
            cuda_graphs_in_budget=cfg.cuda_graphs_in_budget, kv_budget_bytes=kv_budget, kv_dtype=eng.kv_dtype,
            kv_bytes_per_token=kvpt, block_size=eng.block_size, num_blocks=num_blocks, kv_tokens=kv_tokens,
            max_model_len=eng.max_model_len, max_num_seqs=eng.max_num_seqs,
            max_num_batched_tokens=eng.max_num_batched_tokens, max_concurrency=kv_tokens / eng.max_model_len,
            paged_kv=cfg.paged_kv, contiguous_max_seqs=contiguous, outside_budget_bytes=outside,
            estimates=estimates, defaults_used=list(eng.defaults_used), activation_phases=phases,
            warnings=warnings, engine=self.name,
        )
        if usable + outside > total:
            b.warnings.append(
                f"gpu_memory_utilization {cfg.gpu_memory_utilization} leaves {(total - usable) / GiB:.2f} GiB outside "
                f"the budget but {outside / GiB:.2f} GiB is needed there (CUDA context"
                f"{' + CUDA graphs' if not cfg.cuda_graphs_in_budget and graphs else ''}): risk of OOM at start-up"
            )
        if check_fit:
            check_fits(b, card, gpu)
        return b

    # ---- scheduling ----------------------------------------------------------------------------------
    def scheduler_factory(self, cfg: EngineConfig, limits: SchedLimits) -> Callable[[], object]:
        """A builder of one replica's scheduler for this configuration; checks the settings now, so a bad one
        fails with the field named and not inside a simulation."""
        from capacity.sched import make_scheduler

        kw: dict
        if cfg.policy == "static":
            kw = dict(max_batch=cfg.static_max_batch or limits.max_num_seqs, max_wait_s=cfg.static_max_wait_s,
                      block_size=limits.block_size, num_blocks=limits.num_blocks, max_model_len=limits.max_model_len)
        else:
            kw = dict(max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
                      block_size=limits.block_size, num_blocks=limits.num_blocks,
                      chunked_prefill=cfg.enable_chunked_prefill, prefix_caching=self.prefix_caching(cfg),
                      max_model_len=limits.max_model_len)
        make_scheduler(cfg.policy, **kw)
        return lambda: make_scheduler(cfg.policy, **kw)

    def prefix_caching(self, cfg: EngineConfig) -> bool:
        return cfg.enable_prefix_caching

    # ---- launch command ------------------------------------------------------------------------------
    def launch_command(self, card: ModelCard, cfg: EngineConfig, b: MemoryBudget) -> str:
        """`vllm serve` with every knob that decides the simulated configuration spelled out."""
        parts = [f"vllm serve {card.hf_id or card.name}", f"--tensor-parallel-size {b.tp}",
                 f"--max-num-seqs {b.max_num_seqs}", f"--max-model-len {b.max_model_len}",
                 f"--gpu-memory-utilization {cfg.gpu_memory_utilization}",
                 f"--max-num-batched-tokens {b.max_num_batched_tokens}", f"--kv-cache-dtype {cfg.kv_cache_dtype}"]
        if cfg.block_size is not None:
            parts.append(f"--block-size {b.block_size}")
        if not cfg.enable_chunked_prefill:
            parts.append("--no-enable-chunked-prefill")
        parts.append("--enable-prefix-caching" if self.prefix_caching(cfg) else "--no-enable-prefix-caching")
        if cfg.enforce_eager:
            parts.append("--enforce-eager")
        if cfg.policy == "priority":
            parts.append("--scheduling-policy priority")
        if cfg.num_gpu_blocks_override is not None:
            parts.append(f"--num-gpu-blocks-override {cfg.num_gpu_blocks_override}")
        if cfg.usage_context == "llm":
            return "# offline: LLM(model=..., same keyword arguments); as a server:\n" + " ".join(parts)
        return " ".join(parts)

    def launch_notes(self, cfg: EngineConfig) -> list[str]:
        """What the launch command cannot express about the simulated configuration."""
        notes = []
        if cfg.policy in ("sjf", "static"):
            notes.append(f"policy {cfg.policy} is not a vLLM scheduling policy: the command runs vLLM's fcfs")
        if not cfg.paged_kv:
            notes.append("contiguous KV (paged_kv false) is a what-if: vLLM always pages its KV cache")
        return notes

