"""Model cards: one schema for dense, GQA, MoE and MLA decoder-only transformers.

A card holds the shapes that decide memory and compute (layers, heads, head_dim, MLP and expert sizes,
vocabulary) plus the storage formats (compute dtype, weight format and quantisation group size).
Cards load from our YAML (`models/*.yaml`) or straight from a Hugging Face `config.json`
(Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V2/V3).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capacity.errors import ConfigError
from capacity.files import read_mapping, validate

PosInt = Annotated[int, Field(gt=0, le=10**7)]  # 1e7 is far past any real shape; stops 1e12 layers
NonNegInt = Annotated[int, Field(ge=0, le=10**7)]
ComputeDtype = Literal["bf16", "fp16"]
WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoE(_Frozen):
    """Mixture of experts. All experts are resident in memory; `experts_per_token` are computed."""

    num_experts: PosInt
    experts_per_token: PosInt
    moe_intermediate_size: PosInt  # per routed expert
    num_shared_experts: NonNegInt = 0  # DeepSeek-style always-on experts
    shared_expert_intermediate_size: PosInt | None = None  # default: moe_intermediate_size x num_shared
    first_dense_layers: NonNegInt = 0  # DeepSeek first_k_dense_replace: these use the dense MLP

    @model_validator(mode="after")
    def _check(self) -> MoE:
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts})"
            )
        return self

    @property
    def shared_intermediate(self) -> int:
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return self.moe_intermediate_size * self.num_shared_experts


class MLA(_Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one latent + rope key per token."""

    q_lora_rank: PosInt | None = None  # None: q is a plain projection (DeepSeek-V2-Lite)
    kv_lora_rank: PosInt
    qk_nope_head_dim: PosInt
    qk_rope_head_dim: PosInt
    v_head_dim: PosInt


