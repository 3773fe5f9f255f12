"""What vLLM lays out beside the activation peak, per release: how a kernel path stores quantised experts (MXFP4),
how the KV cache is laid out (DeepSeek before MLA, sliding-window groups, a hybrid model's state layers and
the attention block size they raise), and how pipeline stages split a model. Read from each release's code
(docs/memory.md has the files and the checks); `capacity.engine.vllm.memory` puts them into the budget. It
changes when a release changes one of these layouts."""
from __future__ import annotations

import re

from capacity.engine.budget import KVGroups
from capacity.engine.vllm.mla_copies import mla_enabled
from capacity.engine.vllm.release import Release
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.families.registry import traits
from capacity.model.gpus import GPU
from capacity.model.weights import ExpertLayout
from capacity.units import DTYPE_BYTES


def compute_capability(gpu: GPU) -> int | None:
    """The CUDA compute capability as an integer (sm90 -> 90) from the catalogue's arch; None for AMD or unknown."""
    m = re.search(r"\bsm_?(\d{2,3})\b", gpu.arch or "")
    return int(m[1]) if m else None


def mxfp4_layout(card: ModelCard, gpu: GPU, rel: Release) -> ExpertLayout | None:
    """How vLLM's MXFP4 MoE path stores the experts on this GPU (`quantization/mxfp4.py`, read in 0.11):
    `get_mxfp4_backend` picks FlashInfer on sm100 (intermediate and hidden padded to 256), Triton's matmul_ogs
    on sm90 and newer consumer parts (swizzled copies of the weights replace the checkpoint's, but the
    checkpoint's scales stay registered beside the swizzled ones: counted twice), Marlin before sm90
    (intermediate padded to 128, hidden to 256, weights and scales re-packed in place), and on ROCm 256/256.
    gpt-oss arrived in 0.10.1; before it, and for other formats, None."""
    if "mxfp4" not in (card.weight_format, *card.weight_formats.values()) or rel.runner != "v1":
        return None
    if rel.version < (0, 10, 1):
        return None
    cc = compute_capability(gpu)
    if cc is None:
        if "cdna" in (gpu.arch or "").lower() or gpu.name.startswith("mi"):
            return ExpertLayout("rocm", pad_intermediate=256, pad_hidden=256)
        return None
    if cc == 100:
        return ExpertLayout("flashinfer-sm100", pad_intermediate=256, pad_hidden=256)
    if cc >= 90:
        return ExpertLayout("triton", pad_intermediate=64, checkpoint_scales_kept=True)
    return MARLIN_MXFP4


MARLIN_MXFP4 = ExpertLayout("marlin", pad_intermediate=128, pad_hidden=256)


def mxfp4_layout_alternative(layout: ExpertLayout | None, rel: Release) -> ExpertLayout | None:
    """The other path an install may take: before 0.13 (which vendors triton_kernels) a pip install without the
    triton_kernels package falls back from Triton to Marlin on Hopper (a 0.10.1 H100 log loads gpt-oss-120b at
    65.97 GiB: Marlin's 65.98, not Triton's 64.20). The weights' high end takes it."""
    if layout is not None and layout.name == "triton" and rel.version < (0, 13, 0):
        return MARLIN_MXFP4
    return None


