"""Speculative decoding as vLLM and SGLang run it: the setting (`SpeculativeConfig`, EngineConfig.speculative), the
mean accepted length it gives, the draft's card, memory and step cost, and what it changes in a run (`apply`).

Methods: `draft_model` (a smaller model of the same vocabulary, its own card), `eagle` / `eagle3` (a one-layer head
over the target's hidden states: EAGLE-3 fuses three layers' features and has its own, smaller LM head) and `mtp`
(the model's own multi-token-prediction layer: DeepSeek-V3's one MTP module, reused for every draft token; Qwen3-Next
likewise). Chains only (top-k 1: vLLM's `num_speculative_tokens`, SGLang's `--speculative-eagle-topk 1`); SGLang's
draft trees are not modelled.

Acceptance, one of (each says where it comes from; none is measured here):
- `acceptance`: the per-position acceptance rates a_1..a_k as vLLM reports them (`num_accepted_tokens_per_pos /
  num_drafts`, vllm/v1/spec_decode/metrics.py): the share of verify steps whose i-th draft was accepted, so
  non-increasing; E = 1 + sum a_i tokens per verify step (the bonus token included);
- `acceptance_rate` alpha: every draft token accepted with probability alpha given the ones before it (Leviathan et
  al. 2023, "Fast Inference from Transformers via Speculative Decoding", eq. 1): a_i = alpha^i,
  E = (1 - alpha^(k+1)) / (1 - alpha);
- `acceptance_source`: a published figure in capacity/data/speculative_acceptance.yaml (with its source and
  settings): its per-position rates, its alpha, or its mean accepted length at its own k turned into alpha.

What a run does with it (the step cost in capacity.cost.speculative, the schedulers in capacity.sched):
- memory: the draft's weights and its KV (its layers' bytes per token, in the same blocks as the target's:
  vLLM's KV cache spec covers the draft's attention layers too) come out of the KV budget;
- a decoding sequence is verified with k + 1 query tokens, counted in max_num_batched_tokens (vLLM); the draft
  runs its forwards in the same step;
- each verify step advances a sequence by E tokens on average (`capacity.sched.base.accept_drafts`), so the
  inter-token latency is bursty: one gap per verify step, shared by the tokens it emits.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.speculative import SpeculativeCost
from capacity.engine.budget import MemoryBudget, check_tp, kv_bytes_per_token
from capacity.errors import ConfigError, DoesNotFit
from capacity.files import read_mapping, validate
from capacity.model.card import ModelCard, load_named_card
from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES, GiB

Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
METHODS = ("draft_model", "eagle", "eagle3", "mtp")


class SpeculativeConfig(BaseModel):
    """vLLM's --speculative-config (method, num_speculative_tokens, model) / SGLang's --speculative-algorithm and
    --speculative-num-steps, with the acceptance the plan assumes (see module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    method: Literal["draft_model", "eagle", "eagle3", "mtp"]
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)]  # k drafts per verify step
    acceptance_rate: Rate | None = None  # alpha per draft token (see module docstring)
    acceptance: Annotated[list[Rate], Field(min_length=1, max_length=16)] | None = None  # per position, as vLLM reports
    acceptance_source: str | None = None  # a key of capacity/data/speculative_acceptance.yaml
    draft_model: str | None = None  # draft_model: its card (bundled name, YAML or config.json)
    # the draft's path for the launch command (vLLM's "model", SGLang's --speculative-draft-model-path); None: the
    # card's hf_id for draft_model, the target itself for mtp, required for eagle/eagle3 in a launch command only
    draft_path: str | None = None
    draft_vocab_size: Annotated[int, Field(gt=0, le=10**7)] | None = None  # EAGLE-3's own LM head (Llama 3.1: 32000)
    # Engine time per draft forward beyond its roofline (the propose loop's launches, sampling, input preparation),
    # ms. 0: none (the roofline alone, the default); a measured figure where the draft loop was profiled.
    draft_overhead_ms: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        given = [n for n in ("acceptance_rate", "acceptance", "acceptance_source") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of acceptance_rate, acceptance, acceptance_source "
                             f"(got {', '.join(given) or 'none'})")
        if self.acceptance is not None:
            if len(self.acceptance) != self.num_speculative_tokens:
                raise ValueError(f"acceptance: {len(self.acceptance)} rates for num_speculative_tokens "
                                 f"{self.num_speculative_tokens} (one per draft position)")
            for i in range(1, len(self.acceptance)):
                if self.acceptance[i] > self.acceptance[i - 1]:
                    raise ValueError(f"acceptance: position {i + 1} ({self.acceptance[i]}) above position {i} "
                                     f"({self.acceptance[i - 1]}): a draft is accepted only after the ones before it")
        if (self.method == "draft_model") != (self.draft_model is not None):
            raise ValueError("draft_model: the draft model's card is needed with method draft_model, and only there")
        return self


