"""Attention over a paged KV cache, as vLLM's FlashAttention backend runs it: one kernel call per layer for every
sequence of the step.

What vLLM does each layer (v1 `FlashAttentionImpl.forward`): write the step's new keys and values into the paged
KV cache at their slots (`reshape_and_cache_flash`), then one `flash_attn_varlen_func` over all sequences, prefill
chunks and decodes alike, with `cu_seqlens_q` (where each sequence's queries start in the packed batch),
`seqused_k` (each sequence's keys, cached + new), a `block_table` (each sequence's pages in the pool) and a
causal mask aligned to the bottom right (a chunk's query i sees every cached key and new keys 0..i). The pool
holds `pages x page_size` token slots; a sequence's pages are wherever the free queue handed them out, so they
are scattered. vLLM's default page (block) is 16 tokens.

torch 2.13 exposes the same kernel as `torch.nn.attention.varlen.varlen_attn` (FlashAttention, with
`seqused_k` and `block_table`) on CUDA only. So the stack runs it there, after a start-up probe checks it against
the reference below on a small mixed step (`probe_flash`): the first page size and argument form the device
accepts and agrees on wins; none means no paged kernel on this device. Everywhere else (the CPU) the same
inputs go through `reference_attention`: each sequence's pages gathered, then causal SDPA. That is a rehearsal
of the GPU path (layouts, slots, block tables are the same code), not a measure of any kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

PAGE_SIZES = (16, 256)  # vLLM's default block size first; FlashAttention-2's paged path wants multiples of 256


@dataclass
class PagedStep:
    """One step's attention inputs over a paged pool. Sequences are in the step's token order (prefill chunks,
    then decodes); sequence i has `q_lens[i]` new tokens on top of `k_lens[i] - q_lens[i]` cached ones."""

    q_lens: list[int]
    k_lens: list[int]
    page: int
    cu_seq_q: object  # int32 [N + 1]
    cu_seq_k: object  # int32 [N + 1]
    seqused_k: object  # int32 [N]
    block_table: object  # int32 [N, max pages of a sequence]
    slots: object  # int64 [new tokens]: each new token's slot in the pool's flattened [pages * page] token axis
    pool_k: object  # [pages, page, Hk, d]
    pool_v: object

    @property
    def max_q(self) -> int:
        return max(self.q_lens)

    @property
    def max_k(self) -> int:
        return max(self.k_lens)


def build_step(seqs: list[tuple[int, int]], kv_heads: int, head_dim: int, *, page: int, device, dtype,
               gen, spare_pages: int = 0) -> PagedStep:
    """Allocate a pool for `seqs` ((new tokens, cached tokens) each; a decode is (1, context)), hand each
    sequence its pages in a random order (a pool after churn), fill the pool with random K/V and compute the
    slots of the new tokens. Everything here is outside the timed region."""
    import torch

    if not seqs or any(c < 1 or k < 0 for c, k in seqs):
        raise ValueError(f"paged step: every sequence needs >= 1 new token and >= 0 cached (got {seqs})")
    counts = [math.ceil((c + k) / page) for c, k in seqs]
    total = sum(counts) + spare_pages
    order = torch.randperm(total, generator=gen, device=gen.device).cpu()
    table = torch.zeros(len(seqs), max(counts), dtype=torch.int32)
    slots: list[torch.Tensor] = []
    at = 0
    for i, ((c, k), n) in enumerate(zip(seqs, counts)):
        mine = order[at:at + n]
        at += n
        table[i, :n] = mine.to(torch.int32)
        pos = torch.arange(k, k + c)
        slots.append(mine[pos // page].long() * page + pos % page)
    q_lens = [c for c, _ in seqs]
    k_lens = [c + k for c, k in seqs]
    cu_q = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + k_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    pool_k = torch.randn(total, page, kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
    pool_v = torch.randn(total, page, kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
    return PagedStep(q_lens=q_lens, k_lens=k_lens, page=page, cu_seq_q=cu_q.to(device), cu_seq_k=cu_k.to(device),
                     seqused_k=torch.tensor(k_lens, dtype=torch.int32, device=device),
                     block_table=table.to(device), slots=torch.cat(slots).to(device), pool_k=pool_k, pool_v=pool_v)


def write_kv(st: PagedStep, k_new, v_new) -> None:
    """The new tokens' keys and values into their slots (vLLM's reshape_and_cache_flash). k_new: [n, Hk, d]."""
    hk, d = st.pool_k.shape[2], st.pool_k.shape[3]
    st.pool_k.view(-1, hk, d).index_copy_(0, st.slots, k_new)
    st.pool_v.view(-1, hk, d).index_copy_(0, st.slots, v_new)


def flash_attention(q, st: PagedStep, pass_cu_k: bool = True):
    """One FlashAttention varlen call over the paged pool (CUDA). q: [n, Hq, d] -> [n, Hq, d]."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, st.pool_k, st.pool_v, st.cu_seq_q, st.cu_seq_k if pass_cu_k else None, st.max_q,
                       st.max_k, window_size=(-1, 0), enable_gqa=True, seqused_k=st.seqused_k,
                       block_table=st.block_table)


