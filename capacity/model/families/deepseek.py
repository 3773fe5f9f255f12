"""DeepSeek-V2/V3 (vLLM deepseek_v2.py): multi-head latent attention (the KV cache holds one latent of kv_lora_rank
plus the rope key per token and layer), routed and shared experts, the first first_k_dense_replace layers dense.

The router: `DeepseekV2MoE.gate` (ReplicatedLinear, later GateLinear: replicated, the compute dtype) and, where the
config's topk_method is "noaux_tc" (DeepSeek-V3, R1, Kimi-K2: transformers' DeepseekV3Config default; DeepSeekV2Config
defaults to "greedy"), `gate.e_score_correction_bias`, a plain `nn.Parameter(torch.empty(n_routed_experts,
dtype=torch.float32))`: not sharded, so every TP rank holds all of it. The card has no topk_method, so the bias
follows the architecture (a YAML card naming deepseek_v3 gets it too) and a config whose topk_method disagrees with
its model type's is refused in one line.

DeepSeek-V3.2 (`deepseek_v32`, DeepSeek-V3.2-Exp and V3.2): V3's layout plus, on every layer, the DSA lightning
indexer (vLLM deepseek_v2.py `Indexer`, built where the config has index_topk): `wq_b` (ReplicatedLinear
q_lora_rank -> index_n_heads x index_head_dim, quantised with the model), `wk` (ReplicatedLinear hidden ->
index_head_dim, quantised), `k_norm` (a LayerNorm of index_head_dim: weight and bias) and `weights_proj`
(ReplicatedLinear hidden -> index_n_heads, quant_config=None: the compute dtype), all replicated on every rank. Its
key cache (`DeepseekV32IndexerCache.get_kv_cache_spec`: an MLAAttentionSpec of one uint8 head of
index_head_dim + index_head_dim // quant_block_size x 4, quant_block_size 128: fp8 keys and an fp32 scale per 128)
is 132 bytes per token and layer beside the MLA cache whatever the KV dtype: the family's `side_cache_bytes`,
which capacity.engine.budget.kv_bytes_per_token adds. The indexer's sizes are the published ones (index_head_dim
128, index_n_heads 64); a config with others is refused, naming the field.

GLM-5 / GLM-5.1 (`glm_moe_dsa`, zai-org/GLM-5.1): vLLM's registry maps GlmMoeDsaForCausalLM to deepseek_v2.py,
where `class GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM): pass`: the same MLA + DSA-indexer layers, read from the
config (GLM-5.1: qk_nope_head_dim 192, v_head_dim 256, q_lora_rank 2048, 3 dense layers), with the indexer's
index_n_heads 32 (its wq_b and weights_proj are half DeepSeek-V3.2's) and index_head_dim 128 (the same 132-byte
key cache per token and layer). The MTP layer (num_nextn_predict_layers) is loaded only as a speculative draft
and is not counted, as for DeepSeek-V3."""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.families.registry import Family, Need, register
from capacity.model.weights import TensorGroup

_TOPK = {"deepseek_v3": "noaux_tc", "deepseek_v32": "noaux_tc", "glm_moe_dsa": "noaux_tc",
         "deepseek_v2": "greedy"}  # config-class defaults
INDEX_HEAD_DIM, INDEX_HEADS, INDEX_QUANT_BLOCK = 128, 64, 128  # DeepSeek-V3.2's indexer (config.json, vLLM Indexer)
GLM5_INDEX_HEADS = 32  # GLM-5.1's config.json index_n_heads
INDEXER_CACHE_BYTES = INDEX_HEAD_DIM + INDEX_HEAD_DIM // INDEX_QUANT_BLOCK * 4  # 132: fp8 keys + fp32 scale


def _shape(text: dict, card: dict, need: Need, source: str) -> None:
    mt = str(text.get("model_type") or "")
    topk = text.get("topk_method") or _TOPK.get(mt)
    if mt in _TOPK and (topk == "noaux_tc") != (_TOPK[mt] == "noaux_tc"):
        raise ConfigError(f"{source}: topk_method {topk!r} is not supported for model_type {mt} (the score "
                          "correction bias follows the model type: noaux_tc for deepseek_v3 only)")
    mla_moe_fields(text, card, need)


