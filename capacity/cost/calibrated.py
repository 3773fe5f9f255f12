"""Calibrated step cost: interpolates a measured profile (see `capacity/profile.py`, `calibrate/`).

    step_s = scale_layers x [embed(n) + lm_head(s) + sum over layers of layer(n)]
           + scale_prefill_attn x [sum over layers and prefill chunks of prefill_attn(chunk, cached)]
           + scale_decode_attn x [sum over layers of decode_attn(batch, context)] + overhead_s
with n the step's new tokens and s the sequences that sample. `layer(n)` is a whole non-attention layer body
(norms, QKV, rope, O, MLP or MoE, residuals) timed in one piece: on a CPU, isolated per-op timings summed
miss 30-45% of a real layer (measured: caches and kernel switches between ops), so the per-op tables
(qkv, o, gate_up, down, elementwise; MoE: router + touched(n) x expert(n k / touched(n)) with
touched(n) = E (1 - (1 - k/E)^n) distinct experts hit) only split the body into GEMM vs elementwise time
for the breakdown. Attention is one `prefill_attn(chunk, cached)` per prefill
chunk plus one `decode_attn(batch, context)` for all decodes, where the context of a mixed batch is the
longest one for a padded layout (what the measured stack does) or the mean for a paged layout (what paged
kernels read). The scales and `overhead_s` are fitted on whole-step timings of the real stack (the profile's
"fit" steps): isolated op timings run with hot caches, a real step does not; TP all-reduces, when tp > 1 and the profile has no all-reduce table, come from the roofline.

Interpolation is monotone and in log space: PCHIP over log(tokens) -> log(seconds) for 1-D tables, linear
over (log chunk, log(1 + cached)) and (log batch, log context) for the 2-D ones. Off the measured grid the
nearest edge point is scaled by the ratio of roofline work (tokens; attention pairs; KV bytes read), which is
the roofline's own asymptote, and the object records the miss in `off_grid` and warns once per table.
"""
from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from capacity.cost.profile import Profile, check_profile
from capacity.cost.roofline import RooflineCost
from capacity.cost.step import StepPlan
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import get_gpu


class OffGridWarning(UserWarning):
    """A calibrated lookup fell outside the measured grid and was extrapolated."""


_MEMO_MAX = 1 << 16  # entries per table: bounded memory however long a simulation runs


class _Table1D:
    def __init__(self, name: str, xs: list[int], ys: list[float | None]) -> None:
        from scipy.interpolate import PchipInterpolator  # scipy: half a second to import, only for a measured profile

        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if not pts:
            raise ConfigError(f"profile table {name}: no measured points")
        self.name = name
        self.x = np.array([p[0] for p in pts], dtype=float)
        # More work never takes less time: a slow small-size point (first-call warm-up, a noisy neighbour)
        # is lowered to the next larger size's time (running minimum from the large end).
        self.y = np.minimum.accumulate(np.array([p[1] for p in pts], dtype=float)[::-1])[::-1]
        self._f = PchipInterpolator(np.log(self.x), np.log(self.y)) if len(pts) > 1 else None
        self._memo: dict[float, float] = {}  # in-grid lookups repeat (the same batch sizes step after step)

    def __call__(self, x: float, miss: Counter) -> float:
        if x <= 0:
            return 0.0
        lo, hi = self.x[0], self.x[-1]
        if x > hi:  # above the grid: work (tokens) scales linearly, the roofline's compute-bound asymptote
            miss[self.name] += 1
            return float(self.y[-1] * x / hi)
        if x < lo:  # below the smallest measurement the time is flat (launch-bound)
            miss[self.name] += 1
            return float(self.y[0])
        v = self._memo.get(x)
        if v is None:
            v = float(np.exp(self._f(math.log(x)))) if self._f is not None else float(self.y[0])
            if len(self._memo) < _MEMO_MAX:
                self._memo[x] = v
        return v