class ModelCard(_Frozen):
    name: str = Field(min_length=1)  # the card's name (bundled cards: the file name)
    hf_id: str | None = None  # where the shapes come from
    architecture: str = "llama"  # informational (llama, qwen2, qwen3, mistral, mixtral, deepseek_v3, ...)
    num_layers: PosInt
    hidden_size: PosInt
    num_attention_heads: PosInt
    num_kv_heads: PosInt
    head_dim: PosInt | None = None  # default hidden_size / num_attention_heads (Qwen3 sets it explicitly)
    intermediate_size: PosInt  # dense MLP width (dense layers of MoE models too)
    vocab_size: PosInt
    max_position_embeddings: PosInt
    tie_word_embeddings: bool = False  # the LM head shares the embedding matrix
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    dtype: ComputeDtype = "bf16"  # activations, and weights unless weight_dtype says otherwise
    weight_dtype: WeightDtype | None = None  # storage of linear-layer weights; None = dtype
    quant_group_size: PosInt | None = None  # int4: scales per group of inputs; fp8/int8: square blocks
    moe: MoE | None = None  # mixture-of-experts layers (below)
    mla: MLA | None = None  # multi-head latent attention (below)

    @model_validator(mode="after")
    def _check(self) -> ModelCard:
        if self.mla is None:
            if self.num_attention_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                    f"num_kv_heads ({self.num_kv_heads})"
                )
            if self.head_dim is None and self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                    f"({self.num_attention_heads}); give head_dim explicitly"
                )
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) exceeds num_layers ({self.num_layers})"
            )
        if self.weight_dtype == "int4" and self.quant_group_size is None:
            raise ValueError("weight_dtype int4 needs quant_group_size (e.g. 128)")
        return self

    # ---- derived shapes -------------------------------------------------------------------------
    @property
    def head_dim_(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def weight_format(self) -> str:
        return self.weight_dtype or self.dtype

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def kv_elements_per_token_per_layer(self, tp: int = 1) -> int:
        """Elements one token stores per layer on one TP rank (K and V together).

        GQA/MHA: 2 x kv_heads x head_dim, with kv_heads split across ranks but never below one head
        (vLLM replicates KV heads when tp > num_kv_heads). MLA: one latent (kv_lora_rank) plus the rope
        key (qk_rope_head_dim), the same on every rank because the latent is not split by TP.
        """
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        kv_heads_per_rank = max(1, self.num_kv_heads // tp)
        return 2 * kv_heads_per_rank * self.head_dim_

    def with_overrides(self, **fields: Any) -> ModelCard:
        data = self.model_dump()
        data.update({k: v for k, v in fields.items() if v is not None})
        return validate(ModelCard, data, f"model card {self.name}")


# ---- loading ------------------------------------------------------------------------------------
def load_model_card(path: str | Path) -> ModelCard:
    """Load our YAML card, or a Hugging Face config.json (detected by `model_type`/`architectures`)."""
    data = read_mapping(path)
    if "model_type" in data or "architectures" in data:
        p = Path(path)
        name = (p.resolve().parent.name if p.name == "config.json" else p.stem) or "model"
        return from_hf_config(data, name=name, source=str(path))
    return validate(ModelCard, data, str(path))


_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16"}
_SUPPORTED = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v3", "deepseek_v2"}


def from_hf_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelCard:
    """Map a Hugging Face config.json onto a ModelCard. Unknown architectures are an error, not a guess."""
    mt = cfg.get("model_type")
    if mt not in _SUPPORTED:
        raise ConfigError(
            f"{source}: model_type {mt!r} is not supported; supported: {', '.join(sorted(_SUPPORTED))} "
            "(or write a capacity model card YAML)"
        )

    def need(key: str) -> Any:
        if key not in cfg:
            raise ConfigError(f"{source}: field {key!r} is missing (model_type {mt})")
        return cfg[key]

    dtype = _TORCH_DTYPES.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), "bf16")
    card: dict[str, Any] = {
        "name": name,
        "hf_id": cfg.get("_name_or_path") or None,
        "architecture": mt,
        "num_layers": need("num_hidden_layers"),
        "hidden_size": need("hidden_size"),
        "num_attention_heads": need("num_attention_heads"),
        "num_kv_heads": cfg.get("num_key_value_heads") or need("num_attention_heads"),
        "intermediate_size": need("intermediate_size"),
        "vocab_size": need("vocab_size"),
        "max_position_embeddings": cfg.get("max_position_embeddings", 4096),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "dtype": dtype,
    }
    if cfg.get("head_dim"):
        card["head_dim"] = cfg["head_dim"]
    if mt == "qwen2":
        card["attention_bias"] = True
    if mt in ("qwen3", "qwen3_moe"):
        card["qk_norm"] = True
    if mt == "llama" and cfg.get("attention_bias"):
        card["attention_bias"] = True
    if mt == "mixtral":
        card["moe"] = {
            "num_experts": need("num_local_experts"),
            "experts_per_token": need("num_experts_per_tok"),
            "moe_intermediate_size": need("intermediate_size"),
        }
    if mt == "qwen3_moe":
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            raise ConfigError(f"{source}: qwen3_moe with mlp_only_layers/decoder_sparse_step != 1 is not supported")
        card["moe"] = {
            "num_experts": need("num_experts"),
            "experts_per_token": need("num_experts_per_tok"),
            "moe_intermediate_size": need("moe_intermediate_size"),
        }
    if mt in ("deepseek_v3", "deepseek_v2"):
        card["moe"] = {
            "num_experts": need("n_routed_experts"),
            "experts_per_token": need("num_experts_per_tok"),
            "moe_intermediate_size": need("moe_intermediate_size"),
            "num_shared_experts": cfg.get("n_shared_experts") or 0,
            "first_dense_layers": cfg.get("first_k_dense_replace", 0),
        }
        card["mla"] = {
            "q_lora_rank": cfg.get("q_lora_rank"),
            "kv_lora_rank": need("kv_lora_rank"),
            "qk_nope_head_dim": need("qk_nope_head_dim"),
            "qk_rope_head_dim": need("qk_rope_head_dim"),
            "v_head_dim": need("v_head_dim"),
        }
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method")
        if method == "fp8":
            card["weight_dtype"] = "fp8"
            block = quant.get("weight_block_size")
            if block:
                card["quant_group_size"] = block[0]
        elif method in ("awq", "gptq") and quant.get("bits") == 4:
            card["weight_dtype"] = "int4"
            card["quant_group_size"] = quant.get("group_size", 128) if quant.get("group_size", 128) > 0 else 128
        elif method in ("gptq",) and quant.get("bits") == 8:
            card["weight_dtype"] = "int8"
        else:
            raise ConfigError(f"{source}: quantization_config.quant_method {method!r} is not supported")
    return validate(ModelCard, card, source)


MODELS_DIR = Path(__file__).resolve().parents[1] / "data" / "models"  # package data: works from a wheel


def resolve_model_path(name_or_path: str) -> Path:
    """Accept a path, or the stem of a bundled card (`llama-3.1-8b`)."""
    p = Path(name_or_path)
    if p.exists():
        return p
    for cand in (MODELS_DIR / f"{name_or_path}.yaml", MODELS_DIR / name_or_path):
        if cand.is_file():
            return cand
    bundled = ", ".join(sorted(x.stem for x in MODELS_DIR.glob("*.yaml") if not x.stem.startswith("scenario")))
    raise ConfigError(f"model {name_or_path!r}: no such file or bundled card (bundled: {bundled})")
