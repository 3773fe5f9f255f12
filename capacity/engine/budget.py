"""The VRAM budget of one replica, per TP rank (`MemoryBudget`), and the fit checks every engine applies to it.
How the terms are computed is the engine model's business (`capacity.engine.vllm`); this is the shape of
the answer and the arithmetic all engines share (KV bytes per token, blocks, does-not-fit messages)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from capacity.engine.config import check_tp
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES, GiB

TP_CHOICES = (1, 2, 4, 8, 16)


def kv_bytes_per_token(card: ModelCard, kv_dtype: str, tp: int = 1) -> float:
    """KV-cache bytes one token takes on one TP rank, all layers: 2 x layers x kv_heads x head_dim x
    dtype bytes for GQA/MHA (kv_heads per rank, at least 1); layers x (latent + rope) x bytes for MLA."""
    return card.num_layers * card.kv_elements_per_token_per_layer(tp) * DTYPE_BYTES[kv_dtype]


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
    engine: str = "vllm"

    def as_dict(self) -> dict:
        return asdict(self)

    def concurrency_at(self, context: int) -> int:
        """Sequences of `context` tokens that fit at once (paged: whole blocks; contiguous: max_model_len)."""
        if not self.paged_kv:
            return self.contiguous_max_seqs if context <= self.max_model_len else 0
        return self.num_blocks // math.ceil(context / self.block_size)


@dataclass(frozen=True)
class SchedLimits:
    """What a replica's scheduler is given: its batch cap, token budget, KV blocks and longest request."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    max_model_len: int | None = None  # None: no length limit (a fit to a real engine's runs)

    @classmethod
    def of(cls, b: MemoryBudget) -> SchedLimits:
        return cls(b.max_num_seqs, b.max_num_batched_tokens, b.block_size, b.num_blocks, b.max_model_len)


def check_fits(b: MemoryBudget, card: ModelCard, gpu: GPU) -> None:
    if b.weights_bytes >= b.usable_bytes:
        need_tp = next((t for t in TP_CHOICES if t > b.tp and _weights_fit(card, b, t)), None)
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


def _weights_fit(card: ModelCard, b: MemoryBudget, tp: int) -> bool:
    try:
        check_tp(card, tp)
    except ConfigError:
        return False
    return sum(weight_bytes_per_rank(card, tp).values()) < b.usable_bytes
