"""Which CUDA graphs each engine replays, per release, and whose all-reduce rules its steps follow (issue 47, (e)
and (c) beyond vLLM). The cost side (the wrapper and the CPU dispatch figures) is capacity/cost/piecewise.py; this
module reads the engine models and picks the rule; docs/fidelity.md, "CUDA graphs by engine", names the sources.

- vLLM: capacity.cost.piecewise.piecewise_wrap (V1 piecewise graphs; full decode graphs from 0.11).
- SGLang (`model_executor/cuda_graph_runner.py` `CudaGraphRunner.can_run`, `get_batch_sizes_to_capture`): a
  decode batch replays the captured graph of the next captured size (padding on by default) up to
  `cuda_graph_max_bs` (the release's default by GPU memory and TP: capacity.engine.sglang.releases
  `default_cuda_graph_max_bs`); a larger batch runs the model eagerly. Extend (prefill) steps run eagerly, except
  from 0.5.10 where the prefill (piecewise) CUDA graph is on (the same condition the memory model reads: not for
  vision models, DP attention, PP or AMD): then they run piecewise, attention eager between graph pieces, costed
  with vLLM's count of eager attention calls. `enforce_eager` (--disable-cuda-graph): every step eager.
- TensorRT-LLM PyTorch backend (`_torch/pyexecutor/model_engine.py`, `llmapi/llm_args.py` `CudaGraphConfig`):
  graphs are on by default from 1.0 (0.17-0.21: off, capacity.engine.trtllm.release `cuda_graphs_default`);
  `CudaGraphConfig` defaults to max_batch_size 128 and enable_padding False, so the captured decode sizes are
  1-31, 32, 64 and 128 (`_generate_cuda_graph_batch_sizes`), and a generation-only batch of any other size runs
  eagerly (no padding); a step with a context request never replays a graph. The engine backend's C++ runtime
  enqueues a TensorRT engine: no Python dispatch, not wrapped.

A step without a graph costs the CPU its whole model's dispatch: layers x piecewise.layer_eager_s, vLLM's eager
layer (its kernel-launching calls from capacity/cost/kernels.py and its all-reduces at the measured eager call, its
views, allocations and nn.Module calls at the view cost: capacity/cost/piecewise.py's docstring), the one eager-step
model vLLM's `enforce_eager` and forced eager mode use too. SGLang's and TensorRT-LLM's own counts per layer are not counted (TensorRT-LLM fuses rope and the KV write
into its attention op and the all-reduce with the residual and norm): vLLM's larger count is the safe side.
"""
from __future__ import annotations

from capacity.cost import piecewise
from capacity.cost.piecewise import PiecewiseGraphCost, eager_step_cost, layer_dispatch_s, layer_eager_s, piecewise_wrap
from capacity.cost.step import StepCost
from capacity.engine.config import EngineConfig
from capacity.engine.sglang.releases import default_cuda_graph_max_bs, version_key, vlm_fraction_factor
from capacity.model.card import ModelCard

MiB = 1 << 20
# CudaGraphConfig() of TensorRT-LLM 1.0+: max_batch_size 0 -> 128, enable_padding False
TRTLLM_GRAPH_SIZES = frozenset([*range(1, 32), 32, 64, 128])
SGLANG_PIECEWISE_FROM = (0, 5, 10, 0)


def allreduce_rules(engine_model, cfg: EngineConfig) -> str:
    """Whose all-reduce rules the engine's steps follow (RooflineParams.allreduce_engine)."""
    name = getattr(engine_model, "name", "vllm")
    if name == "trtllm":
        return "trtllm-engine" if engine_model._rel(cfg).engine_backend else "trtllm"
    return name if name in ("vllm", "sglang") else "vllm"


def _sglang_wrap(cost: StepCost, em, cfg: EngineConfig, card: ModelCard, overhead_s: float) -> StepCost:
    gpu, tp = cost.gpu, cost.tp  # type: ignore[attr-defined]
    L = card.num_kv_layers
    eager = card.num_layers * layer_eager_s(card, tp)
    if cfg.enforce_eager:
        return eager_step_cost(cost, card, tp, overhead_s)
    max_bs = default_cuda_graph_max_bs(gpu.usable_memory_bytes / MiB, tp, em.release)
    piecewise = (version_key(em.release) >= SGLANG_PIECEWISE_FROM and vlm_fraction_factor(card, em.release) == 1.0
                 and not getattr(cfg, "enable_dp_attention", False) and cfg.pp_size() == 1
                 and not (gpu.device_name or "").startswith("AMD"))
    cpu = L * layer_dispatch_s(card) if piecewise else 0.0
    prefill = f"piecewise prefill graphs ({cpu * 1e3:.2f} ms)" if piecewise else "eager prefill"
    return PiecewiseGraphCost(cost, cpu, overhead_s, False, eager_s=eager,
                              decode_graph_sizes=frozenset(range(1, max_bs + 1)), prefill_eager=not piecewise,
                              label=f"decode graphs up to {max_bs} sequences, {prefill}; eager steps "
                                    f"{eager * 1e3:.2f} ms of dispatch")


def _trtllm_wrap(cost: StepCost, em, cfg: EngineConfig, card: ModelCard, overhead_s: float) -> StepCost:
    rel = em._rel(cfg)
    if rel.engine_backend:
        return cost
    eager = card.num_layers * layer_eager_s(card, cost.tp)  # type: ignore[attr-defined]
    graphs = rel.cuda_graphs_default[0] and not cfg.enforce_eager
    sizes = TRTLLM_GRAPH_SIZES if graphs else frozenset()
    label = ("decode graphs at 1-32, 64, 128 sequences (no padding)" if graphs else "no CUDA graphs")
    return PiecewiseGraphCost(cost, 0.0, overhead_s, False, eager_s=eager, decode_graph_sizes=sizes,
                              prefill_eager=True, label=f"{label}; eager steps {eager * 1e3:.2f} ms of dispatch")


def graph_wrap(cost: StepCost, engine_model, cfg: EngineConfig, card: ModelCard, overhead_s: float,
               profile: str | None) -> StepCost:
    """`cost` wrapped with the CPU dispatch of the steps the engine runs without a full CUDA graph (module
    docstring); a measured profile timed the real steps: unwrapped, as is a model with no attention layer."""
    name = getattr(engine_model, "name", "")
    if not piecewise.PIECEWISE_GRAPHS:
        return cost
    if name == "vllm" or profile is not None or not card.num_kv_layers:
        return piecewise_wrap(cost, engine_model, cfg, card, overhead_s, profile)
    if name == "sglang":
        return _sglang_wrap(cost, engine_model, cfg, card, overhead_s)
    if name == "trtllm":
        return _trtllm_wrap(cost, engine_model, cfg, card, overhead_s)
    return cost
