"""vLLM's start-up memory accounting (`VllmMemory`, mixed into `capacity.engine.vllm.Vllm`): the weights, the
activation peak of the profiling run, non-torch memory, CUDA-graph memory, persistent runner buffers and the KV
blocks that are left, for any release from 0.4 to the current one (`capacity.engine.vllm_release` holds what
changes between releases; `docs/memory.md` the derivation of every term with the code it comes from and the logs
it was checked on). It changes when a release changes its profiler or a new start-up log moves an empirical
term; vLLM's defaults, scheduler and launch command live in `capacity.engine.vllm`.

Start-up memory, per TP rank. The worker loads the weights, runs one profiling pass of
max_num_batched_tokens tokens followed by a dummy sampler run over full-vocabulary logits, and then
    requested  = total_gpu_memory x gpu_memory_utilization
    KV budget  = requested - weights - activation peak - non-torch memory
                 [- persistent runner buffers, where the release's profiler counts them]
                 [- the CUDA-graph estimate, from vLLM 0.20 or with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1]
    num_blocks = floor(KV budget / block bytes)
A block is block_size tokens of every layer; with sliding-window layers (V1 >= 0.10's hybrid allocator) it is
block_size tokens of one group of layers, and every group draws from the same pool.

Weights are exact from the card (the quantisation scales included). The activation peak is derived from the
release's code: the larger of the forward pass (per-layer live tensors) and the sampler phase (rows x
vocabulary x the bytes per logit of the release's top-k/top-p path, plus the hidden states it keeps alive,
the Triton top-k buffer and persistent MoE workspaces). Non-torch memory and CUDA-graph memory are
empirical: their values and ranges come from the real start-up logs in tests/data/vllm_startup. Every
estimated term carries a [low, high] range; the KV budget's range follows, and the planner uses its
conservative end unless `kv_estimate: middle`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from capacity.engine.budget import KVGroups, MemoryBudget, check_fits, fit_problem, kv_bytes_per_token
from capacity.engine.config import EngineConfig, ResolvedEngine
from capacity.engine.vllm_release import Release
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import ExpertLayout, lora_bytes_per_rank, tensor_groups, weight_bytes_per_rank
from capacity.units import DTYPE_BYTES, GiB, MiB


@dataclass(frozen=True)
class Est:
    """An estimated term: the middle and its [lo, hi] range, bytes."""

    mid: float
    lo: float
    hi: float

    @classmethod
    def exact(cls, v: float) -> Est:
        return cls(v, v, v)

    def __add__(self, o: Est) -> Est:
        return Est(self.mid + o.mid, self.lo + o.lo, self.hi + o.hi)


# ---- empirical terms, from the real start-up logs (tests/data/vllm_startup/logs.yaml) ----------------------
# Non-torch memory at tp=1 as each profiler counts it, GiB: (middle, low, high) over the logs of that family.
NON_TORCH_TP1 = {
    # device-wide used - torch allocated (the CUDA context is in it): 0.35 on an RTX 3090 (0.6.4)
    "absolute": (0.35, 0.25, 0.60),
    # free at init - free after profiling, context excluded; no log seen: the snapshot family's spread, widened
    "free-delta": (0.15, 0.05, 0.40),
    # V0 0.7-0.10 snapshot: 0.03-0.09 over T4, RTX 4060/4090, A100 (six logs)
    "v0-snapshot": (0.06, 0.03, 0.10),
    # V0 0.6.5-0.6.6 (utils.py memory_profiling): non-torch growth since the baseline (lazily loaded kernel
    # modules, cuBLAS handles) plus what torch keeps reserved but unallocated after empty_cache and torch buffers
    # alive before the profile that are not weights: read from the released code, nothing near 1.8 GiB at TP 1
    # (the 1.79 of vllm#10511 came from an intermediate commit whose log format no release has)
    "v0-0.6.5": (0.15, 0.05, 0.45),
    # V1 0.9.1-0.16: 0.02 (L4), 0.13-0.14 (H100, four logs)
    "v1-snapshot": (0.14, 0.02, 0.20),
    # V1 0.17-0.26: 0.25-0.27 on H100 (vLLM 0.19, nine logs)
    "v1-0.17": (0.25, 0.20, 0.30),
    # V1 0.27+: free memory consumed (non-torch and allocator slack); not yet seen in a log
    "consumed": (0.30, 0.20, 0.50),
}
# Extra non-torch memory at tp > 1, GiB, as the logs show it where the profiler counts the communicators (V1
# 0.9.1-0.10, whose snapshot precedes the distributed init, and 0.17+, which adds FlashInfer's all-reduce fusion
# workspace on Hopper/Blackwell): 1.79-1.96 at tp 2-4 on NVSwitch H100 boards (the 0.10 Qwen3-235B tp4 log,
# eight 0.19 logs); other links hold NCCL's ring buffers and the custom all-reduce's IPC buffers. The middle is
# the median of the logs after taking off the per-peer growth.
NON_TORCH_MULTI = {"nvls": (1.82, 1.78, 1.90), "nvlink": (0.50, 0.20, 1.00), "pcie": (0.17, 0.05, 0.40)}
NON_TORCH_PER_PEER_GIB = 0.04  # growth per extra rank (tp 2 -> 4: +0.06 to +0.11 in the 0.19 logs)
# One NCCL communicator's buffers per rank, GiB, where the code says which communicators a profiler counts:
# channels x (4 MiB SIMPLE + 4.7 MiB LL128 + 0.5 MiB LL) x (ring, tree): 2-4 channels over PCIe, 8-32 over
# NVLink. An estimate from NCCL's defaults, not measured: the range is wide.
NCCL_COMM_GIB = {"nvls": (0.30, 0.10, 0.60), "nvlink": (0.25, 0.08, 0.60), "pcie": (0.06, 0.02, 0.15)}
CUSTOM_AR_GIB = 0.026  # the custom all-reduce's 8 MiB meta + 8 MiB buffer + 8 MiB rank data (every release)
# CUDA-graph memory per captured piece, MiB: 0.36-0.58 over nine vLLM 0.19 H100 logs of dense and MoE models;
# 1.1 for DeepSeek-V2-Lite (MLA's full graphs).
GRAPH_SEGMENT_MIB = (0.45, 0.35, 0.60)
GRAPH_SEGMENT_MLA_MIB = (1.10, 0.90, 1.30)
# What the logs show beyond the derived activation peak: +0.00 to +0.06 GiB (0.19, fourteen logs) and
# -0.15 to +0.06 (0.8-0.11): the high end adds this much.
ACTIVATION_SLACK_GIB = 0.06
# Weights are counted exactly, but vLLM allocates a little beyond the checkpoint for some architectures (derived
# MLA matrices, multimodal extras): logs of plain dense decoders agree within 0.1%; MoE, MLA, sliding-window and
# vision models were up to 0.6% above the count. The high end of the weights term adds this share.
WEIGHTS_SPREAD = {"plain": 0.002, "other": 0.01}
# Vision encoders' profiling (dummy items, their outputs) is read from code and checked on two logs: wider.
VISION_ACTIVATION_SPREAD = 0.05


def compute_capability(gpu: GPU) -> int | None:
    """The CUDA compute capability as an integer (sm90 -> 90) from the catalogue's arch; None for AMD or unknown."""
    m = re.search(r"\bsm_?(\d{2,3})\b", gpu.arch or "")
    return int(m[1]) if m else None


