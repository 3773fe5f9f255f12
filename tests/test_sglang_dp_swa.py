"""SGLang's DP attention (`--tp T --dp D --enable-dp-attention`) and its hybrid SWA pool split, as read from SGLang's
code (capacity/engine/sglang/dpattn.py and swa.py name the files and functions). Every pinned number is computed by
hand in the test from the model's config and SGLang's rules, or printed in a development-group log
(tests/data/startup_v3/sglang_dev.yaml; the held-out file is not read here), never copied from capacity.
"""
from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from capacity.engine.budget import SchedLimits
from capacity.engine.config import EngineConfig
from capacity.engine.registry import get_engine
from capacity.engine.sglang.dpattn import dp_attention_weights
from capacity.engine.sglang.memory import parse_release, sglang_budget
from capacity.engine.sglang.mla import absorbed_copy_bytes
from capacity.engine.sglang.swa import split_pool, swa_pin
from capacity.errors import ConfigError
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.model.weights import weight_bytes_per_rank
from tests.conftest import ROOT, run_cli

HF = ROOT / "tests/data/hf"
DEV = {c["id"]: c for c in yaml.safe_load((ROOT / "tests/data/startup_v3/sglang_dev.yaml").read_text())}
GiB, MiB = 1 << 30, 1 << 20
QWEN3_MOE = HF / "qwen3-30b-a3b.json"  # 48 layers, hidden 2048, 32 heads, 4 KV heads of 128, vocab 151,936, bf16


def _card(p):
    return load_model_card(p)


# ---- DP attention --------------------------------------------------------------------------------------------
def test_dp_attention_replicates_the_attention_weights_and_the_embedding():
    """Qwen3-30B-A3B at TP 4 with DP attention 4 (attention TP 1): each rank holds the whole attention and the whole
    embedding (qwen2_moe.py `VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled())`), the experts and the
    LM head as at TP 4. Per layer, q 4096 x 2048 + k/v 2 x 512 x 2048 + o 2048 x 4096 = 18,874,368 parameters; over
    48 layers in bf16 1,811,939,328 B, of which TP 4 holds a quarter (one KV head of 4 per rank): 3/4 more,
    1,358,954,496 B. The embedding, 151,936 x 2048 x 2 B = 622,329,856 B, 3/4 more: 466,747,392 B."""
    card = _card(QWEN3_MOE)
    tp4 = sum(weight_bytes_per_rank(card, 4).values())
    dp = sum(dp_attention_weights(card, 4, 4).values())
    assert dp - tp4 == pytest.approx(1_358_954_496 + 466_747_392, abs=1)


def test_dp_attention_sizes_the_kv_cell_at_the_attention_tp():
    """`profile_max_num_token`: get_num_kv_heads(get_attention_tp_size()). Qwen3-30B-A3B at TP 4: one KV head per
    rank, 2 x 1 x 128 x 48 x 2 B = 24,576 B; with DP attention 4 all four heads: 98,304 B. DeepSeek-V3's MLA latent
    is never sharded: (512 + 64) x 61 x 2 B = 70,272 B either way."""
    h100 = get_gpu("h100")
    card = _card(QWEN3_MOE)
    assert sglang_budget(card, h100, 4, release="0.5.5").kv_bytes_per_token == 24_576
    assert sglang_budget(card, h100, 4, release="0.5.5", dp_attention=4).kv_bytes_per_token == 98_304
    ds = _card(HF / "deepseek-v3.json")
    h200 = get_gpu("h200")
    assert sglang_budget(ds, h200, 8, release="0.5.5", dp_attention=8).kv_bytes_per_token == 70_272
    assert sglang_budget(ds, h200, 8, release="0.5.5").kv_bytes_per_token == 70_272


def test_dp_attention_default_fraction_chunk_and_request_cap():
    """0.5.5 `_handle_gpu_memory_settings` on an H100 (81,059.84 MiB in the catalogue) at TP 8: chunk 8,192, graph bs
    512; reserve 512 + 8192 x 1.5 + 512 x 2 + 8 / 8 x 1024 = 14,848 MiB, plus DP attention's 512 x 8 x 3 + 512 x 8 x
    1.5 (graph bs over 300) = 18,432 MiB: 33,280 MiB, F = round((81,059.84 - 33,280) / 81,059.84, 3) = 0.589.
    Then `_handle_data_parallelism` divides the chunk by dp (1,024) and tp_worker.py --max-running-requests (512 / 8
    = 64)."""
    ds = _card(HF / "deepseek-v3.json")
    b = sglang_budget(ds, get_gpu("h100"), 8, release="0.5.5", dp_attention=8, max_running=512)
    assert b.mem_fraction_static == round((81_059.84 - 33_280) / 81_059.84, 3) == 0.589
    assert b.chunked_prefill_size == 1024
    assert b.max_running_requests == 64


