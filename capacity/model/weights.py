"""Weight inventory: every tensor group of a card, its parameter count, and its bytes per TP rank.

Sharding follows vLLM's tensor parallelism: column/row-parallel linears split by tp; K/V projections
split by KV head but never below one head per rank (replicated beyond that); embedding and LM head
split by (padded) vocabulary; norms, routers and MLA's down-projections replicated; experts split along
their intermediate dimension (TP-sharded MoE, no expert parallelism).
Quantised formats apply to linear layers only (embeddings, norms, routers and the vision tower stay in the
compute dtype; the LM head only where the card says so) and their scales are counted: per output channel
(fp8/int8 without groups), square blocks of quant_group_size (fp8/int8 with groups, DeepSeek-V3 style),
fp16 scale + 4-bit zero per group of quant_group_size inputs (int4 AWQ/GPTQ), one e8m0 byte per 32
inputs (mxfp4) or one fp8 byte per 16 inputs (nvfp4). Each module family (attention, dense MLP, experts,
shared experts) takes its own format where the card's `weight_formats` says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from capacity.model.families.registry import family
from capacity.model.schema import ModelCard
from capacity.units import DTYPE_BYTES

Shard = Literal["column", "row", "kv", "vocab", "replicated"]
VOCAB_PADDING = 64  # vLLM pads the vocabulary to a multiple of 64 before splitting it across ranks


@dataclass(frozen=True)
class ExpertLayout:
    """How an engine's MoE kernel stores quantised experts beyond the checkpoint's shapes (vLLM's MXFP4 paths,
    `quantization/mxfp4.py` `create_weights` and `process_weights_after_loading`): the intermediate size per rank
    and the hidden size rounded up to multiples, and whether the checkpoint's scales stay allocated beside the
    kernel's re-laid-out copy."""

    name: str
    pad_intermediate: int = 1
    pad_hidden: int = 1
    checkpoint_scales_kept: bool = False


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class TensorGroup:
    name: str
    count: int  # how many copies (layers x experts)
    rows: int  # output features (1 for norms and biases)
    cols: int  # input features
    shard: Shard
    family: str | None  # the module family whose format a linear layer is stored in; None: compute dtype

    @property
    def params(self) -> int:
        return self.count * self.rows * self.cols


