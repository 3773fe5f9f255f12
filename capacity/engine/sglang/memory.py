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
(`_handle_gpu_memory_settings` in server_args.py); those rules, release line by release line, are
`capacity.engine.sglang.releases` (re-exported here).

Checked on 11 real start-up logs (tests/data/sglang_startup/, hand checks in docs/sglang.md): given a log's T0,
A and F, the formula gives its token count within 0.12% (median 0.02%); predicted from the model card and the GPU
alone, within 2%.

In the MemoryBudget (`SglangMemory.budget`), usable = the whole GPU, "non-torch" = the memory taken before T0,
"activation" = SGLang's reserve T0 x (1 - F) (activations, graphs, request table, workspaces) and graphs 0; the
planner's pool is `kv_tokens_low` (the conservative end) unless kv_estimate is middle.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from capacity.engine.budget import MemoryBudget
from capacity.engine.config import EngineConfig, MemoryModelParams, ResolvedEngine
from capacity.engine.sglang.deepep import deepep_buffer_bytes, deepep_note
from capacity.engine.sglang.dpattn import check_dp_attention, dp_attention_note, dp_attention_weights, dp_chunk
from capacity.engine.sglang.dsa import DSA_PAGE, check_dsa, dsa_cells, dsa_kv_dtype, dsa_notes, is_dsa
from capacity.engine.sglang.ep import check_ep, ep_note, ep_weights
from capacity.engine.sglang.lora import sglang_lora_bytes
from capacity.engine.sglang.mla import absorbed_copy_bytes
from capacity.engine.sglang.mm import runner_mm_factor
from capacity.engine.sglang.releases import (
    CURRENT,
    NEWEST_READ,
    RELEASES,
    _line,
    deepep_reserve_mib,
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_mem_fraction_static,
    mm_reservation_bytes,
    parse_release,
    piecewise_graph_tokens,
    refusal,
    rope_cache_factor,
    spec_reserve_mib,
    version_key,
    vlm_fraction_factor,
)
from capacity.engine.sglang.rocm import apply_aiter_cut
from capacity.engine.sglang.swa import SWA_FULL_TOKENS_RATIO, hybrid_swa_layers, split_pool, swa_note
from capacity.engine.vllm.layout import compute_capability
from capacity.engine.vllm.nontorch import NON_TORCH_MULTI, NON_TORCH_PER_PEER_GIB
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.families.registry import traits
from capacity.model.gpus import GPU
from capacity.model.weights import experts_only_alternative, weight_bytes_per_rank
from capacity.units import DTYPE_BYTES, GiB

# What SGLang's "Load weight end ... mem usage" shows beyond the checkpoint's bytes: it is a device-wide free-memory
# delta, so allocations made while loading count too. +0.10 to +0.20 GiB in the three logs of models with a card
# here (Llama-3.1-8B on an H100 twice, a Qwen2.5-7B-architecture model on an RTX 3090); not read from code, so
# only the conservative end of the pool (kv_tokens_low) takes it, at a little above the largest seen.
LOAD_EXTRA_HIGH_GIB = 0.25
# Memory taken before T0 at TP 1 (the CUDA context, and on a desktop the display server or WDDM on the same GPU):
# not in SGLang's code, so a range. Seen in the logs (catalogue total - T0 - the logged distributed init): MI300X
# 0.17, L4 0.34, H100 0.35, H200 0.50 GiB; RTX 3090 0.82 (jerryzsj), RTX 4090 1.17 (sglang#4895, Docker), a 24 GiB
# card under Docker Desktop 1.24 if a 4090 (maxuhl98). The middle is EngineConfig's 0.5 GiB (the data-centre
# figure). The conservative end takes 1.0 here plus LOAD_EXTRA_HIGH_GIB: 1.25 GiB together, above every log's
# context + load residue (RTX 3090 0.82 + 0.20, maxuhl98 1.24 + 0.00 with the fp32 rope cache counted).
CONTEXT_HIGH_GIB = 1.0
MiB = 1 << 20