def kv_groups(card: ModelCard, rel: Release, block_size: int) -> KVGroups:
    """The KV layout vLLM uses for the card. V1 >= 0.9.1 gives sliding-window layers their own groups (group
    size: the smaller layer count, or the larger one when they differ by under 25%); older engines and V0
    treat every layer as full attention. A model whose every layer slides is one sliding group."""
    if card.state is not None:
        return _state_groups(card, rel)
    n_slide = card.num_sliding_layers
    if not n_slide or card.sliding_window is None or not rel.hybrid_kv:
        return KVGroups()
    window_blocks = -(-(card.sliding_window - 1) // block_size) + 1
    n_full = card.num_kv_layers - n_slide
    if n_full == 0:
        return KVGroups(full=0, sliding=1, group_size=n_slide, window_blocks=window_blocks, window=card.sliding_window)
    lo, hi = min(n_full, n_slide), max(n_full, n_slide)
    size = hi if hi < lo * 1.25 else lo
    return KVGroups(full=-(-n_full // size), sliding=-(-n_slide // size), group_size=size, window_blocks=window_blocks,
                    window=card.sliding_window)


def kv_layout_card(card: ModelCard, rel: Release) -> ModelCard:
    """The card as the release lays out its KV cache. DeepSeek's latent attention is cached as MLA from 0.7.1
    (0.7.1-0.7.2: unquantised and FP8 checkpoints only, `mla_copies.mla_enabled`); otherwise as plain multi-head
    attention over every head: head size 256 (the 192 of q/k and the 128 of v both padded, deepseek_v2.py "TODO,
    support head_size 192") in 0.5.1-0.6.6, 192 from 0.7.0 (`DeepseekV2Attention`)."""
    if card.mla is None or mla_enabled(card, rel):
        return card
    m = card.mla
    size = m.qk_nope_head_dim + m.qk_rope_head_dim if rel.version >= (0, 7, 0) else 256
    return card.model_copy(update={"mla": None, "num_kv_heads": card.num_attention_heads, "head_dim": size})


def state_dtype_bytes(card: ModelCard, rel: Release) -> tuple[float, float]:
    """(convolution, SSM) state bytes per element as vLLM's MambaStateDtypeCalculator picks them with
    mamba_cache_dtype and mamba_ssm_cache_dtype left at auto: the model dtype, except Nemotron-H from 0.13 (the
    config's mamba_ssm_cache_dtype; float16 where it has none, float32 from 0.27) and gated DeltaNet from 0.17
    (the config's dtype where it names one); Kimi Delta Attention's recurrent state float32."""
    st = card.state
    assert st is not None
    conv = DTYPE_BYTES[card.dtype]
    ssm = conv
    if traits(card.architecture).ssm_dtype_from_config and rel.version >= (0, 13, 0):
        ssm = DTYPE_BYTES[st.ssm_dtype] if st.ssm_dtype else (4.0 if rel.version >= (0, 27, 0) else 2.0)
    elif st.kind == "gated_deltanet" and rel.version >= (0, 17, 0) and st.ssm_dtype:
        ssm = DTYPE_BYTES[st.ssm_dtype]
    elif st.kind == "kda":  # kda_state_dtype: the recurrent state always float32
        ssm = 4.0
    return conv, ssm


def mamba_page_bytes(card: ModelCard, rel: Release, tp: int) -> int:
    """One state layer's state for one sequence on one rank (vLLM's MambaSpec.page_size_bytes)."""
    conv, ssm = card.state.state_elements(tp) if card.state is not None else (0, 0)
    cb, sb = state_dtype_bytes(card, rel)
    return int(conv * cb + ssm * sb)


def hybrid_block_size(card: ModelCard, rel: Release, tp: int, kv_dtype: str, block_size: int) -> int:
    """The attention block size vLLM sets for a hybrid model so that one attention page (block_size tokens of one
    layer) holds a whole state (HybridAttentionMambaModelConfig.verify_and_update_config, read in 0.10.2-0.34):
    16 x cdiv(state page, 16 x one token's KV), never below the configured size; the state page is padded to
    it. A model without attention layers keeps the block size (one group of state layers)."""
    if card.num_kv_layers == 0:
        return block_size
    token = card.kv_elements_per_token_per_layer(tp) * DTYPE_BYTES[kv_dtype]
    align = 16
    need = align * -(-mamba_page_bytes(card, rel, tp) // int(align * token))
    return max(block_size, need)


def _state_groups(card: ModelCard, rel: Release) -> KVGroups:
    """A hybrid's groups (kv_cache_utils' uniform-page grouping): layers of each kind in groups of group_size (the
    smaller count, or the larger when they differ by under 25%, 50% from 0.34), every group drawing same-size
    pages from one pool; an attention group holds a page per block_size tokens, a state group one page per
    sequence (prefix caching off, vLLM's default for hybrids before 0.34)."""
    st = card.state
    assert st is not None
    n_attn, n_state = card.num_kv_layers, st.num_layers
    if n_attn == 0:
        return KVGroups(full=0, state=1, group_size=n_state)
    lo, hi = min(n_attn, n_state), max(n_attn, n_state)
    slack = 1.5 if rel.version >= (0, 34, 0) else 1.25
    size = hi if hi < lo * slack else lo
    return KVGroups(full=-(-n_attn // size), state=-(-n_state // size), group_size=size)


def _stage_sizes(card: ModelCard, pp: int, partition: list[int] | None) -> list[int]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them (VLLM_PP_LAYER_PARTITION where given): an
    even split, the remainder one layer each to the stages before the last, from the second-to-last back."""
    n = card.num_layers
    if partition is not None:
        if len(partition) != pp or sum(partition) != n:
            raise ConfigError(f"pp_layer_partition {partition}: needs {pp} stages summing to {n} layers")
        return list(partition)
    if pp > n:
        raise ConfigError(f"pipeline_parallel_size {pp}: more stages than the {n} layers of {card.name}")
    parts = [n // pp] * pp
    for i in range(2, n % pp + 2):
        parts[-i] += 1
    return parts


def pp_stages(card: ModelCard, pp: int, partition: list[int] | None = None) -> list[ModelCard]:
    """The card of each pipeline stage: its layers (a DeepSeek-style model's first dense layers where they fall),
    the embedding and a vision tower on the first, the final norm and the LM head on the last."""
    if card.state is not None or card.num_sliding_layers or card.cross_attention_layers:
        raise ConfigError(f"pipeline_parallel_size {pp}: stages of {card.name} (hybrid, sliding-window or "
                          "cross-attention layers) are not modelled")
    out, start = [], 0
    first_dense = card.moe.first_dense_layers if card.moe is not None else 0
    for i, n in enumerate(_stage_sizes(card, pp, partition)):
        upd: dict = {"num_layers": n, "has_embedding": i == 0, "has_lm_head": i == pp - 1,
                     "attention_layers": n}
        if card.moe is not None:
            dense = max(0, min(start + n, first_dense) - start)
            upd.update(dense_mlp_layers=dense, moe_layers=n - dense)
        if i:
            upd["vision"] = None
        out.append(card.model_copy(update=upd))
        start += n
    return out