def test_dp_attention_weights_against_the_dsv32_b300_log():
    """sglang#14700 (development group): DeepSeek-V3.2 on 8 x B300 with DP attention 8 (DPn TPn tags), 'Load weight
    end ... mem usage=93.06 GB'. hf/deepseek-v3.json has V3's shapes (V3.2 adds a lightning indexer per layer: wq_b
    1536 x 8192, wk 7168 x 128, weights_proj 7168 x 64, about 0.85 B parameters, under 1.7 GiB in any dtype: not in
    the card, so the prediction is below the log by about that much more). With
    DP attention replicating the MLA attention and the embedding the V3 layout is within 5% below the log; as plain
    TP 8 it would be more than 10% below."""
    logged = DEV["sglang14700-dsv32-b300-dp8-fp8kv"]["figures"]["weights_gib"]
    assert logged == 93.06
    ds = _card(HF / "deepseek-v3.json")
    dp = sum(dp_attention_weights(ds, 8, 8).values()) / GiB
    tp = sum(weight_bytes_per_rank(ds, 8).values()) / GiB
    assert 0.95 * logged < dp < logged
    assert tp < 0.9 * logged
    # the December 2025 image (0.5.x) also keeps bf16 w_kc / w_vc beside kv_b_proj (sglang/mla.py): at attention TP 1,
    # 128 x 256 x 512 x 61 x 2 B = 1.906 GiB; still below the log, by about what V3.2's indexer adds
    copies = absorbed_copy_bytes(ds, 1, (0, 5, 5, 0)) / GiB
    assert copies == 128 * 256 * 512 * 61 * 2 / GiB
    assert 0.97 * logged < dp + copies < logged


def test_up_to_0_4_4_dp_attention_is_over_every_rank_and_halves_the_chunk():
    """0.4.3 to 0.4.4 (`server_args.py` __post_init__): DP attention sets dp_size = tp_size and chunked_prefill_size
    // 2; from 0.4.4.post1 dp may be any divisor of tp and the chunk is divided by it (0.4.4.post1, 0.4.5, 0.4.6,
    0.4.8.post1 read). DeepSeek-V3 on an H200 at TP 8: the default chunk under 0.5.3 is 8,192."""
    ds, h200 = _card(HF / "deepseek-v3.json"), get_gpu("h200")
    old = sglang_budget(ds, h200, 8, release=parse_release("sglang@0.4.4"), dp_attention=8)
    assert old.chunked_prefill_size == 8192 // 2
    new = sglang_budget(ds, h200, 8, release=parse_release("sglang@0.4.4.post1"), dp_attention=4)
    assert new.chunked_prefill_size == 8192 // 4
    with pytest.raises(ConfigError, match="enable_dp_attention: data_parallel_size 4: SGLang up to 0.4.4 sets"):
        sglang_budget(ds, h200, 8, release=parse_release("sglang@0.4.4"), dp_attention=4)


def test_dp_attention_refusals_are_one_line_naming_the_field():
    with pytest.raises(ValidationError, match="enable_dp_attention: data_parallel_size 3 must be > 1 and divide"):
        EngineConfig(engine="sglang", tensor_parallel_size=8, data_parallel_size=3, enable_dp_attention=True)
    with pytest.raises(ValidationError, match=r"enable_dp_attention True: SGLang only \(engine vllm does not have this setting\)"):
        EngineConfig(engine="vllm", tensor_parallel_size=8, data_parallel_size=8, enable_dp_attention=True)
    with pytest.raises(ConfigError, match="enable_dp_attention: SGLang's llama model shards attention"):
        sglang_budget(_card(HF / "llama-3.1-8b.json"), get_gpu("h100"), 8, dp_attention=2)
    r = run_cli("memory", "-m", str(QWEN3_MOE), "-g", "h100", "--engine", "sglang", "--tp", "8", "--dp", "3",
                "--enable-dp-attention")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "enable_dp_attention" in r.stderr
    r = run_cli("memory", "-m", str(QWEN3_MOE), "-g", "h100", "--engine", "sglang", "--tp", "4", "--enable-dp-attention")
    assert r.returncode == 1 and "enable_dp_attention: data_parallel_size 1 must be > 1" in r.stderr  # no --dp
    r = run_cli("memory", "-m", str(QWEN3_MOE), "-g", "h100", "--engine", "sglang", "--tp", "4", "--dp", "4")
    assert r.returncode == 1 and "--enable-dp-attention" in r.stderr  # --dp alone: SGLang's replicas, not modelled


