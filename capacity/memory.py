"""VRAM budget per TP rank, mirroring what vLLM does at start-up, and the questions built on it.

vLLM (V1 worker, `determine_available_memory`) takes a snapshot, loads the weights, runs one profiling
forward pass of max_num_batched_tokens tokens plus a dummy sampler pass over max_num_seqs rows of logits,
and then:
    requested  = total_gpu_memory x gpu_memory_utilization
    KV budget  = requested - weights - torch activation peak - non-torch increase
    num_blocks = floor(KV budget / (block_size x kv_bytes_per_token))       (per rank, all layers)
CUDA graphs are captured after the KV cache is allocated, so by default they sit outside the budget
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 moves them inside). Weights are computed exactly from the
card; activation peak, non-torch memory and CUDA-graph memory are estimates (see MemoryModelParams)
unless the scenario gives measured values.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from capacity.engine import EngineConfig, ResolvedEngine, check_tp, cudagraph_capture_sizes, resolve
from capacity.errors import ConfigError, DoesNotFit
from capacity.gpus import GPU
from capacity.model_card import ModelCard
from capacity.units import DTYPE_BYTES, GiB
from capacity.weights import weight_bytes_per_rank

TP_CHOICES = (1, 2, 4, 8, 16)


def kv_bytes_per_token(card: ModelCard, kv_dtype: str, tp: int = 1) -> float:
    """KV-cache bytes one token takes on one TP rank, all layers: 2 x layers x kv_heads x head_dim x
    dtype bytes for GQA/MHA (kv_heads per rank, at least 1); layers x (latent + rope) x bytes for MLA."""
    return card.num_layers * card.kv_elements_per_token_per_layer(tp) * DTYPE_BYTES[kv_dtype]


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


@dataclass
class MemoryBudget:
    """Every term of the budget for one rank, in bytes, plus what the engine resolved."""

    model: str
    gpu: str
    tp: int
    total_bytes: float
    gpu_memory_utilization: float
    usable_bytes: float
    weights_bytes: float
    activation_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float
    cuda_graphs_in_budget: bool
    kv_budget_bytes: float
    kv_dtype: str
    kv_bytes_per_token: float
    block_size: int
    num_blocks: int
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_concurrency: float  # kv_tokens / max_model_len, as vLLM logs it
    paged_kv: bool
    contiguous_max_seqs: int  # sequences that fit if each reserved max_model_len slots
    outside_budget_bytes: float  # CUDA context (+ graphs when outside the budget): must fit physically
    estimates: list[str] = field(default_factory=list)  # names of terms that are estimates
    defaults_used: list[str] = field(default_factory=list)
    activation_phases: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def concurrency_at(self, context: int) -> int:
        """Sequences of `context` tokens that fit at once (paged: whole blocks; contiguous: max_model_len)."""
        if not self.paged_kv:
            return self.contiguous_max_seqs if context <= self.max_model_len else 0
        return self.num_blocks // math.ceil(context / self.block_size)


def budget(card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
    """The VRAM budget. With check_fit, a model or max_model_len that does not fit raises DoesNotFit."""
    eng = resolve(cfg, card, gpu)
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


def check_fits(b: MemoryBudget, card: ModelCard, gpu: GPU) -> None:
    if b.weights_bytes >= b.usable_bytes:
        need_tp = next((t for t in TP_CHOICES if t > b.tp and _weights_fit(card, gpu, b, t)), None)
        hint = f"; try --tp {need_tp}" if need_tp else "; no tensor-parallel size up to 16 fits it"
        raise DoesNotFit(
            f"weights need {b.weights_bytes / GiB:.1f} GiB per rank, usable is {b.usable_bytes / GiB:.1f} GiB "
            f"({gpu.name}: {b.total_bytes / GiB:.1f} GiB x {b.gpu_memory_utilization}) at tp={b.tp}{hint}"
        )
    if b.num_blocks == 0:
        raise DoesNotFit(
            f"no memory left for the KV cache: usable {b.usable_bytes / GiB:.2f} GiB - weights "
            f"{b.weights_bytes / GiB:.2f} - activation {b.activation_bytes / GiB:.2f} - non-torch "
            f"{b.non_torch_bytes / GiB:.2f}{' - CUDA graphs %.2f' % (b.cuda_graph_bytes / GiB) if b.cuda_graphs_in_budget else ''}"
            f" = {b.kv_budget_bytes / GiB:.2f} GiB at tp={b.tp}; raise gpu_memory_utilization, lower "
            "max_num_batched_tokens/max_num_seqs, or raise tp"
        )
    need = math.ceil(b.max_model_len / b.block_size) * b.block_size * b.kv_bytes_per_token
    if (b.paged_kv and b.kv_tokens < b.max_model_len) or (not b.paged_kv and b.contiguous_max_seqs < 1):
        raise DoesNotFit(
            f"one request of max_model_len {b.max_model_len} tokens needs {need / GiB:.2f} GiB of KV cache, "
            f"but only {b.kv_budget_bytes / GiB:.2f} GiB is available ({b.kv_tokens} tokens) at tp={b.tp}; "
            f"the largest max_model_len that fits is {b.kv_tokens if b.paged_kv else 0}"
        )


def _weights_fit(card: ModelCard, gpu: GPU, b: MemoryBudget, tp: int) -> bool:
    try:
        check_tp(card, tp)
    except ConfigError:
        return False
    return sum(weight_bytes_per_rank(card, tp).values()) < b.usable_bytes


# ---- tables --------------------------------------------------------------------------------------
def default_batches(max_num_seqs: int) -> list[int]:
    out = [1, 8, 16, 32, 64, 128, 256, 512, 1024]
    return [x for x in out if x <= max_num_seqs] + ([max_num_seqs] if max_num_seqs not in out else [])


def default_contexts(max_model_len: int) -> list[int]:
    out = [1024 * 2**k for k in range(9) if 1024 * 2**k <= max_model_len]
    return out + ([max_model_len] if max_model_len not in out else [])


def batch_context_table(b: MemoryBudget, batches: list[int], contexts: list[int]) -> list[dict]:
    """For each (batch, context): KV GiB needed, fraction of the KV budget, and whether it fits.

    The seeds' estimate (batch x context x kv_bytes_per_token) generalised: paged KV rounds each sequence
    up to whole blocks; contiguous KV reserves max_model_len slots per sequence whatever its context.
    """
    rows = []
    for batch in batches:
        for ctx in contexts:
            per_seq = (math.ceil(ctx / b.block_size) * b.block_size if b.paged_kv else b.max_model_len)
            need = batch * per_seq * b.kv_bytes_per_token
            fits = need <= b.num_blocks * b.block_size * b.kv_bytes_per_token if b.paged_kv else need <= b.kv_budget_bytes
            reason = "fits"
            if ctx > b.max_model_len:
                fits, reason = False, "context > max_model_len"
            elif batch > b.max_num_seqs:
                fits, reason = False, "batch > max_num_seqs"
            elif not fits:
                reason = "KV cache full"
            rows.append({"batch": batch, "context": ctx, "kv_bytes": need,
                         "kv_fraction": need / b.kv_budget_bytes if b.kv_budget_bytes > 0 else math.inf,
                         "fits": fits, "reason": reason})
    return rows


# ---- inverse queries -----------------------------------------------------------------------------
def min_gpu_memory_utilization(card: ModelCard, gpu: GPU, cfg: EngineConfig, concurrency: int, context: int) -> float:
    """Smallest gpu_memory_utilization (2 decimals, rounded up) that holds `concurrency` sequences of
    `context` tokens and one request of max_model_len."""
    b = budget(card, gpu, cfg, check_fit=False)
    blocks = max(concurrency * math.ceil(context / b.block_size), math.ceil(b.max_model_len / b.block_size))
    kv_need = blocks * b.block_size * b.kv_bytes_per_token
    in_budget = b.cuda_graph_bytes if b.cuda_graphs_in_budget else 0.0
    fixed = b.weights_bytes + b.activation_bytes + b.non_torch_bytes + in_budget
    util = math.ceil((fixed + kv_need) / b.total_bytes * 100 + 1e-9) / 100
    if util > 1.0:
        raise DoesNotFit(
            f"{concurrency} sequences of {context} tokens need {(fixed + kv_need) / GiB:.1f} GiB per rank "
            f"(weights {b.weights_bytes / GiB:.1f} + KV {kv_need / GiB:.1f} + other {(fixed - b.weights_bytes) / GiB:.1f}),"
            f" more than the {b.total_bytes / GiB:.1f} GiB of {gpu.name} at tp={b.tp}; raise tp"
        )
    return util


def min_tp(card: ModelCard, gpu: GPU, cfg: EngineConfig, concurrency: int, context: int) -> int:
    """Smallest tensor-parallel size whose budget holds `concurrency` sequences of `context` tokens."""
    tried = []
    for tp in TP_CHOICES:
        try:
            check_tp(card, tp)
        except ConfigError:
            continue
        b = budget(card, gpu, cfg.model_copy(update={"tensor_parallel_size": tp}), check_fit=False)
        got = b.concurrency_at(context) if b.num_blocks and b.weights_bytes < b.usable_bytes else 0
        tried.append(f"tp={tp}: {got}")
        if got >= concurrency and b.kv_tokens >= b.max_model_len:
            return tp
    raise DoesNotFit(f"no tensor-parallel size holds {concurrency} sequences of {context} tokens ({', '.join(tried)})")


def max_model_len_for(card: ModelCard, gpu: GPU, cfg: EngineConfig, concurrency: int) -> int:
    """Largest max_model_len (a multiple of the block size, at most max_position_embeddings) at which
    `concurrency` sequences of that full length fit at once."""
    lo, hi = 0, card.max_position_embeddings
    while lo < hi:  # the budget depends on max_model_len only through engine defaults: bisect
        mid = (lo + hi + 1) // 2
        b = budget(card, gpu, cfg.model_copy(update={"max_model_len": mid}), check_fit=False)
        ok = b.num_blocks > 0 and b.concurrency_at(mid) >= concurrency and b.weights_bytes < b.usable_bytes
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    if lo == 0:
        raise DoesNotFit(f"{concurrency} concurrent sequences do not fit at any max_model_len on {gpu.name}")
    bs = budget(card, gpu, cfg.model_copy(update={"max_model_len": lo}), check_fit=False).block_size
    return lo if lo == card.max_position_embeddings else lo // bs * bs
