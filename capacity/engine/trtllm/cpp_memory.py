"""The start-up memory of TensorRT-LLM's engine (C++) backend (`trtllm_backend: engine`, `trtllm@0.20`,
`trtllm@X.Y:tensorrt`): an engine built by trtllm-build (or by the LLM API from BuildConfig) and run by the C++
executor. There is no profiling run. Read in NVIDIA/TensorRT-LLM (docs/trtllm.md, "The TensorRT engine (C++)
backend's memory", has each term's file and function and the hand checks):

- `TrtGptModelInflightBatching` (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp), constructor, in
  order: the engine is deserialised (its weights: "Loaded engine size"); the execution context takes the engine's
  activation memory, fixed at build time (`ICudaEngine::getDeviceMemorySizeV2`, "Allocated N MiB for execution
  context memory"); at TP > 1 the custom all-reduce workspace (`createCustomAllReduceWorkspace`); the runtime
  buffers (`createBuffers`: `RuntimeBuffers::setMaxBufferSizes` + `reshape` pre-allocate the engine's `logits`
  output, [max_batch_size x max(1 + draft tokens, beam), vocab padded] in the engine's logits dtype, fp32 by
  default); the decoder (`createDecoder`: `GptDecoderBatched::setup` with the default decoding mode, TopKTopP for
  beam 1, so `DynamicDecodeLayer` builds its layers now): per sequence slot, a vocabulary's worth of the
  embedding bias (`DecoderState::reshapeBuffers`, fp32), of `DecodingLayerWorkspace`'s runtime logits (fp32), of
  `PenaltyLayer::allocateWorkspace`'s occurrence counts (int32) and of AIR top-p's buffers
  (`getAirTopPWorkspaceSizes`: 4 buffers of 4 B x vocab / 32), plus AIR top-p's histograms (2,048 buckets x
  (8 + 4) B), and max_seq_len's worth of the output ids, parent ids, log probs and tiled log probs (4 B each).
- Then `BaseKVCacheManager::calculateMaxNumBlocks` (kvCacheManager.cpp): available = cudaMemGetInfo's free +
  the memory pool's free bytes; tokens = int(free_gpu_memory_fraction (0.9) x available / bytes per token), at
  most `kv_cache_config.max_tokens`; blocks = ceil(tokens / tokens_per_block).

The execution context cannot be derived exactly (TensorRT's builder picks tactics and plans memory); its low end
is the live set of one decoder layer at max_num_tokens tokens (TensorRT reuses memory between layers:
docs/source/reference/memory.md, "Activation size"), its high end 3.5x that (the workspaces of the tactics; FP8
GEMMs keep more, the same document's "Known Issues"). The decoder's sampling workspaces are a range too. The
planner takes the conservative end (every term high).
"""
from __future__ import annotations

from dataclasses import dataclass

from capacity.engine.budget import MemoryBudget, kv_bytes_per_token
from capacity.engine.config import EngineConfig, MemoryModelParams, ResolvedEngine
from capacity.engine.trtllm import vswa
from capacity.engine.trtllm.kv_estimate import dsa_elements
from capacity.engine.trtllm.parallel import weights_per_rank
from capacity.engine.vllm.nontorch import NON_TORCH_MULTI, NON_TORCH_PER_PEER_GIB
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import experts_only_alternative, weight_bytes_per_rank
from capacity.units import GiB