class _Table2D:
    """Grid over (a, b) with `log` on a and `log1p` on b; work(a, b) scales edge points off the grid."""

    def __init__(self, name: str, a: list[int], b: list[int], t: list[list[float | None]], work) -> None:
        from scipy.interpolate import RegularGridInterpolator  # scipy: as above

        self.name, self.work = name, work
        self.a, self.b = np.array(a, float), np.array(b, float)
        grid = np.array([[np.nan if v is None else v for v in row] for row in t], dtype=float)
        if np.isnan(grid).all():
            raise ConfigError(f"profile table {name}: no measured points")
        self.filled = int(np.isnan(grid).sum())
        grid = self._fill(grid)
        # More work never takes less time: each point becomes the minimum over the points with at least as
        # much of both coordinates (noise on a shared host would otherwise make interpolation non-monotone).
        grid = np.minimum.accumulate(np.minimum.accumulate(grid[::-1, ::-1], axis=0), axis=1)[::-1, ::-1]
        self._memo: dict[tuple[float, float], float] = {}
        ax = (np.log(self.a), np.log1p(self.b))
        if len(a) > 1 and len(b) > 1:
            self._f = RegularGridInterpolator(ax, np.log(grid), method="linear")
        else:
            self._f = None
            self._grid = grid

    def _fill(self, g: np.ndarray) -> np.ndarray:
        """Unmeasured points (out of memory) scaled from the nearest measured point below them by work."""
        g = g.copy()
        for i in range(g.shape[0]):
            for j in range(g.shape[1]):
                if not np.isnan(g[i, j]):
                    continue
                cands = [(i, jj) for jj in range(j - 1, -1, -1) if not np.isnan(g[i, jj])][:1]
                cands += [(ii, j) for ii in range(i - 1, -1, -1) if not np.isnan(g[ii, j])][:1]
                if not cands:
                    cands = [tuple(np.argwhere(~np.isnan(g))[0])]
                ii, jj = cands[0]
                g[i, j] = g[ii, jj] * self.work(self.a[i], self.b[j]) / self.work(self.a[ii], self.b[jj])
        return g

    def __call__(self, a: float, b: float, miss: Counter) -> float:
        ca = min(max(a, self.a[0]), self.a[-1])
        cb = min(max(b, self.b[0]), self.b[-1])
        if (ca, cb) != (a, b):
            miss[self.name] += 1
        if self._f is not None:
            t = self._memo.get((ca, cb))
            if t is None:
                t = float(np.exp(self._f((math.log(ca), math.log1p(cb)))))
                if len(self._memo) < _MEMO_MAX:
                    self._memo[(ca, cb)] = t
        else:
            i = int(np.abs(self.a - ca).argmin())
            j = int(np.abs(self.b - cb).argmin())
            t = float(self._grid[i, j])
        if (ca, cb) != (a, b):
            t *= max(1.0, self.work(a, b) / self.work(ca, cb))
        return t

    def many(self, a: float, bs: np.ndarray, miss: Counter) -> np.ndarray:
        """Vectorised __call__ over many b values at one a (the decode fast path)."""
        ca = min(max(a, self.a[0]), self.a[-1])
        cb = np.clip(bs, self.b[0], self.b[-1])
        off = (ca != a) | (cb != bs)
        if off.any():
            miss[self.name] += int(off.sum())
        if self._f is not None:
            pts = np.column_stack([np.full(len(bs), math.log(ca)), np.log1p(cb)])
            t = np.exp(self._f(pts))
        else:
            i = int(np.abs(self.a - ca).argmin())
            t = np.array([self._grid[i, int(np.abs(self.b - x).argmin())] for x in cb])
        ratio = self.work(a, bs) / self.work(ca, cb)
        return t * np.maximum(1.0, ratio)



def _prefill_work(chunk: float, cached: float) -> float:
    return chunk * (cached + (chunk + 1) / 2)  # causal (query, key) pairs


def _decode_work(batch: float, context: float) -> float:
    return batch * (context + 1)  # keys read