def test_dp_attention_schedules_one_rank_and_its_launch_command_spells_the_totals():
    cfg = EngineConfig(engine="sglang@0.5.5", tensor_parallel_size=4, data_parallel_size=4, enable_dp_attention=True,
                       max_model_len=8192)
    em = get_engine(cfg.engine)
    card, gpu = _card(QWEN3_MOE), get_gpu("h100")
    b = em.budget(card, gpu, cfg)
    assert b.max_num_batched_tokens == 8192 // 4
    cmd = em.launch_command(card, cfg, b)
    assert "--tp 4 --dp 4" in cmd and "--enable-dp-attention" in cmd and "--chunked-prefill-size 8192" in cmd
    rank = em.scheduler_factory(cfg, SchedLimits.of(b))()  # one attention rank's (capacity/engine/lockstep.py)
    assert rank.kv_blocks_total == b.planning_blocks and rank.max_running == b.max_num_seqs
    r = run_cli("memory", "-m", str(QWEN3_MOE), "-g", "h100", "--engine", "sglang@0.5.5", "--tp", "4", "--dp", "4",
                "--enable-dp-attention", "--max-model-len", "8192")
    assert r.returncode == 0, r.stderr
    assert "DP attention 4" in r.stdout and "98,304 B per token" in r.stdout


# ---- the hybrid SWA pool ----------------------------------------------------------------------------------------
def test_split_pool_by_hand():
    """full x 12 + swa x 12 = N x 24 with swa = 0.8 full: full = int(N x 24 / 21.6), swa = int(full x 0.8)."""
    assert split_pool(1000, 12, 12) == (1111, 888)
    assert split_pool(1000, 12, 12, page_size=16) == (1104, 880)  # 1111 -> 1104; int(883.2) = 883 -> 880
    for want in (1, 999, 123_457, 1_011_512):
        for page in (1, 16, 64):
            n = swa_pin(want, 12, 12, page)
            assert split_pool(n, 12, 12, page)[1] >= want
            assert split_pool(n - page, 12, 12, page)[1] < want  # the smallest such pin


def test_gpt_oss_pool_is_split_from_0_5_8():
    """gpt-oss-20b (12 full, 12 sliding layers) on an H100: 0.5.5 and 0.5.8 share the default F (the 0.5.3 rule) and
    the weights, so 0.5.5's pool over every layer, N, is 0.5.8's count before the split: its full pool is
    int(N x 24 / 21.6), its SWA pool int(full x 0.8), and the planner's end the SWA pool of the conservative count."""
    card, gpu = _card(HF / "gpt-oss-20b.json"), get_gpu("h100")
    one = sglang_budget(card, gpu, 1, release="0.5.5")
    hyb = sglang_budget(card, gpu, 1, release=parse_release("sglang@0.5.8"))
    assert one.mem_fraction_static == hyb.mem_fraction_static and one.swa_tokens is None
    assert hyb.kv_tokens == int(one.kv_tokens * 24 / 21.6)
    assert hyb.swa_tokens == int(hyb.kv_tokens * 0.8)
    assert hyb.kv_tokens_low == int(int(one.kv_tokens_low * 24 / 21.6) * 0.8)
    assert hyb.kv_tokens_low < one.kv_tokens_low < one.kv_tokens < hyb.kv_tokens


def test_which_releases_and_gpus_split_the_pool():
    """0.5.8-0.5.9 leave it off where gpt-oss's default attention backend is trtllm_mha (SM100: B200); 0.5.10+ split
    there too. Gemma-3 is never split (gemma2_gemma3 override)."""
    card, b200 = _card(HF / "gpt-oss-20b.json"), get_gpu("b200")
    assert sglang_budget(card, b200, 1, release=parse_release("sglang@0.5.9")).swa_tokens is None
    assert sglang_budget(card, b200, 1, release=parse_release("sglang@0.5.10")).swa_tokens is not None
    assert sglang_budget(card, b200, 1, release=parse_release("sglang@0.5.7")).swa_tokens is None
    gemma = _card(HF / "gemma-3-27b-it.json")
    b = sglang_budget(gemma, get_gpu("h100"), 1)
    assert b.swa_tokens is None and any("hybrid SWA pool is off for Gemma-2/3" in n for n in b.notes)


def test_a_hybrid_launch_command_pins_the_swa_pool_it_planned():
    """The command's --max-total-tokens clamps the count over every layer before SGLang splits it: it is chosen so
    that SGLang's SWA pool holds at least the tokens the plan simulated."""
    cfg = EngineConfig(engine="sglang", max_model_len=32768)
    em = get_engine("sglang")
    card, gpu = _card(HF / "gpt-oss-20b.json"), get_gpu("h100")
    b = em.budget(card, gpu, cfg)
    cmd = em.launch_command(card, cfg, b)
    pin = int(cmd.split("--max-total-tokens ")[1].split()[0])
    assert split_pool(pin, 12, 12)[1] >= b.planning_blocks * b.block_size
