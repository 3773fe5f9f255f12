"""`capacity plan --layouts tp,ep,dpN,adpN,adpN-ep|auto`: the same GPUs laid out different ways for a MoE model (or
a dense one), each searched for its highest rate under the SLOs, and which wins.

Layouts on G GPUs (one replica; per engine in capacity/plan/engine_layouts.py):
- tp: attention and experts split by TP over G ranks (vLLM --tensor-parallel-size G);
- ep: attention by TP over G ranks, experts whole over G ranks (vLLM --enable-expert-parallel, SGLang --ep-size G);
- dpN (vLLM): N data-parallel ranks of G / N GPUs each, every rank its own scheduler and KV pool, attention
  replicated per rank, experts whole over the G ranks (--data-parallel-size N --tensor-parallel-size G/N
  --enable-expert-parallel; for a dense model, plain replicas without expert parallelism);
- adpN, adpN-ep (SGLang --dp N --enable-dp-attention, TensorRT-LLM enable_attention_dp with N = G): N attention
  ranks inside the G GPUs, each its own scheduler and KV pool, stepped in lock step (capacity/engine/lockstep.py);
  the experts over the G GPUs (TP-sharded, or whole with -ep);
- auto: every layout of those the engine release has for the model (ep and attention DP only for a MoE model).

Each layout's rate is the planner's rate search (`Planner.rate_search`: the capacity with the queue never empty,
then a bisection on the offered rate) for one replica of that layout, so the answers compare the same GPUs. The
default plan (no --layouts) searches the scenario's own layout only: its answer does not move.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from capacity.engine import get_engine
from capacity.engine.budget import check_tp
from capacity.errors import CapacityError, ConfigError, DoesNotFit
from capacity.plan.engine_layouts import PlanLayout, check, layout_engine
from capacity.plan.planner import Planner
from capacity.units import GiB


@dataclass
class LayoutResult:
    layout: PlanLayout
    max_rate: float = 0.0  # highest rate under the SLOs for the layout's GPUs (req/s)
    capacity_rate: float = 0.0
    weights_gib: float = 0.0  # per rank
    kv_tokens_per_rank: int = 0
    kv_pools: int = 0  # schedulers with their own KV pool (dp)
    source: str = ""
    why: str = ""  # where it does not fit or no rate passes
    command: str = ""
    notes: list[str] = field(default_factory=list)

    def row(self) -> dict:
        lay = self.layout
        return {"layout": lay.label, "gpus": lay.gpus, "tp": lay.tp, "dp": lay.dp, "expert_parallel": lay.ep,
                "attention_dp": lay.adp,
                "max_rate_req_per_s": self.max_rate, "capacity_req_per_s": self.capacity_rate,
                "weights_gib_per_rank": self.weights_gib, "kv_tokens_per_rank": self.kv_tokens_per_rank,
                "kv_pools": self.kv_pools, "kv_tokens_total": self.kv_tokens_per_rank * self.kv_pools,
                "step_cost_source": self.source, "why": self.why, "notes": self.notes, "command": self.command}


def compare_layouts(sc, card, ex, layouts: list[tuple[str, PlanLayout]], auto: bool = False
                    ) -> tuple[list[LayoutResult], LayoutResult | None, list[str]]:
    """Every layout's budget and rate search; the winner: the highest rate under the SLOs (None: none passes);
    the layouts `auto` left out and why. A layout the engine release refuses (engine_layouts.check): one line
    naming it when asked for by name (the caller exits 1), left out with a note under `auto`."""
    offered: list[tuple[PlanLayout, Planner]] = []
    skipped: list[str] = []
    for name, lay in layouts:  # every refusal before any search: a bad entry costs no simulation
        try:
            pl = Planner(sc.model_copy(update={"engine": layout_engine(sc.engine, lay)}), card, ex)
            check_tp(card, lay.tp)
            check(card, pl.engine(lay.tp), lay, pl.budget, sc.profile)
        except ConfigError as exc:
            if not auto:
                raise ConfigError(f"--layouts {name}: {exc}") from None
            skipped.append(f"{lay.label}: not offered ({exc})")
            continue
        offered.append((lay, pl))
    if not offered:
        raise ConfigError(f"--layouts auto: no layout of {card.name} on {sc.engine.engine}: {'; '.join(skipped)}")
    out: list[LayoutResult] = []
    for lay, pl in offered:
        r = LayoutResult(lay)
        out.append(r)
        try:
            # the planner's own treatment of a TP size: the scenario's engine, or a shorter max_model_len where the
            # model's whole context does not fit (said in a note)
            eng, b = pl.fitting_engine(lay.tp)
            r.notes = list(pl.notes)
            r.weights_gib, r.kv_pools = b.weights_bytes / GiB, lay.kv_pools
            r.kv_tokens_per_rank = b.planning_blocks * b.block_size
            r.command = get_engine(eng.engine).launch_command(card, eng, b)
            rs = pl.rate_search(eng, lay.tp, b.max_num_seqs)
        except (DoesNotFit, ConfigError, CapacityError) as exc:
            r.why = str(exc)
            continue
        r.max_rate, r.capacity_rate, r.source, r.why = rs.max_rate, rs.capacity_rate, rs.source, rs.why
    ok = [r for r in out if r.max_rate > 0]
    return out, (max(ok, key=lambda r: r.max_rate) if ok else None), skipped


def layouts_report(card, gpu: str, results: list[LayoutResult], best: LayoutResult | None, console,
                   skipped: tuple[str, ...] | list[str] = ()) -> None:
    from rich.table import Table

    t = Table(title=f"Layouts of {card.name} on {results[0].layout.gpus} x {gpu} (one replica each)",
              title_justify="left")
    for c in ("layout", "tp x dp", "attn DP", "EP", "weights GiB/rank", "KV tokens/rank", "KV pools", "max req/s under SLO",
              "capacity req/s"):
        t.add_column(c)
    for r in results:
        lay = r.layout
        t.add_row(lay.label, f"{lay.tp} x {lay.dp}", str(lay.adp), "yes" if lay.ep else "no", f"{r.weights_gib:.1f}",
                  f"{r.kv_tokens_per_rank:,}", str(r.kv_pools), f"{r.max_rate:.3g}" if r.max_rate else "-",
                  f"{r.capacity_rate:.3g}" if r.capacity_rate else "-")
    console.print(t)
    for r in results:
        for line in ([r.why] if r.why else []) + r.notes:
            console.print(f"{r.layout.label}: {line}")
    for line in skipped:
        console.print(line)
    if best is None:
        console.print("no layout meets the SLOs")
        return
    console.print(f"winner: {best.layout.label} at {best.max_rate:.3g} req/s under the SLOs; `{best.command}`")
    console.print("assumed: expert imbalance x1.5 on the busiest expert-parallel rank (the conservative end of "
                  "1.0-1.5), vLLM's allgather_reducescatter all-to-all; attention DP in lock step at the slowest "
                  "rank (roofline); docs/parallelism.md")
