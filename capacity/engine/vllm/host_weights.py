"""Two vLLM settings that take memory out of the profiled budget: weights kept in host memory (`--cpu-offload-gb`)
and a KV cache sized by hand (`--kv-cache-memory-bytes`). `VllmMemory._budget` (capacity/engine/vllm/memory.py)
applies both; docs/memory.md ("Weights in host memory", "A KV cache set by hand") says which vLLM code each term
comes from.

`--cpu-offload-gb` (vLLM 0.5.3+; `vllm/model_executor/models/utils.py`: `set_cpu_offload_max_bytes`,
`maybe_offload_to_cpu`, `make_layers`; from the offloader rework `model_executor/offloader/uva.py`, `UVAOffloader`):
each worker sets a budget of cpu_offload_gb x 2^30 bytes, and `make_layers` hands every decoder layer it builds,
first to last, to the offloader, which moves the layer's parameters one by one into pinned host memory while the
bytes moved so far are under the budget. So the bytes offloaded are at least the budget and at most one parameter
more (or every decoder layer, when they hold less); the embedding, the LM head and the final norm are not built by
`make_layers` and stay on the GPU. On the copy path (`maybe_offload_to_cpu` before UVA, and `UVAOffloader` with UVA
off) a layer with offloaded parameters copies its whole state dict to the GPU for each forward
(`functional_call(module, {k: v.to(device)})`): one layer's offloaded bytes are live during the profiling pass's
forward, on top of its activations (not during the sampler run that follows, when the copies are freed): the
activation peak is max(forward + that layer, sampler). With UVA the kernels read the host copy in place and nothing
is copied (the activation's low end).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from capacity.engine.budget import MemoryBudget, fit_problem
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.units import GiB

# Tensor groups (capacity.model.weights.tensor_groups) that `make_layers` does not build: they stay on the GPU
NOT_IN_LAYERS = frozenset({"embed_tokens", "lm_head", "final_norm", "vision_tower", "rope_cache"})
DENSE_MLP = frozenset({"mlp_gate_up", "mlp_down"})
MOE = frozenset({"router", "experts_gate_up", "experts_down", "latent_in", "latent_out", "router_bias",
                 "experts_bias", "experts_down_bias", "shared_gate_up", "shared_down"})
# vLLM's fused parameters: q/k/v in one qkv_proj (QKVParallelLinear); a MoE layer's experts in one w13 and one w2
FUSED = (("q_proj", "kv_proj"),)


@dataclass(frozen=True)
class HostWeights:
    """Bytes of one rank's weights in host memory: at least `lo` (the budget, or every decoder layer), at most `hi`
    (one parameter beyond the budget); `copy`: the most bytes of one layer copied back to the GPU for its forward;
    `least`: what the conservative end counts on (0 where the release may not offload at all); `note`: why."""

    lo: float = 0.0
    hi: float = 0.0
    copy: float = 0.0
    least: float = 0.0
    note: str = ""


def layer_bytes(card: ModelCard, groups: dict[str, float]) -> tuple[list[float], float]:
    """Each decoder layer's bytes on a rank, first to last, and the largest single parameter among them, from the
    bytes per tensor group (`weight_bytes_per_rank`). Groups a model family adds beyond the standard layout are not
    spread over the layers (they stay on the GPU here: less offloaded, the safe side). A MoE model's dense layers
    are put first (DeepSeek's first_k_dense_replace)."""
    n = max(1, card.num_layers)
    dense_n = card.num_dense_layers if card.moe is not None else n
    moe_n = card.num_moe_layers if card.moe is not None else 0
    known = {"layer_norms", "q_proj", "kv_proj", "o_proj", "q_bias", "kv_bias", "o_bias", "sinks", "qk_norm",
             "q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj", "cross_attn_norms_gates"}
    every = sum(b for k, b in groups.items() if k in known) / n
    dense = sum(b for k, b in groups.items() if k in DENSE_MLP)
    moe = sum(b for k, b in groups.items() if k in MOE)
    if card.moe is None:
        layers = [every + dense / n] * n
    else:
        layers = [every + dense / max(1, dense_n)] * dense_n + [every + moe / max(1, moe_n)] * moe_n
        layers += [every] * (n - len(layers))
    per_layer = {k: b / max(1, dense_n if k in DENSE_MLP else moe_n if k in MOE else n)
                 for k, b in groups.items() if k in known | DENSE_MLP | MOE and b}
    for parts in FUSED:
        per_layer["+".join(parts)] = sum(per_layer.pop(p, 0.0) for p in parts)
    return layers, max(per_layer.values(), default=0.0)


def host_weights(card: ModelCard, groups: dict[str, float], cpu_offload_gb: float, runner_v2: bool = False) -> HostWeights:
    """What `--cpu-offload-gb` moves off one rank (module docstring): the budget is cpu_offload_gb GiB (vLLM
    multiplies by 1024^3), taken from the first decoder layer on. `runner_v2`: a release whose default is Model
    Runner V2 (`vllm/v1/worker/gpu/`, capacity.engine.vllm.release: dense models from 0.26), which never installs the
    offloader (`set_offloader(create_offloader(...))` is called by the V1 runner only: vllm-project/vllm#51396,
    #56283, open in 2026-09), so `make_layers` gets the `NoopOffloader` and nothing moves: for a dense model nothing
    is offloaded; for another (the V2 list varies by release) the conservative end counts on nothing either."""
    if cpu_offload_gb <= 0:
        return HostWeights()
    if runner_v2 and card.is_dense:
        return HostWeights(note=f"cpu_offload_gb {cpu_offload_gb}: ignored by this release's Model Runner V2 (the "
                           "offloader is never installed: vllm-project/vllm#51396), so every weight stays on the GPU")
    layers, largest = layer_bytes(card, groups)
    total, budget = sum(layers), cpu_offload_gb * GiB
    lo, hi = min(budget, total), min(budget + largest, total)
    copy, done = 0.0, 0.0
    for lb in layers:
        if done >= lo:
            break
        copy = max(copy, min(lb, hi - done))  # a layer wholly offloaded, or the last one's offloaded part at most
        done += lb
    if runner_v2:
        return HostWeights(lo=lo, hi=hi, copy=copy, least=0.0, note=(
            f"cpu_offload_gb {cpu_offload_gb}: Model Runner V2 ignores it (vllm-project/vllm#51396) for the "
            "architectures it runs by default; the conservative end counts on no offload"))
    return HostWeights(lo=lo, hi=hi, copy=copy, least=lo, note=(
        f"cpu_offload_gb {cpu_offload_gb}: {lo / GiB:.2f}-{hi / GiB:.2f} GiB of weights per GPU in host memory; the "
        "step cost does not count reading them over the host link each forward, so predicted latencies are optimistic"))


def hand_set_note(profiled: float, kv_bytes: int) -> str:
    """What a budget with the KV cache set by hand says of it."""
    return (f"kv_cache_memory_bytes {kv_bytes}: the KV cache is {kv_bytes / GiB:.2f} GiB as set (vLLM skips the "
            f"profiled size, {profiled / GiB:.2f} GiB at this gpu_memory_utilization, and does not check it "
            "against gpu_memory_utilization)")


def hand_set_kv_problem(b: MemoryBudget, card: ModelCard, gpu: GPU) -> str | None:
    """Why a vLLM with `--kv-cache-memory-bytes` would not start (None if it starts). `Worker.
    determine_available_memory` (vllm/v1/worker/gpu_worker.py, 0.11+) runs the profiling pass and returns the bytes
    as given, so nothing checks them against gpu_memory_utilization: the KV cache is allocated on top of the weights,
    the activation peak, non-torch memory, the runner's buffers, CUDA graphs and the CUDA context, and it fails to
    allocate when those exceed the GPU's total. Then vLLM's own check that one max_model_len request fits the
    blocks (`check_enough_kv_cache_memory`) applies as usual."""
    graphs = b.cuda_graph_bytes if b.cuda_graphs_in_budget else 0.0
    need = (b.weights_bytes + b.activation_bytes + b.non_torch_bytes + b.runner_buffers_bytes + graphs
            + b.outside_budget_bytes + b.kv_budget_bytes)
    if need > b.total_bytes:
        return (f"kv_cache_memory_bytes {int(b.kv_budget_bytes)}: weights {b.weights_bytes / GiB:.2f} GiB + activation "
                f"{b.activation_bytes / GiB:.2f} + non-torch {b.non_torch_bytes / GiB:.2f} + CUDA graphs and context "
                f"{(graphs + b.outside_budget_bytes) / GiB:.2f} + the KV cache {b.kv_budget_bytes / GiB:.2f} = "
                f"{need / GiB:.2f} GiB, more than the {b.total_bytes / GiB:.2f} GiB of {gpu.name} at tp={b.tp}")
    return fit_problem(replace(b, usable_bytes=b.total_bytes), card, gpu)  # gpu_memory_utilization not applied


__all__ = ["HostWeights", "hand_set_kv_problem", "hand_set_note", "host_weights", "layer_bytes"]
