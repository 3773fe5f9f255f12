"""TensorRT-LLM's engine (C++) backend's start-up memory (capacity/engine/trtllm/cpp_memory.py, docs/trtllm.md):
each term by hand from the shapes the code allocates, the KV formula on the logs' own readings, and the
`trtllm_backend` setting."""
from __future__ import annotations

from pathlib import Path

import pytest

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.engine.trtllm import cpp_memory as cm
from capacity.errors import ConfigError
from capacity.model.card import ModelCard, load_model_card
from capacity.model.gpus import get_gpu, with_memory
from tests.conftest import run_cli

DATA = Path(__file__).resolve().parent / "data"
GiB = 1024**3


def _llama8b_fp8():
    return load_model_card(DATA / "hf" / "llama-3.1-8b.json").with_overrides(weight_dtype="fp8")


def _qwen15_7b():
    return load_model_card(DATA / "startup_v3" / "hf" / "qwen1.5-7b-chat.json")


def test_one_layers_live_set_by_hand():
    """Llama-3.1-8B, TP 1: attention (2 x 32 + 2 x 8) x 128 + 4,096 = 14,336; MLP 3 x 14,336 + 4,096 = 47,104;
    2 bytes x (4,096 + 47,104) = 102,400 B a token. At TP 2 the MLP is 3 x 7,168 + 4,096 = 25,600: 59,392 B."""
    card = _llama8b_fp8()
    assert cm.layer_live_bytes_per_token(card, 1) == 102_400
    assert cm.layer_live_bytes_per_token(card, 2) == 59_392


def test_the_execution_context_range_holds_a_published_log():
    """NVIDIA/TensorRT-LLM issue 1188 (a comment of 2024-11-21): Qwen2.5-Coder-0.5B int8 on an A4000, 'Allocated
    773.51 MiB for execution context memory' at trtllm-build's default max_num_tokens 8,192 and 43.26 MiB at 512.
    By hand: attention (2 x 14 + 2 x 2) x 64 + 896 = 2,944; MLP 3 x 4,864 + 896 = 15,488; 2 B x (896 + 15,488)
    = 32,768 B a token: 256 MiB at 8,192 (the log is 3.0x) and 16 MiB at 512 (2.7x), inside the 1-3.5x range."""
    card = ModelCard(name="qwen2.5-0.5b", num_layers=24, hidden_size=896, num_attention_heads=14, num_kv_heads=2,
                     intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768)
    per = cm.layer_live_bytes_per_token(card, 1)
    assert per == 32_768
    lo, hi = cm.ACTIVATION_SPREAD[1], cm.ACTIVATION_SPREAD[2]
    for tokens, logged_mib in ((8192, 773.51), (512, 43.26)):
        assert lo * per * tokens <= logged_mib * 2**20 <= hi * per * tokens


def test_the_vocab_padded_to_the_ranks():
    """getVocabSizePadded(worldSize): 128,256 is a multiple of 8; 151,936 / 3 rounds up to 151,938."""
    assert cm.vocab_padded(_llama8b_fp8(), 8) == 128_256
    assert cm.vocab_padded(_qwen15_7b(), 3) == 151_938


def test_runtime_and_decoder_buffers_by_hand():
    """trtllm-serve 0.19's engine (max_batch_size 2048, max_num_tokens 8192, max_seq_len the model's 131,072),
    Llama-3.1-8B: the logits output is 2,048 x 128,256 x 4 B (fp32) = 1,050,673,152 B. The decoder per slot:
    128,256 x (4 embedding bias + 4 runtime logits + 4 penalty counts + 16 / 32 AIR top-p) = 128,256 x 12.5 B,
    131,072 x 16 B of ids, parent ids and log probs, 2,048 x 12 B of AIR histograms: 2,048 x (1,603,200 +
    2,097,152 + 24,576) = 7,628,652,544 B; low (no penalty workspace, 8.5 B a pair) 6,577,979,392 B; high (32 B
    a pair) 12,750,684,160 B. The execution context's low end is 102,400 x 8,192 = 838,860,800 B, its high end
    3.5x."""
    card, gpu = _llama8b_fp8(), with_memory(get_gpu("rtx-5090"), 31.84)
    cfg = EngineConfig(engine="trtllm@0.19", kv_cache_dtype="fp8")
    eng = get_engine("trtllm@0.19").resolve(cfg, card, gpu)
    assert (eng.max_num_seqs, eng.max_num_batched_tokens, eng.block_size) == (2048, 8192, 32)
    t = cm.terms(card, gpu, eng)
    assert t.runtime_buffers == (1_050_673_152, 1_050_673_152, 3 * 1_050_673_152)
    assert t.decoder == (7_628_652_544, 6_577_979_392, 12_750_684_160)
    assert t.activation[1] == 838_860_800 and t.activation[2] == 838_860_800 * 3.5


def test_the_kv_formula_on_the_logs_own_readings():
    """calculateMaxNumBlocks from a log's `available`: Qwen1.5-7B (0.13, A100 40 GB): 2 x 32 x 32 x 128 x 2 =
    524,288 B a token; int(0.9 x 21.89 GiB / 524,288) = int(0.9 x 21.89 x 2,048) = 40,347 tokens; ceil(/ 64) = 631
    blocks, as logged. Llama-3.1-8B FP8 KV (0.19, RTX 5090): 65,536 B a token; int(0.9 x 17.83 x 16,384) =
    262,914 tokens, 8,217 blocks of 32; the log's 8,219 is within the rounding of its 17.83 (0.9 x 0.005 GiB /
    65,536 B = 74 tokens, 2.3 blocks)."""
    assert cm.kv_blocks(21.89 * GiB, 524_288, 64) == (40_347, 631)
    tokens, blocks = cm.kv_blocks(17.83 * GiB, 65_536, 32)
    assert (tokens, blocks) == (262_914, 8_217)
    assert abs(8_219 - blocks) <= 0.9 * 0.005 * GiB / 65_536 / 32 + 1
    assert cm.kv_blocks(17.83 * GiB, 65_536, 32, max_tokens=1_000) == (1_000, 32)