def mxfp4_layout(card: ModelCard, gpu: GPU, rel: Release) -> ExpertLayout | None:
    """How vLLM's MXFP4 MoE path stores the experts on this GPU (`quantization/mxfp4.py`, read in 0.11):
    `get_mxfp4_backend` picks FlashInfer on sm100 (intermediate and hidden padded to 256), Triton's matmul_ogs
    on sm90 and newer consumer parts (swizzled copies of the weights replace the checkpoint's, but the
    checkpoint's scales stay registered beside the swizzled ones: counted twice), Marlin before sm90
    (intermediate padded to 128, hidden to 256, weights and scales re-packed in place), and on ROCm 256/256.
    gpt-oss arrived in 0.10.1; before it, and for other formats, None."""
    if "mxfp4" not in (card.weight_format, *card.weight_formats.values()) or rel.runner != "v1":
        return None
    if rel.version < (0, 10, 1):
        return None
    cc = compute_capability(gpu)
    if cc is None:
        if "cdna" in (gpu.arch or "").lower() or gpu.name.startswith("mi"):
            return ExpertLayout("rocm", pad_intermediate=256, pad_hidden=256)
        return None
    if cc == 100:
        return ExpertLayout("flashinfer-sm100", pad_intermediate=256, pad_hidden=256)
    if cc >= 90:
        return ExpertLayout("triton", pad_intermediate=64, checkpoint_scales_kept=True)
    return MARLIN_MXFP4


MARLIN_MXFP4 = ExpertLayout("marlin", pad_intermediate=128, pad_hidden=256)


def mxfp4_layout_alternative(layout: ExpertLayout | None, rel: Release) -> ExpertLayout | None:
    """The other path an install may take: before 0.13 (which vendors triton_kernels) a pip install without the
    triton_kernels package falls back from Triton to Marlin on Hopper (a 0.10.1 H100 log loads gpt-oss-120b at
    65.97 GiB: Marlin's 65.98, not Triton's 64.20). The weights' high end takes it."""
    if layout is not None and layout.name == "triton" and rel.version < (0, 13, 0):
        return MARLIN_MXFP4
    return None


def blas_workspace_bytes(gpu: GPU) -> int:
    """PyTorch's cuBLAS workspace, allocated through the caching allocator on the first GEMM (in the profiling
    run, so inside the torch peak): CUBLAS_WORKSPACE_CONFIG's default ':4096:8' (32 MiB) on sm90 and newer,
    ':4096:2:16:8' (8.125 MiB) before."""
    arch = (gpu.arch or "").lower()
    sm = next((int(t[2:]) for t in arch.replace(",", " ").split() if t.startswith("sm") and t[2:].isdigit()), 0)
    return 32 * MiB if sm >= 90 else 8 * MiB + 128 * 1024