@dataclass
class CalibratedCost:
    """Step cost interpolated from a measured profile for `card` at the profile's TP size."""

    profile: Profile
    card: ModelCard
    gpu: str | None = None  # the scenario's catalogue GPU, checked against the profile's device
    tp: int = 1
    decode_layout: str | None = None  # None: as measured (profile.decode_layout)
    allow_mismatch: bool = False
    use_fit: bool = True  # False: raw op sum (used while fitting)
    profile_path: str = "profile"
    off_grid: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        p = self.profile
        check_profile(p, self.card, self.tp, self.gpu, self.allow_mismatch, source=self.profile_path)
        if self.decode_layout not in (None, "padded", "paged"):
            raise ConfigError(f"decode_layout: must be padded or paged (got {self.decode_layout!r})")
        self.decode_layout = self.decode_layout or p.decode_layout
        self._lin = {k: _Table1D(k, p.tokens, v) for k, v in p.linear.items()}
        self._embed = _Table1D("embed", p.tokens, p.embed)
        self._lm = _Table1D("lm_head", p.tokens, p.lm_head)
        self._expert = _Table1D("expert", p.expert_tokens, p.expert) if p.expert_tokens else None
        self._prefill = _Table2D("prefill_attn", p.prefill_chunk, p.prefill_cached, p.prefill_attn, _prefill_work)
        self._decode = _Table2D("decode_attn", p.decode_batch, p.decode_context, p.decode_attn, _decode_work)
        need = {"qkv", "o"}
        if self.card.num_dense_layers:
            need |= {"gate_up", "down", "elementwise", "layer"}
        if self.card.moe is not None:
            need |= {"router", "elementwise_moe", "layer_moe"}
            if self.card.moe.shared_intermediate:
                need |= {"gate_up", "down"}
            if self._expert is None:
                raise ConfigError(f"{self.profile_path}: MoE card {self.card.name} but the profile has no expert table")
        missing = need - set(self._lin)
        if missing:
            raise ConfigError(f"{self.profile_path}: tables missing for this card: {', '.join(sorted(missing))}")
        self._comm = None
        if self.tp > 1 and not p.allreduce_tokens:
            if self.gpu is None:
                raise ConfigError(f"{self.profile_path}: tp={self.tp} needs all-reduce costs: the profile has none "
                                  "and no GPU was given for the roofline")

            self._comm = RooflineCost(self.card, get_gpu(self.gpu), self.tp)
        self._allreduce = _Table1D("allreduce", p.allreduce_tokens, p.allreduce) if p.allreduce_tokens else None
        fit = p.fit if self.use_fit else None
        self.scales: dict[str, float] = {str(k): v for k, v in fit.scales.items()} if fit else {}
        self.overhead_s = fit.overhead_s if fit else 0.0
        prov = p.provenance
        self.source = (f"calibrated profile {self.profile_path} ({prov.device_name}, {prov.dtype}, "
                       f"torch {prov.torch_version}, {prov.date[:10]})")
        self._warned: set[str] = set()

    # ---- pieces -----------------------------------------------------------------------------------
    def _mlp(self, n: int, moe_layer: bool) -> float:
        m = self.off_grid
        if not moe_layer:
            return self._lin["gate_up"](n, m) + self._lin["down"](n, m)
        moe, expert = self.card.moe, self._expert
        assert moe is not None and expert is not None  # __post_init__ refuses MoE cards without an expert table
        e, k = moe.num_experts, moe.experts_per_token
        touched = e * (1 - (1 - k / e) ** n)
        t = self._lin["router"](n, m) + touched * expert(n * k / touched, m)
        if moe.shared_intermediate:
            t += self._lin["gate_up"](n, m) + self._lin["down"](n, m)
        return t

    def components(self, plan: StepPlan) -> dict[str, float]:
        """Unscaled table sums per fit component (seconds) for one step."""
        n, s = plan.num_tokens, plan.num_sampled
        c, m, lin = self.card, self.off_grid, self._lin
        before = sum(m.values())
        layers = self._embed(n, m) + (self._lm(s, m) if s else 0.0)
        if c.num_dense_layers:
            layers += c.num_dense_layers * lin["layer"](n, m)
        if c.num_moe_layers:
            layers += c.num_moe_layers * lin["layer_moe"](n, m)
        prefill = c.num_layers * sum(self._prefill(p.new_tokens, p.cached_tokens, m) for p in plan.prefills)
        decode = 0.0
        if plan.decode_contexts:
            d = plan.decode_contexts
            ctx = max(d) if self.decode_layout == "padded" else sum(d) / len(d)
            decode = c.num_layers * self._decode(len(d), ctx, m)
        comm = 0.0
        if self._allreduce is not None:
            comm = c.num_layers * 2 * self._allreduce(n, m)
        elif self._comm is not None:
            comm = c.num_layers * self._comm._allreduce_s(n)
        if sum(m.values()) > before:
            self._warn_off_grid()
        return {"layers": layers, "prefill_attn": prefill, "decode_attn": decode, "communication": comm}

    def _gemm_fraction(self, n: int) -> float:
        """Share of GEMMs in a layer body by the isolated op tables (for the breakdown only)."""
        c, lin = self.card, self._lin
        m: Counter = Counter()
        gemm = lin["qkv"](n, m) + lin["o"](n, m)
        elem = 0.0
        if c.num_dense_layers:
            gemm += self._mlp(n, False)
            elem += lin["elementwise"](n, m)
        else:
            gemm += self._mlp(n, True)
            elem += lin["elementwise_moe"](n, m)
        return gemm / (gemm + elem) if gemm + elem > 0 else 1.0

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        if plan.num_tokens == 0:
            return {"overhead": 0.0}
        comp = self.components(plan)
        sc = self.scales
        layers = sc.get("layers", 1.0) * comp["layers"]
        g = self._gemm_fraction(plan.num_tokens)
        return {
            "gemm": g * layers,
            "attention": sc.get("prefill_attn", 1.0) * comp["prefill_attn"] + sc.get("decode_attn", 1.0) * comp["decode_attn"],
            "norms": (1 - g) * layers,
            "communication": comp["communication"],
            "overhead": self.overhead_s,
        }

    def _warn_off_grid(self) -> None:
        new = [k for k in self.off_grid if k not in self._warned]
        if new:
            self._warned.update(new)
            warnings.warn(f"{self.profile_path}: step shapes outside the measured grid for {', '.join(sorted(new))}; "
                          "extrapolated by roofline work scaling from the grid edge", OffGridWarning, stacklevel=3)

    def step_s(self, plan: StepPlan) -> float:
        """The sum of `breakdown` without its GEMM/elementwise split (the simulator's hot path)."""
        if plan.num_tokens == 0:
            return 0.0
        comp, sc = self.components(plan), self.scales
        return math.fsum((sc.get("layers", 1.0) * comp["layers"], sc.get("prefill_attn", 1.0) * comp["prefill_attn"],
                          sc.get("decode_attn", 1.0) * comp["decode_attn"], comp["communication"], self.overhead_s))

    def decode_run_s(self, contexts: tuple[int, ...], k: int) -> np.ndarray:
        """k decode-only steps of the same batch, contexts growing by one per step: everything but decode
        attention depends on the batch size only; decode attention is evaluated for all k contexts at once."""
        plan0 = StepPlan(decode_contexts=tuple(contexts))
        f0 = self.step_s(plan0)
        if k == 1:
            return np.array([f0])
        b = len(contexts)
        ctx0 = max(contexts) if self.decode_layout == "padded" else sum(contexts) / b
        attn = self._decode.many(b, ctx0 + np.arange(k), self.off_grid)
        scale = self.scales.get("decode_attn", 1.0) * self.card.num_layers
        return f0 + scale * (attn - attn[0])
