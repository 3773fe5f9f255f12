"""Model cards: published parameter totals, hand-computed KV bytes, HF config.json loading, bad cards."""
import json

import pytest

from capacity.engine.memory import kv_bytes_per_token
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.weights import count_params

from .conftest import MODELS, ROOT

# Published totals (model cards / safetensors metadata on the Hugging Face Hub).
PUBLISHED = {
    "example-7b": 6_738_415_616,  # Llama-2-7B safetensors total
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-2-70b": 68_976_648_192,
    "qwen3-32b": 32.8e9,  # Qwen3-32B card: "Number of Parameters: 32.8B"
    "qwen2.5-7b": 7.61e9,  # Qwen2.5-7B card: "Number of Parameters: 7.61B"
    "mistral-7b": 7_248_023_552,  # Mistral-7B-v0.3
    "mixtral-8x7b": 46_702_792_704,
    "deepseek-v3": 671e9,  # DeepSeek-V3 paper/card: 671B total (685B on the Hub includes the 14B MTP module)
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_published(card, name):
    got = count_params(card(name))
    assert abs(got - PUBLISHED[name]) / PUBLISHED[name] < 0.01, (name, got)


def test_tiny_param_count_by_hand(card):
    # embed + lm_head 2*2048*256; per layer q 256*256, kv 2*64*256 (2 heads x 32), o 256*256,
    # mlp 3*256*688, norms 2*256; final norm 256.
    per_layer = 256 * 256 + 2 * 64 * 256 + 256 * 256 + 3 * 256 * 688 + 2 * 256
    assert count_params(card("tiny")) == 2 * 2048 * 256 + 4 * per_layer + 256


def test_kv_bytes_per_token_hand_computed(card):
    assert kv_bytes_per_token(card("llama-3.1-8b"), "bf16") == 131_072  # 2 x 32 x 8 x 128 x 2
    assert kv_bytes_per_token(card("llama-3.1-8b"), "bf16", tp=2) == 65_536
    assert kv_bytes_per_token(card("llama-3.1-8b"), "fp8") == 65_536
    assert kv_bytes_per_token(card("example-7b"), "fp16") == 524_288  # 2 x 32 x 32 x 128 x 2 (MHA)
    # Qwen2.5-7B has 4 KV heads: at tp=8 each rank still holds one (replicated), not half a head.
    assert kv_bytes_per_token(card("qwen2.5-7b"), "bf16", tp=8) == 2 * 28 * 1 * 128 * 2
    # DeepSeek-V3 MLA: (512 latent + 64 rope) x 61 layers x 2 B, identical on every TP rank.
    assert kv_bytes_per_token(card("deepseek-v3"), "bf16") == 576 * 61 * 2
    assert kv_bytes_per_token(card("deepseek-v3"), "bf16", tp=8) == 576 * 61 * 2


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b", "qwen3-32b", "mistral-7b", "mixtral-8x7b",
                                  "deepseek-v3"])
def test_hf_config_matches_bundled_card(card, name):
    hf = load_model_card(ROOT / "tests" / "data" / "hf" / f"{name}.json")
    ours = card(name)
    assert count_params(hf) == count_params(ours)
    assert kv_bytes_per_token(hf, "bf16") == kv_bytes_per_token(ours, "bf16")
    assert hf.weight_format == ours.weight_format
    assert (hf.moe is None) == (ours.moe is None) and (hf.mla is None) == (ours.mla is None)


def test_hf_config_json_named_config(tmp_path):
    d = tmp_path / "Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text((ROOT / "tests/data/hf/llama-3.1-8b.json").read_text())
    assert load_model_card(d / "config.json").name == "Llama-3.1-8B"


def test_hf_awq_int4(tmp_path):
    cfg = json.loads((ROOT / "tests/data/hf/qwen2.5-7b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    p = tmp_path / "qwen-awq.json"
    p.write_text(json.dumps(cfg))
    c = load_model_card(p)
    assert (c.weight_format, c.quant_group_size) == ("int4", 128)


def _write(tmp_path, text):
    p = tmp_path / "card.yaml"
    p.write_text(text)
    return p


BASE = (MODELS / "tiny.yaml").read_text()


@pytest.mark.parametrize("text, needle", [
    (BASE + "num_expertz: 4\n", "num_expertz: unknown field"),
    (BASE.replace("num_layers: 4", "num_layers: four"), "num_layers"),
    (BASE.replace("num_layers: 4", "num_layers: -4"), "num_layers"),
    (BASE.replace("hidden_size: 256", "hidden_size: 0"), "hidden_size"),
    (BASE.replace("num_layers: 4", "num_layers: 1000000000000"), "num_layers"),
    (BASE.replace("dtype: bf16", "dtype: fp64"), "dtype"),
    (BASE.replace("num_kv_heads: 2", "num_kv_heads: 3"), "multiple of num_kv_heads"),
    ("name: [unclosed\n", "not valid YAML at line"),
    ("- a\n- list\n", "expected a mapping"),
])
def test_bad_cards_name_the_field(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        load_model_card(_write(tmp_path, text))
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_unsupported_hf_architecture(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "gpt2", "n_layer": 12}))
    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        load_model_card(p)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_model_card(tmp_path / "nope.yaml")
