"""A real decoder stack (one TP rank's shapes) with random weights, built from a model card.

Timing does not depend on weight values, so weights are random. The forward pass over one engine step is
composed of the very per-op functions the suite times (`Layer.qkv`, `Layer.elementwise`, `attention_*`, ...),
so op tables and whole-step timings measure the same kernels:

    x[n, h] = embed(token ids)                      n = all new tokens of the step, prefills first
    per layer:  r = norm(x); q,k,v = qkv(r); rope(q, k)
                attention: each prefill chunk alone (causal over cached + new keys, SDPA),
                           all decodes in one padded batched SDPA over their KV caches;
                           or (attention="paged") every sequence in one call over a paged pool (paged.py)
                x += o(attn); r = norm(x); x += mlp(r)      (MoE: router + the experts actually hit)
    logits = lm_head(norm(x[rows that sample])); next = argmax(logits)

KV caches are shared across layers (values do not matter, sizes do), so a step of 256 sequences x 32k
context fits where 32 separate layer caches would not. Layers may also share weights when the model would
not fit in memory (`distinct_layers`); each distinct layer's weights are larger than a GPU's L2 cache for
the cards this is used on, so sharing does not make the weights cache-resident.

FP8 GEMMs (`gemm="fp8"`, the default for a card with FP8 weights on a device with FP8 tensor cores): the dense
projections (qkv, o, gate/up, down, shared experts) hold e4m3 weights with a per-tensor scale and run
`torch._scaled_mm`, the activations quantised per tensor on the fly (vLLM's dynamic FP8 scheme: a scale from the
input's absolute maximum, then a cast), all on the device, so a step stays capturable as a CUDA graph. Routed
experts, the router and the LM head stay in the activation dtype. A card with FP8 blocks (`quant_group_size`)
runs block scales instead (fp8.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from calibrate.fp8 import FP8_MAX, fp8_supported, stack_gemm_dtype  # noqa: F401 (fp8_supported: re-exported)
from calibrate.moe import MoEOps
from capacity.errors import ConfigError
from capacity.model.card import ModelCard

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def resolve_device(device: str) -> str:
    """Validate a device string ('cpu', 'cuda', 'cuda:N') against what this machine has."""
    import torch

    d = device.strip().lower()
    if d == "cpu":
        return d
    if d == "cuda" or d.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: CUDA was requested but torch {torch.__version__} sees no CUDA "
                              "device on this machine (use --device cpu)")
        idx = 0 if d == "cuda" else d.split(":", 1)[1]
        if not str(idx).isdigit() or int(idx) >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: no such CUDA device (this machine has "
                              f"{torch.cuda.device_count()}: cuda:0..cuda:{torch.cuda.device_count() - 1})")
        return f"cuda:{int(idx)}"
    raise ConfigError(f"--device {device!r}: unknown device; use cpu, cuda or cuda:N")


@dataclass(frozen=True)
class RankShapes:
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP, this rank
    vocab: int  # LM head rows on this rank
    experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int

    @classmethod
    def of(cls, card: ModelCard, tp: int) -> RankShapes:
        if card.mla is not None:
            raise ConfigError(f"model {card.name}: the calibration stack does not implement MLA attention yet; "
                              "use the roofline step cost for this card")
        if card.num_attention_heads % tp:
            raise ConfigError(f"tp={tp} does not divide num_attention_heads ({card.num_attention_heads})")
        moe = card.moe
        return cls(
            hidden=card.hidden_size, q_heads=card.num_attention_heads // tp,
            kv_heads=max(1, card.num_kv_heads // tp), head_dim=card.head_dim_,
            intermediate=math.ceil(card.intermediate_size / tp), vocab=math.ceil(card.vocab_size / tp),
            experts=moe.num_experts if moe else 0, top_k=moe.experts_per_token if moe else 0,
            expert_intermediate=math.ceil(moe.moe_intermediate_size / tp) if moe else 0,
            shared_intermediate=math.ceil(moe.shared_intermediate / tp) if moe and moe.shared_intermediate else 0,
        )


def _rms_norm(x, w, eps: float = 1e-6):
    import torch

    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * w


def _rope(x, cos, sin):
    # x: [n, heads, d]; cos/sin: [n, 1, d]
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Layer(MoEOps):
    """One decoder layer's weights on this rank and its per-op functions (the MoE ones in moe.py)."""

    def __init__(self, s: RankShapes, card: ModelCard, moe: bool, dtype, device, gen, gemm: str = "bf16",
                 block_kernel: str | None = None) -> None:
        import torch

        from calibrate import fp8

        def w(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype).mul_(0.02)

        self.fp8 = gemm == "fp8"
        self.block_kernel = block_kernel  # FP8 block scales: "scaled_mm" or "reference"; None: per tensor
        self.dtype = dtype
        self.one = torch.ones((), device=device, dtype=torch.float32)

        def lin(k, n):  # a dense projection's weight: [k, n] in the activation dtype, or FP8 as _scaled_mm wants it
            if not self.fp8:
                return w(k, n)
            t = torch.randn(n, k, generator=gen, device=device, dtype=dtype).mul_(0.02)
            if block_kernel:
                return fp8.quantize_weight_blocks(t)
            scale = t.abs().amax().float() / FP8_MAX
            return ((t.float() / scale).to(torch.float8_e4m3fn).t(), scale)  # [k, n], column-major

        self.s, self.moe = s, moe
        h, d = s.hidden, s.head_dim
        self.qkv_w = lin(h, (s.q_heads + 2 * s.kv_heads) * d)
        self.qkv_b = w((s.q_heads + 2 * s.kv_heads) * d) if card.attention_bias else None
        self.qk_norm = torch.ones(d, device=device, dtype=dtype) if card.qk_norm else None
        self.o_w = lin(s.q_heads * d, h)
        self.norm_w = torch.ones(h, device=device, dtype=dtype)
        if moe:
            self.router_w = w(h, s.experts)
            self.e_gate_up = w(s.experts, h, 2 * s.expert_intermediate)
            self.e_down = w(s.experts, s.expert_intermediate, h)
            if s.shared_intermediate:
                self.gate_up_w, self.down_w = lin(h, 2 * s.shared_intermediate), lin(s.shared_intermediate, h)
        else:
            self.gate_up_w, self.down_w = lin(h, 2 * s.intermediate), lin(s.intermediate, h)

    def mm(self, x, wt):
        """x @ a dense projection: a plain matmul, or quantise x per tensor (dynamic) and run an FP8 GEMM."""
        if not self.fp8:
            return x @ wt
        import torch

        w8, sw = wt
        if self.block_kernel:
            from calibrate.fp8 import block_mm

            return block_mm(x, w8, sw, self.dtype, self.block_kernel)
        sx = x.abs().amax().float().clamp_(min=1e-12) / FP8_MAX
        x8 = (x / sx.to(x.dtype)).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x8, w8, scale_a=sx, scale_b=sw, out_dtype=self.dtype)

    # ---- GEMM families (timed as `linear[...]`) ---------------------------------------------------
    def qkv(self, r):
        # r: [n, h] -> q [n, Hq, d], k/v [n, Hk, d]
        s = self.s
        y = self.mm(r, self.qkv_w)
        if self.qkv_b is not None:
            y = y + self.qkv_b
        q, k, v = y.split([s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        return (q.view(-1, s.q_heads, s.head_dim), k.view(-1, s.kv_heads, s.head_dim),
                v.view(-1, s.kv_heads, s.head_dim))

    def o(self, a):  # a: [n, Hq*d] -> [n, h]
        return self.mm(a, self.o_w)

    def gate_up(self, r):  # [n, h] -> [n, 2I]
        return self.mm(r, self.gate_up_w)

    def down(self, m):  # [n, I] -> [n, h]
        return self.mm(m, self.down_w)

    # ---- elementwise work of one layer (timed as `linear["elementwise"]`) -------------------------
    def pre_attn(self, x, q, k, cos, sin):
        """norm before attention is separate (it feeds qkv); this is rope (+ qk-norm) on q and k."""
        if self.qk_norm is not None:
            q, k = _rms_norm(q, self.qk_norm), _rms_norm(k, self.qk_norm)
        return _rope(q, cos, sin), _rope(k, cos, sin)

    @staticmethod
    def act(gu):  # [n, 2I] -> [n, I]
        import torch

        g, u = gu.chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u

    def elementwise(self, x, q, k, cos, sin, gu):
        """Everything elementwise in a layer, in one call, for the op table: two norms, rope, act, two adds."""
        r = _rms_norm(x, self.norm_w)
        self.pre_attn(x, q, k, cos, sin)
        x = x + r
        r = _rms_norm(x, self.norm_w)
        if gu is not None:
            self.act(gu)
        return x + r

    # ---- the non-attention part of a layer (timed as `linear["layer"]`, in context) ------------------
    def pre(self, x, cos, sin):
        """norm -> qkv -> (qk-norm) rope. x: [n, h] -> q [n, Hq, d], k/v [n, Hk, d]."""
        q, k, v = self.qkv(_rms_norm(x, self.norm_w))
        q, k = self.pre_attn(x, q, k, cos, sin)
        return q, k, v

    def post(self, x, a):
        """o-proj -> residual -> norm -> MLP (or MoE) -> residual. a: [n, Hq*d] -> x [n, h]."""
        x = x + self.o(a)
        return x + self.mlp(_rms_norm(x, self.norm_w))

    moe_impl = "loop"  # "grouped" where the device runs torch._grouped_mm (set by DecoderStack)

    def mlp(self, r):
        return self.moe_mlp(r) if self.moe else self.down(self.act(self.gate_up(r)))


class DecoderStack:
    """Random-weight decoder stack for one TP rank of `card` on `device`."""

    def __init__(self, card: ModelCard, device: str = "cpu", tp: int = 1, seed: int = 0,
                 max_weight_fraction: float = 0.5, max_context: int | None = None, attention: str = "sdpa") -> None:
        import torch

        from calibrate import paged

        self.card, self.tp, self.device = card, tp, device
        self.gemm = stack_gemm_dtype(card, device)
        self.s = s = RankShapes.of(card, tp)
        self.dtype = getattr(torch, TORCH_DTYPES[card.dtype])
        self.max_context = max_context or card.max_position_embeddings
        self.block_kernel = None  # FP8 blocks (fp8.py): the block-scaled kernel; a CPU's reference; else per tensor
        if self.gemm == "fp8" and card.quant_group_size:
            from calibrate import fp8

            kernel = fp8.probe_block_kernel(device, self.dtype)
            if kernel == "scaled_mm" or not device.startswith("cuda"):
                dense = card.moe is None or card.num_dense_layers
                fp8.check_block_dims(card, {
                    "hidden_size": s.hidden, "q/k/v width": (s.q_heads + 2 * s.kv_heads) * s.head_dim,
                    "o-proj input": s.q_heads * s.head_dim, "intermediate_size": s.intermediate if dense else 0,
                    "shared experts": s.shared_intermediate})
                self.block_kernel = kernel
        gen = torch.Generator(device=device).manual_seed(seed)
        layer_bytes = self._layer_bytes()
        self.distinct_layers = card.num_layers
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(device)
            fit = int(free * max_weight_fraction // max(1, layer_bytes))
            self.distinct_layers = max(1, min(card.num_layers, fit))
        n_dense = card.num_dense_layers
        self.layers = []
        for i in range(self.distinct_layers):
            self.layers.append(Layer(s, card, moe=i >= n_dense and card.moe is not None, dtype=self.dtype,
                                     device=device, gen=gen, gemm=self.gemm,
                                     block_kernel=self.block_kernel))
        self.embed_w = torch.randn(s.vocab, s.hidden, generator=gen, device=device, dtype=self.dtype).mul_(0.02)
        self.lm_w = torch.randn(s.hidden, s.vocab, generator=gen, device=device, dtype=self.dtype).mul_(0.02)
        self.norm_w = torch.ones(s.hidden, device=device, dtype=self.dtype)
        # rope tables over every position a step may touch
        inv = 1.0 / (10000 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim))
        ang = torch.outer(torch.arange(self.max_context + 1, device=device).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.cos, self.sin = ang.cos().to(self.dtype), ang.sin().to(self.dtype)
        # MoE on a GPU: grouped GEMMs with on-device routing when this torch runs them and they agree with
        # the per-expert loop; else the loop (which reads expert counts on the host: not capturable).
        self.moe_impl = "loop"
        if card.moe is not None and device.startswith("cuda"):
            self.moe_impl = self._probe_grouped()
        self.capturable = card.moe is None or self.moe_impl == "grouped"
        # attention: "sdpa" (padded decodes, each prefill chunk alone) or "paged" (calibrate/paged.py)
        self.attention, self.attn_kernel, self.page, self._cu_k = paged.resolve(
            attention, device, s.q_heads, s.kv_heads, s.head_dim, self.dtype)

    def set_moe_impl(self, impl: str) -> None:
        if impl not in ("loop", "grouped"):
            raise ConfigError(f"moe_impl: loop or grouped (got {impl!r})")
        self.moe_impl = impl
        for layer in self.layers:
            layer.moe_impl = impl
        self.capturable = self.card.moe is None or impl == "grouped"

    def _probe_grouped(self) -> str:
        import torch

        layer = next(x for x in self.layers if x.moe)
        if not hasattr(torch, "_grouped_mm"):
            return "loop"
        try:
            with torch.inference_mode():
                r = torch.randn(64, self.s.hidden, device=self.device, dtype=self.dtype)
                layer.moe_impl = "loop"
                ref = layer.mlp(r)
                layer.moe_impl = "grouped"
                got = layer.mlp(r)
            ok = bool((got.float() - ref.float()).abs().max() <= 0.05 * ref.float().abs().max())
        except (RuntimeError, TypeError, NotImplementedError):
            ok = False
        impl = "grouped" if ok else "loop"
        for l_ in self.layers:
            l_.moe_impl = impl
        return impl

    def _layer_bytes(self) -> int:
        s, b = self.s, 1 if self.gemm == "fp8" else 2
        attn = s.hidden * (s.q_heads + 2 * s.kv_heads) * s.head_dim + s.q_heads * s.head_dim * s.hidden
        if self.card.moe is not None:
            mlp = 2 * s.experts * 3 * s.hidden * s.expert_intermediate + 3 * s.hidden * s.shared_intermediate * b
            return attn * b + mlp
        return (attn + 3 * s.hidden * s.intermediate) * b

    def layer(self, i: int) -> Layer:
        return self.layers[i % self.distinct_layers]

    # ---- step inputs ----------------------------------------------------------------------------
    def prepare(self, prefills: list[tuple[int, int]], decodes: list[int], gen_seed: int = 0) -> dict:
        """Allocate everything a step needs (outside the timed region): token ids, positions, KV caches."""
        import torch

        s, dev, dt = self.s, self.device, self.dtype
        for c, k in prefills:
            if c <= 0 or k < 0 or c + k > self.max_context:
                raise ConfigError(f"prefill chunk ({c} new, {k} cached) exceeds max context {self.max_context}")
        if any(d < 0 or d + 1 > self.max_context for d in decodes):
            raise ConfigError(f"decode context over max context {self.max_context}: {max(decodes)}")
        n = sum(c for c, _ in prefills) + len(decodes)
        g = torch.Generator(device=dev).manual_seed(gen_seed)
        ids = torch.randint(0, s.vocab, (n,), generator=g, device=dev)
        pos = [torch.arange(k, k + c) for c, k in prefills] + [torch.tensor(decodes, dtype=torch.long)]
        pos_t = torch.cat(pos).to(dev) if n else torch.zeros(0, dtype=torch.long, device=dev)
        sample_rows = [sum(c for c, _ in prefills[:i + 1]) - 1 for i in range(len(prefills))]
        sample_rows += list(range(n - len(decodes), n))
        st = {"prefills": prefills, "decodes": decodes, "ids": ids, "pos": pos_t,
              "sample_rows": torch.tensor(sample_rows, device=dev, dtype=torch.long)}
        if self.attention == "paged":
            return {**st, "paged": self.paged_step(list(prefills) + [(1, d) for d in decodes], g) if n else None}
        prefill_kv = [torch.randn(2, s.kv_heads, k + c, s.head_dim, generator=g, device=dev, dtype=dt)
                      for c, k in prefills]
        decode_kv = decode_mask = decode_pos = None
        if decodes:
            t = max(decodes) + 1
            decode_kv = torch.randn(2, len(decodes), s.kv_heads, t, s.head_dim, generator=g, device=dev,
                                    dtype=dt)
            decode_pos = torch.tensor(decodes, device=dev)
            decode_mask = (torch.arange(t, device=dev)[None, :] <= decode_pos[:, None])[:, None, None, :]
        return {**st, "prefill_kv": prefill_kv, "decode_kv": decode_kv, "decode_mask": decode_mask,
                "decode_pos": decode_pos}

    def paged_step(self, seqs: list[tuple[int, int]], gen=None):
        """A paged pool holding `seqs` ((new, cached) each; a decode is (1, context)), for `attention_paged`."""
        import torch

        from calibrate.paged import build_step

        gen = gen if gen is not None else torch.Generator(device=self.device).manual_seed(0)
        return build_step(seqs, self.s.kv_heads, self.s.head_dim, page=self.page, device=self.device,
                          dtype=self.dtype, gen=gen)

    def attention_paged(self, q, k_new, v_new, st):
        """Every sequence of a step in one call over the paged pool (vLLM's FlashAttention backend), new K/V
        written to their slots first. q: [n, Hq, d]; k_new/v_new: [n, Hk, d]. Returns [n, Hq*d]."""
        from calibrate.paged import attend

        return attend(self.attn_kernel, q, k_new, v_new, st, self._cu_k)

    # ---- attention (timed as prefill_attn / decode_attn) -----------------------------------------
    @staticmethod
    def attention_prefill(q, k_new, v_new, kv, cached: int):
        """One prefill chunk: write new K/V into its cache, then causal SDPA over cached + new keys.
        q: [c, Hq, d]; k_new/v_new: [c, Hk, d]; kv: [2, Hk, cached + c, d]. Returns [c, Hq*d]."""
        import torch.nn.functional as F
        from torch.nn.attention.bias import causal_lower_right

        c = q.shape[0]
        kv[0, :, cached:cached + c] = k_new.transpose(0, 1)
        kv[1, :, cached:cached + c] = v_new.transpose(0, 1)
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, c, d]
        k, v = kv[0].unsqueeze(0), kv[1].unsqueeze(0)
        if cached == 0:
            o = F.scaled_dot_product_attention(qh, k, v, is_causal=True, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(qh, k, v, attn_mask=causal_lower_right(c, cached + c), enable_gqa=True)
        return o[0].transpose(0, 1).reshape(c, -1)

    @staticmethod
    def attention_decode(q, k_new, v_new, kv, pos, mask):
        """All decoding sequences at once over a padded KV layout. q: [B, Hq, d]; kv: [2, B, Hk, T, d];
        pos: [B] write positions; mask: [B, 1, 1, T]. GQA: each KV head's query group attends as a block
        of rows (no copy of K/V per query head), as decode kernels do."""
        import torch
        import torch.nn.functional as F

        b, hq, d = q.shape
        hk = kv.shape[2]
        rows = torch.arange(b, device=q.device)
        kv[0, rows, :, pos] = k_new
        kv[1, rows, :, pos] = v_new
        qg = q.view(b, hk, hq // hk, d)  # [B, Hk, group, d]
        o = F.scaled_dot_product_attention(qg, kv[0], kv[1], attn_mask=mask)
        return o.reshape(b, hq * d)

    # ---- the step -------------------------------------------------------------------------------
    def embed(self, ids):
        return self.embed_w[ids]

    def lm_head(self, x, rows):
        import torch

        return torch.argmax(_rms_norm(x.index_select(0, rows), self.norm_w) @ self.lm_w, dim=-1)

    def forward(self, st: dict):
        """One engine step over prepared inputs; returns the sampled token ids."""
        x = self.embed(st["ids"])
        cos, sin = self.cos[st["pos"]].unsqueeze(1), self.sin[st["pos"]].unsqueeze(1)
        n_pre = sum(c for c, _ in st["prefills"])
        import torch

        for i in range(self.card.num_layers):
            layer = self.layer(i)
            q, k, v = layer.pre(x, cos, sin)
            if self.attention == "paged":
                x = layer.post(x, self.attention_paged(q, k, v, st["paged"]))
                continue
            outs = []
            start = 0
            for (c, cached), kv in zip(st["prefills"], st["prefill_kv"]):
                outs.append(self.attention_prefill(q[start:start + c], k[start:start + c], v[start:start + c],
                                                   kv, cached))
                start += c
            if st["decodes"]:
                outs.append(self.attention_decode(q[n_pre:], k[n_pre:], v[n_pre:], st["decode_kv"],
                                                  st["decode_pos"], st["decode_mask"]))
            x = layer.post(x, outs[0] if len(outs) == 1 else torch.cat(outs))
        return self.lm_head(x, st["sample_rows"]) if len(st["sample_rows"]) else None
