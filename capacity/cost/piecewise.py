"""(e) Piecewise CUDA graphs: vLLM V1 steps whose attention runs eagerly between graph replays (issue 47).

What vLLM's code does. With `torch.compile` (V1's default), `CompilationConfig.set_splitting_ops_for_v1` splits the
compiled model at the attention custom ops (`vllm.unified_attention`, `unified_attention_with_output`, and for
MLA the same op around `MLACommonImpl.forward`): each piece between two attention calls is captured as a CUDA
graph, the attention itself runs eagerly from Python. Which steps run that way is the release's
`cudagraph_mode`:

- V1 before 0.11 (0.8-0.10, and 0.7's opt-in V1): PIECEWISE by default (`full_cuda_graph` off): every step,
  decode-only ones included, is L graph replays with L eager attention calls between them.
- 0.11 on: FULL_AND_PIECEWISE (the v0.11.0 release notes: "turns on FULL_AND_PIECEWISE as the CUDA graph mode
  default"; `CUDAGraphMode.decode_mode()` FULL, `mixed_mode()` PIECEWISE): a decode-only batch replays one full
  graph (FlashAttention and FlashMLA declare `AttentionCGSupport.UNIFORM_BATCH` or better), a step with a prefill
  in it still runs piecewise.
- V0 runners capture full decode graphs (`CUDAGraphRunner`): not piecewise. SGLang and TensorRT-LLM replay full
  decode graphs by default: not wrapped.

The cost. At small batch the CPU's dispatch of the eager parts outlasts the GPU's work, so such a step lasts the
per-step overhead + max(the GPU's work, the CPU's dispatch of the model): L x (the layer's eager attention calls
+ one graph replay) x the cost of one eager op + the layer's view/slice ops x the cost of one view. Per attention
family, counted from the backends' Python (`eager_attention_ops`):

- FlashAttention (`v1/attention/backends/flash_attn.py`, `FlashAttentionImpl.forward`): `reshape_and_cache_flash`
  and `flash_attn_varlen_func`: 2 calls; `kv_cache.unbind`, `query[:n]`, `output[:n]`: 3 views.
- MLA with FlashMLA (`mla/common.py` `MLACommonImpl.forward`, `mla/flashmla.py` `_forward_decode`,
  `_v_up_proj`): `concat_and_cache_mla`, the `W_UK_T` bmm, the cat, `flash_mla_with_kvcache` (its combine kernel
  rides on the call), the `W_UV` bmm, a reshape copy, the copy into the output: 7 calls; 19 views (eight slices of
  output, q, k_c_normed, k_pe, a squeeze, a flatten, the split, four transposes, two unsqueezes, a view and the
  output slice).

The two CPU figures, from the project's H200 host (calibrate/stack.py run eagerly, bench/decode_floor.py):
`EAGER_OP_S`, the eager "decode 1 @ 1k" step of `bench/results/step_shapes-llama-3.1-8b-h200.json` (19.308 ms)
over 32 layers x 42 kernel-launching ops, whose 12 views a layer are folded in; `VIEW_S`, what a view costs
alone: not measured, a range of 0-5 us, the middle taken. A serving host's CPU differs from that one: both are
assumptions for it (docs/fidelity.md gives the step at both ends of the view range). Steps with more tokens than
the largest captured graph run wholly eagerly, and the prefill path of MLA has more Python than its decode path:
neither is modelled (the decode path's count is used for every piecewise step).
"""
from __future__ import annotations

from capacity.cost.step import StepCost, StepPlan, decode_run_s
from capacity.model.card import ModelCard

STACK_OPS = 42  # kernel-launching ops a layer in calibrate/stack.py's eager decode step
STACK_VIEWS = 12  # and its views a layer
EAGER_OP_S = 19.308e-3 / (32 * STACK_OPS)  # 14.37 us: one eager op with the stack's views folded in (H200 host)
VIEW_RANGE_S = (0.0, 5e-6)  # one view/slice op alone: an assumption
VIEW_S = (VIEW_RANGE_S[0] + VIEW_RANGE_S[1]) / 2
# The switch: False leaves every step cost unwrapped (the model before issue 47's term (e); docs/fidelity.md).
PIECEWISE_GRAPHS = True


def eager_attention_ops(card: ModelCard) -> tuple[int, int]:
    """(kernel-launching calls, view ops) of one layer's eager attention in a decode step (module docstring)."""
    return (7, 19) if card.mla is not None else (2, 3)


def layer_dispatch_s(card: ModelCard, eager_op_s: float = EAGER_OP_S, view_s: float = VIEW_S) -> float:
    """CPU time of one layer in a piecewise step: its eager attention calls and one graph replay at the per-call
    cost left once `view_s` per view is taken out of the measured stack's ops, plus its views at `view_s`."""
    calls, views = eager_attention_ops(card)
    per_call = (eager_op_s * STACK_OPS - STACK_VIEWS * view_s) / STACK_OPS
    return (calls + 1) * per_call + views * view_s


