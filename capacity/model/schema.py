"""The model card's schema: one pydantic model for dense, GQA, MoE, MLA, sliding-window, cross-attention, hybrid
state-space and vision-language decoders (`ModelCard` and its parts). The shapes that decide memory and compute
(layers, heads, head_dim, MLP and expert sizes, vocabulary) plus the storage formats (compute dtype, weight format
and quantisation group size). Loading lives in `capacity.model.card` (our YAML) and `capacity.model.hf`
(a Hugging Face config.json, dispatched per model family through `capacity.model.families`)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capacity.files import validate

PosInt = Annotated[int, Field(gt=0, le=10**7)]  # 1e7 is far past any real shape; stops 1e12 layers
NonNegInt = Annotated[int, Field(ge=0, le=10**7)]
# A context length in tokens: Llama-4-Scout states 10,485,760 (10M), past PosInt's bound
Positions = Annotated[int, Field(gt=0, le=1 << 26)]
Pixels = Annotated[int, Field(ge=0, le=1 << 32)]  # an image's pixel count (a processor's bound)
Name = Annotated[str, Field(min_length=1, max_length=200)]  # names and ids: echoed in every output
ComputeDtype = Literal["bf16", "fp16"]
WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4", "nf4"]
GemmDtype = Literal["auto", "bf16", "fp16", "fp8", "int8", "fp4"]
# Module families whose storage format can differ from the card's weight_dtype (quantised experts with bf16
# attention, an fp8 model that keeps its router in bf16 ...).
Family = Literal["attention", "dense_mlp", "experts", "shared_experts", "lm_head", "vision"]


class _Frozen(BaseModel):
    # strict: `num_layers: true` is not one layer, `4096.0` is not a count, a string is not a number
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class MoE(_Frozen):
    """Mixture of experts. All experts are resident in memory; `experts_per_token` are computed."""

    num_experts: PosInt
    experts_per_token: PosInt
    moe_intermediate_size: PosInt  # per routed expert
    num_shared_experts: NonNegInt = 0  # DeepSeek-style always-on experts
    shared_expert_intermediate_size: PosInt | None = None  # default: moe_intermediate_size x num_shared
    first_dense_layers: NonNegInt = 0  # DeepSeek first_k_dense_replace: these use the dense MLP
    latent_size: PosInt | None = None  # Nemotron-3's latent MoE: routed experts work in this width, projected in/out

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


class StateLayers(_Frozen):
    """Decoder layers that keep a fixed-size recurrent state per sequence instead of a KV cache: Mamba (Jamba),
    Mamba2 (Nemotron-H, Granite-4.0-H, Falcon-H1), gated DeltaNet (Qwen3-Next), short convolutions (LFM2). The
    state per TP rank is sized as vLLM's MambaStateShapeCalculator sizes it (`state_elements`): a convolution
    state of conv_kernel - 1 columns and, but for short convolutions, an SSM/recurrent state."""

    kind: Literal["mamba", "mamba2", "gated_deltanet", "short_conv", "kda"]  # kda: Kimi Delta Attention
    num_layers: PosInt  # decoder layers of this kind
    conv_kernel: PosInt  # the convolution's width (short_conv: L_cache)
    inner: PosInt  # mamba/mamba2: the inner width (heads x head_dim); short_conv: conv_dim; gated_deltanet: 1
    groups: NonNegInt = 0  # mamba2: n_groups; gated_deltanet: key heads
    state_size: PosInt = 1  # mamba/mamba2: the SSM state N; gated_deltanet: the key head dim
    heads: PosInt = 1  # mamba2 heads; gated_deltanet value heads
    head_dim: PosInt = 1  # mamba2 head dim; gated_deltanet value head dim
    dt_rank: NonNegInt = 0  # mamba (Mamba1): the rank of the time-step projection
    ssm_dtype: Literal["bf16", "fp16", "fp32"] | None = None  # the checkpoint config's state dtype, where it names one
    chunk_size: PosInt = 256  # mamba2: the SSD scan's chunk (vLLM get_mamba_chunk_size: mamba_chunk_size or chunk_size)
    parallel: bool = False  # Falcon-H1: every layer holds attention and a state layer side by side

    def state_elements(self, tp: int = 1) -> tuple[int, int]:
        """(convolution state, SSM/recurrent state) elements of one layer for one sequence on one TP rank."""
        k = self.conv_kernel - 1
        if self.kind == "mamba2":
            ng = self.groups + (0 if self.groups % tp == 0 else tp - self.groups)  # groups replicated to TP
            return k * (self.inner + 2 * ng * self.state_size) // tp, self.heads // tp * self.head_dim * self.state_size
        if self.kind == "mamba":
            return k * self.inner // tp, self.inner // tp * self.state_size
        if self.kind in ("gated_deltanet", "kda"):  # kda: groups = heads, state_size = head_dim (q, k, v convs)
            conv = k * (2 * self.groups * self.state_size + self.heads * self.head_dim) // tp
            return conv, self.heads // tp * self.state_size * self.head_dim
        return k * self.inner // tp, 0


class VisionTower(_Frozen):
    """The image encoder of a vision-language model, sized from its config: CLIP and SigLIP ViTs (LLaVA,
    Gemma-3), Pixtral (Mistral-3) and Mllama's tiled encoder (Llama-3.2-Vision), plus the projector into
    the language model."""

    kind: Literal["clip", "siglip", "pixtral", "mllama", "qwen2_5_vl", "qwen2_vl", "qwen3_vl", "glm4v"]
    num_layers: PosInt  # encoder layers vLLM builds (LLaVA drops those past vision_feature_layer)
    hidden_size: PosInt
    intermediate_size: PosInt
    num_heads: PosInt
    patch_size: PosInt
    image_size: PosInt
    num_global_layers: NonNegInt = 0  # Mllama: gated global layers after the local ones
    max_num_tiles: PosInt = 1  # Mllama: an image is up to this many image_size x image_size tiles (LLaVA-NeXT: tiles + base)
    num_aspect_ratios: PosInt = 1  # Mllama: rows of the aspect-ratio embeddings (supported ratios + 1)
    post_layernorm: bool = True
    kept_layer_outputs: NonNegInt = 0  # intermediate layer outputs the encoder keeps for its output (Mllama: 5)
    projector_params: Annotated[int, Field(ge=0, le=10**11)] = 0  # the multimodal projector (counted by the loader)
    tokens_per_image: PosInt  # what one image becomes in the language model (at the largest size)
    config_layers: NonNegInt = 0  # vision_config.num_hidden_layers as the config states it (0: absent)
    position_embeddings: NonNegInt = 0  # Qwen3-VL / Qwen3.5: learned position embeddings of the patches
    extra_mergers: NonNegInt = 0  # Qwen3-VL: deepstack mergers beside the final one
    # image -> tokens rules (capacity.model.vision_tokens; docs/vision.md names the processor each comes from)
    merge_size: PosInt = 1  # Qwen-VL / Mistral-3: merge x merge patches become one language-model token
    min_pixels: Pixels = 0  # Qwen-VL: the processor resizes an image to at least this many pixels (0: none)
    max_pixels: Pixels = 0  # Qwen-VL: ... and at most this many (0: none)
    longest_edge: NonNegInt = 0  # Pixtral / Mistral-3: an image is scaled down to this longest side (0: image_size)
    window_size: NonNegInt = 0  # Qwen2.5-VL: window attention over window_size-pixel squares (0: full attention)
    full_attention_layers: NonNegInt = 0  # Qwen2.5-VL: layers with full attention (fullatt_block_indexes)
    grid_pinpoints: list[tuple[PosInt, PosInt]] = []  # LLaVA-NeXT anyres: image_grid_pinpoints, (height, width) pixels

    @property
    def gated_mlp(self) -> bool:
        """The encoder's MLP has gate and up projections (Qwen2.5-VL, Pixtral); the others one up projection."""
        return self.kind in ("qwen2_5_vl", "pixtral", "glm4v")

    @property
    def patch_frames(self) -> int:
        """Frames one patch embedding spans: the Qwen ViTs' 3D patches cover temporal_patch_size 2 frames."""
        return 2 if self.kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v") else 1

    @property
    def patches_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def encoder_tokens_per_image(self) -> int:
        """Tokens the encoder itself runs over for one image (class tokens included)."""
        extra = 1 if self.kind in ("clip", "mllama") else 0
        return self.max_num_tiles * (self.patches_per_tile + extra)

    def params(self) -> int:
        h, i, p = self.hidden_size, self.intermediate_size, self.patch_size
        n = self.patches_per_tile
        if self.kind in ("qwen2_vl", "qwen3_vl"):  # LayerNorms, qkv with bias, GELU MLP with biases, 3D patches
            layer = 4 * h + 3 * h * h + 3 * h + h * h + h + 2 * h * i + i + h
            embed = 3 * 2 * p * p * h + (h if self.kind == "qwen3_vl" else 0) + self.position_embeddings * h
            merger = 2 * h + (4 * h) ** 2 + 4 * h  # LayerNorm over one patch, then a 4h x 4h linear (+ the projector)
            # Qwen3-VL's deepstack mergers normalise after the 2x2 shuffle (vLLM qwen3_vl.py Qwen3_VisionPatchMerger,
            # use_postshuffle_norm=True: LayerNorm(4h), weight and bias), 6h more each than the final merger's
            post_shuffle = 6 * h * self.extra_mergers
            return (self.num_layers * layer + embed + (1 + self.extra_mergers) * merger + post_shuffle
                    + self.projector_params)
        if self.kind == "qwen2_5_vl":  # RMSNorms, qkv with bias, gated MLP with biases, 3D patch embedding
            layer = 2 * h + 3 * h * h + 3 * h + h * h + h + 3 * h * i + 2 * i + h
            return self.num_layers * layer + 3 * 2 * p * p * h + self.projector_params
        if self.kind == "glm4v":  # RMSNorms, qkv/proj and gated MLP without biases, a 3D patch linear with bias
            layer = 2 * h + 4 * h * h + 3 * h * i  # (i: the blocks' MLP width, out_hidden_size)
            embed = 3 * 2 * p * p * h + h + self.position_embeddings * h + 2 * h  # + post_conv and post RMSNorms
            return self.num_layers * layer + embed + self.projector_params
        if self.kind == "pixtral":  # RMSNorms, gated MLP, no biases
            layer = 4 * h * h + 3 * h * i + 2 * h
            embed = 3 * p * p * h + h
            return self.num_layers * layer + embed + self.projector_params
        layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h  # q/k/v/o with biases, MLP with biases, 2 LayerNorms
        if self.kind == "mllama":
            layer -= 4 * h  # Mllama's encoder attention has no biases
            embed = (3 * p * p * h + h + (n + 1) * h + 1 + self.num_aspect_ratios * self.max_num_tiles * (n + 1) * h
                     + 2 * (1 + self.num_aspect_ratios * self.max_num_tiles * h) + 4 * h)
            return (self.num_layers * layer + self.num_global_layers * (layer + 2) + embed + self.projector_params)
        embed = 3 * p * p * h + (h if self.kind == "siglip" else 0) + (n + (1 if self.kind == "clip" else 0)) * h
        embed += h + 2 * h if self.kind == "clip" else 0  # class embedding and pre-LayerNorm
        embed += 2 * h if self.post_layernorm else 0
        return self.num_layers * layer + embed + self.projector_params


