"""Expert and data parallelism of a MoE model (vLLM's --enable-expert-parallel and --data-parallel-size): the
layout checks, the MoE layer's cost on one rank, and the all-to-all that replaces part of the all-reduce.

Derived from vLLM's code (docs/parallelism.md names each file and function):

- `FusedMoEParallelConfig.make` (model_executor/layers/fused_moe/config.py): the MoE group is the flattened
  tp x dp ranks. Without expert parallelism every rank keeps every expert, split along its intermediate
  dimension over tp x dp ranks (`flatten_tp_across_dp`); with it, ep = tp x dp ranks each keep experts / ep
  whole experts (`determine_expert_map`). Attention stays split over tp inside each data-parallel rank.
- `use_all2all_kernels` is true only with expert parallelism and dp > 1: at dp = 1 the tokens are already on
  every TP rank and the MoE output is all-reduced over tp as before (that all-reduce is the roofline's).
- The default all-to-all backend, `allgather_reducescatter` (`AgRsAll2AllManager`,
  distributed/device_communicators/all2all.py): dispatch all-gathers every DP rank's hidden states and router
  logits over the DP group, combine reduce-scatters the experts' outputs back. So each rank's experts see the
  tokens of all dp ranks: a data-parallel rank's MoE layer works on dp x its own tokens.
- `deepep_low_latency` (DeepEP's low-latency kernels): each token goes to its top-k experts, one copy per expert
  (FP8 with a float scale per 128 values), and comes back in the activation dtype.
- run_engine_core (v1/engine/core.py): DP ranks of a MoE model run in lock step (DPEngineCoreProc: an idle
  rank runs a dummy batch); of a dense model, independently (EngineCoreProc, plain replicas).

Approximations (stated, not hidden): the simulator gives each DP rank its own scheduler and KV pool behind the
router; the lock step is expressed by costing each rank's MoE layers on dp x its own tokens (the router keeps
the ranks' loads alike), not by making ranks wait for the slowest one. Expert load imbalance under expert
parallelism: the busiest rank carries `expert_imbalance` x the mean (an assumption, a range; the planner
uses the conservative end).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from capacity.cost.moe_floor import moe_floor
from capacity.cost.step import StepCost
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES

Backend = Literal["allgather_reducescatter", "deepep_low_latency"]
BACKENDS: tuple[str, ...] = ("allgather_reducescatter", "deepep_low_latency")
# The busiest expert-parallel rank's load over the mean: 1.0 (experts hit evenly) to 1.5 (an assumption, not a
# measurement: routing skew without EPLB). The planner and the simulator take the conservative end.
EXPERT_IMBALANCE_RANGE = (1.0, 1.5)
# Fixed time of one dispatch or combine collective (launch, synchronisation across ranks), by link: NVLink like
# the roofline's all-reduce latency; PCIe a few times more (host bridge hops). Assumptions.
A2A_LATENCY_S = {"nvlink": 10e-6, "pcie": 30e-6}
LL_SCALE_GROUP = 128  # DeepEP low-latency FP8 dispatch: one fp32 scale per 128 values


@dataclass(frozen=True)
class Layout:
    """How a replica spreads over GPUs: tp (attention per data-parallel rank) x dp ranks; the MoE layers split
    experts whole over tp x dp ranks (expert parallel) or each expert's intermediate dimension over them."""

    tp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def moe_ranks(self) -> int:
        return self.tp * self.dp

    @property
    def label(self) -> str:
        return (f"tp{self.tp}" + (f"-dp{self.dp}" if self.dp > 1 else "") + ("-ep" if self.ep else ""))


def check_layout(card: ModelCard, tp: int, dp: int, ep: bool) -> None:
    """One line naming the field and its value for a layout vLLM refuses (or that has no meaning)."""
    if dp < 1 or tp < 1:
        raise ConfigError(f"data_parallel_size {dp}, tensor_parallel_size {tp}: must be >= 1")
    if ep:
        if card.moe is None:
            raise ConfigError(f"enable_expert_parallel: {card.name} has no experts (a dense model)")
        if tp * dp > card.moe.num_experts:
            raise ConfigError(f"enable_expert_parallel: ep size {tp * dp} (tp {tp} x dp {dp}) is above the "
                              f"{card.moe.num_experts} experts of {card.name}")
    elif card.moe is not None and dp > 1 and card.moe.moe_intermediate_size % (tp * dp):
        raise ConfigError(f"data_parallel_size {dp}: the experts' intermediate size {card.moe.moe_intermediate_size} "
                          f"of {card.name} does not split over tp x dp = {tp * dp} ranks (vLLM's FusedMoE asserts "
                          "it); use enable_expert_parallel")


