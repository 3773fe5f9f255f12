"""Build a random-weight Hugging Face Llama from a capacity model card, with a word-level tokenizer.

    python bench/engines/tiny_hf.py --model models/tiny.yaml --out /tmp/tiny-hf

One word = one token ("w0 w1 ..."), so prompt lengths are exact; generation_config has no EOS, so every
request returns exactly max_tokens. Timing does not depend on weight values. Used by the load-test tests
and bench/fidelity.py as the real engine's model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def build(card_path: str, out: str, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from capacity.model.card import load_model_card, resolve_model_path

    card = load_model_card(resolve_model_path(card_path))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for i in range(card.vocab_size - len(specials)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(out_dir)
    cfg = LlamaConfig(vocab_size=card.vocab_size, hidden_size=card.hidden_size, intermediate_size=card.intermediate_size,
                      num_hidden_layers=card.num_layers, num_attention_heads=card.num_attention_heads,
                      num_key_value_heads=card.num_kv_heads, head_dim=card.head_dim_,
                      max_position_embeddings=card.max_position_embeddings, tie_word_embeddings=card.tie_word_embeddings,
                      torch_dtype="bfloat16" if card.dtype == "bf16" else "float16", bos_token_id=1, eos_token_id=None,
                      pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16 if card.dtype == "bf16" else torch.float16)
    model.generation_config.eos_token_id = None
    model.generation_config.do_sample = False
    model.save_pretrained(out_dir)
    (out_dir / "capacity_card.json").write_text(json.dumps(card.model_dump(), indent=1))
    return out_dir


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="models/tiny.yaml")
    ap.add_argument("--out", default="/tmp/tiny-hf")
    a = ap.parse_args()
    print(build(a.model, a.out))
