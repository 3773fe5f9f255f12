"""vLLM's start-up memory accounting (`VllmMemory`, mixed into `capacity.engine.vllm.Vllm`): the weights, the
activation peak of the profiling run, non-torch memory, CUDA-graph memory, persistent runner buffers and the KV
blocks that are left, for any release from 0.4 to the current one (`capacity.engine.vllm.release` holds what
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
from dataclasses import replace

from capacity.engine.budget import KVGroups, MemoryBudget, fit_problem, kv_bytes_per_token
from capacity.engine.config import EngineConfig, ResolvedEngine
from capacity.engine.vllm.config import vllm_config
from capacity.engine.vllm.host_weights import hand_set_kv_problem, hand_set_note, host_weights
from capacity.engine.vllm.layout import (
    _stage_sizes,
    kv_groups,
    kv_layout_card,
    mamba_page_bytes,
    mxfp4_layout,
    mxfp4_layout_alternative,
    pp_stages,
)
from capacity.engine.vllm.mla_copies import absorbed_mla_bytes
from capacity.engine.vllm.nontorch import Est, non_torch
from capacity.engine.vllm.release import Release
from capacity.errors import DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import experts_only_alternative, lora_bytes_per_rank, tensor_groups, weight_bytes_per_rank
from capacity.units import DTYPE_BYTES, GiB, MiB

# ---- empirical terms, from the real start-up logs (tests/data/vllm_startup/logs.yaml) ----------------------
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


def blas_workspace_bytes(gpu: GPU) -> int:
    """PyTorch's cuBLAS workspace, allocated through the caching allocator on the first GEMM (in the profiling
    run, so inside the torch peak): CUBLAS_WORKSPACE_CONFIG's default ':4096:8' (32 MiB) on sm90 and newer,
    ':4096:2:16:8' (8.125 MiB) before."""
    arch = (gpu.arch or "").lower()
    sm = next((int(t[2:]) for t in arch.replace(",", " ").split() if t.startswith("sm") and t[2:].isdigit()), 0)
    return 32 * MiB if sm >= 90 else 8 * MiB + 128 * 1024


def cached_segments_bound(phases: dict[str, float]) -> float:
    """The free-delta profiler's (V0 0.4.0-0.6.3) reading of torch's cache: `determine_num_available_blocks`
    calls `torch.cuda.empty_cache()` before `profile_run`, not after, so the free memory it reads holds every
    segment the caching allocator reserved during the run. The layers repeat the forward's shapes and reuse its
    blocks; the sampler's [rows, vocab] tensors (and an encoder's) come at another time with other shapes and
    may not fit the forward's cached blocks. At most the phases other than the largest stay reserved beside it
    (the forward counted once, as its largest phase)."""
    fwd = max((v for k, v in phases.items() if k.startswith("forward")), default=0.0)
    groups = [fwd, *(v for k, v in phases.items() if not k.startswith("forward"))]
    return sum(groups) - max(groups)


def cudagraph_capture_sizes(max_num_seqs: int, rel: Release | None = None) -> list[int]:
    """vLLM's default capture sizes. V1: 1, 2, 4, then steps of 8 to 256, then steps of 16, up to
    min(2 x max_num_seqs, 512). V0: 1, 2, 4, then steps of 8 up to min(max_num_seqs, 256) (rounded up to 8)."""
    if rel is not None and rel.runner == "v0":
        top = min(256, -(-max_num_seqs // 8) * 8)
        return [s for s in [1, 2, 4, *range(8, 257, 8)] if s <= top]
    top = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return [s for s in sizes if s <= top]


class VllmMemory:
    """The start-up memory accounting of one vLLM release (see module docstring). `Vllm` supplies the release,
    its name, its defaults (`resolve`) and its async-scheduling default, which the accounting reads."""

    name: str
    release: Release

    def resolve(self, cfg: EngineConfig, card: ModelCard, gpu: GPU) -> ResolvedEngine:
        raise NotImplementedError  # Vllm.resolve

    def async_scheduling(self, cfg: EngineConfig) -> bool:
        raise NotImplementedError  # Vllm.async_scheduling

    def inflight_batches(self, cfg: EngineConfig) -> int:
        """The batches a sliding-window group reserves in flight (`max_concurrent_batches` in
        `max_admission_blocks_per_request`): 2 with async scheduling in 0.32's code, 1 in 0.19's, async or not
        (docs/memory.md); the releases between are taken as 0.19's."""
        return 2 if self.async_scheduling(cfg) and self.release.version >= (0, 32, 0) else 1

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
            mi = (moe.moe_intermediate_size if eng.cfg.expert_parallel()  # data parallel: split over tp x dp
                  else math.ceil(moe.moe_intermediate_size / (tp * eng.cfg.dp_size())))
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
        return non_torch(self.release, eng, gpu)

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
        vc = vllm_config(cfg)  # vLLM's own settings
        pp = vc.pipeline_parallel_size
        if pp == 1:
            return self._budget(card, gpu, cfg, check_fit=check_fit)
        stages = [self._budget(c, gpu, cfg, check_fit=False) for c in pp_stages(card, pp, vc.pp_layer_partition)]
        worst = min(range(pp), key=lambda i: stages[i].num_blocks)
        b = replace(stages[worst], model=card.name, warnings=list(stages[worst].warnings))
        sizes = ", ".join(map(str, _stage_sizes(card, pp, vc.pp_layer_partition)))
        b.warnings.append(f"pipeline parallel {pp}: stages of {sizes} layers hold {', '.join(f'{s.num_blocks:,}' for s in stages)} blocks; the engine keeps stage "
                          f"{worst}'s (each stage on {b.tp} GPU{'s' if b.tp > 1 else ''})")
        if check_fit and not b.fits:
            raise DoesNotFit(b.reason)
        return b

    def _budget(self, card: ModelCard, gpu: GPU, cfg: EngineConfig, *, check_fit: bool = True) -> MemoryBudget:
        """The VRAM budget of one rank holding `card` (the whole model, or one pipeline stage)."""
        vc = vllm_config(cfg)  # vLLM's own settings
        eng = self.resolve(cfg, card, gpu)
        rel = self.release
        estimates: list[str] = []
        total = gpu.usable_memory_bytes
        usable = total * cfg.gpu_memory_utilization
        layout = mxfp4_layout(card, gpu, rel)
        # bitsandbytes: a double-quantised absmax is dequantised to fp32 at load from 0.10 (`_dequantize_dq`;
        # absent in 0.9.2, present in 0.10.2), kept nested before
        nested = rel.version < (0, 10, 0)
        ep = eng.tp * vc.data_parallel_size if vc.enable_expert_parallel else 1
        moe_tp = eng.tp * vc.data_parallel_size  # without expert parallelism the experts split over tp x dp
        groups_bytes = weight_bytes_per_rank(card, eng.tp, layout, bnb_nested_absmax=nested, ep=ep, moe_tp=moe_tp)
        weights = sum(groups_bytes.values())
        host = host_weights(card, groups_bytes, vc.cpu_offload_gb, runner_v2=rel.model_runner_v2)
        # LoRA adapters' buffers are made while the model loads: inside "model weights"
        weights += lora_bytes_per_rank(card, eng.tp, vc.max_loras, vc.max_lora_rank)
        weights += absorbed_mla_bytes(card, eng.tp, rel)  # 0.7.1-0.7.3: DeepSeek's absorbed MLA copies (mla_copies.py)
        plain = card.is_dense and card.weight_format in ("bf16", "fp16", "fp8", "int8") and not card.weight_formats
        w_hi = weights * (1 + WEIGHTS_SPREAD["plain" if plain else "other"])
        if (alt_card := experts_only_alternative(card)) is not None:  # which layers the checkpoint quantises
            w_hi = max(w_hi, sum(weight_bytes_per_rank(alt_card, eng.tp, layout, ep=ep, moe_tp=moe_tp).values()))
            estimates.append(f"weights ({card.weight_format} layers not named: experts alone at the high end)")
        if layout is not None:  # the swizzled scale layouts pad a little more than counted here
            alt = mxfp4_layout_alternative(layout, rel)
            w_alt = sum(weight_bytes_per_rank(card, eng.tp, alt).values()) if alt is not None else weights
            w_hi = max(weights * 1.01, w_alt * 1.002)
            estimates.append(f"weights (mxfp4, {layout.name} layout" + (f", {alt.name} without triton_kernels)"
                                                                         if alt is not None else ")"))
        elif "mxfp4" in (card.weight_format, *card.weight_formats.values()):
            w_hi = weights * 1.06  # a release before gpt-oss support: the kernel layout is not known
            estimates.append("weights (mxfp4 layout)")

        weights, w_hi, w_lo = weights - host.lo, w_hi - host.least, weights - host.hi  # --cpu-offload-gb: host_weights.py
        phases, sampler_lo = self.activation_phases(card, eng, gpu)
        fwd = max(v for k, v in phases.items() if k.startswith("forward"))
        if cfg.activation_bytes is not None:
            act = Est.exact(cfg.activation_bytes)
        else:
            mid = max(phases.values())
            lo = max([v for k, v in phases.items() if k != "sampler"] + [sampler_lo])
            slack = ACTIVATION_SLACK_GIB * GiB + (0.10 * mid if rel.accounting == "free-delta" else 0.0)
            if rel.accounting == "free-delta":  # torch's cache at the reading: see cached_segments_bound
                slack += cached_segments_bound(phases)
            if card.vision is not None:
                slack += VISION_ACTIVATION_SPREAD * mid
            if not rel.checked:
                slack += 0.05 * mid  # read from code only: wider
            bump = max(0.0, fwd + host.copy - mid)  # an offloaded layer copied in for its forward (host_weights.py)
            act = Est(mid + bump, min(lo, mid), mid + slack + bump)
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
        if groups.sliding:  # vLLM's max_in_flight_tokens: the budget x concurrent batches (2 with async scheduling
            # in 0.32's code; 0.19's reserves one batch, async or not: docs/memory.md)
            groups = replace(groups, inflight=eng.max_num_batched_tokens * self.inflight_batches(cfg))
        buffers = self.runner_buffers(card, eng, groups)

        in_budget = eng.cuda_graphs_in_budget
        g_in = graphs if in_budget else Est.exact(0.0)
        kv_mid = usable - weights - act.mid - nt.mid - buffers - g_in.mid
        kv_lo = usable - w_hi - act.hi - nt.hi - buffers - g_in.hi
        kv_hi = usable - w_lo - act.lo - nt.lo - buffers - g_in.lo
        kv_note = []
        if vc.kv_cache_memory_bytes is not None:  # set by hand: the worker returns it, not what it profiled
            kv_note = [hand_set_note(kv_mid, vc.kv_cache_memory_bytes)]
            kv_mid = kv_lo = kv_hi = float(vc.kv_cache_memory_bytes)
        kv_card = kv_layout_card(card, rel)
        kvpt = kv_bytes_per_token(kv_card, eng.kv_dtype, eng.tp)
        per_layer = kv_card.kv_elements_per_token_per_layer(eng.tp) * DTYPE_BYTES[eng.kv_dtype]
        block_bytes = eng.block_size * (per_layer * groups.group_size if groups.group_size else kvpt)
        if card.state is not None and groups.full == 0:  # state layers only: a page is one sequence's state
            block_bytes = mamba_page_bytes(card, rel, eng.tp) * groups.group_size

        def blocks(kv: float) -> int:
            return max(0, math.floor(kv / block_bytes)) if kv > 0 else 0

        num_blocks, blocks_lo, blocks_hi = blocks(kv_mid), blocks(kv_lo), blocks(kv_hi)
        warnings = list(card.notes) + kv_note + ([host.note] if host.note else [])
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
            paged_kv=vc.paged_kv, contiguous_max_seqs=contiguous, outside_budget_bytes=outside,
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
        why = fit_problem(b, card, gpu) if vc.kv_cache_memory_bytes is None else hand_set_kv_problem(b, card, gpu)
        b.fits, b.reason = why is None, why or ""
        if why is None and cfg.kv_estimate == "conservative" and b.paged_kv and blocks_lo < per_seq:
            b.warnings.append(f"at the conservative end of the estimate ({blocks_lo:,} blocks) one request of "
                              f"max_model_len {eng.max_model_len} does not fit: the engine may refuse to start")
        if check_fit and why:
            raise DoesNotFit(why)
        return b
