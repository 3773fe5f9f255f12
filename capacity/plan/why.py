"""Why a configuration serves no rate under the SLO, and what would make it serve one (issue 48): the objective a
trickle of requests already misses, the floor behind it, and each way out with its number.

A decode step reads every weight a token passes through once, whatever the batch: at batch 1 the step lasts at
least (bytes read) / (memory bandwidth), the weight-read floor of TPOT. Where the TPOT objective is below it,
no scheduler setting helps; fewer bytes per rank (FP8 or int4 weights, a larger TP) or more bandwidth (another
GPU) do. A TTFT objective that a lone request misses is the prefill of its prompt: more compute (TP, FP8 GEMMs
where the GPU has them, another GPU) or shorter prompts. Each figure below scales the measured latency at the
trickle by the change in its floor: an estimate, which the plan's search then checks where it searched it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES

if TYPE_CHECKING:
    from capacity.engine.config import EngineConfig
    from capacity.plan.results import RateSearch
    from capacity.plan.view import PlannerView

NOT_READ_PER_TOKEN = ("embed_tokens", "rope_cache")  # a token reads one row of these, not the matrix


def weight_read_bytes(card, tp: int) -> float:
    """Bytes one rank reads per decode step at batch 1 (a dense model: every linear weight and the LM head)."""
    return sum(v for k, v in weight_bytes_per_rank(card, tp).items() if k not in NOT_READ_PER_TOKEN)


def infeasible_reason(pl: PlannerView, engine: EngineConfig, rs: RateSearch) -> str:
    """One paragraph: which objective the trickle (2% of capacity) misses, by how much, the floor behind it, and
    the ways out with their estimates."""
    slo, pct = pl.sc.slo, pl.sc.slo.percentile
    pt, pp = rs.unloaded if rs.unloaded else (math.inf, math.inf)
    rate = rs.probes[0][0] if rs.probes else 0.0
    if not (math.isfinite(pt) and math.isfinite(pp)):
        return (f"at {rate:.3g} req/s (2% of its capacity) the run did not settle (saturated or no request "
                "finished): the KV cache or the batch limits, not the latency objectives, stop it")
    parts: list[str] = []
    if pp > slo.tpot_s:
        parts.append(_tpot(pl, engine, rs, pp))
    if pt > slo.ttft_s:
        parts.append(_ttft(pl, rs, pt))
    if not parts:  # each mean meets it, a per-class objective or a rising TTFT does not
        parts.append(f"P{pct} TTFT {pt * 1e3:,.0f} ms and TPOT {pp * 1e3:,.1f} ms meet the objectives on average, "
                     "but a request class's own objective, or a TTFT still rising through the run, fails")
    return f"at {rate:.3g} req/s (2% of its capacity): " + "; ".join(parts)


def _tpot(pl: PlannerView, engine: EngineConfig, rs: RateSearch, pp: float) -> str:
    card, gpu, slo = pl.card, pl.gpu, pl.sc.slo
    tp = rs.tp
    floor = weight_read_bytes(card, tp) / gpu.mem_bw_bytes_per_s
    share = min(1.0, floor / pp)  # the part of the measured TPOT the weight reads explain
    out = (f"P{slo.percentile} TPOT {pp * 1e3:,.1f} ms > {slo.tpot_s * 1e3:,.0f} ms already; reading the weights "
           f"({weight_read_bytes(card, tp) / 2**30:,.1f} GiB per rank at {gpu.mem_bw_bytes_per_s / 1e9:,.0f} GB/s) "
           f"takes {floor * 1e3:,.1f} ms of every decode step")
    if card.moe is not None:
        out += " (all experts counted: an upper bound for a mixture of experts)"

    def scaled(f: float) -> float:
        return pp * (1 - share + share * f)

    ways = []
    fmt = card.weight_format
    if fmt in ("bf16", "fp16"):
        ways.append(f"FP8 weights (--weight-dtype fp8) ~{scaled(DTYPE_BYTES['fp8'] / DTYPE_BYTES[fmt]) * 1e3:,.0f} ms")
        ways.append(f"int4 weights (--weight-dtype int4) ~{scaled(0.5 / DTYPE_BYTES[fmt]) * 1e3:,.0f} ms")
    elif fmt == "fp8":
        ways.append(f"int4 weights (--weight-dtype int4) ~{scaled(0.5) * 1e3:,.0f} ms")
    for t in (2 * tp, 4 * tp):
        if card.num_attention_heads % t == 0 and t <= 8:
            ways.append(f"tp={t} ~{scaled(tp / t) * 1e3:,.0f} ms (weights split; plus its all-reduce)")
            break
    need = gpu.mem_bw_bytes_per_s * share * pp / max(slo.tpot_s - (1 - share) * pp, 1e-9)
    if slo.tpot_s > (1 - share) * pp:
        ways.append(f"a GPU with >= {need / 1e9:,.0f} GB/s")
    ways.append(f"a TPOT objective >= {math.ceil(pp * 1.1 * 1e3):,} ms")
    return out + "; would meet it: " + ", ".join(ways)


def _ttft(pl: PlannerView, rs: RateSearch, pt: float) -> str:
    slo, tp = pl.sc.slo, rs.tp
    ways = []
    for t in (2 * tp, 4 * tp):
        if pl.card.num_attention_heads % t == 0 and t <= 8:
            ways.append(f"tp={t} ~{pt * tp / t * 1e3:,.0f} ms (prefill split)")
            break
    if pl.card.weight_format in ("bf16", "fp16") and pl.gpu.fp8_flops:
        ways.append("FP8 weights (--weight-dtype fp8: FP8 GEMMs on this GPU)")
    ways.append(f"a TTFT objective >= {math.ceil(pt * 1.1 * 1e3):,} ms, or shorter prompts")
    return (f"P{slo.percentile} TTFT {pt * 1e3:,.0f} ms > {slo.ttft_s * 1e3:,.0f} ms for a lone request (its "
            f"prefill); would meet it: " + ", ".join(ways))


__all__ = ["infeasible_reason", "weight_read_bytes"]