def mla_moe_fields(text: dict, card: dict, need: Need) -> None:
    """The card's `moe` and `mla` from DeepSeek-V2/V3's config fields (also GLM-4.7-Flash's glm4_moe_lite)."""
    card["moe"] = {"num_experts": need("n_routed_experts"), "experts_per_token": need("num_experts_per_tok"),
                   "moe_intermediate_size": need("moe_intermediate_size"),
                   "num_shared_experts": text.get("n_shared_experts") or 0,
                   "first_dense_layers": text.get("first_k_dense_replace", 0)}
    card["mla"] = {"q_lora_rank": text.get("q_lora_rank"), "kv_lora_rank": need("kv_lora_rank"),
                   "qk_nope_head_dim": need("qk_nope_head_dim"), "qk_rope_head_dim": need("qk_rope_head_dim"),
                   "v_head_dim": need("v_head_dim")}


def _v32_shape(text: dict, card: dict, need: Need, source: str) -> None:
    mt = str(text.get("model_type") or "deepseek_v32")
    need("index_topk")  # vLLM builds the indexer where the config has index_topk
    heads = GLM5_INDEX_HEADS if mt == "glm_moe_dsa" else INDEX_HEADS
    for key, want in (("index_head_dim", INDEX_HEAD_DIM), ("index_n_heads", heads)):
        if need(key) != want:
            raise ConfigError(f"{source}: {key} {text[key]!r} is not supported for {mt} ({want} only)")
    _shape(text, card, need, source)
    if card["mla"]["q_lora_rank"] is None:
        raise ConfigError(f"{source}: q_lora_rank is missing (the deepseek_v32 indexer reads the q latent)")


def _indexer(card, groups: list, heads: int = INDEX_HEADS) -> list:
    """The score correction bias and, per layer, the indexer's wq_b, wk, k_norm and weights_proj (replicated)."""
    out = _score_bias(card, groups)
    layers, h, q_lora = card.num_layers, card.hidden_size, card.mla.q_lora_rank
    return out + [TensorGroup("indexer_wq_b", layers, heads * INDEX_HEAD_DIM, q_lora, "replicated", "attention"),
                  TensorGroup("indexer_wk", layers, INDEX_HEAD_DIM, h, "replicated", "attention"),
                  TensorGroup("indexer_k_norm", layers, 1, 2 * INDEX_HEAD_DIM, "replicated", None),
                  TensorGroup("indexer_weights_proj", layers, heads, h, "replicated", None)]


def _glm5_indexer(card, groups: list) -> list:
    return _indexer(card, groups, GLM5_INDEX_HEADS)


def _score_bias(card, groups: list) -> list:
    """gate.e_score_correction_bias: n_routed_experts float32 values per MoE layer, replicated on every rank."""
    out = []
    for t in groups:
        out.append(t)
        if t.name == "router":  # count: the MoE layers; rows: the routed experts
            out.append(TensorGroup("router_score_bias", t.count, 1, t.rows, "replicated", "fp32"))
    return out


register(Family("glm_moe_dsa", ("glm_moe_dsa",), "vllm/model_executor/models/deepseek_v2.py", shape=_v32_shape,
                weights=_glm5_indexer, side_cache_bytes=INDEXER_CACHE_BYTES),
         Family("deepseek_v32", ("deepseek_v32",), "vllm/model_executor/models/deepseek_v2.py", shape=_v32_shape,
                weights=_indexer, side_cache_bytes=INDEXER_CACHE_BYTES),
         Family("deepseek_v3", ("deepseek_v3",), "vllm/model_executor/models/deepseek_v2.py", shape=_shape,
                weights=_score_bias),
         Family("deepseek_v2", ("deepseek_v2",), "vllm/model_executor/models/deepseek_v2.py", shape=_shape))
