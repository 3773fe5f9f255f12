"""Kernels per decoder layer and the TP all-reduce's algorithm: two fixed costs of a step at small batch (issue 47).

**(b) Kernels per layer.** The roofline charges `kernel_launch_s` once per op it costs (attention GEMMs, attention,
two norms, the MLP; for a MoE layer the experts, the router and the shared experts): 5 a dense layer, 6-7 a MoE
layer. vLLM launches more kernels than that in a decode step, each with a fixed GPU-side cost even inside a
replayed CUDA graph. Counted from vLLM's model code (docs/fidelity.md, "Decode at small batch", names each file):

- attention, GQA/MHA (`models/llama.py`, `models/qwen3.py`, `attention/layer.py` + the FlashAttention backend):
  the input `fused_add_rms_norm`, `qkv_proj`, Qwen3's `q_norm` and `k_norm` (card.qk_norm), `rotary_emb`,
  `reshape_and_cache_flash`, the attention kernel, `o_proj`: 6, 8 with q/k norms.
- attention, MLA (`models/deepseek_v2.py` `DeepseekV2MLAAttention`, `v1/attention/backends/mla/common.py`
  `MLACommonImpl.forward` and `flashmla.py`): the input norm, `q_a_proj`, `kv_a_proj_with_mqa`, `q_a_layernorm`,
  `kv_a_layernorm`, `q_b_proj`, `rotary_emb`, `o_proj`, then the decode path's `concat_and_cache_mla`, the `W_UK_T`
  bmm, the cat of q_nope and q_pe, `flash_mla_with_kvcache` and its combine kernel, the `W_UV` bmm, the reshape
  copy and the copy into the output: 16 (14 without q_lora_rank: one `q_proj` instead of q_a, its norm and q_b).
- dense MLP (`LlamaMLP`, `Qwen3MLP`): the post-attention `fused_add_rms_norm`, `gate_up_proj`, `silu_and_mul`,
  `down_proj`: 4 (3 without a gate: one up projection and the activation).
- MoE (`layers/fused_moe/fused_moe.py`, `FusedMoE.forward`): the norm, the router `gate`, the top-k
  (`topk_softmax`: 1; DeepSeek's `grouped_topk`: its torch ops, about 4 after Inductor), `moe_align_block_size`,
  the two expert GEMMs (Triton `fused_moe` or `fused_marlin_moe`), the activation, `moe_sum`: 8, 11 with
  grouped top-k; shared experts (`DeepseekV2MoE`) add their gate_up, activation, down and the add: 4.
- a hybrid's state layers (gated DeltaNet, Mamba-2, Mamba, short convs): capacity/cost/state_space_floor.py
  `state_layer_kernels`, counted from vLLM's and SGLang's model code (8 a gated DeltaNet layer).
- The TP all-reduces (two a layer at TP > 1) are not counted here: (c) below costs them.

A kernel's floor is `RooflineParams.kernel_floor_s`: what one small kernel costs inside a replayed CUDA graph,
measured on the project's H200 (`calibrate/profiles/llama-3.1-8b-h200.json`, `linear.elementwise` at one token,
53.6 us for the 32 kernels of calibrate/stack.py's `Layer.elementwise`: 1.68 us each;
tests/test_cost_kernels.py recomputes it from that file). The step's fixed kernel time is the larger of the two
counts: the roofline's launch charges, or vLLM's kernels x the floor (`kernel_floor_extra_s`: the difference, or 0).

**(c) The TP all-reduce's algorithm.** vLLM's `CustomAllreduce` (distributed/device_communicators/
custom_all_reduce.py) is used when the world size is 2, 4, 6 or 8, the message is under its `max_size` (8 MiB),
and the GPUs are fully NVLink-connected or there are only 2 of them (`__init__`: "not supported on more than two
PCIe-only GPUs"); its kernel (csrc/custom_all_reduce.cuh, `allreduce`) runs one-shot (every rank reads every
other rank's whole buffer) for 2 GPUs, or on NVLink below 512 KiB at <= 4 GPUs and below 256 KiB at <= 8, else
two-shot (reduce-scatter + all-gather: the ring's bytes). "Fully NVLink-connected" is the GPU entry's topology
(capacity/data/gpus.yaml `topology`: NVLink-bridged pairs are full at 2 GPUs only; GPU.full_nvlink). Otherwise NCCL: its own tuning model
(src/graph/tuning.cc: `baseLat` and `hwLat`) puts a ring all-reduce's latency in the LL protocol at 6.6 us +
2 (ranks - 1) hops of 0.6 us on NVLink or 1.0 us on PCIe. The custom kernels' latency is `allreduce_latency_s`
(8 us, an assumption not measured here: the range 8-20 us is in docs/fidelity.md). SGLang runs the same custom
all-reduce: `CustomAllreduce.__init__` / `should_custom_ar` (sglang/srt/distributed/device_communicators/
custom_all_reduce.py) and sgl-kernel's csrc/allreduce/custom_all_reduce.cuh carry vLLM's gate and thresholds.
TensorRT-LLM's AUTO strategy is its own (docs/fidelity.md, "All-reduce by engine"): the PyTorch backend
(cpp/tensorrt_llm/thop/allreduceOp.cpp `ifFallbackToNCCL`, `selectImplementation`) runs NCCL above the workspace
(16 MB at <= 2 GPUs, 8 MB above) or without P2P and NVLink on every pair, else MIN_LATENCY at <= 2 GPUs, and at
> 2 GPUs NCCL above 128 tokens; MIN_LATENCY is one-shot up to 128 tokens (kOneShotMaxToken), two-shot above. The
engine backend's plugin picks one-shot at <= 2 GPUs, below 1 MB at <= 4, below 500 kB above, else two-shot.
Without CUDA peer access (GPU.p2p False: GeForce cards) vLLM's and SGLang's `CustomAllreduce` disables itself
(`_can_p2p`, `gpu_p2p_access_check`) and TensorRT-LLM falls back (`ifFallbackToNCCL`): NCCL at any TP.

**(c') The custom kernel by world size** (vLLM and SGLang; docs/fidelity.md "The custom all-reduce by world size").
In csrc/custom_all_reduce.cuh the barriers (`start_sync`, `end_sync`) write the ws flags from ws threads at once
("Latency = 1 p2p write"), so they cost about the same at any ws; what grows with ws is the data each rank pulls:
one-shot (`cross_device_reduce_1stage`) reads the ws - 1 other buffers whole (`packed_reduce` over every peer's
pointer), two-shot (`cross_device_reduce_2stage`) reads (ws - 1) / ws of the message in its reduce-scatter and as
much in its all-gather, with one more full barrier between them (`end_sync<ngpus>` not final: every block waits).
The pull runs on a fixed grid (`allreduce`: at most 36 blocks x 512 threads of 16-byte loads), so it is bound by
the loads the grid keeps in flight, not by the link: the published H100 table (capacity/data/allreduce_published.yaml,
`sglang-2904-h100-vllm`) gives 1 MiB more at TP 2 for 26.6 - 9.5 = 17.1 us: CUSTOM_AR_PULL_BYTES_PER_S = 61.3 GB/s,
a fifth of the NVLink figure the roofline charged (450 GB/s x comm_bw_eff 0.7 = 315 GB/s). The two-shot's extra
barrier is what remains of TP 8 at 1 MiB: 45.0 - 9.5 - 2 x 7/8 x 1 MiB / 61.3 GB/s = 5.6 us
(CUSTOM_AR_TWO_SHOT_SYNC_S). So one-shot = latency + (ws - 1) x bytes / min(link, pull); two-shot = latency +
sync + 2 (ws - 1) / ws x bytes / min(link, pull). tests/test_allreduce_world_size.py recomputes both constants from
the data file and checks the model against the three NVIDIA tables (MAPE 6.5, 10.5 and 6.8%; the link-rate
model it replaces: 28.5, 41.5 and 24.6%). TensorRT-LLM's kernels (Lamport one-shot, other grids) keep the link rate,
and so do AMD parts: the MI300X table (SGLang's ROCm custom all-reduce at TP 4) pulls faster, about 110 GB/s, and the
NVIDIA constants miss it by 45% MAPE where the link rate misses by 28%.
"""
from __future__ import annotations

