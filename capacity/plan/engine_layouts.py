"""The layouts `capacity plan --layouts` offers, engine by engine, and the engine configuration each one is.

One replica of G GPUs (`--layout-gpus`) can be laid out as:

| name     | vLLM                                   | SGLang                                      | TensorRT-LLM                  |
|----------|----------------------------------------|---------------------------------------------|-------------------------------|
| tp       | --tensor-parallel-size G               | --tp G                                      | --tp_size G                   |
| ep       | + --enable-expert-parallel             | + --ep-size G                               | not compared (see below)      |
| dpN      | --data-parallel-size N --tp G/N (+EP)  | not modelled (plain --dp: refused)          | no data parallelism           |
| adpN     | no attention DP inside TP (use dpN)    | --tp G --dp N --enable-dp-attention         | enable_attention_dp, N = G    |
| adpN-ep  |                                        | + --ep-size G                               | not compared                  |

An attention-DP layout (adpN) holds N attention ranks inside the G GPUs, each with its own scheduler and KV pool,
stepped in lock step (capacity/engine/lockstep.py: the slowest rank's attention plus the MoE/MLP over the
gathered tokens). Its memory is the engine's own per-rank budget: SGLang's attention weights sharded over G / N
and held N times (capacity/engine/sglang/dpattn.py), TensorRT-LLM's everything but the routed experts whole on
every rank (capacity/engine/trtllm/parallel.py); the experts stay split over the G GPUs.

Which layouts an engine release has is the engine model's word, not a list here: each layout's configuration is
validated and its start-up budget worked out (`check`), and a ConfigError there (SGLang before 0.4.4.post1 forces
dp = tp with DP attention; a model whose SGLang code shards attention over the whole TP group; TensorRT-LLM's
engine backend; a dense model) refuses the layout: in one line naming it when asked for by name, skipped with a
note under `auto`. TensorRT-LLM's `--ep_size` is modelled as memory only (its step cost keeps the experts
TP-sharded, the same per-rank expert bytes), so an `ep` layout of it would repeat `tp`: refused, said so.
Attention-DP and expert layouts are for MoE models (a dense model's data parallelism is replicas).
"""
from __future__ import annotations

from dataclasses import dataclass

from capacity.cost.parallel import Layout, check_layout
from capacity.engine.config import EngineConfig
from capacity.engine.lockstep import check_attention_dp
from capacity.errors import ConfigError, DoesNotFit
from capacity.model.card import ModelCard


@dataclass(frozen=True)
class PlanLayout:
    """One replica's layout: `tp` GPUs per data-parallel rank (the MoE/MLP's TP group), `dp` vLLM data-parallel
    ranks, experts whole over the GPUs (`ep`), `adp` attention-DP ranks inside the tp GPUs (1: none)."""

    tp: int = 1
    dp: int = 1
    ep: bool = False
    adp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def kv_pools(self) -> int:
        """Schedulers with a KV pool of their own: vLLM's dp ranks, or the attention-DP ranks."""
        return self.dp * self.adp

    @property
    def label(self) -> str:
        if self.adp > 1:
            return f"tp{self.tp}-adp{self.adp}" + ("-ep" if self.ep else "")
        return Layout(self.tp, self.dp, self.ep).label


def parse_layouts(spec: str, gpus: int, card: ModelCard, engine: str) -> tuple[list[tuple[str, PlanLayout]], bool]:
    """([(name as given, layout)], whether `auto`) from `tp,ep,dpN,adpN,adpN-ep` or `auto` on `gpus` GPUs of
    `engine` (vllm, sglang, trtllm); one line naming the bad entry otherwise."""
    if gpus < 1:
        raise ConfigError(f"--layout-gpus {gpus}: must be >= 1")
    names = [x.strip().lower() for x in spec.split(",") if x.strip()]
    if not names:
        raise ConfigError(f"--layouts {spec!r}: give tp, ep, dpN, adpN, adpN-ep or auto")
    moe = card.moe is not None
    auto = names == ["auto"]
    if auto:
        names = ["tp"] + (["ep"] if moe and engine != "trtllm" else [])
        divisors = [n for n in range(2, gpus + 1) if gpus % n == 0]
        if engine == "vllm":
            names += [f"dp{n}" for n in divisors]
        elif moe and engine == "sglang":
            names += [x for n in divisors for x in (f"adp{n}", f"adp{n}-ep")]
        elif moe and engine == "trtllm" and gpus > 1:
            names.append(f"adp{gpus}")
    out: list[tuple[str, PlanLayout]] = []
    for n in names:
        lay = _one(n, gpus, moe, engine)
        if lay not in [x for _, x in out]:
            out.append((n, lay))
    return out, auto


