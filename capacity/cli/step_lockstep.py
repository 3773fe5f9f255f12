"""`capacity step-cost --enable-dp-attention` (SGLang) and `--trtllm-attention-dp` (TensorRT-LLM): the step of D
attention ranks in lock step (capacity/engine/lockstep.py), with its terms printed.

The --prefill chunks and --decode sequences given are the replica's step; they are dealt to the D ranks one
sequence at a time in the order given (the --prefill chunks first), rank 0 first: SGLang's round-robin routing
(`DataParallelController.round_robin_scheduler`) of requests in that order. The lock step then costs as the
simulator does: the slowest rank's attention (at attention TP tp / D) plus the rest of the replica's step (MoE/MLP,
LM head, norms, the all-reduces standing for the gather and scatter) over the gathered rows (SGLang's padding rule,
`gathered_tokens`)."""
from __future__ import annotations

from typing import Any

from capacity.cost.step import StepPlan
from capacity.engine.configs import AnyEngineConfig
from capacity.engine.lockstep import attention_dp_ranks, check_attention_dp, lockstep_cost
from capacity.engine.sglang.dpattn import check_dp_attention
from capacity.engine.sglang.releases import version_key
from capacity.errors import CapacityError


def attention_dp_config(em: Any, spec: str | None, card: Any, gpu: Any, tp: int, dp: int, ep: bool,
                        sglang: bool, trtllm: bool) -> Any:
    """The engine configuration of the flags (None: no attention DP asked for); one line naming the flag and its
    value where the engine or the model has no such layout."""
    if not (sglang or trtllm):
        return None
    from pydantic import TypeAdapter, ValidationError

    flag = "--enable-dp-attention" if sglang else "--trtllm-attention-dp"
    if sglang and trtllm:
        raise CapacityError("--enable-dp-attention and --trtllm-attention-dp: one engine's flag at a time")
    want = "sglang" if sglang else "trtllm"
    if em is None or em.name != want:
        raise CapacityError(f"{flag}: {'SGLang' if sglang else 'TensorRT-LLM'}'s setting; give --engine {want}[@X.Y] "
                            f"(got {spec or 'none'})")
    obj: dict[str, Any] = {"engine": spec, "tensor_parallel_size": tp}
    if sglang:
        obj.update(data_parallel_size=dp, enable_dp_attention=True, ep_size=tp if ep else 1)
    else:
        if dp != 1:
            raise CapacityError(f"--dp {dp}: TensorRT-LLM has no data-parallel size; its attention DP runs one rank "
                                "per --tp GPU")
        if ep:
            raise CapacityError("--enable-expert-parallel: vLLM's and SGLang's here; TensorRT-LLM's --ep_size is "
                                "modelled as memory only")
        obj.update(trtllm_attention_dp=True)
    try:
        cfg = TypeAdapter(AnyEngineConfig).validate_python(obj)
    except ValidationError as err:
        raise CapacityError(str(err.errors()[0]["msg"]).removeprefix("Value error, ")) from None
    em.resolve(cfg, card, gpu)  # the engine's own refusals (TensorRT-LLM: a dense model, the engine backend)
    if sglang:
        check_dp_attention(card, tp, dp, version_key(em.release))
    return cfg


def dealt(plan: StepPlan, d: int) -> tuple[StepPlan, ...]:
    """The replica's plan dealt to d ranks one sequence at a time, prefill chunks first (module docstring)."""
    pre: list[list] = [[] for _ in range(d)]
    dec: list[list[int]] = [[] for _ in range(d)]
    for i, c in enumerate(plan.prefills):
        pre[i % d].append(c)
    n = len(plan.prefills)
    for j, ctx in enumerate(plan.decode_contexts):
        dec[(n + j) % d].append(ctx)
    return tuple(StepPlan(tuple(pre[r]), tuple(dec[r])) for r in range(d))


def lockstep_terms(cost: Any, cfg: Any, card: Any, tp: int, kv_dtype: str, profile: str | None,
                   plan: StepPlan) -> tuple[Any, dict[str, Any]]:
    """(the lock-step cost, its terms for `plan` dealt to the ranks)."""
    check_attention_dp(cfg, card, profile)
    d = attention_dp_ranks(cfg)
    kv = card.dtype if kv_dtype == "auto" else kv_dtype  # as the budget resolves it
    lc = lockstep_cost(cost, card, cost.gpu, tp, d, kv, cuda_graphs=not cfg.enforce_eager)
    return lc, lc.terms(dealt(plan, d))


def print_terms(echo: Any, t: dict[str, Any]) -> None:
    ms = ", ".join(f"{x * 1e3:.3f}" for x in t["rank_attention_s"])
    echo(f"  lock step over {len(t['rank_tokens'])} attention ranks (sequences dealt round robin in the order given)")
    echo(f"    tokens per rank   {t['rank_tokens']}")
    echo(f"    gathered rows     {t['gathered_tokens']} (the MoE/MLP, LM head and all-reduces run over them)")
    echo(f"    rest              {t['rest_over_gathered_s'] * 1e3:10.3f} ms (the replica's step over the gathered rows "
         "less its attention)")
    echo(f"    rank attention    [{ms}] ms (slowest: rank {t['slowest_rank']}, at attention TP)")
    echo(f"    lock step         {t['lock_step_s'] * 1e3:10.3f} ms = rest + the slowest rank's attention")


__all__ = ["attention_dp_config", "dealt", "lockstep_terms", "print_terms"]