from capacity.cost.state_space_floor import state_layer_kernels
from capacity.model.card import ModelCard

# NCCL src/graph/tuning.cc: baseLat[Ring][LL] and hwLat[NVLINK|PCI][Ring][LL], microseconds
NCCL_RING_LL_BASE_S = 6.6e-6
NCCL_RING_LL_HOP_S = {"nvlink": 0.6e-6, "pcie": 1.0e-6}
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024  # CustomAllreduce max_size (8192 * 1024)
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
# TensorRT-LLM: getMaxRequiredWorkspaceSize (customAllReduceUtils.h): 16 MB at <= 2 GPUs, 8 MB above, keyed by tp <= 2
TRTLLM_WORKSPACE_BYTES = {True: 16e6, False: 8e6}
TRTLLM_MIN_LATENCY_MAX_TOKENS = 128  # allReduceFusionKernels.h kOneShotMaxToken; allreduceOp.cpp's AUTO threshold
ALLREDUCE_ENGINES = ("vllm", "sglang", "trtllm", "trtllm-engine")
# (c'): the custom kernel's pull rate and its two-shot barrier, from capacity/data/allreduce_published.yaml
# (`sglang-2904-h100-vllm`, H100, eager): 1 MiB / (26.6 - 9.5) us; 45.0 - 9.5 us - 2 x 7/8 x 1 MiB at that rate
CUSTOM_AR_PULL_BYTES_PER_S = 1048576 / 17.1e-6  # 61.3 GB/s
CUSTOM_AR_TWO_SHOT_SYNC_S = 5.575e-6
# (c') is OFF by default (2026-12-08): the tables support the pull rate up to 1-2 MiB only, and vLLM's one-shot at
# TP 2 and its two-shot above run up to 8 MiB (large decode batches); extrapolated there, it made the TensorRT-LLM
# table's vLLM-engine columns worse (bench/published.py --quick: 15.5% -> 18.4%) and moved the README's 70B plan.
# `allreduce_call_s(..., pull=True)` (or this switch) turns it on; tests/test_allreduce_world_size.py checks it.
CUSTOM_AR_PULL = False