def tensor_groups(card: ModelCard) -> list[TensorGroup]:
    h, L, hd = card.hidden_size, card.num_layers, card.head_dim_
    nq, nkv = card.num_attention_heads, card.num_kv_heads
    g: list[TensorGroup] = []
    if card.has_embedding:
        g.append(TensorGroup("embed_tokens", 1, card.vocab_size + card.extra_vocab, h, "vocab", None))
    if card.has_lm_head and (not card.tie_word_embeddings or not card.has_embedding):  # a last stage keeps its own
        g.append(TensorGroup("lm_head", 1, card.vocab_size, h, "vocab",
                             "lm_head" if "lm_head" in card.weight_formats else None))
    if card.has_lm_head:
        g.append(TensorGroup("final_norm", 1, 1, h, "replicated", None))
    g.append(TensorGroup("layer_norms", L, card.norms_per_layer, h, "replicated", None))
    if card.state is not None:
        g += _state_groups(card)
    L = card.num_kv_layers  # the attention tensors: every layer but a hybrid's state layers

    if card.mla is None:
        g += [
            TensorGroup("q_proj", L, nq * hd * (2 if card.attention_output_gate else 1), h, "column", "attention"),
            TensorGroup("kv_proj", L, 2 * nkv * hd, h, "kv", "attention"),
            TensorGroup("o_proj", L, h, nq * hd, "row", "attention"),
        ]
        if card.attention_bias:
            g += [
                TensorGroup("q_bias", L, 1, nq * hd, "column", None),
                TensorGroup("kv_bias", L, 1, 2 * nkv * hd, "kv", None),
            ]
        if card.attention_out_bias:
            g.append(TensorGroup("o_bias", L, 1, h, "replicated", None))
        if card.attention_sinks:
            g.append(TensorGroup("sinks", L, 1, nq, "column", None))
        if card.qk_norm:
            g.append(TensorGroup("qk_norm", L, 2, hd, "replicated", None))
        if card.cross_attention_layers:  # Mllama: q/k norms and two tanh gates on each cross-attention layer
            g.append(TensorGroup("cross_attn_norms_gates", card.cross_attention_layers, 1, 2 * hd + 2, "replicated",
                                 None))
    else:
        m = card.mla
        qk_hd = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            g.append(TensorGroup("q_proj", L, nq * qk_hd, h, "column", "attention"))
        else:
            g += [
                TensorGroup("q_a_proj", L, m.q_lora_rank, h, "replicated", "attention"),
                TensorGroup("q_a_norm", L, 1, m.q_lora_rank, "replicated", None),
                TensorGroup("q_b_proj", L, nq * qk_hd, m.q_lora_rank, "column", "attention"),
            ]
        g += [
            TensorGroup("kv_a_proj", L, m.kv_lora_rank + m.qk_rope_head_dim, h, "replicated", "attention"),
            TensorGroup("kv_a_norm", L, 1, m.kv_lora_rank, "replicated", None),
            TensorGroup("kv_b_proj", L, nq * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, "column",
                        "attention"),
            TensorGroup("o_proj", L, h, nq * m.v_head_dim, "row", "attention"),
        ]

    dense_layers = card.num_dense_layers
    up = 2 if card.gated_mlp else 1  # gate and up, or up alone
    if dense_layers:
        g += [
            TensorGroup("mlp_gate_up", dense_layers, up * card.intermediate_size, h, "column", "dense_mlp"),
            TensorGroup("mlp_down", dense_layers, h, card.intermediate_size, "row", "dense_mlp"),
        ]
    if card.moe is not None:
        moe, ml = card.moe, card.num_moe_layers
        e, mi = moe.num_experts, moe.moe_intermediate_size
        width = moe.latent_size or h  # the width the routed experts read and write
        g += [
            TensorGroup("router", ml, e, h, "replicated", None),
            TensorGroup("experts_gate_up", ml * e, up * mi, width, "column", "experts"),
            TensorGroup("experts_down", ml * e, width, mi, "row", "experts"),
        ]
        if moe.latent_size:  # into and out of the latent width, once per MoE layer
            g += [TensorGroup("latent_in", ml, moe.latent_size, h, "replicated", "attention"),
                  TensorGroup("latent_out", ml, h, moe.latent_size, "replicated", "attention")]
        if card.expert_bias:  # gpt-oss: router bias, and gate/up and down biases per expert (kept in fp32 by vLLM)
            g += [
                TensorGroup("router_bias", ml, 1, e, "replicated", None),
                TensorGroup("experts_bias", ml * e, 1, 2 * mi, "column", "fp32"),
                TensorGroup("experts_down_bias", ml * e, 1, h, "replicated", "fp32"),
            ]
        if moe.shared_intermediate:
            si = moe.shared_intermediate
            g += [
                TensorGroup("shared_gate_up", ml, up * si, h, "column", "shared_experts"),
                TensorGroup("shared_down", ml, h, si, "row", "shared_experts"),
            ]
    if card.vision is not None:  # the encoder and projector, in the compute dtype, split across ranks
        g.append(TensorGroup("vision_tower", 1, card.vision.params(), 1, "column", None))
    fam = family(card.architecture)  # tensors a family stores beyond this layout (capacity.model.families)
    return fam.weights(card, g) if fam is not None and fam.weights is not None else g