def moe_tp(tp: int, dp: int, ep: bool) -> int:
    """The ranks each expert's intermediate dimension is split over (1 under expert parallelism)."""
    return 1 if ep else tp * dp


def a2a_bytes_per_token(card: ModelCard, dp: int, ep: bool, backend: str = "allgather_reducescatter"
                        ) -> tuple[float, float]:
    """(dispatch, combine) bytes that one rank receives per token of its own batch per MoE layer (0 where vLLM runs
    no all-to-all: dp == 1). allgather_reducescatter: (dp - 1) copies of the other ranks' hidden states and router
    logits in, (dp - 1) partial outputs out (ring collectives, per rank). deepep_low_latency: k copies of the
    token in FP8 plus its scales, k outputs back in the activation dtype."""
    if dp == 1 or card.moe is None:
        return 0.0, 0.0
    h, b = card.moe.latent_size or card.hidden_size, DTYPE_BYTES[card.dtype]
    if backend == "allgather_reducescatter":
        return float((dp - 1) * (card.hidden_size + card.moe.num_experts) * b), float((dp - 1) * card.hidden_size * b)
    if backend == "deepep_low_latency":
        if not ep:
            raise ConfigError("all2all_backend deepep_low_latency: needs enable_expert_parallel")
        k = card.moe.experts_per_token
        return float(k * (h + math.ceil(h / LL_SCALE_GROUP) * 4)), float(k * h * b)
    raise ConfigError(f"all2all_backend {backend!r}: use {', '.join(BACKENDS)}")


def link_of(gpu: GPU) -> str:
    return "nvlink" if "nvlink" in gpu.interconnect else "pcie"