def attention_kernels(card: ModelCard) -> int:
    """Kernels of one attention block in a decode step (the input norm included), from vLLM's model code."""
    if card.mla is not None:
        return 16 if card.mla.q_lora_rank is not None else 14
    return 8 if card.qk_norm else 6


def mlp_kernels(card: ModelCard, moe_layer: bool) -> int:
    """Kernels of one MLP block (the post-attention norm included), from vLLM's model code."""
    if not moe_layer:
        return 4 if card.gated_mlp else 3
    assert card.moe is not None
    topk = 4 if card.architecture.startswith("deepseek") else 1  # grouped_topk's torch ops vs topk_softmax
    n = 7 + topk
    if card.moe.shared_intermediate:
        n += 4
    return n


def kernel_floor_extra_s(card: ModelCard, kernel_floor_s: float, kernel_launch_s: float, shared: bool) -> float:
    """(b): the fixed kernel time of one step beyond what the roofline's launch charges already hold, over all the
    layers: max(0, vLLM's kernels x the floor - the roofline's ops x kernel_launch_s). `shared`: the roofline costs
    a shared-expert op."""
    La, Ld, Lm = card.num_kv_layers, card.num_dense_layers, card.num_moe_layers
    kernels = La * attention_kernels(card) + Ld * mlp_kernels(card, False)
    if Lm:
        kernels += Lm * mlp_kernels(card, True)
    # the roofline's ops: attention GEMMs and attention per attention layer, two norms per layer, the MLP's ops
    ops = 2 * La + 2 * card.num_layers + Ld + Lm * (2 + (1 if shared else 0))
    if card.state is not None:  # a hybrid's state layers: their kernels (state_space_floor.state_layer_kernels);
        Ls = card.state.num_layers  # the roofline's ops there: the projections and the decode update's two launches
        kernels += Ls * state_layer_kernels(card)
        ops += 3 * Ls
    return max(0.0, kernels * kernel_floor_s - ops * kernel_launch_s)


