"""The model-family registry (capacity/model/families/): each model_type has one family, the generic loader and the
weight layout name no family, a family registered anywhere is used, and a model type no family claims loads as a
standard decoder with a note of what was assumed and which fields were read (or is refused, naming the field)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from capacity.errors import ConfigError
from capacity.model.families import registry
from capacity.model.families.registry import Family, family, supported
from capacity.model.hf import from_hf_config

MODEL = Path(__file__).resolve().parents[1] / "capacity" / "model"
LLAMA_1B = {"num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def test_every_model_type_has_one_family():
    types = supported()
    assert len(types) == len(set(types)) >= 29
    assert {"llama", "deepseek_v3", "gemma3", "mllama", "nemotron_h", "qwen3_next", "ernie4_5_moe"} <= set(types)
    for mt in types:
        fam = family(mt)
        assert fam is not None and mt in fam.model_types and fam.source.startswith("vllm/model_executor/models/")


def _string_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


@pytest.mark.parametrize("module", ["hf.py", "hf_quant.py", "hf_vision.py", "weights.py", "card.py"])
def test_generic_code_names_no_model_type(module):
    """The generic loader and weight layout dispatch through the registry: no model_type appears in their code.
    (schema.py is left out: its VisionTower kinds, whose parameter counts it holds, share names with model types.)"""
    assert _string_literals(MODEL / module) & set(supported()) == set()


def test_a_registered_family_is_used(monkeypatch):
    def shape(text, card, need, source):
        card["qk_norm"] = True
        card["moe"] = {"num_experts": need("n_experts"), "experts_per_token": 2, "moe_intermediate_size": 1024}

    toy = Family("toy", ("toy_moe",), "vllm/model_executor/models/toy.py", shape=shape)
    monkeypatch.setitem(registry._BY_TYPE, "toy_moe", toy)
    card = from_hf_config({**LLAMA_1B, "model_type": "toy_moe", "n_experts": 8}, "toy")
    assert card.qk_norm and card.moe is not None and card.moe.num_experts == 8 and card.notes == []
    with pytest.raises(ConfigError, match=r"field 'n_experts' is missing \(model_type toy_moe\)"):
        from_hf_config({**LLAMA_1B, "model_type": "toy_moe"}, "toy")


def test_unknown_standard_decoder_loads_with_a_note():
    card = from_hf_config({**LLAMA_1B, "model_type": "brand_new_decoder"}, "new")
    llama = from_hf_config({**LLAMA_1B, "model_type": "llama"}, "new")
    assert card.model_dump(exclude={"notes", "architecture"}) == llama.model_dump(exclude={"notes", "architecture"})
    (note,) = card.notes
    assert "'brand_new_decoder' has no family here: read as a Llama-style decoder" in note
    for f in ("num_hidden_layers", "hidden_size", "num_key_value_heads", "tie_word_embeddings"):
        assert f in note


@pytest.mark.parametrize("extra, field", [({"n_routed_experts": 8}, "n_routed_experts"),
                                          ({"kv_lora_rank": 512}, "kv_lora_rank"),
                                          ({"vision_config": {"hidden_size": 1}}, "vision_config")])
def test_unknown_type_with_other_layers_is_refused(extra, field):
    with pytest.raises(ConfigError, match=f"has field '{field}'"):
        from_hf_config({**LLAMA_1B, "model_type": "brand_new_decoder", **extra}, "new")


def test_gemma_1_7b():
    """Gemma 7B (`gemma`, families/gemma.py): vLLM gemma.py's layout, derived by hand from the config (MHA of 16
    heads of 256, a gated GELU MLP, two RMSNorms a layer, the LM head the embedding)."""
    from capacity.engine.budget import kv_bytes_per_token
    from capacity.model.card import load_model_card
    from capacity.model.weights import count_params, weight_bytes_per_rank

    card = load_model_card(Path(__file__).parent / "data" / "families" / "gemma-7b.json")
    h, L, nq, hd, inter, vocab = 3072, 28, 16, 256, 24576, 256000
    layer = nq * hd * h * 3 + h * nq * hd + 3 * h * inter + 2 * h  # q, k, v (16 KV heads), o; gate/up/down
    params = vocab * h + L * layer + h
    assert params == 8_537_680_896 == count_params(card)  # Gemma 7B: "8.54B" on its model card
    assert card.tie_word_embeddings and card.notes == []
    assert sum(weight_bytes_per_rank(card, 1).values()) == params * 2 + 8192 * hd * 2
    assert kv_bytes_per_token(card, "bf16", 1) == 2 * nq * hd * L * 2 == 458_752
