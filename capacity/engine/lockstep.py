"""Attention data parallelism as the simulator runs it: SGLang's `--dp D --enable-dp-attention` and TensorRT-LLM's
`enable_attention_dp` (D = tp there). One engine replica holds D attention ranks, each with a scheduler and a KV
pool of its own (the per-rank figures of the start-up memory model: sglang/dpattn.py, trtllm/parallel.py), fed by
the engine's own routing rule, and every step runs in lock step over all of them. Read in the engines' code
(docs/parallelism.md, "Attention data parallelism", names each file and function):

- Routing. SGLang (`managers/data_parallel_controller.py`, `DataParallelController.round_robin_scheduler`): the
  default `load_balance_method` is round_robin in every release read (0.4.6.post5: the only method that works,
  shortest_queue raises NotImplementedError; 0.5.5: round_robin default, minimum_tokens falls back to it; 0.5.20:
  "auto", which resolves to round_robin outside prefill/decode disaggregation). TensorRT-LLM
  (`_torch/pyexecutor/executor_request_queue.py`, `_schedule_attention_dp_requests` and
  `_balance_requests_across_ranks`): a heap over (active tokens, active requests, rank) of the ranks below
  expected = max(ceil((active + new) / D), the most active on a rank); the next request goes to the rank with
  the fewest active prompt tokens ("fewest_tokens" here).
- Lock step. SGLang (`Scheduler.prepare_mlp_sync_batch_raw`, 0.5.x; `prepare_dp_attn_batch`, 0.4.x): each rank
  forms its own batch (prefill or decode: the ranks need not agree), all-gathers (num_tokens, can_cuda_graph,
  is_extend) every step, and a rank with nothing runs an idle batch while any rank has tokens. TensorRT-LLM
  (`PyExecutor._balance_adp_requests`, the `tp_allgather` of each rank's counts, and the dummy requests of an idle
  rank): the same. So one step lasts the slowest rank's attention plus the MoE/MLP over the gathered tokens.
- Gathered tokens. SGLang `layers/dp_attention.py` `DpPaddingMode.get_dp_padding_mode`: SUM_LEN (the sum over
  ranks) when any rank extends; in decode, MAX_LEN (D x the largest rank's count) when 2 x sum > D x max, else
  SUM_LEN; with CUDA graphs (`cuda_graph_runner.py` `replay_prepare`: every rank pads to the captured batch size
  of the largest rank, `global_num_tokens_gpu.fill_(bs)`, padding mode MAX_LEN) always D x max. TensorRT-LLM pads
  to the largest rank with CUDA graphs too (assumed the same rule). The captured-size bucket above the largest
  count is not modelled (a few tokens low).

The step cost (`LockStepCost`): with G the gathered plan (the ranks' plans merged, padded with empty decodes up
to the gathered count), P_r rank r's plan,
    step = inner(G) - attention_T(G) + max_r [attention_A(P_r) + attention-TP all-reduce_A(P_r)]
where inner is the replica's step cost at tp T (MoE/MLP, LM head, norms and TP all-reduces over G: the all-reduces
stand for the gather before and the scatter after the MLP, messages of G tokens over the T ranks), attention_X
is the attention kernel plus the attention projections of a roofline at tp X, and A = T / D the attention TP.
Hybrid models (SGLang's qwen3_next, falcon_h1: the DP-attention architectures with state layers): their state
mixers are sharded by the attention-TP group as attention is (the configs' `mamba2_cache_params`:
`Mamba2StateShape.create(tp_world_size=get_attention_tp_size(), ...)`, so each attention rank keeps its own
requests' conv and SSM states at attention TP), so the state layers' projections, conv and scan count in the
rank's part, not in the gathered rest. TensorRT-LLM has no state pools modelled: refused there.

Assumptions, on the safe side where uncertain: the LM head and the sampler run over the gathered tokens (SGLang
gathers for the vocabulary-parallel head unless --enable-dp-lm-head; sampling is per rank in truth); the idle
batch of a rank with no tokens costs nothing beyond the lock step. A calibrated profile measured one TP layout:
refused. The decode fast path is off (each step is planned by every rank).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from capacity.cost.roofline import RooflineCost
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.engine.config import EngineConfig
from capacity.engine.sglang.config import dp_attention as sglang_dp_attention
from capacity.engine.trtllm.config import trtllm_attention_dp
from capacity.errors import ConfigError
from capacity.sched.base import Scheduler, Seq, Step
from capacity.workload import Request

ROUTES = ("round_robin", "fewest_tokens")
ROUTE_OF_ENGINE = {"sglang": "round_robin", "trtllm": "fewest_tokens"}  # see the module docstring


def attention_dp_ranks(cfg: EngineConfig) -> int:
    """Attention ranks in one replica: SGLang's dp with --enable-dp-attention, TensorRT-LLM's tp with
    enable_attention_dp, else 1."""
    if trtllm_attention_dp(cfg):
        return cfg.tensor_parallel_size
    return sglang_dp_attention(cfg)


def gathered_tokens(counts: Sequence[int], extend: bool, cuda_graphs: bool) -> int:
    """Tokens the MoE/MLP runs on in a lock step whose ranks hold `counts` tokens (SGLang's DpPaddingMode rule,
    see the module docstring): the sum when a rank extends, else D x the largest with CUDA graphs, else the
    cheaper padding of the two."""
    total, top, d = sum(counts), max(counts), len(counts)
    if extend or total == 0:
        return total
    if cuda_graphs or 2 * total > top * d:
        return top * d
    return total


def merged(plans: Sequence[StepPlan], pad_to: int) -> StepPlan:
    """The ranks' plans as one (prefill chunks and decode contexts together), with empty decodes up to `pad_to`
    tokens (the padded rows of the gathered buffer)."""
    prefills: list[PrefillChunk] = []
    decodes: list[int] = []
    q, enc = 1, 0.0
    for p in plans:
        prefills.extend(p.prefills)
        decodes.extend(p.decode_contexts)
        q = max(q, p.decode_queries)
        enc = max(enc, p.encoder_s)
    n = sum(c.new_tokens for c in prefills) + len(decodes) * q
    decodes.extend([0] * max(0, pad_to - n))
    return StepPlan(prefills=tuple(prefills), decode_contexts=tuple(decodes), decode_queries=q, encoder_s=enc)


class RooflineAttention:
    """The attention part of a roofline step cost (`capacity.cost.roofline.RooflineCost`) at its tp: the attention
    kernel, the attention projections (QKV/O, MLA's low-rank ones), a hybrid's state mixers (their projections,
    conv and scan) and, `with_allreduce`, the mixer's TP all-reduce after o_proj / out_proj (one of the roofline's
    two per layer)."""

    def __init__(self, roofline: Any, with_allreduce: bool = False) -> None:
        self.c, self.with_allreduce = roofline, with_allreduce

    def part_s(self, plan: StepPlan) -> float:
        n = plan.num_tokens
        if n == 0:
            return 0.0
        c = self.c
        parts = c.breakdown(plan)
        t = parts.get("attention", 0.0)
        if c._La:
            t += c._La * c._gemm(n, c._attn_w, 4 * c.card.hidden_size, "attention")
        if c._state is not None:  # a hybrid's state mixers: sharded by attention TP too (module docstring)
            t += parts.get("state", 0.0) + c._state.gemm_step_s(n)
        if self.with_allreduce and c.tp > 1:
            t += c.card.num_layers * c._allreduce_s(n) / 2
        return t


class LockStepCost:
    """The step cost of D attention ranks in lock step (module docstring): `inner` the replica's cost at tp T,
    `full` its attention part (to take out), `rank` the attention part of one rank at the attention TP. A plan the
    lock-step scheduler did not split (`split`) is taken as every rank running that plan (the safe side: the MoE
    over D x its tokens)."""

    def __init__(self, inner: Any, full: Any, rank: Any, dp: int, cuda_graphs: bool = True) -> None:
        self.inner, self.full, self.rank, self.dp, self.cuda_graphs = inner, full, rank, dp, cuda_graphs
        self._split: dict[int, tuple[StepPlan, tuple[StepPlan, ...]]] = {}
        self.source = f"{getattr(inner, 'source', type(inner).__name__)} + attention DP x{dp} in lock step"

    def __getattr__(self, name: str):  # the wrapped cost's other attributes (card, gpu, params, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def split(self, plan: StepPlan, ranks: tuple[StepPlan, ...]) -> None:
        """The lock-step scheduler's word that `plan` (about to be costed) is these ranks' plans merged."""
        if len(self._split) > 64:  # plans asked for and never costed (a step that did not run): the oldest go
            for k in list(self._split)[:32]:
                del self._split[k]
        self._split[id(plan)] = (plan, ranks)  # (the plan is held: its id is not reused while it is here)

    def lockstep_s(self, ranks: Sequence[StepPlan]) -> float:
        counts = [p.num_tokens for p in ranks]
        if not any(counts):
            return 0.0
        extend = any(p.prefills for p in ranks)
        g = merged(ranks, gathered_tokens(counts, extend, self.cuda_graphs))
        slowest = max(self.rank.part_s(p) for p in ranks)
        return max(0.0, self.inner.step_s(g) - self.full.part_s(g)) + slowest

    def terms(self, ranks: Sequence[StepPlan]) -> dict[str, Any]:
        """The lock step's parts for these ranks' plans (what `capacity step-cost` prints): each rank's tokens,
        the gathered rows the MoE/MLP runs on, the rest of the step over them, each rank's attention, and the
        step = rest + the slowest rank's attention (`lockstep_s`)."""
        counts = [p.num_tokens for p in ranks]
        rows = gathered_tokens(counts, any(p.prefills for p in ranks), self.cuda_graphs) if any(counts) else 0
        g = merged(ranks, rows)
        rest = max(0.0, self.inner.step_s(g) - self.full.part_s(g)) if rows else 0.0
        attn = [self.rank.part_s(p) for p in ranks]
        return {"rank_tokens": counts, "gathered_tokens": rows, "rest_over_gathered_s": rest,
                "rank_attention_s": attn, "slowest_rank": max(range(len(attn)), key=attn.__getitem__),
                "lock_step_s": rest + max(attn) if rows else 0.0}

    def _ranks(self, plan: StepPlan) -> tuple[StepPlan, ...]:
        got = self._split.get(id(plan))  # (kept: a wrapper may cost the same plan twice)
        if got is not None and got[0] is plan:
            return got[1]
        return (plan,) * self.dp

    def step_s(self, plan: StepPlan) -> float:
        return self.lockstep_s(self._ranks(plan))

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        ranks = self._ranks(plan)
        return {"lock_step": self.lockstep_s(ranks)}


