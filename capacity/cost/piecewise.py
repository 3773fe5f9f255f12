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
- A hybrid's state layers are split out too (`_attention_ops` holds vllm::mamba_mixer2, gdn_attention and the other
  state ops): each state layer adds its eager op and one graph replay (capacity/cost/state_space_floor.py
  `state_eager_ops`).
- V0 runners capture full decode graphs (`CUDAGraphRunner`): not piecewise. SGLang's and TensorRT-LLM's graphs
  (decode graphs up to a batch size, eager or piecewise prefill) are read in capacity/engine/graphs.py, which
  wraps their steps with this class too (`eager_s`: a step with no graph at all, `layer_eager_s`).

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

A step with no graph at all (`enforce_eager`, vLLM V0 and V1 alike; the release's forced eager mode, fallback.py;
SGLang's and TensorRT-LLM's eager steps, capacity/engine/graphs.py) dispatches every layer from Python
(`layer_eager_s`), counted from vLLM's eager forward of `LlamaDecoderLayer` (models/llama.py; the same count for
every family, its kernels from capacity/cost/kernels.py): the layer's kernel-launching torch calls (kernels.py's
attention and MLP kernels, 10 for Llama: `fused_add_rms_norm` x 2, `F.linear` x 4 via `UnquantizedLinearMethod.apply`,
`ops.rotary_embedding`, `reshape_and_cache_flash`, `flash_attn_varlen_func`, `ops.silu_and_mul`; + one all-reduce
call per `RowParallelLinear` at tp > 1) at the per-call cost, and its dispatches that launch nothing at `VIEW_S`:
`EAGER_WRAPPER_OPS` (10: `qkv.split`; `RotaryEmbedding.forward_cuda`'s `cos_sin_cache.to`; `Attention.forward`'s
`torch.empty`, the q/k/v/output `.view`s, the `torch.ops.vllm.unified_attention_with_output` call into Python and
the returned `.view`; `SiluAndMul.forward_cuda`'s `torch.empty`), the attention backend's views
(`eager_attention_ops`), `EAGER_MODULE_CALLS` (12 `nn.Module` calls: the layer, its attention, qkv_proj,
rotary_emb, attn, o_proj, the two norms, the MLP, gate_up_proj, act_fn, down_proj) and at tp > 1 two per
all-reduce (the `vllm::all_reduce` custom op's entry, its `torch.empty_like` output). Llama at tp 1: 10 calls x
13.65 us + 25 x 2.5 us = 0.199 ms a layer (0.144-0.254 ms over the view range; an eager step takes the high
end, `EAGER_VIEW_S`: 0.254 ms). calibrate/stack.py's measured
layer (0.603 ms, `EAGER_OP_S` x 42) is the same per-op cost over 42 UNFUSED torch ops (its norms, rope and
activation are chains of elementwise ops that vLLM runs as one custom kernel each): it sets the per-op cost, not
vLLM's count (docs/fidelity.md, "One eager step").
"""
from __future__ import annotations

from capacity.cost.kernels import attention_kernels, mlp_kernels
from capacity.cost.state_space_floor import state_eager_ops
from capacity.cost.step import StepCost, StepPlan, decode_run_s
from capacity.model.card import ModelCard

STACK_OPS = 42  # kernel-launching ops a layer in calibrate/stack.py's eager decode step
STACK_VIEWS = 12  # and its views a layer
EAGER_OP_S = 19.308e-3 / (32 * STACK_OPS)  # 14.37 us: one eager op with the stack's views folded in (H200 host)
VIEW_RANGE_S = (0.0, 5e-6)  # one view/slice op alone: an assumption
VIEW_S = (VIEW_RANGE_S[0] + VIEW_RANGE_S[1]) / 2
# A step run wholly eagerly takes the range's high end: the longer dispatch, the conservative step (errors on the
# safe side: a rate promised on the short end is one the engine may not reach)
EAGER_VIEW_S = VIEW_RANGE_S[1]
# vLLM's eager decoder layer (module docstring): dispatches that launch no kernel, and nn.Module calls, each at VIEW_S
EAGER_WRAPPER_OPS = 10  # split, cos_sin_cache.to, Attention.forward's empty + 4 views + the custom op + view, empty
EAGER_MODULE_CALLS = 12  # LlamaDecoderLayer's nn.Module calls, itself included
EAGER_ALLREDUCE_OPS = (1, 2)  # one all-reduce at tp > 1: (kernel-launching calls, dispatches launching nothing)
# The switch: False leaves every step cost unwrapped (the model before issue 47's term (e); docs/fidelity.md).
PIECEWISE_GRAPHS = True


def eager_attention_ops(card: ModelCard) -> tuple[int, int]:
    """(kernel-launching calls, view ops) of one layer's eager attention in a decode step (module docstring)."""
    return (7, 19) if card.mla is not None else (2, 3)


def layer_dispatch_s(card: ModelCard, eager_op_s: float = EAGER_OP_S, view_s: float = VIEW_S) -> float:
    """CPU time of one layer in a piecewise step: its eager attention calls and one graph replay at the per-call
    cost left once `view_s` per view is taken out of the measured stack's ops, plus its views at `view_s`."""
    calls, views = eager_attention_ops(card)
    return (calls + 1) * eager_call_s(eager_op_s, view_s) + views * view_s


def eager_call_s(eager_op_s: float = EAGER_OP_S, view_s: float = VIEW_S) -> float:
    """One kernel-launching eager torch call: the stack's op with its views (`view_s` each) taken out."""
    return (eager_op_s * STACK_OPS - STACK_VIEWS * view_s) / STACK_OPS


def decode_is_piecewise(version: tuple[int, int, int], runner: str) -> bool:
    """A vLLM release whose default cudagraph_mode runs decode-only steps piecewise: V1 before 0.11."""
    return runner == "v1" and version < (0, 11, 0)


def layer_eager_s(card: ModelCard, tp: int, eager_op_s: float = EAGER_OP_S, view_s: float = EAGER_VIEW_S) -> float:
    """CPU time of one layer run wholly eagerly (no graph), counted from vLLM's eager forward (module docstring): its
    kernel-launching calls (the attention and MLP kernels of capacity/cost/kernels.py, and an all-reduce per
    RowParallelLinear at tp > 1) at `eager_call_s`, its dispatches that launch nothing and its nn.Module calls at
    `view_s` each."""
    moe_share = card.num_moe_layers / max(1, card.num_layers)
    mlp = (1 - moe_share) * mlp_kernels(card, False) + (moe_share * mlp_kernels(card, True) if moe_share else 0.0)
    ar_calls, ar_other = (2 * EAGER_ALLREDUCE_OPS[0], 2 * EAGER_ALLREDUCE_OPS[1]) if tp > 1 else (0, 0)
    calls = attention_kernels(card) + mlp + ar_calls
    other = EAGER_WRAPPER_OPS + eager_attention_ops(card)[1] + EAGER_MODULE_CALLS + ar_other
    return calls * eager_call_s(eager_op_s, view_s) + other * view_s


def eager_step_cost(cost: StepCost, card: ModelCard, tp: int, overhead_s: float, layers: int | None = None,
                    why: str = "no CUDA graphs") -> PiecewiseGraphCost:
    """`cost` with every step eager: overhead + max(the GPU's work, `layers` x layer_eager_s of CPU dispatch).
    `layers`: the layers a step runs (None: all of them)."""
    eager = (card.num_layers if layers is None else layers) * layer_eager_s(card, tp)
    return PiecewiseGraphCost(cost, 0.0, overhead_s, False, eager_s=eager, decode_graph_sizes=frozenset(),
                              prefill_eager=True, label=f"{why}: {eager * 1e3:.2f} ms of eager dispatch")


class PiecewiseGraphCost:
    """A step cost whose piecewise or eager steps last overhead + max(the wrapped step's GPU work, the CPU's
    dispatch): `cpu_s` for a piecewise step (L eager attention calls and graph replays, module docstring), `eager_s`
    for a step with no graph at all. `decode_piecewise`: decode-only steps run piecewise (vLLM V1 before 0.11);
    `decode_graph_sizes`: the decode batch sizes with a captured graph (None: every size), others run eagerly
    (SGLang above cuda_graph_max_bs, TensorRT-LLM off its captured sizes); `prefill_eager`: a step with a prefill
    runs with no graph (SGLang's extend before its piecewise graph, TensorRT-LLM's context), else piecewise."""

    def __init__(self, inner, cpu_s: float, overhead_s: float, decode_piecewise: bool, *, eager_s: float = 0.0,
                 decode_graph_sizes: frozenset[int] | None = None, prefill_eager: bool = False,
                 label: str | None = None) -> None:
        if not 0 <= cpu_s < 1 or not 0 <= overhead_s < 1 or not 0 <= eager_s < 1:
            raise ValueError(f"cpu_s, overhead_s, eager_s: in [0, 1) s (got {cpu_s}, {overhead_s}, {eager_s})")
        self.inner = inner
        self._inner_step_s = inner.step_s  # bound once: step_s runs for every step of every simulation
        self.cpu_s = cpu_s
        self.eager_s = eager_s
        self.overhead_s = overhead_s
        self.decode_piecewise = decode_piecewise
        self.decode_graph_sizes = decode_graph_sizes
        self.prefill_eager = prefill_eager
        src = getattr(inner, "source", type(inner).__name__)
        if label is None:
            which = "every step" if decode_piecewise else "steps with a prefill"
            self.source = f"{src}; piecewise CUDA graphs in {which}: {cpu_s * 1e3:.2f} ms of eager dispatch"
        else:
            self.source = f"{src}; {label}"
        if decode_piecewise or decode_graph_sizes is not None:  # max() of a line is not a line: use decode_run_s
            self.decode_line = None

    def __getattr__(self, name: str):  # the wrapped cost's other attributes (card, gpu, params, decode_line, ...)
        if name in ("inner", "_inner_step_s"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _decode_cpu_s(self, batch: int) -> float:
        if self.decode_piecewise:
            return self.cpu_s
        sizes = self.decode_graph_sizes
        return self.eager_s if sizes is not None and batch not in sizes else 0.0

    def _cpu(self, plan: StepPlan) -> float:
        """The CPU dispatch this step waits for (0: a full-graph step)."""
        if plan.prefills:
            return self.eager_s if self.prefill_eager else self.cpu_s
        return self._decode_cpu_s(len(plan.decode_contexts)) if plan.decode_contexts else 0.0

    def step_s(self, plan: StepPlan) -> float:
        t = self._inner_step_s(plan)
        c = self._cpu(plan)
        if not c:
            return t  # a full-graph step
        if plan.num_tokens == 0 or t - self.overhead_s >= c:
            return t  # (as it was, to the last bit, where the GPU is the longer)
        return self.overhead_s + c

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        b = dict(self.inner.breakdown(plan))
        c = self._cpu(plan)
        if plan.num_tokens == 0 or not c:
            return b
        wait = c - (self.inner.step_s(plan) - self.overhead_s)
        if wait > 0:  # the part of the step the GPU waits for the CPU's eager dispatch
            b["eager dispatch"] = wait
        return b

    def decode_run_s(self, contexts, k: int):
        import numpy as np

        durs = decode_run_s(self.inner, contexts, k)
        c = self._decode_cpu_s(len(contexts))
        if not c:
            return durs
        return np.where(durs - self.overhead_s >= c, durs, self.overhead_s + c)


def piecewise_wrap(cost: StepCost, engine_model, cfg, card: ModelCard, overhead_s: float,
                   profile: str | None) -> StepCost:
    """`cost` wrapped in PiecewiseGraphCost where vLLM runs steps without a full CUDA graph: every step eager with
    `enforce_eager` (V0 and V1) or the release's forced eager mode (fallback.py), V1's piecewise graphs otherwise;
    not with a measured profile (it timed the real steps)."""
    rel = getattr(engine_model, "release", None)
    if not PIECEWISE_GRAPHS or getattr(engine_model, "name", "") != "vllm" or profile is not None:
        return cost
    if getattr(engine_model, "forced_eager", False) or getattr(cfg, "enforce_eager", False):
        # every step dispatches the layers a text-only step runs (mllama skips its cross-attention layers)
        return eager_step_cost(cost, card, getattr(cost, "tp", 1), overhead_s,
                               card.num_layers - card.cross_attention_layers)
    if rel is None or rel.runner != "v1" or not card.num_kv_layers:
        return cost
    cpu = card.num_kv_layers * layer_dispatch_s(card)
    if card.state is not None:  # a hybrid's state layers run eagerly between graph pieces too (state_eager_ops)
        calls, views = state_eager_ops(card)
        cpu += card.state.num_layers * ((calls + 1) * eager_call_s() + views * VIEW_S)
    return PiecewiseGraphCost(cost, cpu, overhead_s, decode_is_piecewise(rel.version, rel.runner))
