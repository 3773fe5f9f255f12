"""SGLang's start-up memory accounting (`SglangMemory`, mixed into `capacity.engine.sglang.Sglang`): the KV pool
SGLang sizes from its free-memory readings and `--mem-fraction-static` (`sglang_budget`, `pool_tokens`), the
default F, chunked_prefill_size and cuda_graph_max_bs of each modelled release, max_running_requests, and the
constants read from SGLang's code and start-up logs. It changes when a release changes how it sizes its pool or
its memory defaults, or a new start-up log moves an empirical term; the mapping of EngineConfig onto SGLang's
flags, the scheduler and the launch commands live in `capacity.engine.sglang`.

How SGLang sizes its KV pool (v0.5.5, `python/sglang/srt/model_executor/model_runner.py`,
`profile_max_num_token` and `init_memory_pool`; the same line in 0.4.3 to 0.5.23):

- T0 = free GPU memory after the CUDA context and the distributed init (NCCL, custom all-reduce buffers), before
  the weights load, the minimum over ranks (`init_torch_distributed`);
- A = free memory just before the pool is allocated, i.e. after the weights (the minimum over ranks);
- rest = A - T0 x (1 - mem_fraction_static); tokens = int(rest x 2^30 // cell), where cell is the KV bytes of
  one token on one rank (max(1, kv_heads / TP) x head_dim x layers x 2 x bytes, or MLA's (kv_lora_rank +
  qk_rope_head_dim) x layers x bytes); clamped by --max-total-tokens, then rounded down to a page.

So `--mem-fraction-static F` is a share of T0 (free memory at start-up), not of the device's total, and SGLang
subtracts nothing for activations, CUDA graphs, the request-to-token table or attention workspaces: they all
have to fit in what F leaves, T0 x (1 - F). Its OOMs come at graph capture or at the first large prefill, not at
pool sizing; vLLM instead measures its activation peak and graph memory and subtracts them. The default F,
chunked_prefill_size and cuda_graph_max_bs depend on the GPU's memory, TP and the release
(`_handle_gpu_memory_settings` in server_args.py); `RELEASES` lists the releases whose rules are modelled (0.4.3,
0.4.6, 0.4.9 and 0.5.5).

Checked on 11 real start-up logs (tests/data/sglang_startup/, hand checks in docs/sglang.md): given a log's T0,
A and F, the formula gives its token count within 0.12% (median 0.02%); predicted from the model card and the GPU
alone, within 2%.

In the MemoryBudget (`SglangMemory.budget`), usable = the whole GPU, "non-torch" = the memory taken before T0,
"activation" = SGLang's reserve T0 x (1 - F) (activations, graphs, request table, workspaces) and graphs 0; the
planner's pool is `kv_tokens_low` (the conservative end) unless kv_estimate is middle.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from capacity.engine.budget import MemoryBudget
from capacity.engine.config import EngineConfig, ResolvedEngine
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.units import DTYPE_BYTES, GiB

# What SGLang's "Load weight end ... mem usage" shows beyond the checkpoint's bytes: it is a device-wide free-memory
# delta, so allocations made while loading count too. +0.10 to +0.20 GiB in the three logs of models with a card
# here (Llama-3.1-8B on an H100 twice, a Qwen2.5-7B-architecture model on an RTX 3090); not read from code, so
# only the conservative end of the pool (kv_tokens_low) takes it, at a little above the largest seen.
LOAD_EXTRA_HIGH_GIB = 0.25
RELEASES = ("0.4.3", "0.4.6", "0.4.9", "0.5.5")  # releases whose default rules are modelled (a later one: 0.5.5's)
CURRENT = "0.5.5"
MiB = 1 << 20


def parse_release(spec: str) -> str:
    """`sglang` (the current rule set) or `sglang@X.Y[.Z]`: the modelled release whose rules apply to it (the
    latest modelled one at or below it)."""
    if spec == "sglang":
        return CURRENT
    m = re.fullmatch(r"sglang@(\d+)\.(\d+)(?:\.(\d+))?(?:\.post\d+)?", spec)
    if not m:
        raise ConfigError(f"engine {spec!r}: use sglang or sglang@X.Y[.Z]")
    v = tuple(int(x or 0) for x in m.groups())
    if v < (0, 4, 3):
        raise ConfigError(f"engine {spec!r}: SGLang releases before 0.4.3 are not modelled (their logs lack "
                          "the memory figures to check a model against)")
    return max((r for r in RELEASES if tuple(map(int, r.split("."))) <= v), key=lambda r: tuple(map(int, r.split("."))))


def default_chunked_prefill_size(gpu_mem_mib: float, release: str = CURRENT) -> int:
    """SGLang's default --chunked-prefill-size for a GPU of this much memory (server_args.py)."""
    gib = gpu_mem_mib / 1024
    if release in ("0.4.3", "0.4.6", "0.4.9"):
        return 2048 if gpu_mem_mib < 25000 else 8192
    if gib < 35:
        return 2048
    if gib < 60:
        return 4096
    if gib < 160:
        return 8192
    return 16384