def _count(n: str, prefix: str) -> int | None:
    tail = n[len(prefix):]
    return int(tail) if n.startswith(prefix) and tail.isascii() and tail.isdigit() and int(tail) > 0 else None


def _one(n: str, gpus: int, moe: bool, engine: str) -> PlanLayout:
    if n == "tp":
        return PlanLayout(gpus)
    if n == "ep":
        if engine == "trtllm":
            raise ConfigError("--layouts ep: TensorRT-LLM's --ep_size is modelled as memory only (its step cost keeps "
                              "the experts TP-sharded), so it would repeat tp; not compared")
        return PlanLayout(gpus, 1, True)
    if (dp := _count(n, "dp")) is not None:
        if gpus % dp:
            raise ConfigError(f"--layouts {n}: dp {dp} does not divide the {gpus} GPUs (--layout-gpus)")
        if engine != "vllm" and dp > 1:
            raise ConfigError(f"--layouts {n}: {engine}'s data parallelism here is attention DP inside the TP group "
                              f"(adp{dp}); plain data-parallel ranks are vLLM's")
        return PlanLayout(gpus // dp, dp, moe)
    ep = n.endswith("-ep")
    if (adp := _count(n[:-3] if ep else n, "adp")) is not None:
        if engine == "vllm":
            raise ConfigError(f"--layouts {n}: attention DP inside the TP group is SGLang's --enable-dp-attention or "
                              "TensorRT-LLM's enable_attention_dp; vLLM's data parallelism is dpN")
        if not moe:
            raise ConfigError(f"--layouts {n}: the model is dense; attention-DP layouts are compared for MoE models "
                              "(a dense model's data parallelism is replicas)")
        if adp < 2 or gpus % adp:
            raise ConfigError(f"--layouts {n}: attention DP {adp} must be > 1 and divide the {gpus} GPUs "
                              "(--layout-gpus)")
        if engine == "trtllm" and (adp != gpus or ep):
            raise ConfigError(f"--layouts {n}: TensorRT-LLM's enable_attention_dp runs one attention rank per GPU "
                              f"(adp{gpus} on {gpus} GPUs), its --ep_size is not compared")
        return PlanLayout(gpus, 1, ep, adp)
    raise ConfigError(f"--layouts {n!r}: use tp, ep, dpN (N dividing --layout-gpus) or auto; adpN, adpN-ep for "
                      "SGLang's and TensorRT-LLM's attention DP")


def layout_engine(base: EngineConfig, lay: PlanLayout) -> EngineConfig:
    """The scenario's engine configuration set to `lay` (validated as a configuration read from a file is)."""
    name = base.engine.split("@")[0].split(":")[0]
    upd: dict = {"tensor_parallel_size": lay.tp}
    if name == "vllm":
        upd.update(data_parallel_size=lay.dp, enable_expert_parallel=lay.ep)
    elif name == "sglang":
        upd.update(data_parallel_size=max(lay.adp, 1), enable_dp_attention=lay.adp > 1,
                   ep_size=lay.tp if lay.ep else 1)
    elif name == "trtllm":
        upd.update(trtllm_attention_dp=lay.adp > 1, moe_expert_parallel_size=lay.tp if lay.ep else None)
    elif lay.dp > 1 or lay.ep or lay.adp > 1:
        raise ConfigError(f"engine {base.engine}: no data, attention-DP or expert layouts modelled")
    data = base.model_dump(exclude_unset=True)
    data.update(upd)
    from pydantic import ValidationError

    try:
        return type(base).model_validate(data)
    except ValidationError as exc:  # its first message, one line
        raise ConfigError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def check(card: ModelCard, eng: EngineConfig, lay: PlanLayout, budget, profile: str | None) -> None:
    """The engine's own refusal of this layout, if any (ConfigError): the layout's checks, the attention-DP
    refusals of the lock-step model, and the start-up budget (`budget(eng)`; not fitting is not a refusal)."""
    if lay.adp == 1:
        check_layout(card, lay.tp, lay.dp, lay.ep)
    else:
        check_attention_dp(eng, card, profile)
    try:
        budget(eng)
    except DoesNotFit:
        pass


__all__ = ["PlanLayout", "check", "layout_engine", "parse_layouts"]