EngineName = Literal["vllm", "sglang", "trtllm"]


class Checkpoint(_Frozen):
    """A published checkpoint of the same model stored in another format (a quantised repository): what a launch
    command names when the plan runs that format, and what `-m ID` loads (the card with that format)."""

    id: Name  # Hugging Face id
    weight_dtype: WeightDtype
    quant_group_size: PosInt | None = None  # int4: the checkpoint's group
    method: Annotated[str, Field(max_length=40)] = ""  # informational: modelopt, compressed-tensors, awq, gptq
    engines: Annotated[list[EngineName], Field(min_length=1)] = ["vllm", "sglang", "trtllm"]  # which load it


class ModelCard(_Frozen):
    name: Name  # the card's name (bundled cards: the file name)
    hf_id: Name | None = None  # where the shapes come from
    hf_aliases: Annotated[list[Name], Field(max_length=64)] = []  # other Hugging Face ids with the same shapes
    architecture: Name = "llama"  # informational (llama, qwen2, qwen3, mistral, mixtral, deepseek_v3, ...)
    num_layers: PosInt
    hidden_size: PosInt
    num_attention_heads: PosInt
    num_kv_heads: PosInt
    head_dim: PosInt | None = None  # default hidden_size / num_attention_heads (Qwen3 sets it explicitly)
    intermediate_size: PosInt  # dense MLP width (dense layers of MoE models too)
    vocab_size: PosInt
    max_position_embeddings: Positions
    tie_word_embeddings: bool = False  # the LM head shares the embedding matrix
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    dtype: ComputeDtype = "bf16"  # activations, and weights unless weight_dtype says otherwise
    weight_dtype: WeightDtype | None = None  # storage of linear-layer weights; None = dtype
    quant_group_size: PosInt | None = None  # int4: scales per group of inputs; fp8/int8: square blocks
    weight_formats: dict[Family, WeightDtype] = {}  # per-family storage where it differs from weight_dtype
    # The format hf_id's checkpoint stores, where an override (--weight-dtype) changed the card's: None = the
    # card's own weight format. A launch command then names a checkpoint of the card's format (below).
    hf_format: WeightDtype | None = None
    checkpoints: Annotated[list[Checkpoint], Field(max_length=16)] = []  # published checkpoints in other formats
    # The dtype quantised GEMMs multiply in (capacity.model.compute): auto = what engines run for the weight format on
    # the GPU (fp8 weights: FP8 x FP8 where the GPU has FP8 tensor cores); bf16/fp16 = weight-only (W8A16, W4A16).
    gemm_dtype: GemmDtype = "auto"
    moe: MoE | None = None  # mixture-of-experts layers (below)
    mla: MLA | None = None  # multi-head latent attention (below)
    sliding_window: PosInt | None = None  # tokens a sliding-window layer attends to
    num_sliding_layers: NonNegInt = 0  # layers that attend through the sliding window (the rest see everything)
    attention_sinks: bool = False  # a learned sink logit per head (gpt-oss)
    attention_output_gate: bool = False  # q_proj also produces a sigmoid gate per head (Qwen3-Next, Qwen3.5)
    attention_out_bias: bool = False  # o_proj has a bias (gpt-oss)
    expert_bias: bool = False  # experts and router have biases (gpt-oss)
    norms_per_layer: Annotated[int, Field(ge=1, le=8)] = 2  # RMSNorms per decoder layer (Gemma-2/3: 4)
    final_logit_softcap: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None  # tanh cap on the logits (Gemma-2)
    # Positions of each rotary cos/sin cache vLLM builds (empty: one of max_position_embeddings). Linear rope
    # scaling builds its cache max_position_embeddings x factor long; Gemma-3 keeps a local and a global one.
    rope_caches: list[Positions] = []
    cross_attention_layers: NonNegInt = 0  # Mllama: decoder layers that attend to the image instead of the text
    extra_vocab: NonNegInt = 0  # embedding rows past vocab_size (Mllama's image tokens)
    vision: VisionTower | None = None  # the image encoder of a vision-language model
    state: StateLayers | None = None  # hybrid models: their state-space / linear-attention layers
    # Layer counts where a hybrid's pattern decides them (Nemotron-H spells attention, Mamba, MLP and MoE as layers
    # of their own); None: every decoder layer has attention (less any state layers) and an MLP or MoE.
    attention_layers: NonNegInt | None = None
    dense_mlp_layers: NonNegInt | None = None
    moe_layers: NonNegInt | None = None
    gated_mlp: bool = True  # gate and up projections (SwiGLU); false: one up projection (Nemotron's relu^2)
    bnb_double_quant: bool = False
    # A pipeline stage's share of the model (capacity.engine's stage cards): the first stage holds the embedding
    # (and a vision tower), the last the final norm and the LM head.
    has_embedding: bool = True
    has_lm_head: bool = True  # bitsandbytes 4-bit with a double-quantised (uint8) absmax
    # What the loader assumed for a model type it has no family for (shown with every budget)
    notes: Annotated[list[Annotated[str, Field(max_length=400)]], Field(max_length=16)] = []

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
        if "int4" in (self.weight_dtype, *self.weight_formats.values()) and self.quant_group_size is None:
            raise ValueError("weight_dtype int4 needs quant_group_size (e.g. 128)")
        quantised = {self.weight_format, *self.weight_formats.values()} - {"bf16", "fp16"}
        if self.gemm_dtype in ("fp8", "int8", "fp4") and not quantised:
            raise ValueError(f"gemm_dtype {self.gemm_dtype} needs quantised weights (weight_dtype is {self.weight_format})")
        if self.num_sliding_layers > self.num_layers:
            raise ValueError(f"num_sliding_layers ({self.num_sliding_layers}) exceeds num_layers ({self.num_layers})")
        if self.num_sliding_layers and self.sliding_window is None:
            raise ValueError("num_sliding_layers needs sliding_window (the window in tokens)")
        if self.state is not None and self.state.num_layers > self.num_layers:
            raise ValueError(f"state.num_layers ({self.state.num_layers}) exceeds num_layers ({self.num_layers})")
        if self.state is not None and self.num_kv_layers == 0 and self.sliding_window is not None:
            raise ValueError("a model without attention layers has no sliding window")
        if self.cross_attention_layers > self.num_layers:
            raise ValueError(f"cross_attention_layers ({self.cross_attention_layers}) exceeds num_layers ({self.num_layers})")
        return self

    # ---- derived shapes -------------------------------------------------------------------------
    @property
    def head_dim_(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def weight_format(self) -> str:
        return self.weight_dtype or self.dtype

    def format_of(self, family: str) -> str:
        """Storage format of one module family's linear weights."""
        return self.weight_formats.get(family, self.weight_format)  # type: ignore[call-overload]

    @property
    def is_dense(self) -> bool:
        """No experts, no sliding window, no encoder: what vLLM's newer model runner takes by default."""
        return self.moe is None and not self.num_sliding_layers and self.vision is None and self.mla is None

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        return self.moe_layers if self.moe_layers is not None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_dense_layers(self) -> int:
        if self.dense_mlp_layers is not None:
            return self.dense_mlp_layers
        return self.num_layers - self.num_moe_layers

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep a KV cache (every decoder layer, less a hybrid's state layers)."""
        if self.attention_layers is not None:
            return self.attention_layers
        if self.state is not None and not self.state.parallel:
            return self.num_layers - self.state.num_layers
        return self.num_layers

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
        given = {k: v for k, v in fields.items() if v is not None}
        if "weight_dtype" in given and self.hf_format is None and given["weight_dtype"] != self.weight_format:
            data["hf_format"] = self.weight_format  # hf_id still names the checkpoint of the card's own format
        data.update(given)
        return validate(ModelCard, data, f"model card {self.name}")

    def checkpoint_for(self, engine: str) -> str | None:
        """The Hugging Face id whose stored weights are this card's format, for an engine that loads it: hf_id
        where no override changed the format, else a published checkpoint in the format (and group); None where
        none is known."""
        if self.hf_format in (None, self.weight_format):
            return self.hf_id
        for ck in self.checkpoints:
            same_group = self.weight_format != "int4" or ck.quant_group_size in (None, self.quant_group_size)
            if ck.weight_dtype == self.weight_format and engine in ck.engines and same_group:
                return ck.id
        return None

    def as_checkpoint(self, hf_id: str) -> ModelCard:
        """This card as one of its published checkpoints stores it (`-m RedHatAI/...-FP8`)."""
        ck = next(c for c in self.checkpoints if c.id.lower() == hf_id.lower())
        data = self.model_dump()
        data.update(hf_id=ck.id, weight_dtype=ck.weight_dtype, hf_format=None,
                    quant_group_size=ck.quant_group_size or self.quant_group_size)
        return validate(ModelCard, data, f"model card {self.name} as {ck.id}")