def _state_groups(card: ModelCard) -> list[TensorGroup]:
    """The tensors of a hybrid's state layers (vLLM's MambaMixer2, MambaMixer, GatedDeltaNet, ShortConv): input and
    output projections split by TP like attention's, the depthwise convolution and per-head parameters split by
    channel or head."""
    st = card.state
    assert st is not None
    h, n, k = card.hidden_size, st.num_layers, st.conv_kernel
    if st.kind == "mamba2":
        conv = st.inner + 2 * st.groups * st.state_size
        return [TensorGroup("state_in_proj", n, 2 * st.inner + 2 * st.groups * st.state_size + st.heads, h, "column",
                            "attention"),
                TensorGroup("state_conv", n, conv, k + 1, "column", None),  # weight and bias
                TensorGroup("state_heads", n, 3 * st.heads, 1, "column", None),  # dt_bias, A_log, D
                TensorGroup("state_norm", n, st.inner, 1, "column", None),
                TensorGroup("state_out_proj", n, h, st.inner, "row", "attention")]
    if st.kind == "mamba":
        i, r = st.inner, st.dt_rank or -(-h // 16)
        return [TensorGroup("state_in_proj", n, 2 * i, h, "column", "attention"),
                TensorGroup("state_conv", n, i, k + 1, "column", None),
                TensorGroup("state_x_proj", n, r + 2 * st.state_size, i, "row", "attention"),
                TensorGroup("state_dt_proj", n, i, r + 1, "column", "attention"),
                TensorGroup("state_a_d", n, i, st.state_size + 1, "column", None),
                TensorGroup("state_out_proj", n, h, i, "row", "attention")]
    if st.kind == "gated_deltanet":
        qk, v = st.groups * st.state_size, st.heads * st.head_dim
        return [TensorGroup("state_in_proj", n, 2 * qk + 2 * v + 2 * st.heads, h, "column", "attention"),
                TensorGroup("state_conv", n, 2 * qk + v, k, "column", None),
                TensorGroup("state_heads", n, 2 * st.heads, 1, "column", None),  # dt_bias, A_log
                TensorGroup("state_norm", n, 1, st.head_dim, "replicated", None),
                TensorGroup("state_out_proj", n, h, v, "row", "attention")]
    if st.kind == "kda":  # vLLM layers/kda.py KimiDeltaAttention: q/k/v, gate low-rank pairs, fp32 convs and decay
        p, d, hd = st.heads * st.head_dim, st.head_dim, st.heads
        return [TensorGroup("state_in_proj", n, 3 * p + hd, h, "column", "attention"),  # q/k/v_proj, b_proj
                TensorGroup("state_gate_a", n, 2 * d, h, "replicated", "attention"),  # f_a_proj, g_a_proj
                TensorGroup("state_gate_b", n, 2 * p, d, "column", "attention"),  # f_b_proj, g_b_proj
                TensorGroup("state_conv", n, 3 * p, k, "column", "fp32"),  # q/k/v_conv1d (params_dtype float32)
                TensorGroup("state_heads", n, p + hd, 1, "column", "fp32"),  # dt_bias, A_log (float32)
                TensorGroup("state_norm", n, 1, d, "replicated", None),  # o_norm (FusedRMSNormGated)
                TensorGroup("state_out_proj", n, h, p, "row", "attention")]
    return [TensorGroup("state_in_proj", n, 3 * st.inner, h, "column", "attention"),
            TensorGroup("state_conv", n, st.inner, k, "column", None),
            TensorGroup("state_out_proj", n, h, st.inner, "row", "attention")]


def count_params(card: ModelCard) -> int:
    """Total parameters (tied embeddings counted once), as model cards publish them."""
    return sum(t.params for t in tensor_groups(card))


def _elements_per_rank(t: TensorGroup, card: ModelCard, tp: int) -> tuple[int, int]:
    """(rows, cols) of this group's tensor on one rank. A one-row group is a bias (or a per-head vector) laid out
    along its layer's output dimension: vLLM's ColumnParallelLinear / QKVParallelLinear create the bias with the
    output size per partition (`linear.py` `create_weights`: `output_size_per_partition`), so a column bias splits
    its elements by tp and a K/V bias by the KV heads each rank keeps, like the weight's rows."""
    if t.rows == 1 and t.shard == "column":
        return 1, math.ceil(t.cols / tp)
    if t.rows == 1 and t.shard == "kv":
        return 1, t.cols * max(1, card.num_kv_heads // tp) // card.num_kv_heads
    if t.shard == "column":
        return math.ceil(t.rows / tp), t.cols
    if t.shard == "row":
        return t.rows, math.ceil(t.cols / tp)
    if t.shard == "kv":
        per_rank_heads = max(1, card.num_kv_heads // tp)
        return t.rows * per_rank_heads // card.num_kv_heads, t.cols
    if t.shard == "vocab":
        padded = math.ceil(t.rows / VOCAB_PADDING) * VOCAB_PADDING
        return math.ceil(padded / tp), t.cols
    return t.rows, t.cols


def _scale_bytes(rows: int, cols: int, fmt: str, group: int | None, nested: bool = False) -> float:
    if fmt in ("bf16", "fp16", "fp32"):
        return 0.0
    if fmt == "nf4" and nested:  # a uint8 absmax per block of 64, an fp32 one per 256 of those
        blocks = math.ceil(rows * cols / 64)
        return blocks + math.ceil(blocks / 256) * 4
    if fmt == "mxfp4":  # OCP microscaling: one e8m0 exponent per 32 inputs
        return rows * math.ceil(cols / 32)
    if fmt == "nf4":  # bitsandbytes: an fp32 absmax per block of 64 (vLLM dequantises a nested absmax at load)
        return math.ceil(rows * cols / 64) * 4
    if fmt == "nvfp4":  # one fp8 scale per 16 inputs, plus fp32 global scales (negligible)
        return rows * math.ceil(cols / 16) + 8
    if fmt == "int4":
        # AWQ/GPTQ: one fp16 scale and one packed 4-bit zero point per group of `group` inputs per output
        return rows * math.ceil(cols / (group or 128)) * (2 + 0.5)  # the card validator requires a group for int4
    if group:  # fp8/int8 block quantisation: one fp32 scale per group x group block
        return math.ceil(rows / group) * math.ceil(cols / group) * 4
    return rows * 4  # one fp32 scale per output channel


def _padded(t: TensorGroup, rows: int, cols: int, layout: ExpertLayout) -> tuple[int, int]:
    """An expert tensor's (rows, cols) per rank as the kernel allocates it: gate/up [2 x I, H], down [H, I]."""
    pi, ph = layout.pad_intermediate, layout.pad_hidden
    if t.name == "experts_gate_up":
        return 2 * _round_up(rows // 2, pi), _round_up(cols, ph)
    return _round_up(rows, ph), _round_up(cols, pi)


def weight_bytes_per_rank(card: ModelCard, tp: int = 1, layout: ExpertLayout | None = None,
                          bnb_nested_absmax: bool = False, ep: int = 1, moe_tp: int | None = None) -> dict[str, float]:
    """Bytes of every tensor group on one TP rank (the largest rank where splits are uneven). `layout`: the
    engine kernel's storage of MXFP4 experts (padding, scales kept twice); None counts the checkpoint's shapes.
    `bnb_nested_absmax`: a double-quantised bitsandbytes absmax stays nested (uint8) rather than dequantised
    to fp32 at load. `ep` > 1: expert parallelism, each rank holding ceil(experts / ep) whole experts. `moe_tp`: the
    ranks the experts' intermediate dimension splits over when it is not tp (vLLM's data parallelism without
    expert parallelism flattens tp x dp for the MoE layers: capacity/cost/parallel.py)."""
    nested = bnb_nested_absmax and card.bnb_double_quant
    cdt = card.dtype
    out: dict[str, float] = {}
    experts = card.moe.num_experts if card.moe is not None else 1
    for t in tensor_groups(card):
        rows, cols = _elements_per_rank(t, card, moe_tp if moe_tp and t.family == "experts" else tp)
        if ep > 1 and t.family == "experts" and t.name.startswith("experts_"):  # whole experts, split over ranks
            rows, cols = t.rows, t.cols
            t = TensorGroup(t.name, t.count // experts * -(-experts // ep), t.rows, t.cols, "replicated", t.family)
        fmt = t.family if t.family == "fp32" else (card.format_of(t.family) if t.family else cdt)
        if fmt not in (cdt, "fp32"):
            group = card.quant_group_size
            if layout is not None and fmt == "mxfp4" and t.name in ("experts_gate_up", "experts_down"):
                prow, pcol = _padded(t, rows, cols, layout)
                kept = _scale_bytes(rows, cols, fmt, group) if layout.checkpoint_scales_kept else 0.0
                b = t.count * (prow * pcol * DTYPE_BYTES[fmt] + _scale_bytes(prow, pcol, fmt, group) + kept)
            else:
                b = t.count * (rows * cols * DTYPE_BYTES[fmt] + _scale_bytes(rows, cols, fmt, group, nested))
        else:
            b = t.count * rows * cols * DTYPE_BYTES[fmt]
        out[t.name] = b
    # vLLM's rotary embedding keeps a cos/sin cache of max_position_embeddings x rotary_dim in the compute
    # dtype, allocated while loading and so reported inside "model weights take ..." (32 MiB for Llama-3.1).
    fam = family(card.architecture)  # a partial rotary (GLM: half of head_dim) caches only the rotated width
    partial = fam.partial_rotary if fam is not None else 1.0
    rotary_dim = card.mla.qk_rope_head_dim if card.mla is not None else int(card.head_dim_ * partial)
    positions = sum(card.rope_caches) if card.rope_caches else card.max_position_embeddings
    out["rope_cache"] = positions * rotary_dim * DTYPE_BYTES[cdt] if fam is None or fam.rotary else 0.0
    return out


def lora_bytes_per_rank(card: ModelCard, tp: int, max_loras: int, rank: int) -> float:
    """vLLM's LoRA buffers on one rank (`lora/layers`, read in 0.11): every wrapped linear keeps, per adapter slot,
    an A of rank x input per slice and a B of output x rank per slice (column-parallel layers: input whole, output
    per rank; row-parallel: input per rank, output whole): q/k/v and gate/up are 3 and 2 slices; the embedding
    and the LM head keep A/B over the vocabulary plus 256 extra-vocabulary rows. Experts are not wrapped. In the
    compute dtype (lora_dtype auto)."""
    if max_loras <= 0:
        return 0.0
    h, hd, layers = card.hidden_size, card.head_dim_, card.num_kv_layers
    q = card.num_attention_heads * hd * (2 if card.attention_output_gate else 1)
    kv = max(1, card.num_kv_heads // tp) * hd
    attn = 3 * rank * h + rank * (-(-q // tp) + 2 * kv) + rank * -(-card.num_attention_heads * hd // tp) + h * rank
    mlp = 0
    if card.num_dense_layers:
        i = -(-card.intermediate_size // tp)
        mlp = card.num_dense_layers * ((2 if card.gated_mlp else 1) * rank * h + rank * (2 if card.gated_mlp else 1) * i
                                       + rank * i + h * rank)
    vocab = -(-card.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    embed = rank * (vocab + 256) + 256 * h + h * rank
    head = rank * h + -(-vocab // tp) * rank + 256 * h
    return float(max_loras * (layers * attn + mlp + embed + head) * DTYPE_BYTES[card.dtype])


def experts_only_alternative(card: ModelCard) -> ModelCard | None:
    """The same MoE checkpoint with only its routed experts quantised, or None where that question does not arise.

    A MoE card quantised by an override (`--weight-dtype`: `hf_format` names the format the card had), with no
    per-module map, is counted with every linear layer quantised; which layers the user's checkpoint quantises
    is not known (a checkpoint's own quantization_config says so, and is then read exactly). Published MoE
    checkpoints often quantise the experts alone and keep attention, linear attention, shared experts and dense
    layers in the compute dtype (a Qwen3.5-35B-A3B GPTQ-Int4 run loads 21.05 GiB where all-int4 counts 19.07:
    tests/data/startup_v3). The engines' budgets take this card's weights as the high end of the weights term,
    so the planner never counts on memory those layers may hold."""
    if (card.moe is None or card.weight_formats or card.hf_format in (None, card.weight_format)
            or card.weight_format in ("bf16", "fp16", "fp32", card.dtype)):
        return None
    keep = {f: card.dtype for f in ("attention", "dense_mlp", "shared_experts")}
    return card.model_copy(update={"weight_formats": keep})


def mlp_and_final_norm_biases(card: ModelCard) -> list[TensorGroup]:
    """The bias tensors of a non-gated MLP with biases (up: column-split; down: replicated, added once after the
    all-reduce) and of a final LayerNorm, which families with biased GELU/ReLU MLPs add to the inventory (OPT,
    Phi, StarCoder2, GPT-BigCode)."""
    out: list[TensorGroup] = []
    if card.num_dense_layers:
        out += [TensorGroup("mlp_up_bias", card.num_dense_layers, card.intermediate_size, 1, "column", None),
                TensorGroup("mlp_down_bias", card.num_dense_layers, 1, card.hidden_size, "replicated", None)]
    if card.has_lm_head:
        out.append(TensorGroup("final_norm_bias", 1, 1, card.hidden_size, "replicated", None))
    return out