def reference_attention(q, st: PagedStep):
    """The same attention, sequence by sequence: gather its pages, causal SDPA aligned to the bottom right."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    hk, d = st.pool_k.shape[2], st.pool_k.shape[3]
    outs = []
    start = 0
    for i, (c, t) in enumerate(zip(st.q_lens, st.k_lens)):
        pages = st.block_table[i, :math.ceil(t / st.page)].long()
        k = st.pool_k.index_select(0, pages).reshape(-1, hk, d)[:t].transpose(0, 1).unsqueeze(0)
        v = st.pool_v.index_select(0, pages).reshape(-1, hk, d)[:t].transpose(0, 1).unsqueeze(0)
        qh = q[start:start + c].transpose(0, 1).unsqueeze(0)
        mask = None if c == 1 else causal_lower_right(c, t)
        outs.append(F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1))
        start += c
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def attend(kernel: str, q, k_new, v_new, st: PagedStep, pass_cu_k: bool = True):
    """Write the new K/V, then attend: q [n, Hq, d], k_new/v_new [n, Hk, d] -> [n, Hq * d]."""
    write_kv(st, k_new, v_new)
    o = flash_attention(q, st, pass_cu_k) if kernel == "flash" else reference_attention(q, st)
    return o.reshape(q.shape[0], -1)


def resolve(attention: str, device: str, q_heads: int, kv_heads: int, head_dim: int,
            dtype) -> tuple[str, str, int, bool]:
    """(layout, kernel, page size, pass cu_seq_k) for the stack's `attention` setting on `device`:
    sdpa -> the padded layout (decodes padded to the longest, SDPA with a mask; each prefill chunk alone);
    paged -> the paged pool with FlashAttention where the probe passes, the reference on a CPU, an error on a
    GPU without the kernel; auto -> paged where FlashAttention runs, else sdpa."""
    from capacity.errors import ConfigError

    if attention not in ("auto", "sdpa", "paged"):
        raise ConfigError(f"--attention-kernel: auto, sdpa or paged (got {attention!r})")
    if attention == "sdpa":
        return "sdpa", "sdpa", 0, True
    found = probe_flash(kv_heads, q_heads, head_dim, device, dtype)
    if found is not None:
        return "paged", "flash", found[0], found[1]
    if attention == "auto":
        return "sdpa", "sdpa", 0, True
    if str(device).startswith("cuda"):
        raise ConfigError(f"--attention-kernel paged: torch on {device} cannot run paged FlashAttention "
                          "(torch.nn.attention.varlen.varlen_attn with a block table); use --attention-kernel sdpa")
    return "paged", "reference", PAGE_SIZES[0], True


def probe_flash(kv_heads: int, q_heads: int, head_dim: int, device, dtype) -> tuple[int, bool] | None:
    """The first (page size, pass cu_seq_k) with which `varlen_attn` runs on `device` and agrees with the
    reference on a mixed step (two prefill chunks, one of them on cached keys, and three decodes that cross
    page boundaries); None if there is none (no CUDA, a torch without the kernel, or disagreement)."""
    import torch

    if not str(device).startswith("cuda"):
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return None
    seqs = [(37, 0), (20, 300), (1, 15), (1, 16), (1, 517)]
    n = sum(c for c, _ in seqs)
    for page in PAGE_SIZES:
        for pass_cu_k in (True, False):
            gen = torch.Generator(device=device).manual_seed(11)
            try:
                st = build_step(seqs, kv_heads, head_dim, page=page, device=device, dtype=dtype, gen=gen, spare_pages=3)
                q = torch.randn(n, q_heads, head_dim, generator=gen, device=device, dtype=dtype)
                kn = torch.randn(n, kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
                vn = torch.randn(n, kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
                with torch.inference_mode():
                    write_kv(st, kn, vn)
                    got = flash_attention(q, st, pass_cu_k).float()
                    ref = reference_attention(q, st).float()
                torch.cuda.synchronize(device)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                continue
            if bool((got - ref).abs().max() <= 0.02 * ref.abs().max().clamp(min=1e-3)):
                return page, pass_cu_k
    return None