def pool_tokens(t0_gib: float, avail_gib: float, mem_fraction: float, cell_bytes: int, page_size: int = 1,
                max_total_tokens: int | None = None, state: float = 0.0) -> int:
    """SGLang's KV pool size in tokens from its two free-memory readings (GiB, as it logs them), F and the bytes
    of one token on one rank: int((A - T0 (1 - F)) x 2^30 // cell), clamped, rounded down to a page. `state`:
    a hybrid model's state pool, a share of the rest (0 < state < 1) or bytes set aside first (>= 1)."""
    rest = avail_gib - t0_gib * (1 - mem_fraction)
    if 0 < state < 1:
        rest *= 1 - state
    elif state >= 1:
        rest -= state / GiB
    tokens = int(rest * GiB // cell_bytes)
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return max(0, tokens // page_size * page_size)


def max_running_requests(tokens: int, context_len: int, flag: int | None = None, release: str = CURRENT) -> int:
    """Requests SGLang runs at once: the request-to-token table's size (max(tokens / context x 512, 2048), at
    most 4096, 5120 in 0.3.0; one slot more in 0.3.2-0.4.8, one less in 0.3.0), capped by half the pool's tokens
    unless the flag sets it (model_runner.py init_memory_pool: ReqToTokenPool(max_num_reqs), + 1 row from 0.3.2;
    tp_worker.py / scheduler.py: min(..., req_to_token_pool.size), size - 1 in 0.3.0)."""
    line = _line(release)
    cap, extra = (5120, -1) if line < (0, 3, 1, 0) else (4096, 0 if line < (0, 3, 2, 0) or line >= (0, 4, 9, 0) else 1)
    reqs = min(max(int(tokens / context_len * 512), 2048), cap) + extra
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
    dp_attention: int = 1  # DP attention's dp size (1: off); the figures are one attention group's rank
    swa_tokens: int | None = None  # a hybrid SWA pool's sliding-layer pool (kv_tokens is its full pool)
    kv_dtype: str = ""  # the KV dtype SGLang settles on where it differs from the one asked (DeepSeek-V3.2)
    weights_high_bytes: float = 0.0  # the high end of weights_bytes (experts-only quantisation), 0: none
    deepep_bytes: float = 0.0  # DeepEP's buffers, made at the first forward out of the reserve (sglang/deepep.py)

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
                  context_bytes: float | None = None, dp_attention: int = 1, ep_size: int = 1,
                  speculative: str | None = None,
                  lora: tuple[int, int | None, list[str] | None] | None = None,
                  deepep: tuple[str, int] | None = None) -> SglangBudget:
    """SGLang's start-up memory for this model on this GPU at this TP (see the module docstring). T0 is the GPU's
    total less the CUDA context and, at TP > 1, the distributed init (`context_bytes` overrides both; by default
    the CUDA context of EngineConfig's memory parameters, 0.5 GiB, plus vLLM's measured NCCL / custom all-reduce
    buffers for this link: the same libraries; the logs show T0 0.4-1.0 GiB below the total at TP 1 and 1.96-2.01
    GiB of distributed init at TP 8 on an H200). A is T0 less the weights of one rank. `kv_tokens_low` is the pool
    if the context takes the high end (1.0 GiB, and the high end of the NCCL term): what a plan may count on.
    `dp_attention` > 1: DP attention over that many groups of the tp GPUs (sglang/dpattn.py); a hybrid SWA model's
    pool is split as the release does (sglang/swa.py), kv_tokens_low then being its SWA pool. `ep_size` > 1: the
    experts split over that many ranks (sglang/ep.py); `speculative`: SGLang's --speculative-algorithm, for the
    default F's reserve (the draft itself is the pipeline's, capacity.engine.speculative); `lora`: --enable-lora's
    (max_loras_per_batch, lora_rank, lora_target_modules), whose buffers load before the pool (sglang/lora.py); `deepep`: --moe-a2a-backend deepep's (--deepep-mode, max
    dispatch tokens per rank): ep_size = tp, and DeepEP's buffers out of the reserve (sglang/deepep.py)."""
    attn_tp = check_dp_attention(card, tp, dp_attention, _line(release)) if dp_attention != 1 else tp
    ep_size = tp if deepep is not None else ep_size  # _handle_a2a_moe: DeepEP sets ep_size = tp_size
    check_ep(card, tp, ep_size, _line(release))
    if context_bytes is None:
        ctx_mid, ctx_high = MemoryModelParams().cuda_context_bytes, CONTEXT_HIGH_GIB * GiB
        if tp > 1:
            link = "nvls" if gpu.nvls else ("nvlink" if gpu.interconnect.startswith("nvlink") else "pcie")
            mid, _, high = NON_TORCH_MULTI[link]
            peers = (tp - 2) * NON_TORCH_PER_PEER_GIB
            ctx_mid, ctx_high = ctx_mid + (mid + peers) * GiB, ctx_high + (high + peers) * GiB
    else:
        ctx_mid = ctx_high = context_bytes

    notes: list[str] = []
    split = hybrid_swa_layers(card, _line(release), gpu.arch or "")
    if card.num_sliding_layers and split is None:  # Gemma-2/3, gpt-oss before 0.5.8, Mistral-7B v0.1, Phi-3
        notes.append(swa_note(None, card))
    if not 0 < (mem_fraction_static if mem_fraction_static is not None else 0.5) < 1:
        raise ConfigError(f"mem_fraction_static: must be in (0, 1) (got {mem_fraction_static})")
    if page_size <= 0:
        raise ConfigError(f"page_size: must be > 0 (got {page_size})")
    total = gpu.usable_memory_bytes
    gpu_mib = total / MiB
    chunk = chunked_prefill_size or default_chunked_prefill_size(gpu_mib, release)
    graph_bs = cuda_graph_max_bs or default_cuda_graph_max_bs(gpu_mib, tp, release)
    vlm = vlm_fraction_factor(card, release)
    amd = "cdna" in (gpu.arch or "").lower()
    f = mem_fraction_static if mem_fraction_static is not None else default_mem_fraction_static(
        gpu_mib, tp, release, chunked_prefill_size=chunked_prefill_size, cuda_graph_max_bs=cuda_graph_max_bs,
        mla=card.mla is not None, vlm_factor=vlm, amd=amd, dp=dp_attention, speculative=speculative,
        deepep=deepep is not None)
    if mem_fraction_static is None and spec_reserve_mib(speculative, _line(release)):
        notes.append(f"speculative decoding ({speculative}): the default F reserves "
                     f"{spec_reserve_mib(speculative, _line(release)) / 1024:.0f} GiB more (sglang@{release} rules)")
    if mem_fraction_static is None and deepep_reserve_mib(deepep is not None, _line(release)):
        notes.append(f"DeepEP: the default F reserves 2 GiB more for its buffers (sglang@{release} rules)")
    if mem_fraction_static is None and vlm != 1.0:
        notes.append(f"a vision-language model: SGLang lowers the default F by x{vlm:.3f} for the encoder")
    runner = runner_mm_factor(card, _line(release))  # before 0.4.9: the model runner lowers any F (sglang/mm.py)
    if runner != 1.0:
        f *= runner
        notes.append(f"a multimodal model: the model runner (sglang@{release} rules) lowers F by x{runner:.2f} to {f:.3f}")
    dsa = is_dsa(card)  # DeepSeek-V3.2: the indexer's cache, page 64, fp8 on Blackwell (sglang/dsa.py)
    asked_dtype = kv_cache_dtype
    if dsa:
        check_dsa(card, _line(release), amd)
        kv_cache_dtype, page_size = dsa_kv_dtype(kv_cache_dtype, (compute_capability(gpu) or 0) >= 100), DSA_PAGE
    kv_bytes = DTYPE_BYTES["fp8" if kv_cache_dtype == "fp8" else card.dtype] if kv_cache_dtype in ("auto", "fp8") else None
    if kv_bytes is None:
        raise ConfigError(f"kv_cache_dtype {kv_cache_dtype!r}: SGLang's are auto and fp8 here")
    cell = card.kv_elements_per_token_per_layer(attn_tp) * card.num_kv_layers * int(kv_bytes)
    cell_low = pool_cell = cell
    if dsa:
        cell, cell_low, pool_cell = dsa_cells(card, _line(release), int(kv_bytes))
    if card.mla is not None and _line(release) < (0, 3, 2, 0):  # 0.3.0-0.3.1: --enable-mla off by default
        cell = max(1, card.num_kv_heads // tp) * 256 * card.num_kv_layers * 2 * int(kv_bytes)  # head_dim 256
        notes.append("MLA off by default before 0.3.2: DeepSeek-V2's pool is sized as MHA (kv heads x 256 x 2)")
    t0 = total - ctx_mid
    weights = _rank_weights(card, tp, dp_attention, ep_size, release, amd, attn_tp)
    if ep_size > 1:
        notes.append(ep_note(tp, ep_size, card))
    if lora is not None:  # LoRAMemoryPool: allocated after the weights, before profile_max_num_token reads A
        lora_bytes, lora_note = sglang_lora_bytes(card, tp, _line(release), *lora, dp_attention=dp_attention)
        weights += lora_bytes
        notes.append(lora_note)
    weights_hi = weights  # the experts-only reading of a --weight-dtype override (model/weights.py)
    if (alt_card := experts_only_alternative(card)) is not None:
        weights_hi = max(weights, weights - _rank_weights(card, tp, dp_attention, ep_size, release, amd, attn_tp)
                         + _rank_weights(alt_card, tp, dp_attention, ep_size, release, amd, attn_tp))
        notes.append(f"weights: {card.weight_format} layers not named; if only the experts are {card.weight_format}, "
                     f"{weights_hi / GiB:.2f} GiB a rank (the conservative end takes it)")
    state_share = 0.0
    if card.state is not None:
        state_share, state_note = _state_reserve(card, attn_tp, release, max_running)  # states at attention TP
        notes.append(state_note)
    avail = t0 - weights
    mm_res = mm_reservation_bytes(card, release)  # 0.5.18+: the multimodal embedding cache, out of the pool
    if mm_res:
        notes.append(f"multimodal: {mm_res / MiB:.0f} MiB of the pool's budget kept for the embedding cache "
                     "(SGLANG_VLM_CACHE_SIZE_MB)")
    ctx = context_len or card.max_position_embeddings
    f = apply_aiter_cut(card, tp, _line(release), ctx, amd, f, notes)  # AMD's aiter backend (sglang/rocm.py)
    tokens = pool_tokens(t0 / GiB, (avail - mm_res) / GiB, f, cell, page_size, max_total_tokens, state_share)
    t0_low = total - ctx_high
    low = pool_tokens(t0_low / GiB, (t0_low - weights_hi - mm_res - LOAD_EXTRA_HIGH_GIB * GiB) / GiB, f, cell_low,
                      page_size, max_total_tokens, state_share)
    if dsa:
        notes += dsa_notes(card, _line(release), kv_cache_dtype, kv_cache_dtype != asked_dtype, page_size, tokens, cell,
                           pool_cell, dp_attention, mem_fraction_static is not None)
    swa = None
    if split is not None:  # full pool = kv_tokens; the conservative end is the SWA pool (sglang/swa.py)
        (tokens, swa), low = split_pool(tokens, *split, page_size), split_pool(low, *split, page_size)[1]
        cell = int(card.kv_elements_per_token_per_layer(attn_tp) * kv_bytes * (split[0] + SWA_FULL_TOKENS_RATIO * split[1]))
        notes.append(swa_note(split, card, tokens, swa))
    if dp_attention > 1:
        chunk = dp_chunk(chunk, dp_attention, _line(release))
        max_running = max_running // dp_attention if max_running is not None else None
        notes.append(dp_attention_note(tp, dp_attention, chunk))
    a2a = deepep_buffer_bytes(card, tp, *deepep) if deepep is not None else 0.0
    if deepep is not None:
        notes.append(deepep_note(a2a, t0 * (1 - f), deepep[0]))
    b = SglangBudget(release, tp, total, ctx_mid, t0, weights, avail, f, mem_fraction_static is None,
                     t0 * (1 - f), cell, tokens, tokens * pool_cell, ctx, page_size, chunk, graph_bs,
                     max_running_requests(tokens, ctx, max_running, release), low, context_high_bytes=ctx_high,
                     notes=notes, dp_attention=dp_attention, swa_tokens=swa,
                     kv_dtype=kv_cache_dtype if kv_cache_dtype != asked_dtype else "", weights_high_bytes=weights_hi,
                     deepep_bytes=a2a)
    if tokens <= 0:
        b.notes.append(f"no KV pool: the weights take more than F x T0 (SGLang stops: {refusal(release)})")
    elif not b.fits:
        b.notes.append(f"the pool holds {tokens:,} tokens, less than one request of context_len {ctx:,}")
    b.notes.append("activations, CUDA graphs, the request table and attention workspaces must fit in the reserve "
                   f"T0 x (1 - F) = {b.reserve_bytes / GiB:.2f} GiB (SGLang does not measure them at start-up)")
    return b


def _rank_weights(card: ModelCard, tp: int, dp_attention: int, ep_size: int, release: str, amd: bool,
                  attn_tp: int) -> float:
    """The weights one rank loads: TP (or DP attention's layout, sglang/dpattn.py), experts over ep_size
    (sglang/ep.py), the rope cache in the release's dtype, and DeepSeek's absorbed copies (sglang/mla.py)."""
    per_group = dp_attention_weights(card, tp, dp_attention) if dp_attention > 1 else weight_bytes_per_rank(card, tp)
    per_group = ep_weights(card, tp, ep_size, per_group)
    per_group["rope_cache"] = per_group.get("rope_cache", 0.0) * rope_cache_factor(card, release, amd)
    return sum(per_group.values()) + absorbed_copy_bytes(card, attn_tp, _line(release), amd)


def _state_reserve(card: ModelCard, tp: int, release: str, max_running: int | None) -> tuple[float, str]:
    """A hybrid model's state pool (SGLang 0.5.2+, model_runner.py `handle_max_mamba_cache`, read in 0.5.5): with
    the radix cache on (the default), the state takes r / (1 + r) of what is left for the pools (r =
    mamba_full_memory_ratio, 0.9); Nemotron-H runs with the radix cache off, and its state pool is
    max_running_requests (512 unless set) requests' states, set aside first. A request's state: every state
    layer's convolution state (bf16) and SSM state (--mamba-ssm-dtype, float32 by default)."""
    st = card.state
    assert st is not None
    if _line(release) < (0, 5, 3, 0):
        raise ConfigError(f"engine sglang@{release}: hybrid models ({st.kind} layers) are modelled from the SGLang "
                          "0.5.3 rules (their state pools arrived in 0.5.2)")
    if st.kind not in ("mamba2", "gated_deltanet"):
        raise ConfigError(f"model {card.name}: SGLang has no {st.kind} state pool in the releases read")
    conv, ssm = st.state_elements(tp)
    per_request = st.num_layers * (conv * 2 + ssm * 4)
    if traits(card.architecture).sglang_states_per_request:
        n = max_running or 512
        return float(n * per_request), (f"hybrid: {n} requests' states ({per_request / MiB:.1f} MiB each) set aside "
                                         "before the KV pool (radix cache off for Nemotron-H)")
    return 0.9 / 1.9, (f"hybrid: the state pool takes 0.9/1.9 of the pools' memory ({per_request / MiB:.1f} MiB per "
                       "request), the KV pool the rest (mamba_full_memory_ratio 0.9)")


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

    def startup_memory(self, card: ModelCard, gpu: GPU, tp: int, *, mem_fraction_static: float | None,
                       context_len: int | None, kv_cache_dtype: str, chunked_prefill_size: int | None,
                       max_running: int | None, dp_attention: int = 1, ep_size: int = 1) -> SglangBudget:
        """SGLang's own start-up accounting (T0, F, the reserve, the pool) under this release's rules, in SGLang's
        terms (`capacity memory --engine sglang`): `sglang_budget` at SGLang's flags."""
        return sglang_budget(card, gpu, tp, release=self.release, mem_fraction_static=mem_fraction_static,
                             context_len=context_len, kv_cache_dtype=kv_cache_dtype,
                             chunked_prefill_size=chunked_prefill_size, max_running=max_running,
                             dp_attention=dp_attention, ep_size=ep_size)

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """SGLang's start-up memory as a MemoryBudget (see the module docstring for where each term goes). With
        check_fit, a model whose weights leave no pool, or a pool smaller than one context_len request, raises
        DoesNotFit."""
        eng, sb = self._resolve(cfg, card, gpu)
        page, cell, ctx = sb.page_size, sb.kv_bytes_per_token, eng.max_model_len  # DSA: page 64 (sglang/dsa.py)
        f, total, w = sb.mem_fraction_static, sb.total_bytes, sb.weights_bytes
        t0_low = total - sb.context_high_bytes
        blocks, blocks_lo = sb.kv_tokens // page, sb.kv_tokens_low // page
        planning = blocks_lo if cfg.kv_estimate == "conservative" else blocks
        estimates = ["cuda_context"] + (["distributed_init"] if eng.tp > 1 else [])
        if sb.weights_high_bytes > w:  # the same words as vLLM's budget
            estimates.append(f"weights ({card.weight_format} layers not named: experts alone at the high end)")
        warnings = [*card.notes, *(n for n in sb.notes if not n.startswith("no KV pool") and not n.startswith("the pool holds"))]
        if cfg.num_gpu_blocks_override is not None and cfg.num_gpu_blocks_override * page > sb.kv_tokens:
            warnings.append(f"num_gpu_blocks_override {cfg.num_gpu_blocks_override:,} pages is more than the "
                            f"{sb.kv_tokens:,} tokens SGLang would profile: it keeps the smaller (--max-total-tokens)")
        b = MemoryBudget(
            model=card.name, gpu=gpu.name, tp=eng.tp, total_bytes=total, gpu_memory_utilization=1.0,
            usable_bytes=total, weights_bytes=w, activation_bytes=sb.reserve_bytes,
            non_torch_bytes=sb.context_bytes, cuda_graph_bytes=0.0, cuda_graphs_in_budget=False,
            kv_budget_bytes=sb.free_at_start_bytes * f - w, kv_dtype=sb.kv_dtype or eng.kv_dtype, kv_bytes_per_token=cell,
            block_size=page, num_blocks=blocks, kv_tokens=sb.kv_tokens, max_model_len=ctx,
            max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens,
            max_concurrency=sb.kv_tokens / ctx, paged_kv=True, contiguous_max_seqs=sb.kv_tokens // ctx,
            outside_budget_bytes=0.0, estimates=estimates,
            defaults_used=[*eng.defaults_used, *(["mem_fraction_static"] if sb.mem_fraction_default else [])],
            warnings=warnings, engine=self.name, release=self.label, release_checked=True,
            ranges={"weights": [w, max(w, sb.weights_high_bytes) + LOAD_EXTRA_HIGH_GIB * GiB], "activation": [t0_low * (1 - f), sb.reserve_bytes],
                    "non_torch": [sb.context_bytes, sb.context_high_bytes], "cuda_graphs": [0.0, 0.0],
                    "kv_budget": [sb.kv_tokens_low * cell, sb.kv_tokens * cell]},
            num_blocks_range=[blocks_lo, blocks], kv_estimate=cfg.kv_estimate, planning_blocks=planning,
            block_bytes=page * cell, chunked_prefill=eng.chunked_prefill)
        why = self.fit_problem(b, sb)
        capped = (why is not None and cfg.max_model_len is None and 1 < planning * page and sb.kv_tokens < ctx
                  and sb.deepep_bytes <= sb.reserve_bytes)
        if capped:
            # context_len left at the model's: SGLang starts and caps a request at the pool (tp_worker.py:
            # max_req_len = min(context_len - 1, max_total_num_tokens - 1)); a context_len the user set stays a refusal
            b.max_model_len = planning * page - 1  # the pool the simulated scheduler is given
            b.max_concurrency, b.contiguous_max_seqs = planning * page / b.max_model_len, 1
            b.warnings.append(f"the pool holds {planning * page:,} tokens, less than the model's context_len {ctx:,}: "
                              f"SGLang starts and refuses requests of more than {b.max_model_len:,} tokens "
                              f"(max_req_len); set max_model_len to plan for longer ones")
            why = None
        b.fits, b.reason = why is None, why or ""
        if why is None and not capped and cfg.kv_estimate == "conservative" and sb.kv_tokens_low < ctx:
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
                    f"{t0 / GiB:.2f} GiB at tp={b.tp} (SGLang stops: {refusal(self.release)}); raise tp")
        if sb.deepep_bytes > sb.reserve_bytes:
            return (f"DeepEP's buffers ({sb.deepep_bytes / GiB:.2f} GiB a rank) are more than SGLang's reserve T0 x (1 - "
                    f"F) = {sb.reserve_bytes / GiB:.2f} GiB, which they come out of at the first forward: lower "
                    "mem_fraction_static")
        if sb.kv_tokens < b.max_model_len:
            return (f"one request of context_len {b.max_model_len} tokens needs {b.max_model_len:,} KV slots, but the "
                    f"pool holds {sb.kv_tokens:,} at tp={b.tp} (SGLang would start and cut requests at the pool); "
                    f"the largest max_model_len that fits is {sb.kv_tokens}")
        return None


__all__ = ["CURRENT", "LOAD_EXTRA_HIGH_GIB", "NEWEST_READ", "RELEASES", "MiB", "SglangBudget", "SglangMemory",
           "default_chunked_prefill_size", "default_cuda_graph_max_bs", "default_mem_fraction_static",
           "max_running_requests", "parse_release", "piecewise_graph_tokens", "pool_tokens", "sglang_budget",
           "version_key", "vlm_fraction_factor"]