def decode_is_piecewise(version: tuple[int, int, int], runner: str) -> bool:
    """A vLLM release whose default cudagraph_mode runs decode-only steps piecewise: V1 before 0.11."""
    return runner == "v1" and version < (0, 11, 0)


class PiecewiseGraphCost:
    """A step cost whose piecewise steps last overhead + max(the wrapped step's GPU work, `cpu_s`): the CPU dispatch
    of L eager attention calls and graph replays (module docstring). `decode_piecewise`: decode-only steps run
    piecewise too (vLLM V1 before 0.11); a step with a prefill always does (V1's mixed batches)."""

    def __init__(self, inner, cpu_s: float, overhead_s: float, decode_piecewise: bool) -> None:
        if not 0 <= cpu_s < 1 or not 0 <= overhead_s < 1:
            raise ValueError(f"cpu_s, overhead_s: in [0, 1) s (got {cpu_s}, {overhead_s})")
        self.inner = inner
        self._inner_step_s = inner.step_s  # bound once: step_s runs for every step of every simulation
        self.cpu_s = cpu_s
        self.overhead_s = overhead_s
        self.decode_piecewise = decode_piecewise
        src = getattr(inner, "source", type(inner).__name__)
        which = "every step" if decode_piecewise else "steps with a prefill"
        self.source = f"{src}; piecewise CUDA graphs in {which}: {cpu_s * 1e3:.2f} ms of eager dispatch"
        if decode_piecewise:  # max() of a line is not a line: the engine loop must use decode_run_s
            self.decode_line = None

    def __getattr__(self, name: str):  # the wrapped cost's other attributes (card, gpu, params, decode_line, ...)
        if name in ("inner", "_inner_step_s"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _piecewise(self, plan: StepPlan) -> bool:
        return bool(plan.prefills) or (self.decode_piecewise and bool(plan.decode_contexts))

    def step_s(self, plan: StepPlan) -> float:
        t = self._inner_step_s(plan)
        if not plan.prefills and not (self.decode_piecewise and plan.decode_contexts):
            return t  # a full-graph step
        if plan.num_tokens == 0 or t - self.overhead_s >= self.cpu_s:
            return t  # (as it was, to the last bit, where the GPU is the longer)
        return self.overhead_s + self.cpu_s

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        b = dict(self.inner.breakdown(plan))
        if plan.num_tokens == 0 or not self._piecewise(plan):
            return b
        wait = self.cpu_s - (self.inner.step_s(plan) - self.overhead_s)
        if wait > 0:  # the part of the step the GPU waits for the CPU's eager dispatch
            b["eager dispatch"] = wait
        return b

    def decode_run_s(self, contexts, k: int):
        import numpy as np

        durs = decode_run_s(self.inner, contexts, k)
        if not self.decode_piecewise:
            return durs
        return np.where(durs - self.overhead_s >= self.cpu_s, durs, self.overhead_s + self.cpu_s)


def piecewise_wrap(cost: StepCost, engine_model, cfg, card: ModelCard, overhead_s: float,
                   profile: str | None) -> StepCost:
    """`cost` wrapped in PiecewiseGraphCost where vLLM V1 runs piecewise graphs (not with a measured profile, which
    timed the real steps, nor with enforce_eager, whose every op is eager: not modelled), else `cost`."""
    rel = getattr(engine_model, "release", None)
    if PIECEWISE_GRAPHS and getattr(engine_model, "forced_eager", False) and profile is None:  # the release's eager
        # mode (capacity/engine/vllm/fallback.py): every step waits for the dispatch of the layers it runs (a text-only
        # step skips mllama's cross-attention layers), each at the stack's measured eager layer (STACK_OPS ops)
        w = PiecewiseGraphCost(cost, (card.num_layers - card.cross_attention_layers) * STACK_OPS * EAGER_OP_S,
                               overhead_s, True)
        w.source = f"{getattr(cost, 'source', type(cost).__name__)}; no CUDA graphs: {w.cpu_s * 1e3:.2f} ms of eager dispatch"
        return w
    if not PIECEWISE_GRAPHS or getattr(engine_model, "name", "") != "vllm" or rel is None or rel.runner != "v1" or profile is not None \
            or getattr(cfg, "enforce_eager", False) or not card.num_kv_layers:
        return cost
    return PiecewiseGraphCost(cost, card.num_kv_layers * layer_dispatch_s(card), overhead_s,
                              decode_is_piecewise(rel.version, rel.runner))