def cudagraph_capture_sizes(max_num_seqs: int, rel: Release | None = None) -> list[int]:
    """vLLM's default capture sizes. V1: 1, 2, 4, then steps of 8 to 256, then steps of 16, up to
    min(2 x max_num_seqs, 512). V0: 1, 2, 4, then steps of 8 up to min(max_num_seqs, 256) (rounded up to 8)."""
    if rel is not None and rel.runner == "v0":
        top = min(256, -(-max_num_seqs // 8) * 8)
        return [s for s in [1, 2, 4, *range(8, 257, 8)] if s <= top]
    top = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return [s for s in sizes if s <= top]


def kv_groups(card: ModelCard, rel: Release, block_size: int) -> KVGroups:
    """The KV layout vLLM uses for the card. V1 >= 0.9.1 gives sliding-window layers their own groups (group
    size: the smaller layer count, or the larger one when they differ by under 25%); older engines and V0
    treat every layer as full attention. A model whose every layer slides is one sliding group."""
    if card.state is not None:
        return _state_groups(card, rel)
    n_slide = card.num_sliding_layers
    if not n_slide or card.sliding_window is None or not rel.hybrid_kv:
        return KVGroups()
    window_blocks = -(-(card.sliding_window - 1) // block_size) + 1
    n_full = card.num_kv_layers - n_slide
    if n_full == 0:
        return KVGroups(full=0, sliding=1, group_size=n_slide, window_blocks=window_blocks, window=card.sliding_window)
    lo, hi = min(n_full, n_slide), max(n_full, n_slide)
    size = hi if hi < lo * 1.25 else lo
    return KVGroups(full=-(-n_full // size), sliding=-(-n_slide // size), group_size=size, window_blocks=window_blocks,
                    window=card.sliding_window)


def kv_layout_card(card: ModelCard, rel: Release) -> ModelCard:
    """The card as the release lays out its KV cache. DeepSeek's latent attention is cached as MLA from 0.7.1;
    before, as plain multi-head attention over every head: head size 256 (the 192 of q/k and the 128 of v both
    padded, deepseek_v2.py "TODO, support head_size 192") in 0.5.1-0.6.6, 192 in 0.7.0."""
    if card.mla is None or rel.version >= (0, 7, 1):
        return card
    m = card.mla
    size = m.qk_nope_head_dim + m.qk_rope_head_dim if rel.version >= (0, 7, 0) else 256
    return card.model_copy(update={"mla": None, "num_kv_heads": card.num_attention_heads, "head_dim": size})


def state_dtype_bytes(card: ModelCard, rel: Release) -> tuple[float, float]:
    """(convolution, SSM) state bytes per element as vLLM's MambaStateDtypeCalculator picks them with
    mamba_cache_dtype and mamba_ssm_cache_dtype left at auto: the model dtype, except Nemotron-H from 0.13 (the
    config's mamba_ssm_cache_dtype; float16 where it has none, float32 from 0.27) and gated DeltaNet from 0.17
    (the config's dtype where it names one)."""
    st = card.state
    assert st is not None
    conv = DTYPE_BYTES[card.dtype]
    ssm = conv
    if card.architecture == "nemotron_h" and rel.version >= (0, 13, 0):
        ssm = DTYPE_BYTES[st.ssm_dtype] if st.ssm_dtype else (4.0 if rel.version >= (0, 27, 0) else 2.0)
    elif st.kind == "gated_deltanet" and rel.version >= (0, 17, 0) and st.ssm_dtype:
        ssm = DTYPE_BYTES[st.ssm_dtype]
    return conv, ssm


def mamba_page_bytes(card: ModelCard, rel: Release, tp: int) -> int:
    """One state layer's state for one sequence on one rank (vLLM's MambaSpec.page_size_bytes)."""
    conv, ssm = card.state.state_elements(tp) if card.state is not None else (0, 0)
    cb, sb = state_dtype_bytes(card, rel)
    return int(conv * cb + ssm * sb)


def hybrid_block_size(card: ModelCard, rel: Release, tp: int, kv_dtype: str, block_size: int) -> int:
    """The attention block size vLLM sets for a hybrid model so that one attention page (block_size tokens of one
    layer) holds a whole state (HybridAttentionMambaModelConfig.verify_and_update_config, read in 0.10.2-0.34):
    16 x cdiv(state page, 16 x one token's KV), never below the configured size; the state page is padded to
    it. A model without attention layers keeps the block size (one group of state layers)."""
    if card.num_kv_layers == 0:
        return block_size
    token = card.kv_elements_per_token_per_layer(tp) * DTYPE_BYTES[kv_dtype]
    align = 16
    need = align * -(-mamba_page_bytes(card, rel, tp) // int(align * token))
    return max(block_size, need)


def _state_groups(card: ModelCard, rel: Release) -> KVGroups:
    """A hybrid's groups (kv_cache_utils' uniform-page grouping): layers of each kind in groups of group_size (the
    smaller count, or the larger when they differ by under 25%, 50% from 0.34), every group drawing same-size
    pages from one pool; an attention group holds a page per block_size tokens, a state group one page per
    sequence (prefix caching off, vLLM's default for hybrids before 0.34)."""
    st = card.state
    assert st is not None
    n_attn, n_state = card.num_kv_layers, st.num_layers
    if n_attn == 0:
        return KVGroups(full=0, state=1, group_size=n_state)
    lo, hi = min(n_attn, n_state), max(n_attn, n_state)
    slack = 1.5 if rel.version >= (0, 34, 0) else 1.25
    size = hi if hi < lo * slack else lo
    return KVGroups(full=-(-n_attn // size), state=-(-n_state // size), group_size=size)


def _stage_sizes(card: ModelCard, pp: int, partition: list[int] | None) -> list[int]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them (VLLM_PP_LAYER_PARTITION where given): an
    even split, the remainder one layer each to the stages before the last, from the second-to-last back."""
    n = card.num_layers
    if partition is not None:
        if len(partition) != pp or sum(partition) != n:
            raise ConfigError(f"pp_layer_partition {partition}: needs {pp} stages summing to {n} layers")
        return list(partition)
    if pp > n:
        raise ConfigError(f"pipeline_parallel_size {pp}: more stages than the {n} layers of {card.name}")
    parts = [n // pp] * pp
    for i in range(2, n % pp + 2):
        parts[-i] += 1
    return parts


def pp_stages(card: ModelCard, pp: int, partition: list[int] | None = None) -> list[ModelCard]:
    """The card of each pipeline stage: its layers (a DeepSeek-style model's first dense layers where they fall),
    the embedding and a vision tower on the first, the final norm and the LM head on the last."""
    if card.state is not None or card.num_sliding_layers or card.cross_attention_layers:
        raise ConfigError(f"pipeline_parallel_size {pp}: stages of {card.name} (hybrid, sliding-window or "
                          "cross-attention layers) are not modelled")
    out, start = [], 0
    first_dense = card.moe.first_dense_layers if card.moe is not None else 0
    for i, n in enumerate(_stage_sizes(card, pp, partition)):
        upd: dict = {"num_layers": n, "has_embedding": i == 0, "has_lm_head": i == pp - 1,
                     "attention_layers": n}
        if card.moe is not None:
            dense = max(0, min(start + n, first_dense) - start)
            upd.update(dense_mlp_layers=dense, moe_layers=n - dense)
        if i:
            upd["vision"] = None
        out.append(card.model_copy(update=upd))
        start += n
    return out


class VllmMemory:
    """The start-up memory accounting of one vLLM release (see module docstring). `Vllm` supplies the release,
    its name, its defaults (`resolve`) and its async-scheduling default, which the accounting reads."""

    name: str
    release: Release

    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        raise NotImplementedError  # Vllm.resolve

    def async_scheduling(self, cfg: EngineConfig) -> bool:
        raise NotImplementedError  # Vllm.async_scheduling

    # ---- the activation peak -------------------------------------------------------------------------
    def activation_phases(self, card: ModelCard, eng: ResolvedEngine, gpu: GPU) -> tuple[dict[str, float], float]:
        """Torch peak increase of the profiling run, per rank, by phase, and the sampler phase at the optimistic
        end of the release's top-k/top-p paths (the middle is `phases['sampler']`).

        Forward pass over N = max_num_batched_tokens tokens: the largest set of tensors alive at once in one
        layer. Sampler phase: R rows of full-vocabulary logits (every rank holds all of them) at the release's
        bytes per logit, the hidden states the profile keeps alive, and buffers allocated there that persist.
        """
        rel, p = self.release, eng.cfg.memory_params
        b = DTYPE_BYTES[card.dtype]
        n, tp, h = eng.max_num_batched_tokens, eng.tp, card.hidden_size
        ar_out = h if tp > 1 else 0  # out-of-place all-reduce result
        if card.mla is None:
            hd = card.head_dim_
            q = card.num_attention_heads // tp * hd
            kv = 2 * max(1, card.num_kv_heads // tp) * hd
            attn = 2 * h + (q + kv) + q + h + ar_out
        else:
            m = card.mla
            heads = card.num_attention_heads // tp
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            attn = (2 * h + (m.q_lora_rank or 0) + heads * qk + (m.kv_lora_rank + m.qk_rope_head_dim)
                    + heads * (qk + m.v_head_dim) + heads * m.v_head_dim + h + ar_out)
        phases = {"forward_attention": n * b * attn}
        if card.num_dense_layers:
            i = math.ceil(card.intermediate_size / tp)
            # residual, the normed input, gate/up output, the activation's output, and the layer input the
            # caller still holds (V0 0.6.4 logs: 2.07 GiB at 20k tokens and 2.99 at 29k for Llama-3.1-8B)
            phases["forward_mlp"] = n * b * (3 * h + 3 * i + ar_out)
        workspace = 0.0
        if card.moe is not None:
            moe = card.moe
            cap = rel.fused_moe_chunk(p.fused_moe_chunk_tokens)
            chunk = n if cap is None else min(n, cap)
            # expert parallelism keeps whole experts on a rank; otherwise TP splits each expert
            mi = moe.moe_intermediate_size if eng.cfg.enable_expert_parallel else math.ceil(moe.moe_intermediate_size / tp)
            si = math.ceil(moe.shared_intermediate / tp)
            # wn: rows of the fused gate/up weight per rank (up alone for a non-gated MLP); kk: the width the
            # experts read (a latent MoE's latent size, else hidden)
            k, wn = moe.experts_per_token, (2 if card.gated_mlp else 1) * mi
            kk = moe.latent_size or h
            if rel.moe_workspace_persistent:  # TritonExperts' workspaces: (M, k, max(N/2, K)) and (M, k, max(N, K))
                workspace = chunk * k * b * (max(wn // 2, kk) + max(wn, kk))
            elif rel.version < (0, 5, 5):  # three caches: gate/up output, activation, down output
                workspace = chunk * k * b * (wn + wn // 2 + kk)
            else:  # fused_experts_impl: one flat cache for gate/up and down outputs, one for the activation
                workspace = chunk * k * b * (max(wn, kk) + wn // 2)
            per_tok = 2 * h + moe.num_experts + (h if si else 0) + ar_out  # hidden, router logits, shared out
            phases["forward_moe"] = n * b * per_tok + workspace + n * k * 8 + (n * b * 3 * si if si else 0)
        if card.state is not None:  # the mixer's input projection, its output and the residual stream
            st = card.state
            proj = next(t for t in tensor_groups(card) if t.name == "state_in_proj").rows
            phases["forward_state"] = n * b * (3 * h + math.ceil(proj / tp) + 2 * math.ceil(max(st.inner, st.heads * st.head_dim) / tp) + ar_out)
        enc_out = 0.0
        if card.vision is not None:
            phases["encoder"], enc_out = self._encoder_bytes(card, eng)
        rows = rel.sampler_rows(eng.max_num_seqs, n)
        d = b
        mid_b, lo_b = rel.sampler_bytes_per_logit(d, rows, card.is_dense)
        if p.sampler_bytes_per_logit is not None:
            mid_b = lo_b = d + p.sampler_bytes_per_logit
        hidden = (n if rel.hidden_states_alive_in_sampler else rows) * h * b
        persistent = float(rel.triton_topk_buffer(rows, card.vocab_size, gpu.sm_count or 132))
        if card.moe is not None and rel.moe_workspace_persistent:
            persistent += workspace
        # the sampled rows [R, hidden], and from 0.9 their random replacement (rand_like) beside them
        copies = 2 if rel.runner == "v1" and rel.version >= (0, 9, 0) else 1
        base = (hidden + copies * rows * h * b + persistent + (enc_out if rel.runner == "v1" else 0.0)
                + blas_workspace_bytes(gpu))
        if not card.has_lm_head:  # a pipeline stage before the last samples nothing
            return phases, max(phases.values())
        phases["sampler"] = rows * card.vocab_size * mid_b + base
        return phases, rows * card.vocab_size * lo_b + base

    def encoder_items(self, card: ModelCard, eng: ResolvedEngine) -> int:
        """Dummy images the profiling run sends through the encoder, in one batch (read per release).

        V0's decoder-only runner (`ModelRunner.profile_run`): n = max(1, min(max_num_seqs, mnbt // T)) sequences,
        each with one image (V0's limit per prompt), so n images; 0.7.x drops the image from a dummy prompt longer
        than its share of the budget (0 images when T > mnbt). V0's encoder-decoder runner (Mllama): every one of
        max_num_seqs sequences carries an image, no cap. V1: as many items as the encoder budget B = max(mnbt, T)
        holds, ceil(B / T) to 0.9, floor from 0.10 (at least 1), and from 0.10.1 at most max_model_len // T per
        request."""
        v = card.vision
        assert v is not None
        rel, n, t = self.release, eng.max_num_batched_tokens, v.tokens_per_image
        if rel.runner == "v0":
            if v.kind == "mllama":
                return max(1, eng.max_num_seqs)
            if (0, 7, 0) <= rel.version < (0, 8, 0) and t > n:
                return 0
            return max(1, min(eng.max_num_seqs, n // t))
        budget = max(n, t)
        if rel.version < (0, 10, 0):
            return -(-budget // t)
        items = max(1, budget // t)
        if rel.version >= (0, 10, 1):
            items = max(1, min(items, eng.max_num_seqs * max(1, min(999, eng.max_model_len // t))))
        return items

    def _encoder_bytes(self, card: ModelCard, eng: ResolvedEngine) -> tuple[float, float]:
        """(the vision encoder's profiling peak, its outputs that stay alive through the text pass and sampler).

        The items of `encoder_items` run as one batch. Per encoder token, what one layer keeps alive: ViTs the
        residual, the normed input, the MLP hidden and its activation (2h + 2i); Pixtral also the gated MLP's
        second half, the conv output the pool still references and the layer input (5h + 3i), and from 0.12 to
        0.28 (no xformers in the wheel) transformers' dense block-diagonal mask over every patch of the batch,
        [N, N] in bf16; Mllama keeps five layer outputs as well (2h + 2i + 5h: 0.29 GiB per image, which the
        0.7.0 log of 128 images, 36.63 GiB, bears out; the code suggests a dense [L, L] aspect-ratio mask and a
        stacked copy of the kept outputs on top, 0.46 GiB, which no log shows). The projected outputs (per
        language-model token) stay referenced:
        V1 keeps them until after the sampler; 0.12 pads a shorter output to T rows.
        """
        v = card.vision
        assert v is not None
        b = DTYPE_BYTES[card.dtype]
        rel = self.release
        items = self.encoder_items(card, eng)
        if items == 0:
            return 0.0, 0.0
        rows = max(eng.max_num_batched_tokens, v.tokens_per_image) if rel.encoder_output_padded else v.tokens_per_image
        out = items * rows * card.hidden_size * b  # 0.11 pads each output to the budget (the original is freed)
        pixels = items * 3 * v.image_size ** 2 * v.max_num_tiles * b  # the dummy images stay referenced
        if v.kind == "pixtral":
            patches = items * v.patches_per_tile
            peak = patches * b * (5 * v.hidden_size + 3 * v.intermediate_size)
            if rel.runner == "v1" and (0, 12, 0) <= rel.version < (0, 29, 0):
                peak += patches ** 2 * 2  # the dense [1, 1, N, N] bf16 mask
            return peak + out + pixels, out + pixels
        if v.kind == "mllama" and rel.runner == "v0" and rel.version < (0, 7, 0):
            # 0.6.x (a 1024 x 1024 dummy image): the aspect-ratio mask [L, L] (L = tiles x 1608, padded) and 23
            # live [L, h] tensors (the five kept outputs, their stacked copy, input, residual, norm, the MLP), plus
            # fp32 pixels twice: 0.46 GiB an image, as the 0.6.3 log of 128 images on a GH200 shows (2,252 blocks)
            length = v.max_num_tiles * (-(-(v.patches_per_tile + 1) // 8) * 8)
            per_image = length ** 2 * b + 23 * length * v.hidden_size * b + 2 * v.max_num_tiles * 3 * v.image_size ** 2 * 4
            return items * per_image + out, out
        per_tok = b * (2 * v.hidden_size + 2 * v.intermediate_size + v.kept_layer_outputs * v.hidden_size)
        return items * v.encoder_tokens_per_image * per_tok + out + pixels, out + pixels

    # ---- the budget ------------------------------------------------------------------------------------
    def non_torch(self, eng: ResolvedEngine, gpu: GPU) -> Est:
        rel, p = self.release, eng.cfg.memory_params
        acc = rel.accounting
        if acc == "snapshot" and rel.runner == "v0":
            key = "v0-0.6.5" if rel.version < (0, 7, 0) else "v0-snapshot"
        elif acc == "snapshot":
            key = "v1-snapshot" if rel.version < (0, 17, 0) else "v1-0.17"
        else:
            key = acc
        base = Est(*(x * GiB for x in NON_TORCH_TP1[key]))
        if p.non_torch_bytes is not None:
            base = Est.exact(p.non_torch_bytes)
        tp = eng.tp
        if tp == 1 and (eng.cfg.pipeline_parallel_size > 1 or eng.cfg.data_parallel_size > 1):
            tp = 2  # one more communicator (the stages' send/recv, the data-parallel group): counted as at TP 2
        if tp == 1:
            return base
        link = "nvls" if gpu.nvls else ("nvlink" if gpu.interconnect.startswith("nvlink") else "pcie")
        if p.non_torch_multi_gpu_bytes is not None:
            multi = Est.exact(p.non_torch_multi_gpu_bytes)
        else:
            multi = self.multi_gpu_non_torch(tp, link, p.cuda_context_bytes)
        if self._multi_from_logs():
            peer = NON_TORCH_PER_PEER_GIB * GiB if p.non_torch_per_peer_bytes is None else p.non_torch_per_peer_bytes
            multi = multi + Est.exact((tp - 2) * peer)
        return base + multi

    def _multi_from_logs(self) -> bool:
        rel = self.release
        return rel.runner == "v1" and ((0, 9, 1) <= rel.version < (0, 11, 0) or rel.version >= (0, 17, 0))

    def multi_gpu_non_torch(self, tp: int, link: str, context_bytes: float) -> Est:
        """What the profiler counts of the communicators at tp > 1 (read per release in worker.py/gpu_worker.py
        init_device, parallel_state.py, pynccl.py, custom_all_reduce.py):

        - V1 0.9.1-0.10 and 0.17+: the logs' figure (the snapshot precedes the distributed init; 0.17 adds
          FlashInfer's all-reduce fusion workspace).
        - V1 0.11-0.16: the distributed init precedes the snapshot, so only the torch device group's NCCL
          communicator, created lazily by the profile's logits all_gather, is counted: one communicator (the
          high end keeps the logs' figure: what NCCL connects lazily on a first large collective is unmeasured).
        - V0 0.6.4-0.10: pynccl, used eagerly from 0.6.5, and the lazy torch communicator of the input
          broadcast, plus the custom all-reduce's buffers.
        - V0 0.4.0-0.6.3 (free memory consumed since init): the world group's, pynccl's and the TP group's
          communicators (two from 0.5.5: no world warm-up), and the CUDA contexts other ranks open on this GPU:
          tp - 1 in 0.4.0 (`_can_actually_p2p` copies to every peer), one in 0.4.1-0.4.2 (rank 0 builds the P2P
          cache in-process on a first run), none from 0.4.3 (a subprocess)."""
        rel = self.release
        comm = NCCL_COMM_GIB[link]
        if self._multi_from_logs():
            return Est(*(x * GiB for x in NON_TORCH_MULTI[link]))
        if rel.runner == "v1":  # 0.11-0.16
            mid, lo, _ = comm
            return Est(mid * GiB, lo * GiB, NON_TORCH_MULTI[link][2] * GiB)
        if rel.accounting == "free-delta":
            comms = 3 if rel.version <= (0, 5, 0) else 2
            contexts = tp - 1 if rel.version < (0, 4, 1) else (1 if rel.version < (0, 4, 3) else 0)
            ctx = contexts * context_bytes
            return Est(comms * comm[0] * GiB + ctx + CUSTOM_AR_GIB * GiB, comms * comm[1] * GiB + 0.6 * ctx,
                       comms * comm[2] * GiB + 1.6 * ctx + CUSTOM_AR_GIB * GiB)
        return Est(*((2 * x + CUSTOM_AR_GIB) * GiB for x in comm))

    def runner_buffers(self, card: ModelCard, eng: ResolvedEngine, groups: KVGroups) -> float:
        """Persistent model-runner buffers made before profiling, counted only by the absolute (V1 0.7-0.9.0)
        and consumed (0.27+) profilers: input ids, positions, slot mapping, input embeddings, block tables,
        and Model Runner V2's penalty bins."""
        rel = self.release
        if rel.runner != "v1" or rel.accounting not in ("absolute", "consumed"):
            return 0.0
        n = eng.max_num_batched_tokens
        tables = eng.max_num_seqs * math.ceil(eng.max_model_len / eng.block_size) * 4 * max(1, groups.groups)
        bins = rel.output_bin_counts(eng.max_num_seqs, card.vocab_size, card.is_dense)
        return n * (4 + 8 + 8) + n * card.hidden_size * DTYPE_BYTES[card.dtype] + tables + bins

    def cuda_graphs(self, card: ModelCard, eng: ResolvedEngine, fwd_per_token: float) -> Est:
        p = eng.cfg.memory_params
        sizes = cudagraph_capture_sizes(eng.max_num_seqs, self.release)
        # V1: piecewise graphs (one piece per layer + 1) and full decode graphs; V0's whole-model graphs cost about
        # as much per layer (0.2-0.8 MiB per size and layer in five V0 logs)
        segments = len(sizes) * (card.num_layers + 1) + len(sizes)
        act = max(sizes) * fwd_per_token
        if p.cuda_graph_bytes_per_segment is not None:
            return Est.exact(act + segments * p.cuda_graph_bytes_per_segment)
        mib = GRAPH_SEGMENT_MLA_MIB if card.mla is not None else GRAPH_SEGMENT_MIB
        return Est(*(act + segments * x * MiB for x in mib))

    def budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """The VRAM budget. With check_fit, a model or max_model_len that does not fit raises DoesNotFit. With
        pipeline parallelism, every stage's budget (`pp_stages`), and the stage with the fewest blocks is the
        engine's (V1's KV cache config takes the minimum over workers)."""
        pp = cfg.pipeline_parallel_size
        if pp == 1:
            return self._budget(card, gpu, cfg, check_fit=check_fit)
        stages = [self._budget(c, gpu, cfg, check_fit=False) for c in pp_stages(card, pp, cfg.pp_layer_partition)]
        worst = min(range(pp), key=lambda i: stages[i].num_blocks)
        b = replace(stages[worst], model=card.name, warnings=list(stages[worst].warnings))
        sizes = ", ".join(map(str, _stage_sizes(card, pp, cfg.pp_layer_partition)))
        b.warnings.append(f"pipeline parallel {pp}: stages of {sizes} layers hold {', '.join(f'{s.num_blocks:,}' for s in stages)} blocks; the engine keeps stage "
                          f"{worst}'s (each stage on {b.tp} GPU{'s' if b.tp > 1 else ''})")
        if check_fit and not b.fits:
            from capacity.errors import DoesNotFit

            raise DoesNotFit(b.reason)
        return b

    def _budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """The VRAM budget of one rank holding `card` (the whole model, or one pipeline stage)."""
        eng = self.resolve(cfg, card, gpu)
        rel = self.release
        estimates: list[str] = []
        total = gpu.usable_memory_bytes
        usable = total * cfg.gpu_memory_utilization
        layout = mxfp4_layout(card, gpu, rel)
        # bitsandbytes: a double-quantised absmax is dequantised to fp32 at load from 0.10 (`_dequantize_dq`;
        # absent in 0.9.2, present in 0.10.2), kept nested before
        nested = rel.version < (0, 10, 0)
        ep = eng.tp * cfg.data_parallel_size if cfg.enable_expert_parallel else 1
        weights = sum(weight_bytes_per_rank(card, eng.tp, layout, bnb_nested_absmax=nested, ep=ep).values())
        # LoRA adapters' buffers are made while the model loads: inside "model weights"
        weights += lora_bytes_per_rank(card, eng.tp, cfg.max_loras, cfg.max_lora_rank)
        plain = card.is_dense and card.weight_format in ("bf16", "fp16", "fp8", "int8") and not card.weight_formats
        w_hi = weights * (1 + WEIGHTS_SPREAD["plain" if plain else "other"])
        if layout is not None:  # the swizzled scale layouts pad a little more than counted here
            alt = mxfp4_layout_alternative(layout, rel)
            w_alt = sum(weight_bytes_per_rank(card, eng.tp, alt).values()) if alt is not None else weights
            w_hi = max(weights * 1.01, w_alt * 1.002)
            estimates.append(f"weights (mxfp4, {layout.name} layout" + (f", {alt.name} without triton_kernels)"
                                                                         if alt is not None else ")"))
        elif "mxfp4" in (card.weight_format, *card.weight_formats.values()):
            w_hi = weights * 1.06  # a release before gpt-oss support: the kernel layout is not known
            estimates.append("weights (mxfp4 layout)")

        phases, sampler_lo = self.activation_phases(card, eng, gpu)
        fwd = max(v for k, v in phases.items() if k.startswith("forward"))
        if cfg.activation_bytes is not None:
            act = Est.exact(cfg.activation_bytes)
        else:
            mid = max(phases.values())
            lo = max([v for k, v in phases.items() if k != "sampler"] + [sampler_lo])
            slack = ACTIVATION_SLACK_GIB * GiB + (0.10 * mid if rel.accounting == "free-delta" else 0.0)
            if card.vision is not None:
                slack += VISION_ACTIVATION_SPREAD * mid
            if not rel.checked:
                slack += 0.05 * mid  # read from code only: wider
            act = Est(mid, min(lo, mid), mid + slack)
            estimates.append("activation")
        if cfg.non_torch_bytes is not None:
            nt = Est.exact(cfg.non_torch_bytes)
        else:
            nt = self.non_torch(eng, gpu)
            estimates.append("non_torch")
        if cfg.enforce_eager:
            graphs = Est.exact(0.0)
        elif cfg.cuda_graph_bytes is not None:
            graphs = Est.exact(cfg.cuda_graph_bytes)
        else:
            graphs = self.cuda_graphs(card, eng, fwd / eng.max_num_batched_tokens)
            estimates.append("cuda_graphs")
        estimates.append("cuda_context")
        groups = kv_groups(card, rel, eng.block_size)
        if groups.sliding:  # vLLM's max_in_flight_tokens: the budget x concurrent batches (2 with async scheduling)
            groups = replace(groups, inflight=eng.max_num_batched_tokens * (2 if self.async_scheduling(cfg) else 1))
        buffers = self.runner_buffers(card, eng, groups)

        in_budget = eng.cuda_graphs_in_budget
        g_in = graphs if in_budget else Est.exact(0.0)
        kv_mid = usable - weights - act.mid - nt.mid - buffers - g_in.mid
        kv_lo = usable - w_hi - act.hi - nt.hi - buffers - g_in.hi
        kv_hi = usable - weights - act.lo - nt.lo - buffers - g_in.lo
        kv_card = kv_layout_card(card, rel)
        kvpt = kv_bytes_per_token(kv_card, eng.kv_dtype, eng.tp)
        per_layer = kv_card.kv_elements_per_token_per_layer(eng.tp) * DTYPE_BYTES[eng.kv_dtype]
        block_bytes = eng.block_size * (per_layer * groups.group_size if groups.group_size else kvpt)
        if card.state is not None and groups.full == 0:  # state layers only: a page is one sequence's state
            block_bytes = mamba_page_bytes(card, rel, eng.tp) * groups.group_size

        def blocks(kv: float) -> int:
            return max(0, math.floor(kv / block_bytes)) if kv > 0 else 0

        num_blocks, blocks_lo, blocks_hi = blocks(kv_mid), blocks(kv_lo), blocks(kv_hi)
        warnings = list(card.notes)
        if cfg.num_gpu_blocks_override is not None:  # vLLM uses the override instead of what it profiled
            if cfg.num_gpu_blocks_override > num_blocks:
                warnings.append(f"num_gpu_blocks_override {cfg.num_gpu_blocks_override:,} is more than the "
                                f"{num_blocks:,} blocks the memory budget holds: the engine may run out of memory")
            num_blocks = blocks_lo = blocks_hi = cfg.num_gpu_blocks_override
        kv_tokens = num_blocks // max(1, groups.groups) * eng.block_size
        if card.state is not None and rel.version >= (0, 27, 0):  # printed as concurrency x max_model_len
            kv_tokens = int(num_blocks / max(1, groups.startup_blocks(eng.max_model_len, eng.block_size))
                            * eng.max_model_len)
        contiguous = max(0, math.floor(kv_mid / (eng.max_model_len * kvpt))) if kv_mid > 0 else 0
        outside = cfg.memory_params.cuda_context_bytes + (graphs.mid - g_in.mid)
        planning = blocks_lo if cfg.kv_estimate == "conservative" else num_blocks
        per_seq = groups.startup_blocks(eng.max_model_len, eng.block_size)

        b = MemoryBudget(
            model=card.name, gpu=gpu.name, tp=eng.tp, total_bytes=total,
            gpu_memory_utilization=cfg.gpu_memory_utilization, usable_bytes=usable, weights_bytes=weights,
            activation_bytes=act.mid, non_torch_bytes=nt.mid, cuda_graph_bytes=graphs.mid,
            cuda_graphs_in_budget=in_budget, kv_budget_bytes=kv_mid, kv_dtype=eng.kv_dtype,
            kv_bytes_per_token=kvpt, block_size=eng.block_size, num_blocks=num_blocks, kv_tokens=kv_tokens,
            max_model_len=eng.max_model_len, max_num_seqs=eng.max_num_seqs,
            max_num_batched_tokens=eng.max_num_batched_tokens, max_concurrency=num_blocks / per_seq,
            paged_kv=cfg.paged_kv, contiguous_max_seqs=contiguous, outside_budget_bytes=outside,
            estimates=estimates, defaults_used=list(eng.defaults_used), activation_phases=phases,
            warnings=warnings, engine=self.name, release=rel.label, release_checked=rel.checked,
            runner_buffers_bytes=buffers,
            ranges={"weights": [weights, w_hi], "activation": [act.lo, act.hi], "non_torch": [nt.lo, nt.hi],
                    "cuda_graphs": [graphs.lo, graphs.hi], "kv_budget": [kv_lo, kv_hi]},
            num_blocks_range=[blocks_lo, blocks_hi], kv_estimate=cfg.kv_estimate, planning_blocks=planning,
            kv_groups=groups, block_bytes=block_bytes, chunked_prefill=eng.chunked_prefill,
        )
        if usable + outside > total:
            b.warnings.append(
                f"gpu_memory_utilization {cfg.gpu_memory_utilization} leaves {(total - usable) / GiB:.2f} GiB outside "
                f"the budget but {outside / GiB:.2f} GiB is needed there (CUDA context"
                f"{' + CUDA graphs' if not in_budget and graphs.mid else ''}): risk of OOM at start-up"
            )
        if not rel.checked:
            b.warnings.append(f"{rel.label}: its accounting is read from the release's code and not yet checked "
                              "against a real start-up log; the ranges are wider")
        why = fit_problem(b, card, gpu)
        b.fits, b.reason = why is None, why or ""
        if why is None and cfg.kv_estimate == "conservative" and b.paged_kv and blocks_lo < per_seq:
            b.warnings.append(f"at the conservative end of the estimate ({blocks_lo:,} blocks) one request of "
                              f"max_model_len {eng.max_model_len} does not fit: the engine may refuse to start")
        if check_fit:
            check_fits(b, card, gpu)
        return b
