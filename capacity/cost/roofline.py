"""Step cost: the time of one engine step, from a roofline over the GPU's datasheet figures.

A step processes prefill chunks (new tokens on top of tokens already cached) and decode sequences
(one new token each, at their context length), possibly mixed (chunked prefill). Every operator costs
    max(flops / (peak x efficiency), bytes / (bandwidth x efficiency)) + launch cost
per layer: the GEMMs (QKV, O, MLP or the routed experts actually touched), attention (prefill ~ chunk x
context FLOPs; decode ~ KV bytes read), norms/rope, the TP all-reduces, then the LM head and sampler for
the sequences that emit a token, and a fixed per-step engine overhead. Efficiencies are data
(`RooflineParams`), never literals in the formulas. A calibrated implementation with the same
`step_s(plan)` interface will interpolate measured tables (calibrate/).

Attention has two modes: "ideal" (each sequence attends to its own context: FlashAttention/paged
kernels on GPU) and "dense_packed" (one masked attention over the whole packed step, cost ~ total query
tokens x total keys: what some engines do on CPU) so the model can represent the kernel actually run.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from capacity.cost.kernels import allreduce_call_s, kernel_floor_extra_s
from capacity.cost.moe_floor import MoEFloor, moe_floor
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.state_space import StateSpaceCost
from capacity.cost.step import StepPlan
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES


@dataclass
class RooflineCost:
    """Roofline step cost for one model on one GPU at one TP size (per rank; ranks run in lockstep)."""

    card: ModelCard
    gpu: GPU
    tp: int = 1
    kv_dtype: str | None = None
    params: RooflineParams = field(default_factory=RooflineParams)

    def __post_init__(self) -> None:
        self.kv_dtype = self.kv_dtype or self.card.dtype
        from capacity.model.compute import describe, gemm_dtypes

        # Each GEMM family at the tensor-core rate of the dtype it multiplies in (FP8 weights on an H100: FP8 GEMMs).
        self.gemm_dtypes = gemm_dtypes(self.card, self.gpu)
        self._fam_peak = {f: self.gpu.peak_flops(d) for f, d in self.gemm_dtypes.items()}
        self._fam_eff = {f: self._gemm_eff(d) for f, d in self.gemm_dtypes.items()}
        self.source = f"roofline ({self.gpu.name} datasheet x efficiencies, {describe(self.card, self.gpu)})"
        w = weight_bytes_per_rank(self.card, self.tp)
        self._La = self.card.num_kv_layers  # attention layers: all of them but a hybrid's state layers
        # Per-layer weight bytes of each GEMM family on this rank.
        attn_names = ("q_proj", "kv_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj")
        attn_w = 0.0  # a loop, not sum(): sum() of floats is compensated from Python 3.12 on, a compiled loop not
        for n in attn_names:
            attn_w += w.get(n, 0.0)
        self._attn_w = attn_w / max(1, self._La)
        self._dense_w = (w.get("mlp_gate_up", 0.0) + w.get("mlp_down", 0.0)) / max(1, self.card.num_dense_layers)
        moe_layers = max(1, self.card.num_moe_layers)
        self._shared_w = (w.get("shared_gate_up", 0.0) + w.get("shared_down", 0.0)) / moe_layers
        e = self.card.moe.num_experts if self.card.moe else 1
        self._expert_w = (w.get("experts_gate_up", 0.0) + w.get("experts_down", 0.0)) / (moe_layers * e)
        self._lm_w = w.get("lm_head", w["embed_tokens"])
        self._floors = self._gemm_floors(w) if self.params.measured_gemm_floor else {}
        # the routed experts' measured floor (capacity/cost/moe_floor.py; None: no table, the roofline alone)
        self._moe_floor: MoEFloor | None = (moe_floor(self.card, self.gpu, self.tp, self.params.allreduce_engine)
                                            if self.params.measured_moe_floor else None)
        self._b = DTYPE_BYTES[self.card.dtype]
        self._peak = self.gpu.peak_flops(self.card.dtype)  # LM head, router, norms: the activation dtype
        self._act_eff = self._gemm_eff(self.card.dtype)
        fp8_attn = (self.params.fp8_attention and self.kv_dtype == "fp8" and self.gpu.fp8_flops is not None
                    and self.gpu.arch.startswith(("Hopper", "Blackwell")))
        self._attn_peak = self.gpu.peak_flops("fp8") if fp8_attn else self._peak
        # Memo tables: the simulator asks for the same token counts and chunks over and over.
        self._terms_memo: dict[tuple[int, int], tuple[float, float, float, float]] = {}
        self._chunk_memo: dict[tuple[int, int], float] = {}
        c = self.card
        heads = c.num_attention_heads // self.tp
        qk, v = (c.head_dim_, c.head_dim_) if c.mla is None else (c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim,
                                                                  c.mla.v_head_dim)
        self._per_key_flops = 2 * heads * (qk + v)  # QK^T and PV per (query, key) pair
        self._kv_tok = c.kv_elements_per_token_per_layer(self.tp) * DTYPE_BYTES[self.kv_dtype]
        p = self.params
        # ideal decode attention of one layer = keys x this + launch (both roofline terms scale with keys)
        # (b) vLLM's kernels per layer x their floor, beyond the launch charges of the ops (capacity/cost/kernels.py)
        self._kernel_s = (kernel_floor_extra_s(c, p.kernel_floor_s, p.kernel_launch_s, self._shared_w > 0)
                          if p.kernel_count_floor else 0.0)
        self._decode_s_per_key = max(self._per_key_flops / (self._attn_peak * p.attn_flops_eff),
                                     self._kv_tok / (self.gpu.mem_bw_bytes_per_s * p.mem_bw_eff))
        self._state: StateSpaceCost | None = None  # a hybrid's state layers (capacity/cost/state_space.py)
        if c.state is not None:
            self._state = StateSpaceCost(c, self.gpu, self.tp, p, self._fam_peak["attention"],
                                         self._fam_eff["attention"], c.format_of("attention"))

    def _gemm_eff(self, dtype: str) -> float:
        """gemm_flops_eff, capped by what this GPU's engine kernels were measured to reach in `dtype`."""
        from capacity.model.compute import measured_gemm_efficiency

        eff = self.params.gemm_flops_eff
        if not self.params.measured_gemm_eff:
            return eff
        got = measured_gemm_efficiency(self.gpu, dtype, block_scaled=self.card.quant_group_size is not None)
        return eff if got is None else min(eff, got)

    def _gemm_floors(self, w: dict[str, float]) -> dict[str, list[list[float]]]:
        """Per GEMM family, the measured latency curves over m of its GEMMs on one rank (gemm_floor_curve), where
        a table covers the GPU, the family's compute dtype and its shapes."""
        from capacity.model.compute import gemm_floor_curve, gemm_latency_table

        c = self.card
        h = c.hidden_size
        L = self._La
        groups: dict[str, list[tuple[str, float, bool]]] = {  # (tensor, layers, input is the hidden state)
            "dense_mlp": [("mlp_gate_up", c.num_dense_layers, True), ("mlp_down", c.num_dense_layers, False)],
            "shared_experts": [("shared_gate_up", c.num_moe_layers, True), ("shared_down", c.num_moe_layers, False)]}
        if c.mla is None:
            groups["attention"] = [("q_proj+kv_proj", L, True), ("o_proj", L, False)]
        out: dict[str, list[list[float]]] = {}
        for fam, tensors in groups.items():
            fmt, gd = c.format_of(fam), self.gemm_dtypes[fam]
            if fmt in ("bf16", "fp16") and gd in ("bf16", "fp16"):
                table_dtype = "bf16"
            elif fmt == "fp8" and gd == "fp8":
                table_dtype = "fp8_block" if c.quant_group_size is not None else "fp8"
            elif fmt == "nvfp4" and gd == "fp4":
                table_dtype = "fp4"
            else:
                continue
            table = gemm_latency_table(self.gpu, table_dtype)
            if table is None:
                continue
            curves = []
            for names, layers, from_hidden in tensors:
                b = 0.0
                for name in names.split("+"):
                    b += w.get(name, 0.0)
                if not b or not layers:
                    continue
                other = round(b / layers / DTYPE_BYTES[fmt] / h)  # the GEMM's other dimension
                n, k = (other, h) if from_hidden else (h, other)
                curve = gemm_floor_curve(table, n, k)
                if curve is not None:
                    curves.append(curve)
            if curves:
                out[fam] = curves
        return out

    # ---- primitives -----------------------------------------------------------------------------
    def _op(self, flops: float, bytes_: float, eff: float, peak: float | None = None) -> float:
        p = self.params
        return max(flops / ((peak or self._peak) * eff),
                   bytes_ / (self.gpu.mem_bw_bytes_per_s * p.mem_bw_eff)) + p.kernel_launch_s

    def _gemm(self, tokens: int, weight_bytes: float, act_width: float, family: str | None = None) -> float:
        """A GEMM family over `tokens` rows: 2 FLOPs per weight element per token, at the rate of the dtype the
        family multiplies in; reads its weights once and `act_width` activation elements per token (inputs +
        outputs). family None: an unquantised GEMM (the LM head) at the activation dtype."""
        elems = self._elems(weight_bytes, family) if family else weight_bytes / self._b
        flops = 2.0 * tokens * elems
        t = self._op(flops, weight_bytes + tokens * act_width * self._b,
                     self._fam_eff[family] if family else self._act_eff, self._fam_peak[family] if family else None)
        curves = self._floors.get(family) if family else None
        if curves:
            from capacity.model.compute import gemm_floor_s

            floor = 0.0
            for curve in curves:
                floor += gemm_floor_s(curve, tokens)
            t = max(t, floor)
        return t

    def _elems(self, weight_bytes: float, family: str) -> float:
        """Number of weight elements a GEMM family multiplies (its FLOPs per token / 2)."""
        return weight_bytes / DTYPE_BYTES[self.card.format_of(family)]

    # ---- per-layer pieces -----------------------------------------------------------------------
    def _attention_s(self, plan: StepPlan) -> float:
        c = self.card
        heads = c.num_attention_heads // self.tp
        if c.mla is None:
            qk_dim = v_dim = c.head_dim_
        else:
            qk_dim, v_dim = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim, c.mla.v_head_dim
        kv_tok = c.kv_elements_per_token_per_layer(self.tp) * DTYPE_BYTES[self.kv_dtype or c.dtype]
        per_key_flops = 2 * heads * (qk_dim + v_dim)  # QK^T and PV per (query, key) pair
        if self.params.attention == "dense_packed":
            q_tok = plan.num_tokens
            keys = sum(p.cached_tokens + p.new_tokens for p in plan.prefills) + sum(d + 1 for d in plan.decode_contexts)
            return self._op(q_tok * keys * per_key_flops, keys * kv_tok, self.params.attn_flops_eff, self._attn_peak)
        t = 0.0
        for p in plan.prefills:  # causal: the i-th new token sees cached + i keys
            pairs = p.new_tokens * (p.cached_tokens + (p.new_tokens + 1) / 2)
            t += self._op(pairs * per_key_flops, (p.cached_tokens + p.new_tokens) * kv_tok, self.params.attn_flops_eff,
                          self._attn_peak)
        if plan.decode_contexts:  # one batched decode kernel: streams every sequence's KV once (for all its queries)
            keys = sum(d + 1 for d in plan.decode_contexts)
            t += self._op(keys * per_key_flops * plan.decode_queries, keys * kv_tok, self.params.attn_flops_eff,
                          self._attn_peak)
        return t

    def _mlp_s(self, tokens: int, moe_layer: bool) -> float:
        c = self.card
        h = c.hidden_size
        if not moe_layer:
            return self._gemm(tokens, self._dense_w, 2 * h + 3 * c.intermediate_size / self.tp, "dense_mlp")
        moe = c.moe
        assert moe is not None  # only MoE layers get here
        e, k = moe.num_experts, moe.experts_per_token
        touched = e * (1 - (1 - k / e) ** tokens)  # expected distinct experts hit by `tokens` tokens
        flops = 2.0 * tokens * k * self._elems(self._expert_w, "experts")
        bytes_ = touched * self._expert_w + tokens * k * 2 * h * self._b
        t = self._op(flops, bytes_, self._fam_eff["experts"], self._fam_peak["experts"])
        if self._moe_floor is not None:
            t = max(t, self._moe_floor.floor_s(tokens))
        t += self._op(2.0 * tokens * h * e, e * h * self._b, self._act_eff)  # router
        if self._shared_w:
            t += self._gemm(tokens, self._shared_w, 2 * h + 3 * moe.shared_intermediate / self.tp, "shared_experts")
        return t

    def _allreduce_s(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        p = self.params
        bytes_ = tokens * self.card.hidden_size * self._b
        if p.allreduce_algorithms:  # (c): the algorithm the engine runs for this message (capacity/cost/kernels.py)
            return 2 * allreduce_call_s(self.tp, bytes_, self.gpu.interconnect,
                                        self.gpu.ring_bytes_per_s(self.tp) * p.comm_bw_eff, p.allreduce_latency_s,
                                        p.allreduce_engine, self.gpu.full_nvlink(self.tp), tokens,
                                        self.gpu.nvlink_ring(self.tp), self.gpu.p2p,
                                        (self.gpu.device_name or "").startswith("AMD"))
        ring = 2 * (self.tp - 1) / self.tp * bytes_ / (self.gpu.interconnect_bytes_per_s * p.comm_bw_eff)
        return 2 * (ring + p.allreduce_latency_s)  # after attention and after the MLP

    # ---- the step -------------------------------------------------------------------------------
    def _terms(self, n: int, s: int) -> tuple[float, float, float, float]:
        """(gemm, norms, communication, sampling) of a step with n tokens of which s sample: memoised."""
        key = (n, s)
        got = self._terms_memo.get(key)
        if got is None:
            b = self._breakdown_full(StepPlan(), n, s)  # attention excluded: it depends on the plan
            got = self._terms_memo[key] = (b["gemm"], b["norms"], b["communication"], b["sampling"])
        return got

    def _chunk_s(self, new: int, cached: int) -> float:
        got = self._chunk_memo.get((new, cached))
        if got is None:
            pairs = new * (cached + (new + 1) / 2)  # causal: the i-th new token sees cached + i keys
            got = self._chunk_memo[(new, cached)] = self._op(
                pairs * self._per_key_flops, (cached + new) * self._kv_tok, self.params.attn_flops_eff, self._attn_peak)
        return got

    def _decode_key_s(self, queries: int) -> float:
        """Decode attention of one layer per key read, with `queries` query tokens per sequence (a speculative
        verify step: k + 1), which multiply the FLOPs, not the KV bytes streamed."""
        if queries == 1:
            return self._decode_s_per_key
        p = self.params
        return max(queries * self._per_key_flops / (self._attn_peak * p.attn_flops_eff),
                   self._kv_tok / (self.gpu.mem_bw_bytes_per_s * p.mem_bw_eff))

    def decode_step_s(self, batch: int, keys: int) -> float:
        """A decode-only step of `batch` sequences reading `keys` keys in total (sum of context + 1)."""
        gemm, norms, comm, samp = self._terms(batch, batch)
        attn = self._La * (keys * self._decode_s_per_key + self.params.kernel_launch_s)
        if self._state is not None:
            attn += self._state.scan_step_s([], batch)
        return gemm + norms + comm + samp + attn + self._kernel_s + self.params.step_overhead_s

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        n = plan.num_tokens
        if n == 0:
            return {"overhead": 0.0}
        if self.params.attention != "ideal":
            return self._breakdown_full(plan, n, plan.num_sampled)
        gemm, norms, comm, samp = self._terms(n, plan.num_sampled)
        attn = 0.0  # (a loop: as _attn_w)
        for p in plan.prefills:
            attn += self._chunk_s(p.new_tokens, p.cached_tokens)
        if plan.decode_contexts:
            keys = sum(plan.decode_contexts) + len(plan.decode_contexts)
            attn += keys * self._decode_key_s(plan.decode_queries) + self.params.kernel_launch_s
        out = {"gemm": gemm, "attention": self._La * attn, "norms": norms, "communication": comm,
               "sampling": samp, "overhead": self.params.step_overhead_s}
        if self._kernel_s:
            out["kernels"] = self._kernel_s
        if self._state is not None:
            out["state"] = self._state_scan_s(plan)
        return out

    def _state_scan_s(self, plan: StepPlan) -> float:
        assert self._state is not None
        chunks = [(p.new_tokens, p.cached_tokens) for p in plan.prefills]
        return self._state.scan_step_s(chunks, len(plan.decode_contexts), plan.decode_queries)

    def _breakdown_full(self, plan: StepPlan, n: int, s: int) -> dict[str, float]:
        c = self.card
        h = c.hidden_size
        gemm_attn = self._gemm(n, self._attn_w, 4 * h, "attention") if self._La else 0.0
        attn = self._attention_s(plan)
        norms = self._op(0.0, 6 * n * h * self._b, 1.0) * 2  # two RMSNorms (+rope) of read/write passes
        mlp = (c.num_dense_layers * self._mlp_s(n, False) if c.num_dense_layers else 0.0) + (
            c.num_moe_layers * self._mlp_s(n, True) if c.num_moe_layers else 0.0)
        lm = self._gemm(s, self._lm_w, h + c.vocab_size / self.tp) if s else 0.0
        sampler = self._op(0.0, s * c.vocab_size * self.params.sampler_bytes_per_logit, 1.0) if s else 0.0
        out = {
            "gemm": self._La * gemm_attn + mlp + lm,
            "attention": self._La * attn,
            "norms": c.num_layers * norms,
            "communication": c.num_layers * self._allreduce_s(n),
            "sampling": sampler,
            "overhead": self.params.step_overhead_s,
        }
        if self._kernel_s:  # (a constant: not in the `_terms` memo's four)
            out["kernels"] = self._kernel_s
        if self._state is not None:  # the state layers' projections (GEMMs) and their conv + scan
            out["gemm"] += self._state.gemm_step_s(n)
            out["state"] = self._state_scan_s(plan)
        return out

    def step_s(self, plan: StepPlan) -> float:
        """The sum of `breakdown`'s terms (fsum: exactly rounded, so in any order): the usual plan's terms without
        building the dict."""
        n = plan.num_tokens
        if n == 0 or self.params.attention != "ideal" or self._state is not None:
            return math.fsum(self.breakdown(plan).values())
        gemm, norms, comm, samp = self._terms(n, plan.num_sampled)
        attn = 0.0  # (as breakdown)
        for p in plan.prefills:
            attn += self._chunk_s(p.new_tokens, p.cached_tokens)
        if plan.decode_contexts:
            keys = sum(plan.decode_contexts) + len(plan.decode_contexts)
            attn += keys * self._decode_key_s(plan.decode_queries) + self.params.kernel_launch_s
        return math.fsum((gemm, self._La * attn, norms, comm, samp, self._kernel_s, self.params.step_overhead_s))

    def decode_line(self, contexts) -> tuple[float, float]:
        """(f0, g): k decode-only steps of the same batch last f0 + g x j (j = 0..k-1). Every term but attention
        depends on the batch size only, and attention is max(flops, bytes) of quantities both proportional to
        the keys read (ideal) or to batch x keys (dense_packed), which grow by one per sequence per step. So the
        duration is exactly linear in the step index: two evaluations give it."""
        b = len(contexts)
        if self.params.attention == "ideal":
            return (self.decode_step_s(b, sum(contexts) + b),
                    self._La * self._decode_s_per_key * b)
        f0 = self.step_s(StepPlan(decode_contexts=tuple(contexts)))
        f1 = self.step_s(StepPlan(decode_contexts=tuple(c + 1 for c in contexts)))
        return f0, f1 - f0

    def decode_run_s(self, contexts: Sequence[int], k: int):  # a list from the engine loop (mypyc checks)
        """k decode-only steps of the same batch (`decode_line`, expanded)."""
        import numpy as np

        f0, g = self.decode_line(contexts)
        return f0 + g * np.arange(k)