class ParallelCost:
    """A roofline step cost (`inner`, built at the attention's tp) with the MoE layers of `layout`: the experts'
    GEMMs on this rank's share of dp x its tokens, and the dispatch and combine of each MoE layer. Every other
    term (attention, dense parts, the TP all-reduces, sampling) is the inner cost's."""

    def __init__(self, inner, layout: Layout, backend: str = "allgather_reducescatter",
                 expert_imbalance: float = EXPERT_IMBALANCE_RANGE[1], a2a_latency_s: float | None = None) -> None:
        card, gpu = inner.card, inner.gpu
        if card.moe is None:
            raise ConfigError(f"{card.name}: no MoE layers (data parallelism of a dense model is plain replicas)")
        if not EXPERT_IMBALANCE_RANGE[0] <= expert_imbalance <= 4:
            raise ConfigError(f"expert_imbalance {expert_imbalance}: expected 1 to 4 (busiest rank / mean)")
        a2a_bytes_per_token(card, layout.dp, layout.ep, backend)  # the backend checked
        self.inner, self.layout, self.backend, self.imbalance = inner, layout, backend, expert_imbalance
        self.a2a_latency_s = A2A_LATENCY_S[link_of(gpu)] if a2a_latency_s is None else a2a_latency_s

        w = weight_bytes_per_rank(card, 1)
        self._full_expert_w = (w["experts_gate_up"] + w["experts_down"]) / (card.num_moe_layers * card.moe.num_experts)
        self._memo: dict[int, tuple[float, float]] = {}
        # the measured MoE floor (capacity/cost/moe_floor.py) of the experts split over tp x dp ranks; none under
        # expert parallelism (aiconfigurator's EP rows are not in the data file: the roofline alone there)
        fl = getattr(inner, "_moe_floor", None)
        self._floor = (None if fl is None or layout.ep else
                       moe_floor(card, gpu, layout.moe_ranks, inner.params.allreduce_engine))
        imb = f", expert imbalance x{expert_imbalance:g}" if layout.ep else ""
        self.source = f"{inner.source} + {layout.label} ({backend if layout.dp > 1 else 'no all-to-all'}{imb})"

    def __getattr__(self, name: str):  # the wrapped cost's other attributes (card, gpu, params, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ---- the MoE layer on one rank ------------------------------------------------------------------
    def experts_s(self, tokens: int) -> float:
        """The routed experts' GEMMs of one MoE layer on the busiest rank, its data-parallel rank holding
        `tokens` of the step's tokens (the MoE group works on dp x tokens)."""
        inner, lay, card = self.inner, self.layout, self.card
        moe = card.moe
        e, k, h = moe.num_experts, moe.experts_per_token, card.hidden_size
        n = tokens * lay.dp
        b = DTYPE_BYTES[card.dtype]
        hit = 1 - (1 - k / e) ** n  # chance an expert is touched by n tokens
        if lay.ep:
            local = -(-e // lay.moe_ranks)
            w = self._full_expert_w
            pairs = n * k / lay.moe_ranks * self.imbalance
            touched = min(float(local), local * hit * self.imbalance)
        else:
            w = self._full_expert_w / lay.moe_ranks
            pairs, touched = float(n * k), e * hit
        elems = w / DTYPE_BYTES[card.format_of("experts")]
        t = inner._op(2.0 * pairs * elems, touched * w + pairs * 2 * h * b, inner._fam_eff["experts"],
                      inner._fam_peak["experts"])
        return t if self._floor is None else max(t, self._floor.floor_s(n))

    def _tp_experts_s(self, tokens: int) -> float:
        """The inner roofline's routed-expert term (TP-sharded experts, the rank's own tokens, its measured floor
        included), to take out."""
        inner, card = self.inner, self.card
        moe = card.moe
        e, k, h = moe.num_experts, moe.experts_per_token, card.hidden_size
        touched = e * (1 - (1 - k / e) ** tokens)
        flops = 2.0 * tokens * k * inner._elems(inner._expert_w, "experts")
        bytes_ = touched * inner._expert_w + tokens * k * 2 * h * DTYPE_BYTES[card.dtype]
        t = inner._op(flops, bytes_, inner._fam_eff["experts"], inner._fam_peak["experts"])
        fl = getattr(inner, "_moe_floor", None)  # the inner roofline's measured floor, taken out with it
        return t if fl is None else max(t, fl.floor_s(tokens))

    def a2a_s(self, tokens: int) -> float:
        """Dispatch and combine of one MoE layer for a rank holding `tokens` tokens (0 at dp 1)."""
        d, c = a2a_bytes_per_token(self.card, self.layout.dp, self.layout.ep, self.backend)
        if not d and not c:
            return 0.0
        bw = self.gpu.interconnect_bytes_per_s * self.inner.params.comm_bw_eff
        return tokens * (d + c) / bw + 2 * self.a2a_latency_s

    def delta(self, tokens: int) -> tuple[float, float]:
        """(gemm, communication) this layout adds to the inner cost's step of `tokens` tokens (all MoE layers)."""
        got = self._memo.get(tokens)
        if got is None:
            L = self.card.num_moe_layers
            got = self._memo[tokens] = (L * (self.experts_s(tokens) - self._tp_experts_s(tokens)),
                                        L * self.a2a_s(tokens))
        return got

    # ---- the StepCost interface ------------------------------------------------------------------------
    def breakdown(self, plan) -> dict[str, float]:
        b = dict(self.inner.breakdown(plan))
        n = plan.num_tokens
        if n:
            g, c = self.delta(n)
            b["gemm"] = b.get("gemm", 0.0) + g
            b["communication"] = b.get("communication", 0.0) + c
        return b

    def step_s(self, plan) -> float:
        return math.fsum(self.breakdown(plan).values())

    def decode_line(self, contexts) -> tuple[float, float]:
        f0, g = self.inner.decode_line(contexts)
        d = self.delta(len(contexts))
        return f0 + d[0] + d[1], g

    def decode_run_s(self, contexts, k: int):
        d = self.delta(len(contexts))
        return self.inner.decode_run_s(contexts, k) + (d[0] + d[1])


def dp_ranks(dep) -> int:
    """Schedulers the simulator runs for a deployment: every replica's data-parallel ranks (vLLM: an engine core
    with its own scheduler and KV pool per rank)."""
    return dep.replicas * dep.engine.dp_size()


def dp_router(dep) -> str:
    """The router in front of the ranks: the deployment's, except that the default round robin becomes the
    least-loaded choice at dp > 1, as vLLM's front end picks a rank (DPLBAsyncMPClient.get_core_engine_for_request,
    v1/engine/core_client.py: the fewest waiting x 4 + running; here the fewest outstanding)."""
    if dep.engine.dp_size() > 1 and dep.router == "round_robin":
        return "least_outstanding"
    return dep.router


def wrap(cost: StepCost, card: ModelCard, tp: int, dp: int, ep: bool, profile: str | None,
         backend: str = "allgather_reducescatter", expert_imbalance: float = EXPERT_IMBALANCE_RANGE[1]) -> StepCost:
    """The step cost of one data-parallel rank: `cost` itself for a dense model or a plain TP layout, else the
    ParallelCost around it (a calibrated profile measured one TP layout: refused for another)."""
    check_layout(card, tp, dp, ep)
    if card.moe is None or (dp == 1 and not ep):
        return cost
    if profile is not None:
        raise ConfigError(f"--profile {profile}: measured at tensor parallelism; data_parallel_size {dp} / "
                          f"enable_expert_parallel {ep} of a MoE model is costed by the roofline only (no --profile)")
    return ParallelCost(cost, Layout(tp, dp, ep), backend, expert_imbalance)
