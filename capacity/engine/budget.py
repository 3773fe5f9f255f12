"""The VRAM budget of one replica, per TP rank (`MemoryBudget`), and the fit checks every engine applies to it.
How the terms are computed is the engine model's business (`capacity.engine.vllm`); this is the shape of
the answer and the arithmetic all engines share (KV bytes per token, blocks, does-not-fit messages)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.families.registry import traits
from capacity.model.gpus import GPU
from capacity.model.weights import weight_bytes_per_rank
from capacity.sched.base import Scheduler
from capacity.units import DTYPE_BYTES, GiB

TP_CHOICES = (1, 2, 4, 8, 16)


def kv_bytes_per_token(card: ModelCard, kv_dtype: str, tp: int = 1) -> float:
    """KV-cache bytes one token takes on one TP rank, all layers: 2 x layers x kv_heads x head_dim x
    dtype bytes for GQA/MHA (kv_heads per rank, at least 1); layers x (latent + rope) x bytes for MLA.
    (Sliding-window layers hold only their window: see KVGroups.)"""
    side = traits(card.architecture).side_cache_bytes  # DeepSeek-V3.2's indexer keys, beside the KV cache
    return card.num_kv_layers * (card.kv_elements_per_token_per_layer(tp) * DTYPE_BYTES[kv_dtype] + side)


@dataclass(frozen=True)
class KVGroups:
    """How the engine lays out the KV cache of a model with sliding-window layers (vLLM's hybrid allocator):
    layers are split into groups of `group_size` (padding the last group of a kind), every group draws blocks
    from one pool, a full-attention group holds a block per `block_size` tokens and a sliding-window group
    only the blocks that cover its window. A model without sliding layers is one full group."""

    full: int = 1  # full-attention groups
    sliding: int = 0  # sliding-window groups
    group_size: int = 0  # layers per group (0: all layers, one group)
    window_blocks: int = 0  # blocks a sliding group keeps per sequence: cdiv(window - 1, block_size) + 1
    window: int = 0  # the sliding window, tokens (0: unknown; the scheduler then takes the largest with window_blocks)
    # tokens scheduled but not yet settled, which a sliding group reserves on top of its window at admission
    # (vLLM's max_in_flight_tokens: max_num_batched_tokens x concurrent batches)
    inflight: int = 0
    state: int = 0  # groups of a hybrid's state layers: one block per sequence each, whatever its length

    @property
    def groups(self) -> int:
        return self.full + self.sliding + self.state

    def blocks_for(self, tokens: int, block_size: int) -> int:
        """Pool blocks a sequence of `tokens` holds while it decodes (every full-group block, the window's, a
        state group's one)."""
        b = -(-tokens // block_size)
        return self.full * b + self.sliding * min(b, self.window_blocks) + self.state

    def _cap(self, block_size: int, max_model_len: int | None = None) -> int:
        """vLLM's max_admission_blocks_per_request of a sliding group: cdiv(min(W - 1 + in flight, max_model_len),
        block) + 1 (the window may start inside a block)."""
        w = self.window or (self.window_blocks - 1) * block_size + 1
        t = w - 1 + self.inflight
        return -(-(t if max_model_len is None else min(t, max_model_len)) // block_size) + 1

    def admission_blocks(self, tokens: int, block_size: int) -> int:
        """Free blocks vLLM wants before it admits a request of `tokens` tokens (the full-input reserve): a
        sliding group reserves up to its cap, not its window, since a prefill chunk holds the window plus the
        chunk until the next step frees it."""
        b = -(-tokens // block_size)
        if not self.sliding:
            return self.full * b + self.state
        return self.full * b + self.sliding * min(b, self._cap(block_size)) + self.state

    def startup_blocks(self, max_model_len: int, block_size: int) -> int:
        """Blocks per request behind vLLM's start-up "Maximum concurrency for L tokens per request"
        (get_max_concurrency_for_kv_cache_config: every group's max_memory_usage_bytes / page size)."""
        b = -(-max_model_len // block_size)
        if not self.sliding:
            return self.full * b + self.state
        return self.full * b + self.sliding * self._cap(block_size, max_model_len) + self.state

    def as_tuple(self) -> tuple[int, ...] | None:
        if not self.sliding:
            return None
        return (self.full, self.sliding, self.window_blocks) + ((self.window,) if self.window else ())


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
    release: str = "vllm"  # the engine release whose accounting produced it (e.g. vllm@0.11.2)
    release_checked: bool = False  # whether that release's accounting was compared with real start-up logs
    runner_buffers_bytes: float = 0.0  # persistent model-runner buffers the release's profiler counts
    # [low, high] of every estimated term and of the KV budget; the middle is the term's own field
    ranges: dict[str, list[float]] = field(default_factory=dict)
    num_blocks_range: list[int] = field(default_factory=list)  # [conservative, optimistic]
    kv_estimate: str = "conservative"  # which end the planner uses (planning_blocks)
    planning_blocks: int = 0  # the blocks the planner and the simulator use
    kv_groups: KVGroups = field(default_factory=KVGroups)
    block_bytes: float = 0.0  # bytes of one pool block (block_size tokens of every layer in a group)
    chunked_prefill: bool = True  # as the engine resolved it
    fits: bool = True  # whether the engine starts (weights, one max_model_len request) at the middle estimate
    reason: str = ""  # why not, when it does not

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def planning_tokens(self) -> int:
        """Tokens the planner's blocks hold, counted as vLLM counts them (blocks // groups x block size)."""
        return self.planning_blocks // max(1, self.kv_groups.groups) * self.block_size

    def blocks_for(self, context: int) -> int:
        """Pool blocks one sequence of `context` tokens holds."""
        return self.kv_groups.blocks_for(context, self.block_size)

    def concurrency_at(self, context: int) -> int:
        """Sequences of `context` tokens that fit at once in the blocks the planner uses (paged: whole blocks;
        contiguous: max_model_len slots each). With sliding-window layers the last one admitted needs its
        admission reserve free next to the others' held blocks: (n - 1) x held + reserve <= blocks."""
        if not self.paged_kv:
            return self.contiguous_max_seqs if context <= self.max_model_len else 0
        held = self.blocks_for(context)
        reserve = self.kv_groups.admission_blocks(context, self.block_size)
        if self.planning_blocks < reserve:
            return 0
        return (self.planning_blocks - reserve) // held + 1


def check_tp(card: ModelCard, tp: int) -> None:
    """vLLM needs attention heads divisible by tp, and KV heads either divisible by tp or dividing it."""
    if card.num_attention_heads % tp:
        raise ConfigError(
            f"tensor_parallel_size {tp}: num_attention_heads ({card.num_attention_heads}) of {card.name} "
            f"is not divisible by {tp}"
        )
    if card.mla is None and card.num_kv_heads % tp and tp % card.num_kv_heads:
        raise ConfigError(
            f"tensor_parallel_size {tp}: num_kv_heads ({card.num_kv_heads}) of {card.name} neither divides "
            f"nor is divisible by {tp}"
        )


SchedulerFactory = Callable[[], Scheduler]  # builds one replica's scheduler (EngineModel.scheduler_factory)


@dataclass(frozen=True)
class SchedLimits:
    """What a replica's scheduler is given: its batch cap, token budget, KV blocks and longest request."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    max_model_len: int | None = None  # None: no length limit (a fit to a real engine's runs)
    kv_groups: tuple[int, ...] | None = None  # sliding-window layout (full, sliding, window blocks[, window])
    chunked_prefill: bool | None = None  # as the engine resolved it (None: the engine's default)

    @classmethod
    def of(cls, b: MemoryBudget) -> SchedLimits:
        g = b.kv_groups
        blocks, seqs = b.planning_blocks, b.max_num_seqs
        if g.state:  # a hybrid: the scheduler sees attention blocks, with a state page set aside per sequence slot
            full = max(1, g.full)
            seqs = max(1, min(seqs, b.planning_blocks // (g.state + full)))  # slots whose state and a block fit
            blocks = max(0, b.planning_blocks - seqs * g.state) // full
        if blocks <= 0:  # never simulate blocks the engine may not have
            lo, hi = b.num_blocks_range or [b.num_blocks, b.num_blocks]
            raise DoesNotFit(f"no KV block at the conservative end of the memory estimate on {b.gpu} at tp={b.tp} "
                             f"(the engine's middle estimate {b.num_blocks:,} blocks, range {lo:,}-{hi:,}): raise "
                             "--gpu-memory-gib or gpu_memory_utilization, or give measured --activation-gib / "
                             "--non-torch-gib / --cuda-graph-gib to narrow the range")
        return cls(seqs, b.max_num_batched_tokens, b.block_size, blocks, b.max_model_len,
                   g.as_tuple(), b.chunked_prefill)


def check_fits(b: MemoryBudget, card: ModelCard, gpu: GPU) -> None:
    """DoesNotFit with the reason when the engine would refuse to start (at the middle estimate)."""
    why = fit_problem(b, card, gpu)
    if why:
        raise DoesNotFit(why)


def fit_problem(b: MemoryBudget, card: ModelCard, gpu: GPU, largest: int | None = None) -> str | None:
    """Why the engine would refuse to start with this budget (None if it starts). Whether it starts is judged at
    the middle estimate of the KV blocks (the engine's own start-up check); the largest max_model_len it names is
    the one sure to fit, at the conservative end (the blocks the planner uses). `largest` is that length solved
    with the budget re-derived at each length (`capacity.engine.memory.max_model_len_for`, what `memory
    --target-concurrency 1` answers); without it, this budget's blocks at the conservative end estimate it."""
    if b.weights_bytes >= b.usable_bytes:
        need_tp = next((t for t in TP_CHOICES if t > b.tp and _weights_fit(card, b, t)), None)
        hint = f"; try --tp {need_tp}" if need_tp else "; no tensor-parallel size up to 16 fits it"
        return (f"weights need {b.weights_bytes / GiB:.1f} GiB per rank, usable is {b.usable_bytes / GiB:.1f} GiB "
                f"({gpu.name}: {b.total_bytes / GiB:.1f} GiB x {b.gpu_memory_utilization}) at tp={b.tp}{hint}")
    if b.num_blocks == 0:
        graphs = f" - CUDA graphs {b.cuda_graph_bytes / GiB:.2f}" if b.cuda_graphs_in_budget else ""
        return (f"no memory left for the KV cache: usable {b.usable_bytes / GiB:.2f} GiB - weights "
                f"{b.weights_bytes / GiB:.2f} - activation {b.activation_bytes / GiB:.2f} - non-torch "
                f"{b.non_torch_bytes / GiB:.2f}{graphs} = {b.kv_budget_bytes / GiB:.2f} GiB at tp={b.tp}; raise "
                "gpu_memory_utilization, lower max_num_batched_tokens/max_num_seqs, or raise tp")
    need_blocks = b.kv_groups.startup_blocks(b.max_model_len, b.block_size)  # vLLM's start-up check
    if (b.paged_kv and need_blocks > b.num_blocks) or (not b.paged_kv and b.contiguous_max_seqs < 1):
        if largest is None:
            largest = _largest_len(b) if b.paged_kv else 0
        return (f"one request of max_model_len {b.max_model_len:,} tokens needs {need_blocks:,} KV blocks "
                f"({need_blocks * b.block_bytes / GiB:.2f} GiB), "
                f"but only {b.num_blocks:,} fit in {b.kv_budget_bytes / GiB:.2f} GiB at tp={b.tp}; the largest "
                f"max_model_len sure to fit is {largest:,} (the KV range's conservative end, "
                f"{b.planning_blocks:,} blocks)")
    return None


def _largest_len(b: MemoryBudget) -> int:
    """The longest request whose start-up blocks fit in the blocks the planner uses (the conservative end)."""
    lo, hi = 0, b.max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if b.kv_groups.startup_blocks(mid, b.block_size) <= b.planning_blocks else (lo, mid - 1)
    return lo


def _weights_fit(card: ModelCard, b: MemoryBudget, tp: int) -> bool:
    try:
        check_tp(card, tp)
    except ConfigError:
        return False
    return sum(weight_bytes_per_rank(card, tp).values()) < b.usable_bytes