class LockStepScheduler:
    """D ranks' schedulers behind the engine's routing rule, stepped together (the `Scheduler` protocol): a step is
    every rank's own step, merged; a rank with nothing to run idles through it. The decode fast path is off."""

    def __init__(self, ranks: list[Scheduler], route: str, cost: LockStepCost | None = None) -> None:
        if route not in ROUTES:
            raise ConfigError(f"attention DP route {route!r}: use {', '.join(ROUTES)}")
        self.ranks, self.route, self.cost = ranks, route, cost
        self.next_rank = 0
        self.rank_of: dict[int, int] = {}  # id(seq) -> its rank
        self.active = [0] * len(ranks)  # requests routed to a rank and not finished
        self.active_tokens = [0] * len(ranks)  # their prompt tokens (TensorRT-LLM's balance)
        self._last: list[tuple[int, Step]] = []

    # ---- routing ------------------------------------------------------------------------------------------
    def pick(self, req: Request) -> int:
        d = len(self.ranks)
        if self.route == "round_robin":
            r = self.next_rank
            self.next_rank = (r + 1) % d
            return r
        expected = max(-(-(sum(self.active) + 1) // d), max(self.active))
        open_ = [r for r in range(d) if self.active[r] < expected]
        return min(open_, key=lambda r: (self.active_tokens[r], self.active[r], r))

    def add(self, req: Request) -> Seq:
        r = self.pick(req)
        seq = self.ranks[r].add(req)
        self.rank_of[id(seq)] = r
        self.active[r] += 1
        self.active_tokens[r] += req.prompt_tokens
        return seq

    def admissible(self, req: Request) -> str | None:
        return self.ranks[0].admissible(req)  # every rank has the same pool and limits

    # ---- the lock step ------------------------------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        steps: list[tuple[int, Step]] = []
        for r, s in enumerate(self.ranks):
            out = s.schedule(now)
            if isinstance(out, float):  # a batching window (static batching): not a policy these engines have
                raise ConfigError("attention DP: a rank's scheduler keeps a batching window; not modelled")
            if out.plan.num_tokens or out.scheduled or out.preempted:
                steps.append((r, out))
        self._last = [(r, st) for r, st in steps if st.plan.num_tokens]
        plans = tuple(st.plan for _, st in self._last)
        step = Step(merged(plans, 0))
        for _, st in steps:
            step.scheduled.extend(st.scheduled)
            step.preempted.extend(st.preempted)
            step.loads.extend(st.loads)
            step.load_s = max(step.load_s, st.load_s)
        if self.cost is not None and plans:
            idle = StepPlan()
            by_rank = {r: st.plan for r, st in self._last}
            self.cost.split(step.plan, tuple(by_rank.get(r, idle) for r in range(len(self.ranks))))
        return step

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        emitted: list[Seq] = []
        done: list[Seq] = []
        for r, st in self._last:
            e, d = self.ranks[r].complete(st, end_s)
            emitted.extend(e)
            done.extend(d)
        self._last = []
        for s in done:
            r = self.rank_of.pop(id(s), -1)
            if r >= 0:
                self.active[r] -= 1
                self.active_tokens[r] -= s.req.prompt_tokens
        return emitted, done

    def decode_stretch(self, max_steps: int) -> int:
        return 0

    def advance_decodes(self, k: int, end_s: float) -> list[Seq]:
        raise AssertionError("attention DP: no decode stretch")

    # ---- what the simulator reads -------------------------------------------------------------------------
    @property
    def running(self) -> list[Seq]:
        return [s for r in self.ranks for s in r.running]

    @property
    def has_work(self) -> bool:
        return any(r.has_work for r in self.ranks)

    @property
    def outstanding(self) -> int:
        return sum(r.outstanding for r in self.ranks)

    @property
    def num_waiting(self) -> int:
        return sum(r.num_waiting for r in self.ranks)

    @property
    def max_running(self) -> int:
        return sum(r.max_running for r in self.ranks)

    @property
    def kv_blocks_used(self) -> int:
        return sum(r.kv_blocks_used for r in self.ranks)

    @property
    def kv_blocks_total(self) -> int:
        return sum(r.kv_blocks_total for r in self.ranks)

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.ranks)

    @property
    def overlap(self) -> bool:  # the input lag of an overlap scheduler (capacity.sim.entities.lags_input)
        return bool(getattr(self.ranks[0], "overlap", False))

    @property
    def retired_after(self) -> bool:
        return any(getattr(r, "retired_after", False) for r in self.ranks)

    @property
    def drafts_accepted(self) -> int:
        return sum(getattr(r, "drafts_accepted", 0) for r in self.ranks)


def check_attention_dp(cfg: EngineConfig, card: Any, profile: str | None) -> None:
    """What the lock-step model refuses under attention DP, in one line naming the setting (nothing when off)."""
    if attention_dp_ranks(cfg) == 1:
        return
    field = "trtllm_attention_dp" if trtllm_attention_dp(cfg) else "enable_dp_attention"
    if profile is not None:
        raise ConfigError(f"--profile {profile}: measured at one TP layout; {field} is costed by the roofline "
                          "only (no --profile)")
    if cfg.speculative is not None:
        raise ConfigError(f"{field}: speculative decoding with attention data parallelism is not modelled")
    if card.state is not None and field == "trtllm_attention_dp":
        raise ConfigError(f"{field}: {card.name} has state-space layers; TensorRT-LLM's state pools are not "
                          "modelled")


def lockstep_cost(cost: Any, card: Any, gpu: Any, tp: int, d: int, kv_dtype: str, cuda_graphs: bool = True
                  ) -> LockStepCost:
    """`cost` (the replica's step cost at tp) in lock step over d attention ranks at attention TP tp / d: the
    attention parts from the roofline at both TPs (module docstring)."""
    full = RooflineCost(card, gpu, tp, kv_dtype=kv_dtype)
    rank = RooflineCost(card, gpu, max(1, tp // d), kv_dtype=kv_dtype)
    return LockStepCost(cost, RooflineAttention(full), RooflineAttention(rank, with_allreduce=True), d,
                        cuda_graphs=cuda_graphs)


def attention_dp(em: Any, dep: Any, b: Any, cost: Any, factory: Callable[[], Scheduler]
                 ) -> tuple[Any, Callable[[], Scheduler]]:
    """The replica's step cost and scheduler factory under attention DP (unchanged without it): D ranks of
    `factory`'s scheduler in lock step, costed by `LockStepCost`. Refused in one line where not modelled."""
    cfg = dep.engine
    d = attention_dp_ranks(cfg)
    if d == 1:
        return cost, factory
    check_attention_dp(cfg, dep.card, dep.profile)
    lc = lockstep_cost(cost, dep.card, dep.gpu, b.tp, d, b.kv_dtype, cuda_graphs=not cfg.enforce_eager)
    route = ROUTE_OF_ENGINE.get(getattr(em, "name", ""), "round_robin")

    def make() -> Scheduler:
        return LockStepScheduler([factory() for _ in range(d)], route, lc)  # type: ignore[return-value]

    return lc, make


__all__ = ["LockStepCost", "LockStepScheduler", "ROUTE_OF_ENGINE", "RooflineAttention", "attention_dp",
           "attention_dp_ranks", "check_attention_dp", "gathered_tokens", "lockstep_cost", "merged"]