def allreduce_plan(tp: int, nbytes: float, interconnect: str, engine: str = "vllm", full_nvlink: bool | None = None,
                   tokens: int = 0, p2p: bool = True) -> str:
    """Which all-reduce `engine` runs for a message of `nbytes` (`tokens` tokens) at this TP size: "one-shot",
    "two-shot" (the custom kernels) or "nccl" (module docstring; docs/fidelity.md, "All-reduce by engine").
    `full_nvlink`: every pair of the tp GPUs is NVLink-connected (GPU.full_nvlink; None: the interconnect says).
    `p2p`: the GPUs have CUDA peer access (GPU.p2p); without it every engine runs NCCL."""
    if not p2p:
        return "nccl"  # CustomAllreduce._can_p2p / gpu_p2p_access_check; TensorRT-LLM ifFallbackToNCCL
    full = ("nvlink" in interconnect) if full_nvlink is None else full_nvlink
    if engine == "trtllm":  # PyTorch backend, AllReduceStrategy.AUTO (thop/allreduceOp.cpp selectImplementation)
        if nbytes > TRTLLM_WORKSPACE_BYTES[tp <= 2] or not full:
            return "nccl"  # ifFallbackToNCCL: above the workspace, no P2P or no NVLink
        if tp > 2 and tokens > TRTLLM_MIN_LATENCY_MAX_TOKENS:
            return "nccl"
        return "one-shot" if tokens <= TRTLLM_MIN_LATENCY_MAX_TOKENS else "two-shot"  # MIN_LATENCY: kOneShotMaxToken
    if engine == "trtllm-engine":  # the engine backend's AllReduce plugin, AUTO (customAllReduceUtils selectImplementation)
        if nbytes > TRTLLM_WORKSPACE_BYTES[tp <= 2] or not full:
            return "nccl"
        if tp <= 2 or (tp <= 4 and nbytes < 1e6) or nbytes < 5e5:
            return "one-shot"
        return "two-shot"
    # vLLM and SGLang: CustomAllreduce (same gate, same kernel thresholds)
    if tp in CUSTOM_AR_WORLD_SIZES and nbytes < CUSTOM_AR_MAX_BYTES and (full or tp == 2):
        if tp == 2 or (tp <= 4 and nbytes < 512 * 1024) or (tp <= 8 and nbytes < 256 * 1024):
            return "one-shot"
        return "two-shot"
    return "nccl"


def allreduce_call_s(tp: int, nbytes: float, interconnect: str, link_bytes_per_s: float,
                     custom_latency_s: float, engine: str = "vllm", full_nvlink: bool | None = None,
                     tokens: int = 0, nvlink_ring: bool | None = None, p2p: bool = True, amd: bool = False,
                     pull: bool | None = None) -> float:
    """One all-reduce of `nbytes` over `tp` ranks: the algorithm's latency + its bytes over the link (each rank reads
    tp - 1 other buffers one-shot; the ring's 2 (tp - 1) / tp of the message two-shot and in NCCL). NCCL's hops are
    NVLink ones where NCCL's ring runs on NVLink (`nvlink_ring`, GPU.nvlink_ring; None: as `full_nvlink`). vLLM's
    and SGLang's custom kernel pulls at most CUSTOM_AR_PULL_BYTES_PER_S and its two-shot pays one more barrier ((c'));
    not on AMD parts (`amd`: ROCm's build of the kernel, whose published MI300X timings the NVIDIA rate misses).
    `pull`: apply (c') (None: CUSTOM_AR_PULL, off by default)."""
    if tp == 1:
        return 0.0
    algo = allreduce_plan(tp, nbytes, interconnect, engine, full_nvlink, tokens, p2p)
    custom = engine in ("vllm", "sglang") and not amd and (CUSTOM_AR_PULL if pull is None else pull)
    pull_bytes_per_s = min(link_bytes_per_s, CUSTOM_AR_PULL_BYTES_PER_S) if custom else link_bytes_per_s
    if algo == "one-shot":
        return custom_latency_s + (tp - 1) * nbytes / pull_bytes_per_s
    if algo == "two-shot":
        sync = CUSTOM_AR_TWO_SHOT_SYNC_S if custom else 0.0
        return custom_latency_s + sync + 2 * (tp - 1) / tp * nbytes / pull_bytes_per_s
    ring = 2 * (tp - 1) / tp * nbytes / link_bytes_per_s
    full = ("nvlink" in interconnect) if full_nvlink is None else full_nvlink
    hop = NCCL_RING_LL_HOP_S["nvlink" if (full if nvlink_ring is None else nvlink_ring) else "pcie"]
    return NCCL_RING_LL_BASE_S + 2 * (tp - 1) * hop + ring