def test_qwen15_7b_on_0_13s_defaults_by_hand():
    """trtllm-build 0.13's defaults (max_batch_size 256, max_num_tokens 8,192, tokens_per_block 64): the
    execution context's middle is 2 x 2 x (4,096 + 3 x 11,008 + 4,096) x 8,192 = 1,350,565,888 B; the logits
    256 x 151,936 x 4 = 155,582,464 B; the decoder's middle 256 x (151,936 x 12.5 + 32,768 x 16 + 24,576) =
    626,704,384 B."""
    card, gpu = _qwen15_7b(), with_memory(get_gpu("a100-40gb"), 39.39)
    cfg = EngineConfig(engine="trtllm@0.13", kv_estimate="middle")
    eng = get_engine("trtllm@0.13").resolve(cfg, card, gpu)
    assert (eng.max_num_seqs, eng.max_num_batched_tokens, eng.block_size) == (256, 8192, 64)
    t = cm.terms(card, gpu, eng)
    assert t.activation[0] == 1_350_565_888
    assert t.runtime_buffers[0] == 155_582_464 and t.decoder[0] == 626_704_384
    b = get_engine("trtllm@0.13").budget(card, gpu, cfg, check_fit=False)
    lo, hi = b.num_blocks_range
    assert lo <= b.num_blocks <= hi and b.planning_blocks == b.num_blocks
    assert b.kv_budget_bytes == b.num_blocks * 64 * 524_288  # the allocation: whole blocks
    cons = get_engine("trtllm@0.13").budget(card, gpu, cfg.model_copy(update={"kv_estimate": "conservative"}))
    assert cons.planning_blocks == lo < b.num_blocks


def test_the_setting_picks_the_backend():
    """trtllm_backend: engine on the current release gives the C++ executor's accounting (and its label);
    pytorch on 0.20 (the engine backend by default) gives the profile; a spec that names the other backend and a
    setting that disagrees are refused."""
    card, gpu = _llama8b_fp8(), get_gpu("h100-sxm")
    cur = get_engine("trtllm")
    b_pt = cur.budget(card, gpu, EngineConfig(engine="trtllm", max_model_len=8192))
    b_cpp = cur.budget(card, gpu, EngineConfig(engine="trtllm", max_model_len=8192, trtllm_backend="engine"))
    assert b_pt.release == "trtllm@1.1" and b_cpp.release == "trtllm@1.1:tensorrt"
    # max_seq_len 8,192: the logits 1,050,673,152 + the decoder 262,668,288 x 12.5 + 2,048 x (8,192 x 16 + 24,576)
    assert b_cpp.runner_buffers_bytes == 1_050_673_152 + 3_283_353_600 + 318_767_104
    assert b_pt.runner_buffers_bytes == 0
    assert get_engine("trtllm@0.20").budget(card, gpu, EngineConfig(engine="trtllm@0.20", max_model_len=8192,
                                                                    trtllm_backend="pytorch")).release == \
        "trtllm@0.20:pytorch"
    with pytest.raises(ConfigError, match="names the pytorch backend"):
        get_engine("trtllm@0.20:pytorch").budget(card, gpu, EngineConfig(engine="trtllm@0.20:pytorch",
                                                                         trtllm_backend="engine"))
    with pytest.raises(ConfigError, match="only the engine backend"):
        get_engine("trtllm@0.13").resolve(EngineConfig(engine="trtllm@0.13", trtllm_backend="pytorch"), card, gpu)
    with pytest.raises(ConfigError, match="only the engine backend"):
        get_engine("trtllm@0.13:pytorch")


def test_moe_and_mla_are_refused_on_the_engine_backend():
    card = load_model_card(DATA / "hf" / "qwen3-30b-a3b.json")
    with pytest.raises(ConfigError, match="dense attention"):
        get_engine("trtllm@0.20").budget(card, get_gpu("h100-sxm"), EngineConfig(engine="trtllm@0.20"))


@pytest.mark.parametrize("args, field", [
    (["--engine", "trtllm", "--trtllm-backend", "tensorrt"], "trtllm_backend"),
    (["--trtllm-backend", "engine"], "trtllm_backend engine"),
])
def test_bad_backend_is_one_line(args, field):
    r = run_cli("memory", "--model", "models/llama-3.1-8b.yaml", "--gpu", "h100-sxm", *args)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and field in err[0], r.stderr


def test_the_memory_command_shows_the_engine_backends_terms():
    """`capacity memory --engine trtllm@0.20` (the engine backend by default): the runtime and decoder buffers
    have their own row and the KV cache is 0.9 of what is free after the engine."""
    r = run_cli("memory", "--model", "models/llama-3.1-8b.yaml", "--gpu", "h100-sxm", "--engine", "trtllm@0.20",
                "--max-model-len", "8192")
    assert r.returncode == 0, r.stderr
    assert "runtime + decoder buffers" in r.stdout and "free after the engine" in r.stdout
    assert "execution context" in r.stdout