FREE_GPU_MEMORY_FRACTION = 0.9  # KvCacheConfig.freeGpuMemoryFraction's default (executor/kvCacheConfig.cpp)
LOGITS_BYTES = 4  # the engine's logits output: float32 (trtllm-build --logits_dtype, default float32)
# The runtime buffers per (max_batch_size x vocab padded) pair (middle, low, high): the logits output is the one
# vocabulary-sized buffer read; the high end allows 3x for the rest of RuntimeBuffers not read (a published 0.1x
# log, NVIDIA/TensorRT-LLM issue 1188, shows 2.66 GB for 2,048 x 151,936 pairs: 8.5-9 B a pair)
RUNTIME_BYTES_PER_PAIR = (float(LOGITS_BYTES), float(LOGITS_BYTES), 3.0 * LOGITS_BYTES)
PENALTY_BYTES = 4  # PenaltyLayer's occurrence workspace: int32 per batch slot and vocabulary entry
AIR_TOPP_BYTES = 4 * 4 / 32  # getAirTopPWorkspaceSizes: buf1, idxBuf1, buf2, idxBuf2 of calcBufLen = vocab / 32
# The decoder's bytes per (max_batch_size x vocab padded) pair at start-up (middle, low, high): the embedding bias
# and the runtime logits (fp32, 4 + 4), the penalty workspace, AIR top-p's buffers; low: a decoding mode without
# occurrence penalties; high: 32 B (the 0.12-0.14 logs read before: 20-36 B a pair with the runtime buffers' 4;
# the sort-based top-p path, getTopPWorkspaceSize, keeps float keys and int32 values double buffered)
DECODER_BYTES_PER_PAIR = (8 + PENALTY_BYTES + AIR_TOPP_BYTES, 8 + AIR_TOPP_BYTES, 32.0)
DECODER_BYTES_PER_SEQ_TOKEN = 16  # ids, parentIds (int32), logProbs, logProbsTiled (fp32) x max_seq_len per slot
AIR_HISTOGRAM_BYTES = 2048 * (8 + 4)  # per slot: 2^11 buckets of a uint64 histogram and an int32 count
ACTIVATION_SPREAD = (2.0, 1.0, 3.5)  # x the one-layer live set (middle, low, high)
CONTEXT_GIB = (1.0, 0.5, 2.0)  # CUDA context, TensorRT's and cuBLAS's kernels: as the PyTorch backend's range

Triple = tuple[float, float, float]


def layer_live_bytes_per_token(card: ModelCard, tp: int) -> float:
    """Bytes per max_num_tokens token of the largest live set of one decoder layer on one rank: the residual
    stream plus the larger of attention (q, k, v, the attention output, the o-projection's output) and the MLP
    (gate and up, their product, the down projection's output), in the activation dtype (2 bytes)."""
    if card.mla is not None or card.moe is not None or card.state is not None:
        raise ConfigError(f"model {card.name}: the engine backend's activation is modelled for dense attention "
                          "models (no MLA, MoE or state layers); use trtllm_backend pytorch")
    hd = card.head_dim or card.hidden_size // card.num_attention_heads
    h = card.hidden_size
    attn = (2 * card.num_attention_heads + 2 * card.num_kv_heads) * hd / tp + h
    mlp = (3 if card.gated_mlp else 2) * card.intermediate_size / tp + h
    return 2.0 * (h + max(attn, mlp))