def default_cuda_graph_max_bs(gpu_mem_mib: float, tp: int, release: str = CURRENT) -> int:
    """SGLang's default --cuda-graph-max-bs (server_args.py)."""
    gib = gpu_mem_mib / 1024
    if release in ("0.4.3", "0.4.6", "0.4.9"):
        return (8 if tp < 4 else 80) if gpu_mem_mib < 25000 else 160
    if gib < 20:
        return 8
    if gib < 35:
        return 24 if tp < 4 else 80
    if gib < 60:
        return 32 if tp < 4 else 160
    if gib < 160:
        return 256 if tp < 4 else 512
    return 512


def default_mem_fraction_static(gpu_mem_mib: float, tp: int = 1, release: str = CURRENT, pp: int = 1,
                                chunked_prefill_size: int | None = None, cuda_graph_max_bs: int | None = None) -> float:
    """SGLang's default --mem-fraction-static for a GPU with this much memory (nvidia-smi's total, MiB), as each
    release chooses it (server_args.py; no speculative decoding, no DP attention, not a vision model)."""
    gib = gpu_mem_mib / 1024
    if release == "0.4.3" or (release == "0.4.6" and gpu_mem_mib <= 81920):
        return 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
    if release == "0.4.6":  # > 80 GiB: the TP table's share, raised by a fixed 48 GiB of headroom
        f = 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
        return min(f + 48 * 1024 * (1 - f) / gpu_mem_mib, (gpu_mem_mib - 18 * 1024) / gpu_mem_mib) if gib > 96 else 0.88
    if release == "0.4.9":
        tpp = tp * pp
        reserved_gib = (2.8 + tpp / 10 if gib < 35 else 9.5 + tpp / 2 if gib < 90 else 12 + tpp / 2 if gib < 160 else 32)
        return round((gpu_mem_mib - reserved_gib * 1024) / gpu_mem_mib, 3)
    chunk = chunked_prefill_size or default_chunked_prefill_size(gpu_mem_mib, release)
    graph_bs = cuda_graph_max_bs or default_cuda_graph_max_bs(gpu_mem_mib, tp, release)
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if gib > 60:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def pool_tokens(t0_gib: float, avail_gib: float, mem_fraction: float, cell_bytes: int, page_size: int = 1,
                max_total_tokens: int | None = None) -> int:
    """SGLang's KV pool size in tokens from its two free-memory readings (GiB, as it logs them), F and the bytes
    of one token on one rank: int((A - T0 (1 - F)) x 2^30 // cell), clamped, rounded down to a page."""
    rest = avail_gib - t0_gib * (1 - mem_fraction)
    tokens = int(rest * GiB // cell_bytes)
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return max(0, tokens // page_size * page_size)


def max_running_requests(tokens: int, context_len: int, flag: int | None = None, release: str = CURRENT) -> int:
    """Requests SGLang runs at once: the request-to-token table's size (max(tokens / context x 512, 2048), at
    most 4096; one more slot before 0.4.9), capped by half the pool's tokens unless the flag sets it."""
    reqs = min(max(int(tokens / context_len * 512), 2048), 4096) + (1 if release in ("0.4.3", "0.4.6") else 0)
    return min(flag if flag is not None else tokens // 2, reqs)


@dataclass
class SglangBudget:
    """SGLang's start-up memory on one rank (bytes unless named otherwise); see the module docstring."""

    release: str
    tp: int
    total_bytes: float  # what the GPU reports (mem_get_info's total)
    context_bytes: float  # CUDA context + distributed init, taken before T0 (an estimate)
    free_at_start_bytes: float  # T0
    weights_bytes: float
    avail_after_weights_bytes: float  # A
    mem_fraction_static: float
    mem_fraction_default: bool  # F is the release's default (not given)
    reserve_bytes: float  # T0 x (1 - F): activations, CUDA graphs, the request table and workspaces live here
    kv_bytes_per_token: int  # the cell: one token's KV on one rank
    kv_tokens: int
    kv_pool_bytes: float
    context_len: int
    page_size: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    max_running_requests: int
    kv_tokens_low: int  # the pool with the context at the high end of its range (what a plan may count on)
    notes: list[str] = field(default_factory=list)
    context_high_bytes: float = 0.0  # the high end of context_bytes (the one kv_tokens_low assumes)

    @property
    def fits(self) -> bool:
        return self.kv_tokens >= self.context_len

    def as_dict(self) -> dict:
        return {"engine": f"sglang@{self.release}", **asdict(self)}


def sglang_budget(card: ModelCard, gpu: GPU, tp: int = 1, *, release: str = CURRENT,
                  mem_fraction_static: float | None = None, context_len: int | None = None,
                  kv_cache_dtype: str = "auto", chunked_prefill_size: int | None = None,
                  cuda_graph_max_bs: int | None = None, max_total_tokens: int | None = None,
                  max_running: int | None = None, page_size: int = 1,
                  context_bytes: float | None = None) -> SglangBudget:
    """SGLang's start-up memory for this model on this GPU at this TP (see the module docstring). T0 is the GPU's
    total less the CUDA context and, at TP > 1, the distributed init (`context_bytes` overrides both; by default
    the CUDA context of EngineConfig's memory parameters, 0.5 GiB, plus vLLM's measured NCCL / custom all-reduce
    buffers for this link: the same libraries; the logs show T0 0.4-1.0 GiB below the total at TP 1 and 1.96-2.01
    GiB of distributed init at TP 8 on an H200). A is T0 less the weights of one rank. `kv_tokens_low` is the pool
    if the context takes the high end (1.0 GiB, and the high end of the NCCL term): what a plan may count on."""
    from capacity.engine.config import MemoryModelParams
    from capacity.engine.vllm import NON_TORCH_MULTI, NON_TORCH_PER_PEER_GIB
    from capacity.model.weights import weight_bytes_per_rank

    if context_bytes is None:
        ctx_mid, ctx_high = MemoryModelParams().cuda_context_bytes, 1.0 * GiB
        if tp > 1:
            link = "nvls" if gpu.nvls else ("nvlink" if gpu.interconnect.startswith("nvlink") else "pcie")
            mid, _, high = NON_TORCH_MULTI[link]
            peers = (tp - 2) * NON_TORCH_PER_PEER_GIB
            ctx_mid, ctx_high = ctx_mid + (mid + peers) * GiB, ctx_high + (high + peers) * GiB
    else:
        ctx_mid = ctx_high = context_bytes

    if card.num_sliding_layers:
        raise ConfigError(f"model {card.name}: SGLang's split of the pool between sliding-window and full layers "
                          "is not modelled (use --engine vllm)")
    if not 0 < (mem_fraction_static if mem_fraction_static is not None else 0.5) < 1:
        raise ConfigError(f"mem_fraction_static: must be in (0, 1) (got {mem_fraction_static})")
    if page_size <= 0:
        raise ConfigError(f"page_size: must be > 0 (got {page_size})")
    total = gpu.usable_memory_bytes
    gpu_mib = total / MiB
    chunk = chunked_prefill_size or default_chunked_prefill_size(gpu_mib, release)
    graph_bs = cuda_graph_max_bs or default_cuda_graph_max_bs(gpu_mib, tp, release)
    f = mem_fraction_static if mem_fraction_static is not None else default_mem_fraction_static(
        gpu_mib, tp, release, chunked_prefill_size=chunked_prefill_size, cuda_graph_max_bs=cuda_graph_max_bs)
    kv_bytes = DTYPE_BYTES["fp8" if kv_cache_dtype == "fp8" else card.dtype] if kv_cache_dtype in ("auto", "fp8") else None
    if kv_bytes is None:
        raise ConfigError(f"kv_cache_dtype {kv_cache_dtype!r}: SGLang's are auto and fp8 here")
    cell = card.kv_elements_per_token_per_layer(tp) * card.num_layers * int(kv_bytes)
    t0 = total - ctx_mid
    weights = sum(weight_bytes_per_rank(card, tp).values())
    avail = t0 - weights
    ctx = context_len or card.max_position_embeddings
    tokens = pool_tokens(t0 / GiB, avail / GiB, f, cell, page_size, max_total_tokens)
    t0_low = total - ctx_high
    low = pool_tokens(t0_low / GiB, (t0_low - weights - LOAD_EXTRA_HIGH_GIB * GiB) / GiB, f, cell, page_size,
                      max_total_tokens)
    b = SglangBudget(release, tp, total, ctx_mid, t0, weights, avail, f, mem_fraction_static is None,
                     t0 * (1 - f), cell, tokens, tokens * cell, ctx, page_size, chunk, graph_bs,
                     max_running_requests(tokens, ctx, max_running, release), low, context_high_bytes=ctx_high)
    if tokens <= 0:
        b.notes.append("no KV pool: the weights take more than F x T0 (SGLang stops: 'Not enough memory. Please "
                       "try to increase --mem-fraction-static')")
    elif not b.fits:
        b.notes.append(f"the pool holds {tokens:,} tokens, less than one request of context_len {ctx:,}")
    b.notes.append("activations, CUDA graphs, the request table and attention workspaces must fit in the reserve "
                   f"T0 x (1 - F) = {b.reserve_bytes / GiB:.2f} GiB (SGLang does not measure them at start-up)")
    return b


# ---- the memory accounting of the engine model -------------------------------------------------------------
class SglangMemory:
    """SGLang's start-up memory as a MemoryBudget, for one release's rules (see module docstring). `Sglang`
    supplies the release, its name and label, and its defaults (`_resolve`), which the accounting reads."""

    name: str
    release: str

    @property
    def label(self) -> str:
        raise NotImplementedError  # Sglang.label

    def _resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> tuple[ResolvedEngine, SglangBudget]:
        raise NotImplementedError  # Sglang._resolve

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """SGLang's start-up memory as a MemoryBudget (see the module docstring for where each term goes). With
        check_fit, a model whose weights leave no pool, or a pool smaller than one context_len request, raises
        DoesNotFit."""
        from capacity.errors import DoesNotFit

        eng, sb = self._resolve(cfg, card, gpu)
        page, cell, ctx = eng.block_size, sb.kv_bytes_per_token, eng.max_model_len
        f, total, w = sb.mem_fraction_static, sb.total_bytes, sb.weights_bytes
        t0_low = total - sb.context_high_bytes
        blocks, blocks_lo = sb.kv_tokens // page, sb.kv_tokens_low // page
        planning = blocks_lo if cfg.kv_estimate == "conservative" else blocks
        estimates = ["cuda_context"] + (["distributed_init"] if eng.tp > 1 else [])
        warnings = [*card.notes, *(n for n in sb.notes if not n.startswith("no KV pool") and not n.startswith("the pool holds"))]
        if cfg.num_gpu_blocks_override is not None and cfg.num_gpu_blocks_override * page > sb.kv_tokens:
            warnings.append(f"num_gpu_blocks_override {cfg.num_gpu_blocks_override:,} pages is more than the "
                            f"{sb.kv_tokens:,} tokens SGLang would profile: it keeps the smaller (--max-total-tokens)")
        b = MemoryBudget(
            model=card.name, gpu=gpu.name, tp=eng.tp, total_bytes=total, gpu_memory_utilization=1.0,
            usable_bytes=total, weights_bytes=w, activation_bytes=sb.reserve_bytes,
            non_torch_bytes=sb.context_bytes, cuda_graph_bytes=0.0, cuda_graphs_in_budget=False,
            kv_budget_bytes=sb.free_at_start_bytes * f - w, kv_dtype=eng.kv_dtype, kv_bytes_per_token=cell,
            block_size=page, num_blocks=blocks, kv_tokens=sb.kv_tokens, max_model_len=ctx,
            max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens,
            max_concurrency=sb.kv_tokens / ctx, paged_kv=True, contiguous_max_seqs=sb.kv_tokens // ctx,
            outside_budget_bytes=0.0, estimates=estimates, defaults_used=[*eng.defaults_used, "mem_fraction_static"],
            warnings=warnings, engine=self.name, release=self.label, release_checked=True,
            ranges={"weights": [w, w + LOAD_EXTRA_HIGH_GIB * GiB], "activation": [t0_low * (1 - f), sb.reserve_bytes],
                    "non_torch": [sb.context_bytes, sb.context_high_bytes], "cuda_graphs": [0.0, 0.0],
                    "kv_budget": [sb.kv_tokens_low * cell, sb.kv_tokens * cell]},
            num_blocks_range=[blocks_lo, blocks], kv_estimate=cfg.kv_estimate, planning_blocks=planning,
            block_bytes=page * cell, chunked_prefill=eng.chunked_prefill)
        why = self.fit_problem(b, sb)
        b.fits, b.reason = why is None, why or ""
        if why is None and cfg.kv_estimate == "conservative" and sb.kv_tokens_low < ctx:
            b.warnings.append(f"at the conservative end of the estimate ({sb.kv_tokens_low:,} tokens) one request of "
                              f"context_len {ctx} does not fit: SGLang would cap requests at the pool")
        if check_fit and why:
            raise DoesNotFit(why)
        return b

    def fit_problem(self, b: MemoryBudget, sb: SglangBudget) -> str | None:
        """Why SGLang would not start (no pool), or would cut a context_len request (pool < context_len)."""
        f, t0 = sb.mem_fraction_static, sb.free_at_start_bytes
        if sb.kv_tokens <= 0:
            return (f"no KV pool: weights {sb.weights_bytes / GiB:.2f} GiB per rank leave nothing of F x T0 = {f} x "
                    f"{t0 / GiB:.2f} GiB at tp={b.tp} (SGLang stops: 'Not enough memory. Please try to increase "
                    "--mem-fraction-static'); raise tp")
        if sb.kv_tokens < b.max_model_len:
            return (f"one request of context_len {b.max_model_len} tokens needs {b.max_model_len:,} KV slots, but the "
                    f"pool holds {sb.kv_tokens:,} at tp={b.tp} (SGLang would start and cut requests at the pool); "
                    f"the largest max_model_len that fits is {sb.kv_tokens}")
        return None