def load_acceptance(key: str) -> dict:
    """A published acceptance figure from capacity/data/speculative_acceptance.yaml."""
    from importlib.resources import files

    data = read_mapping(str(files("capacity") / "data" / "speculative_acceptance.yaml"))
    if key not in data:
        raise ConfigError(f"speculative.acceptance_source {key!r}: not a published figure here; use one of "
                          f"{', '.join(sorted(data))}")
    return data[key]


def alpha_for_length(tau: float, k: int) -> float:
    """The per-token rate alpha whose mean accepted length (1 - alpha^(k+1)) / (1 - alpha) at k drafts is tau."""
    if not 1 <= tau <= k + 1:
        raise ConfigError(f"acceptance length {tau}: must be in [1, k + 1 = {k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < tau else (lo, mid)
    return (lo + hi) / 2


def per_position(spec: SpeculativeConfig) -> list[float]:
    """a_1..a_k: the share of verify steps whose i-th draft is accepted (see module docstring)."""
    k = spec.num_speculative_tokens
    if spec.acceptance is not None:
        return list(spec.acceptance)
    if spec.acceptance_rate is not None:
        return [spec.acceptance_rate ** i for i in range(1, k + 1)]
    fig = load_acceptance(spec.acceptance_source or "")
    if "per_position" in fig:
        rates = [float(x) for x in fig["per_position"]]
        if len(rates) < k:
            raise ConfigError(f"speculative.num_speculative_tokens {k}: {spec.acceptance_source} gives "
                              f"{len(rates)} positions")
        return rates[:k]
    alpha = float(fig["alpha"]) if "alpha" in fig else alpha_for_length(float(fig["acceptance_length"]), int(fig["k"]))
    return [alpha ** i for i in range(1, k + 1)]


def mean_accepted(spec: SpeculativeConfig) -> float:
    """E: tokens a verify step emits on average, the bonus token included (1 + sum of the per-position rates)."""
    return 1.0 + math.fsum(per_position(spec))


def draft_card(card: ModelCard, spec: SpeculativeConfig) -> ModelCard:
    """The draft's shapes: the draft model's own card; for eagle/eagle3 one dense decoder layer of the target's
    width (+ LM head, EAGLE-3's of draft_vocab_size); for mtp one decoder layer of the target's own kind (DeepSeek-V3:
    an MoE layer, reused for every draft token)."""
    if spec.method == "draft_model":
        return load_named_card(spec.draft_model or "")
    data = card.model_dump()
    data.update(name=f"{card.name}-{spec.method}", num_layers=1, num_sliding_layers=0, state=None, vision=None,
                cross_attention_layers=0, attention_layers=None, dense_mlp_layers=None, moe_layers=None, notes=[])
    if spec.method in ("eagle", "eagle3"):
        data["moe"] = None
        if spec.draft_vocab_size is not None:
            data["vocab_size"] = spec.draft_vocab_size
    elif data.get("moe") is not None:
        data["moe"] = {**data["moe"], "first_dense_layers": 0}
    return validate(ModelCard, data, f"speculative draft of {card.name}")


def draft_memory(card: ModelCard, spec: SpeculativeConfig, tp: int, kv_dtype: str) -> tuple[float, float]:
    """(weight bytes, KV bytes per token) of the draft on one TP rank. A head (eagle, eagle3, mtp) shares the
    target's embedding and (but EAGLE-3's) LM head (vLLM's EagleProposer.load_model, vllm/v1/spec_decode/eagle.py),
    and adds its input projection (fc / eh_proj: 2 x hidden, EAGLE-3 3 x hidden, to hidden; replicated)."""
    d = draft_card(card, spec)
    w = weight_bytes_per_rank(d, tp)
    total = math.fsum(w.values())
    if spec.method != "draft_model":  # (its rotary cache too: vLLM's get_rope caches one per shape, shared)
        total -= w.get("embed_tokens", 0.0) + w.get("rope_cache", 0.0)
        if spec.method != "eagle3":
            total -= w.get("lm_head", 0.0)
        fan_in = 3 if spec.method == "eagle3" else 2
        total += fan_in * card.hidden_size * card.hidden_size * DTYPE_BYTES[card.dtype]
    return total, kv_bytes_per_token(d, kv_dtype, tp)


def _release_key(label: str) -> tuple[int, ...]:
    """'sglang@0.4.6.post2' -> (0, 4, 6); () without a version."""
    return tuple(int(x) for x in label.split("@", 1)[-1].replace(".post", ".").split(".")[:3] if x.isdigit())


def with_draft(b: MemoryBudget, card: ModelCard, spec: SpeculativeConfig, engine: str = "vllm") -> MemoryBudget:
    """The budget with the draft's weights taken from the KV budget and its KV added to every block (each end of
    the KV range re-derived: blocks = (blocks x block bytes - draft weights) / (block bytes with the draft's
    layers)). DoesNotFit naming the setting when the draft leaves no room; ConfigError for an engine other than
    vLLM and SGLang (the two modelled)."""
    if engine not in ("vllm", "sglang"):
        raise ConfigError(f"speculative: modelled for vllm and sglang, not {engine}")
    what = f"speculative.{'draft_model ' + str(spec.draft_model) if spec.draft_model else 'method ' + spec.method}"
    if engine == "sglang" and _release_key(b.release) < (0, 5, 15):  # docs/sglang.md, "Terms per release line"
        w, kv = draft_memory(card, spec, b.tp, b.kv_dtype)
        need, room = w + kv * b.kv_tokens, b.activation_bytes
        return dataclasses.replace(b, warnings=[*b.warnings, f"{what}: SGLang {b.release} sizes the target's KV pool "
                                                f"before its draft worker loads: the draft's weights and its own pool, "
                                                f"{need / GiB:.2f} GiB, come out of the reserve T0 x (1 - F) = "
                                                f"{room / GiB:.2f} GiB" + (" (more than it: SGLang would run out of "
                                                                           "memory loading the draft)" if need > room else "")])
    if spec.method == "draft_model" and b.tp > 1:
        try:
            check_tp(draft_card(card, spec), b.tp)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    w, kv = draft_memory(card, spec, b.tp, b.kv_dtype)
    if b.weights_bytes + w >= b.usable_bytes:
        raise DoesNotFit(f"{what}: weights {w / GiB:.1f} GiB per rank beside the target's {b.weights_bytes / GiB:.1f} "
                         f"GiB exceed the usable {b.usable_bytes / GiB:.1f} GiB at tp={b.tp}")
    bb = b.block_bytes or b.block_size * b.kv_bytes_per_token
    bb_new = bb * (b.kv_bytes_per_token + kv) / b.kv_bytes_per_token if b.kv_bytes_per_token else bb

    def blocks(n: int) -> int:
        return max(0, int((n * bb - w) // bb_new))

    out = dataclasses.replace(
        b, weights_bytes=b.weights_bytes + w, kv_budget_bytes=max(0.0, b.kv_budget_bytes - w),
        kv_bytes_per_token=b.kv_bytes_per_token + kv, block_bytes=bb_new, num_blocks=blocks(b.num_blocks),
        planning_blocks=blocks(b.planning_blocks), num_blocks_range=[blocks(n) for n in b.num_blocks_range],
        warnings=[*b.warnings, f"{what}: {w / GiB:.2f} GiB of draft weights and {kv:,.0f} B/token of draft KV "
                  "per rank taken from the KV cache (its activations and CUDA graphs are not counted)"])
    tokens = out.planning_blocks // max(1, out.kv_groups.groups) * out.block_size
    out = dataclasses.replace(out, kv_tokens=tokens, max_concurrency=tokens / max(1, out.max_model_len))
    # vLLM refuses to start below one max_model_len request; SGLang starts and caps a request at its pool
    need = out.kv_groups.startup_blocks(out.max_model_len, out.block_size) if out.engine == "vllm" else 1
    if out.planning_blocks < need:
        raise DoesNotFit(f"{what}: with the draft's weights ({w / GiB:.2f} GiB) and KV, {out.planning_blocks:,} KV "
                         f"blocks are left, one request of max_model_len {out.max_model_len:,} needs {need:,} "
                         f"at tp={b.tp}; lower max_model_len or raise tp")
    return out


def launch_flags(engine: str, spec: SpeculativeConfig | None, legacy: bool = False) -> list[str]:
    """The launch command's flags: vLLM's --speculative-config JSON (vllm/config/speculative.py: method, model,
    num_speculative_tokens); SGLang's --speculative-algorithm (EAGLE for eagle and the DeepSeek MTP/NextN head,
    EAGLE3, STANDALONE for a draft model) with --speculative-num-steps k, --speculative-eagle-topk 1 and
    --speculative-num-draft-tokens k + 1 (a chain, python/sglang/srt/server_args.py). The draft's path: draft_path,
    else the draft model's card's hf_id; an EAGLE head without one is named DRAFT_PATH to fill in. `legacy`: vLLM
    0.4.1-0.8.2's --speculative-model PATH --num-speculative-tokens k (capacity/engine/vllm/flags.py)."""
    if spec is None:
        return []
    import json

    path = spec.draft_path
    if path is None and spec.method == "draft_model":
        path = load_named_card(spec.draft_model or "").hf_id
    if path is None and spec.method in ("eagle", "eagle3", "draft_model"):
        path = "DRAFT_PATH"
    k = spec.num_speculative_tokens
    if engine == "sglang":
        algo = {"eagle": "EAGLE", "mtp": "EAGLE", "eagle3": "EAGLE3", "draft_model": "STANDALONE"}[spec.method]
        out = [f"--speculative-algorithm {algo}"] + ([f"--speculative-draft-model-path {path}"] if path else [])
        return out + [f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"]
    if legacy and spec.method == "draft_model":  # flags.check refuses eagle/mtp before --speculative-config
        return [f"--speculative-model {path} --num-speculative-tokens {k}"]
    cfg: dict = {"method": spec.method, "num_speculative_tokens": k}
    if path:
        cfg["model"] = path
    return [f"--speculative-config '{json.dumps(cfg, separators=(',', ':'))}'"]


def run_notes(spec: SpeculativeConfig, budget_warnings: Sequence[str] = ()) -> list[str]:
    """What a run's figures assume about speculation (printed with every simulation that uses it), after the memory
    budget's own speculative warnings."""
    said = [w for w in budget_warnings if w.startswith("speculative")]
    if spec.acceptance_source is not None:
        where = f"the published figure {spec.acceptance_source} ({load_acceptance(spec.acceptance_source)['source']})"
    else:
        where = "the acceptance given (assumed, not measured here)"
    return said + [f"speculative {spec.method}, k={spec.num_speculative_tokens}: E={mean_accepted(spec):.2f} tokens per "
            f"verify step from {where}; ITL is the gap between verify steps (their tokens arrive together), TPOT "
            "the mean per token"]


def speculating(factory, spec: SpeculativeConfig):
    """A scheduler factory whose schedulers speculate: their config's spec_tokens (k) and spec_extra_mean (E - 1,
    capacity.sched.base.accept_drafts); built once now, so a bad setting fails before the simulation."""
    settings = {"spec_tokens": spec.num_speculative_tokens, "spec_extra_mean": mean_accepted(spec) - 1.0}

    def make():
        sched = factory()
        sched.cfg = dataclasses.replace(sched.cfg, **settings)
        return sched
    make()
    return make


def wrap_cost(cost, card: ModelCard, spec: SpeculativeConfig, gpu, tp: int, kv_dtype: str, engine: str):
    """The run's step cost with the draft and the verify step (capacity.cost.speculative); the draft on the
    roofline of the same GPU at the same TP, its per-step engine overhead 0 (the engine's is paid once a step)."""
    draft = RooflineCost(draft_card(card, spec), gpu, tp, kv_dtype=None if kv_dtype in (None, "auto") else kv_dtype,
                         params=RooflineParams(step_overhead_s=0.0))
    return SpeculativeCost(cost, draft, spec.num_speculative_tokens, "sglang" if engine.startswith("sglang") else "vllm",
                           label=f"{spec.method} k={spec.num_speculative_tokens}, E={mean_accepted(spec):.2f}",
                           forward_overhead_s=spec.draft_overhead_ms / 1e3)