def vocab_padded(card: ModelCard, tp: int) -> int:
    """ModelConfig::getVocabSizePadded(worldSize): the vocabulary rounded up to a multiple of the ranks."""
    return -(-card.vocab_size // tp) * tp


@dataclass
class EngineBackendTerms:
    """What one rank holds before the KV cache (bytes: middle, low, high)."""

    weights: Triple
    activation: Triple  # the execution context (getDeviceMemorySizeV2)
    context: Triple  # CUDA context + kernels; at TP > 1 NCCL and the custom all-reduce workspace
    runtime_buffers: Triple  # the logits output
    decoder: Triple

    def total(self, end: int) -> float:
        return sum(t[end] for t in (self.weights, self.activation, self.context, self.runtime_buffers, self.decoder))


def terms(card: ModelCard, gpu: GPU, eng: ResolvedEngine) -> EngineBackendTerms:
    """Each term for `eng` (max_batch_size = max_num_seqs, max_num_tokens = max_num_batched_tokens)."""
    cfg, tp = eng.cfg, eng.tp
    w = sum(weight_bytes_per_rank(card, tp).values())  # a dense model (MoE is refused): no experts-only end
    weights = (w, w, w * 1.01)  # "Loaded engine size": the weights and the engine's own kernels
    per_token = layer_live_bytes_per_token(card, tp) * eng.max_num_batched_tokens
    act: Triple = ((cfg.activation_bytes,) * 3 if cfg.activation_bytes is not None
                   else (per_token * ACTIVATION_SPREAD[0], per_token * ACTIVATION_SPREAD[1],
                         per_token * ACTIVATION_SPREAD[2]))
    c_mid, c_lo, c_hi = (x * GiB for x in CONTEXT_GIB)
    if cfg.memory_params.cuda_context_bytes != MemoryModelParams().cuda_context_bytes:
        c_mid = c_lo = c_hi = cfg.memory_params.cuda_context_bytes
    if tp > 1:
        link = "nvls" if gpu.nvls else ("nvlink" if gpu.interconnect.startswith("nvlink") else "pcie")
        peers = (tp - 2) * NON_TORCH_PER_PEER_GIB
        n_mid, n_lo, n_hi = ((x + peers) * GiB for x in NON_TORCH_MULTI[link])
        c_mid, c_lo, c_hi = c_mid + n_mid, c_lo + n_lo, c_hi + n_hi
    context: Triple = (cfg.non_torch_bytes,) * 3 if cfg.non_torch_bytes is not None else (c_mid, c_lo, c_hi)
    pairs = eng.max_num_seqs * vocab_padded(card, tp)
    rmid, rlo, rhi = (pairs * x for x in RUNTIME_BYTES_PER_PAIR)
    per_slot = eng.max_model_len * DECODER_BYTES_PER_SEQ_TOKEN + AIR_HISTOGRAM_BYTES
    dmid, dlo, dhi = (pairs * x + eng.max_num_seqs * per_slot for x in DECODER_BYTES_PER_PAIR)
    return EngineBackendTerms(weights, act, context, (rmid, rlo, rhi), (dmid, dlo, dhi))


def kv_blocks(available_bytes: float, bytes_per_token: float, tokens_per_block: int,
              fraction: float = FREE_GPU_MEMORY_FRACTION, max_tokens: int | None = None) -> tuple[int, int]:
    """calculateMaxNumBlocks: (tokens, blocks) = int(fraction x available / bytes per token), at most max_tokens;
    blocks rounded up."""
    tokens = max(0, int(fraction * available_bytes / bytes_per_token))
    if max_tokens is not None:
        tokens = min(tokens, max_tokens)
    return tokens, -(-tokens // tokens_per_block)


def experts_only_high(card: ModelCard, cfg: EngineConfig, tp: int) -> float:
    """The PyTorch backend's weights on one rank if the checkpoint quantises its routed experts alone (a MoE card whose
    --weight-dtype override names no layers: `capacity.model.weights.experts_only_alternative`), 0 where that question
    does not arise: the high end of the weights term, as in vLLM's and SGLang's budgets. (The engine backend here
    refuses MoE models, so only the PyTorch backend's `Trtllm.peak` takes it.)"""
    alt = experts_only_alternative(card)
    return weights_per_rank(alt, cfg, tp) if alt is not None else 0.0


def budget(card: ModelCard, gpu: GPU, cfg: EngineConfig, eng: ResolvedEngine, label: str, *,
           check_fit: bool = True) -> MemoryBudget:
    """The engine backend's start-up memory as a MemoryBudget (usable = the whole device; KV = 0.9 x what is free
    after every term). The middle uses every term's middle; the conservative end every term high."""
    if dsa_elements(card):  # DeepseekV32ForCausalLM is a PyTorch-backend model (_torch/models), no TensorRT engine
        raise ConfigError(f"trtllm_backend: DeepSeek-V3.2 ({card.name}) runs on the PyTorch backend only ({label})")
    t = terms(card, gpu, eng)
    total = gpu.usable_memory_bytes
    bpt = kv_bytes_per_token(card, eng.kv_dtype, eng.tp)
    block = eng.block_size
    cap = cfg.num_gpu_blocks_override * block if cfg.num_gpu_blocks_override is not None else None
    ends = {}
    for name, end in (("mid", 0), ("lo", 2), ("hi", 1)):  # the conservative KV end has every term high
        tokens, blocks = kv_blocks(max(0.0, total - t.total(end)), bpt, block, max_tokens=cap)
        ends[name] = (blocks * block * bpt, tokens, blocks)
    kv_mid, tok_mid, blocks = ends["mid"]
    kv_lo, _, blocks_lo = ends["lo"]
    kv_hi, _, blocks_hi = ends["hi"]
    planning = blocks_lo if cfg.kv_estimate == "conservative" else blocks
    warnings = list(card.notes)
    ctx = eng.max_model_len
    plan_tokens = planning * block
    if 0 < plan_tokens < ctx:
        warnings.append(f"the KV pool holds {plan_tokens:,} tokens, less than max_seq_len {ctx:,}: the executor "
                        "lowers max_seq_len to the pool ('maxAttentionWindow and maxSequenceLen are too large for at "
                        f"least one sequence to fit in kvCache. they are reduced to {plan_tokens}')")
        ctx = plan_tokens
    if not eng.chunked_prefill and eng.max_num_batched_tokens < ctx:
        warnings.append(f"chunked context off: prompts longer than max_num_tokens {eng.max_num_batched_tokens:,} "
                        "are rejected; enable_chunked_prefill to serve them")
    other = t.runtime_buffers[0] + t.decoder[0]
    b = MemoryBudget(
        model=card.name, gpu=gpu.name, tp=eng.tp, total_bytes=total, gpu_memory_utilization=1.0, usable_bytes=total,
        weights_bytes=t.weights[0], activation_bytes=t.activation[0], non_torch_bytes=t.context[0],
        runner_buffers_bytes=other,
        cuda_graph_bytes=0.0, cuda_graphs_in_budget=True, kv_budget_bytes=kv_mid, kv_dtype=eng.kv_dtype,
        kv_bytes_per_token=bpt, block_size=block, num_blocks=blocks, kv_tokens=blocks * block, max_model_len=ctx,
        max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens,
        max_concurrency=blocks * block / ctx, paged_kv=True, contiguous_max_seqs=blocks * block // ctx,
        outside_budget_bytes=0.0, estimates=["activation", "non_torch", "cuda_context", "decoder"],
        defaults_used=[*eng.defaults_used, "free_gpu_memory_fraction"], warnings=warnings, engine="trtllm",
        release=label, release_checked=False,
        ranges={"weights": [t.weights[1], t.weights[2]], "activation": [t.activation[1], t.activation[2]],
                "non_torch": [t.context[1], t.context[2]],
                "runner_buffers": [t.runtime_buffers[1] + t.decoder[1], t.runtime_buffers[2] + t.decoder[2]],
                "cuda_graphs": [0.0, 0.0], "kv_budget": [kv_lo, kv_hi]},
        num_blocks_range=[blocks_lo, blocks_hi], kv_estimate=cfg.kv_estimate, planning_blocks=planning,
        block_bytes=block * bpt, chunked_prefill=eng.chunked_prefill)
    if card.num_sliding_layers:  # the executor's maxAttentionWindowVec defaults to [max_seq_len], as the PyTorch's
        b.warnings.append(vswa.one_pool_note(card))
    why = None
    if t.total(0) >= total:
        why = (f"weights {t.weights[0] / GiB:.1f} GiB + execution context {t.activation[0] / GiB:.2f} + runtime and "
               f"decoder buffers {other / GiB:.2f} + context {t.context[0] / GiB:.2f} per rank leave nothing of "
               f"{gpu.name}'s {total / GiB:.1f} GiB at tp={eng.tp}; raise tp or lower max_batch_size / "
               "max_num_tokens")
    elif blocks == 0:
        why = f"no KV blocks: 0.9 x the {(total - t.total(0)) / GiB:.2f} GiB free after the engine at tp={eng.tp}"
    b.fits, b.reason = why is None, why or ""
    if check_fit and why:
        raise DoesNotFit(why)
    return b


def breakdown(card: ModelCard, gpu: GPU, eng: ResolvedEngine) -> dict[str, Triple]:
    """Each term in GiB (middle, low, high), for `capacity memory`'s notes and the tests."""
    t = terms(card, gpu, eng)
    return {k: tuple(x / GiB for x in getattr(t, k))
            for k in ("weights", "activation", "context", "runtime_buffers", "decoder")}


__all__ = ["ACTIVATION_SPREAD", "AIR_HISTOGRAM_BYTES", "DECODER_BYTES_PER_PAIR", "DECODER_BYTES_PER_SEQ_TOKEN", "EngineBackendTerms", "LOGITS_BYTES", "RUNTIME_BYTES_PER_PAIR", "budget",
           "breakdown", "kv_blocks", "layer_live_bytes_per_token", "terms", "vocab_padded"]
