"""The start-up memory model on real logs from sources the project had not used (tests/data/startup_v3, scored by
bench/memory_unseen.py). The logs were split before anyone looked at them: a source whose sha256 % 3 == 0 is in
the held-out group. Every scored case is pinned: a case the model gets right must stay right, and a miss is a
strict expected failure with its reason, so that fixing it turns the test red until the mark is removed.
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import memory_unseen as mu  # noqa: E402

GROUPS = {g: {c["id"]: c for c in mu.load_cases(g)} for g in ("dev", "heldout")}
DEV = GROUPS["dev"]
# Misses of the development group: what is off, and why (docs/memory.md, "Unseen logs").
KNOWN = {
    "gh9630-llama32-11b-vision-h100-96gb-v0-mns128": "128 Mllama images take 60 of the GH200's 85.5 GiB in the "
        "profile: a 5% error in the encoder's peak is the whole 5.5 GiB KV cache (the safe side: predicted low)",
    "sglang4895-gemma3-27b-awq-4090-fail": "an unnamed AWQ checkpoint that loads 18.82 GiB where a plain AWQ g128 "
        "count gives 16.1 (its quantization_config is not known), and T0 22.46 GiB (a desktop card) against 23.13: "
        "with the log's own T0 and A the model runner's x0.95 multimodal cut leaves no pool, as SGLang refused "
        "(tests/test_sglang_startup_v3.py), but from the card the pool stays positive",
    "gh11587-llama32-11b-vision-bnb4-rtx4090": "Unsloth's bnb-4bit checkpoint loads 6.72 GiB where a bf16 vision "
        "tower gives 7.8: it quantises part of the tower, and its skip list is not in the config copies here (the "
        "activation, 2.03 GiB against the log's 1.92, is right)",
    "aws-kr-deepseek-coder-v2-lite-8xa100-40gb-tp8-v0-071-lmi": "non-torch memory 2.10 GiB at TP 8 on an A100 "
        "NVSwitch board against 0.59 estimated (two NCCL communicators of 8 ranks: their channel count is not "
        "modelled); the weights, 3.96 GiB with 0.7.1's absorbed MLA copies, match the log's 3.97; KV +5.3% in the "
        "middle, +2.4% at the conservative end",
    "trt4275-llama31-8b-fp8-rtx5090-0.19": "TensorRT-LLM 0.19's engine backend at trtllm-serve's defaults "
        "(max_batch_size 2048, max_seq_len 131,072; the command is not in the issue): KV 11.43 GiB in the middle "
        "against 16.05 logged (-29%, the safe side). The log leaves 5.55 GiB beside the weights; at those defaults "
        "the logits (0.98 GiB) and the decoder (7.10: 2,048 slots x (128,256 x 12.5 B + 131,072 x 16 B)) alone "
        "are more, so the run had a smaller max_batch_size or max_seq_len (not shown): left open, not fitted",
    "pr4454-phi2-super-marlin-a6000": "phi-2's own config (families/phi.py) without the Marlin checkpoint's "
        "quantization_config (not found): 5.2 GiB of fp16 weights where the 4-bit checkpoint loads about a third, "
        "so KV 36.60 GiB against 40.11 logged (-8.8%, the safe side)",
    "gh36973-qwen35-35b-a3b-gptq-rtx5090-v1-dev88": "Qwen3.5-35B-A3B GPTQ-Int4 given as --weight-dtype int4 "
        "(the checkpoint's quantization_config is not here): all-int4 counts 19.07 GiB of weights where the "
        "reporter's load is 21.05, so KV 7.42 GiB in the middle against 5.18 (+43%); the weights' high end counts "
        "the experts alone quantised (21.01 GiB, capacity.model.weights.experts_only_alternative), so the planner's "
        "end is 5.22 GiB (+0.8%)",
}  # llmd-llama4-scout-16e-h100-tp4-v0190 passes since families/llama4.py (16.80 GiB of KV against 16.75 logged)


def _mark(case_id: str):
    if case_id in KNOWN:
        return pytest.param(case_id, marks=pytest.mark.xfail(reason=KNOWN[case_id], strict=True))
    return case_id


SCORED = [k for k, c in DEV.items() if c["inputs"] and not c["inputs"].get("skip")]


def test_the_split_follows_the_hash_of_the_source():
    """Held out exactly when int(sha256(source URL)) % 3 == 0, whichever helper collected the case."""
    for group, cases in GROUPS.items():
        for c in cases.values():
            src = c["log"]["source"]
            held = int(hashlib.sha256(src.encode()).hexdigest(), 16) % 3 == 0
            assert held == (group == "heldout"), (c["id"], src)


def test_every_case_has_inputs_or_a_reason_and_its_numbers_are_in_its_text():
    for cases in GROUPS.values():
        for c in cases.values():
            inp = c["inputs"]
            assert inp, f"{c['id']}: no inputs in inputs.yaml"
            assert inp.get("skip") or {"model", "gpu", "engine"} <= set(inp), c["id"]
            rec = c["log"]
            text = rec.get("log_excerpt") or "\n".join(rec.get("lines") or []) or rec.get("log") or ""
            nums = rec.get("logged") or rec.get("figures") or rec.get("readings") or {}
            for key, v in nums.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or key.endswith(("_gib_tp1", "_gib_tp2")):
                    continue
                plain = f"{v}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
                assert re.search(re.escape(plain), text.replace(",", "")), (c["id"], key, v)


def _check(case: dict) -> None:
    """A case passes: no refusal, the fit verdict right, the KV within max(5%, 0.5 GiB), and the planner's end
    never promising more than 5% over the log."""
    r = mu.score(case)
    assert "error" not in r, r.get("error")
    assert r["fits_ok"], f"fits: logged {r['fits_log']}, predicted {r['fits_pred']}"
    if "within5" in r:
        assert r["within5"], f"KV {r['kv_pred_gib']:.2f} vs {r['kv_log_gib']:.2f} GiB ({r['kv_err_pct']:+.1f}%)"
        assert r["plan_over_pct"] <= 5, f"the planner's end promises {r['plan_over_pct']:+.1f}% more KV"


@pytest.mark.parametrize("case_id", [_mark(k) for k in SCORED])
def test_dev_case(case_id):
    _check(DEV[case_id])


def test_hybrid_block_size_as_the_nemotron_log_prints_it():
    """Nemotron-3-Super at TP 4, fp8 KV, vLLM 0.14.1: 'Setting attention block size to 4160 tokens'. By hand: a
    Mamba2 layer's state per rank is conv 3 x (8192 + 2 x 8 x 128) / 4 = 7,680 bf16 plus SSM 128 / 4 x 64 x 128
    = 262,144 fp32 (the config's mamba_ssm_cache_dtype) = 1,063,936 B; one token of one attention layer is 2 x
    (2 // 4 -> 1 head) x 128 x 1 B = 256 B; 16 x cdiv(1,063,936, 16 x 256) = 4,160. The log's 'Padding mamba page
    size by 0.10%' is 4,160 x 256 / 1,063,936 - 1."""
    from capacity.engine.vllm.layout import hybrid_block_size, mamba_page_bytes
    from capacity.engine.vllm.release import release

    case = DEV["nemo-nemotron3-super-120b-bf16-4xh100pcie-tp4-kvfp8-v0141"]
    card = mu._card(case["inputs"])
    rel = release("0.14.1")
    assert mamba_page_bytes(card, rel, 4) == 3 * (8192 + 2 * 8 * 128) // 4 * 2 + 128 // 4 * 64 * 128 * 4 == 1_063_936
    assert hybrid_block_size(card, rel, 4, "fp8", 16) == 4160 == case["log"]["logged"]["attention_block_size_tokens"]
    assert round(100 * (4160 * 256 / 1_063_936 - 1), 2) == case["log"]["logged"]["mamba_page_padding_pct"]
    b = mu.predict(case)
    assert (b.kv_groups.full, b.kv_groups.state, b.kv_groups.group_size) == (1, 5, 8)  # 8 attention, 40 Mamba2
    assert b.kv_tokens == b.num_blocks // 6 * 4160


def test_sglang_vision_fraction_as_the_docs_ci_log_prints_it():
    """SGLang's docs CI (the 0.4.9 line): 'mem_fraction_static 0.874', lowered to 0.787 for Qwen2.5-VL: the reserve
    rule on an 80 GB card (9.5 + 1/2 GiB of 81,559 MiB) times 0.90."""
    from capacity.engine.sglang.memory import default_mem_fraction_static, vlm_fraction_factor

    case = DEV["sgldocs-mirror-qwen25-vl-7b-ci"]
    fig = case["log"]["figures"]
    card = mu._card({"model": "startup_v3/hf/qwen2.5-vl-7b.json"})
    f = default_mem_fraction_static(81559, 1, "0.4.9")
    assert f == fig["mem_fraction_static"] == 0.874
    assert round(f * vlm_fraction_factor(card, "0.4.9"), 3) == fig["mem_fraction_static_after_mm_reduction"]


def test_deepseek_before_mla_is_cached_as_multi_head_attention():
    """DeepSeek-Coder-V2-Lite on two L40s (vLLM 0.5.x, fp16): the log's 63,040 KV tokens and 'does not fit' at
    163,840. Before 0.7.1 vLLM caches every head's K and V at head size 256 (deepseek_v2.py): 2 x 8 heads per
    rank x 256 x 2 B x 27 layers = 221,184 B a token, 7.1x MLA's 31,104."""
    from capacity.engine.vllm.layout import kv_layout_card
    from capacity.engine.vllm.release import release

    case = DEV["gh6156-deepseek-coder-v2-lite-2xl40-tp2-dnf"]
    card = mu._card(case["inputs"])
    old = kv_layout_card(card, release("0.5.1"))
    assert old.kv_elements_per_token_per_layer(2) * 2 * 27 == 221_184
    assert kv_layout_card(card, release("0.7.0")).head_dim == 192 and kv_layout_card(card, release("0.7.1")) is card
    b = mu.predict(case)
    assert not b.fits and b.kv_tokens == pytest.approx(63_040, rel=0.05)


def test_vllm_071_keeps_deepseeks_absorbed_mla_matrices_in_the_weights():
    """DeepSeek-Coder-V2-Lite at TP 8 on A100-40GB (vLLM 0.7.1, fp16): 'model weights take 3.97GiB'. 0.7.1's
    MLACommonImpl.process_weights_after_loading (attention/backends/mla/utils.py, run by the loader) keeps per
    layer, beside q_proj / kv_b_proj / o_proj, with 16 / 8 = 2 heads a rank, hidden 2,048 (q_lora_rank None),
    kv_lora_rank 512, qk_rope_head_dim 64:
    W_QR 2,048 x 2 x 64 = 262,144; W_Q_UK 2,048 x 2 x 512 = 2,097,152; W_UV_O 2 x 512 x 2,048 = 2,097,152
    elements, 4,456,448 x 2 B = 8,912,896 B a layer, x 27 layers = 240,648,192 B (0.224 GiB). 0.8.0 keeps views."""
    from capacity.engine.vllm.mla_copies import absorbed_mla_bytes
    from capacity.engine.vllm.release import release

    case = DEV["aws-kr-deepseek-coder-v2-lite-8xa100-40gb-tp8-v0-071-lmi"]
    card = mu._card(case["inputs"])
    assert absorbed_mla_bytes(card, 8, release("0.7.1")) == 27 * (262_144 + 2 * 2_097_152) * 2 == 240_648_192
    assert absorbed_mla_bytes(card, 8, release("0.7.3")) == 240_648_192
    assert absorbed_mla_bytes(card, 8, release("0.8.0")) == absorbed_mla_bytes(card, 8, release("0.7.0")) == 0.0
    assert absorbed_mla_bytes(card, 8, release("0.19")) == 0.0  # unquantised: W_UV / W_UK_T are views of the weight
    assert absorbed_mla_bytes(card.with_overrides(weight_dtype="int4", quant_group_size=128), 8,
                              release("0.7.1")) == 0.0  # MLA off for GPTQ/AWQ in 0.7.x (ModelConfig.use_mla)
    logged = case["log"]["logged"]["weights_gib"]
    assert logged == 3.97
    assert mu.predict(case).weights_bytes / 2**30 == pytest.approx(logged, abs=0.02)  # 3.958 (3.734 without them)


def test_vllm_071_and_072_run_an_awq_deepseek_without_mla():
    """ModelConfig.use_mla (0.7.1, 0.7.2 wheels): a checkpoint quantised other than fp8 / compressed-tensors runs
    DeepseekV2Attention ("MLA is not supported with %s quantization. Disabling MLA."), whose cache holds K and V
    of every local head at qk_nope + qk_rope = 128 + 64 = 192: 2 x 16 heads x 192 = 6,144 elements a token and
    layer at TP 1, where MLA's latent + rope is 512 + 64 = 576 (10.7x fewer). From 0.7.3 use_mla is
    `is_deepseek_mla and not VLLM_MLA_DISABLE` for any checkpoint; MLACommonImpl then dequantises kv_b_proj by
    applying the method to an identity and keeps it (self.W_UK / self.W_UV): 512 x 2 x (128 + 128) = 262,144
    elements a layer at TP 8 beside W_QR + W_Q_UK + W_UV_O (4,456,448): 27 x 4,718,592 x 2 B = 254,803,968 B."""
    from capacity.engine.vllm.layout import kv_layout_card
    from capacity.engine.vllm.mla_copies import absorbed_mla_bytes
    from capacity.engine.vllm.release import release

    card = mu._card(DEV["aws-kr-deepseek-coder-v2-lite-8xa100-40gb-tp8-v0-071-lmi"]["inputs"])
    awq = card.with_overrides(weight_dtype="int4", quant_group_size=128)
    for v, per_layer in (("0.7.1", 6_144), ("0.7.2", 6_144), ("0.7.3", 576), ("0.8.0", 576)):
        assert kv_layout_card(awq, release(v)).kv_elements_per_token_per_layer(1) == per_layer, v
        assert kv_layout_card(card, release(v)).kv_elements_per_token_per_layer(1) == 576, v
    assert absorbed_mla_bytes(awq, 8, release("0.7.3")) == 27 * (4_456_448 + 262_144) * 2 == 254_803_968


def test_vllm_071_absorbed_mla_copies_of_fp8_deepseek_v3_by_hand():
    """DeepSeek-V3 FP8 (blocks of 128) at TP 8 on 0.7.1: 16 heads a rank, q_lora_rank 1,536, hidden 7,168.
    W_QR 1,536 x 16 x 64 x 2 B = 3,145,728; W_Q_UK re-quantised 1,536 x 8,192 x 1 B = 12,582,912 + 12 x 64 fp32
    scales (3,072) = 12,585,984; W_UV_O 8,192 x 7,168 = 58,720,256 + 64 x 56 x 4 = 14,336 -> 58,734,592; the
    dequantised kv_b_proj kept as W_UK / W_UV: 512 x 16 x 256 x 2 B = 4,194,304. 78,660,608 B a layer x 61 layers
    = 4,798,297,088 B (4.47 GiB a rank)."""
    from capacity.engine.vllm.mla_copies import absorbed_mla_bytes, dequantised_kv_b_bytes
    from capacity.engine.vllm.release import release
    from capacity.model.card import load_model_card

    v3 = load_model_card(ROOT / "capacity/data/models/deepseek-v3.yaml")
    assert absorbed_mla_bytes(v3, 8, release("0.7.1")) == (3_145_728 + 12_585_984 + 58_734_592 + 4_194_304) * 61
    # from 0.8.0 (read in 0.8.0, 0.10.1, 0.19.0) only the dequantised kv_b_proj stays, held by the W_UV / W_UK_T
    # views: 512 x 16 x 256 x 2 B = 4,194,304 B a layer (not counted yet from 0.8.0: it moves a golden case)
    assert dequantised_kv_b_bytes(v3, 8) == 4_194_304


def test_summary_of_the_development_group():
    rows = [mu.score(c) for c in DEV.values()]
    s = mu.summary(rows)["all"]
    assert s["plan_over_by_more_than_5pct"] == []  # never promise KV the engine will not have
    assert s["pass"] >= 16 and s["does_not_fit_predicted"] == "5/6"  # trt5872 scored (EP, 2026-12-07)


def test_an_int4_override_of_a_moe_plans_on_its_experts_alone_quantised():
    """gh36973: the reporter's Qwen3.5-35B-A3B GPTQ-Int4 loads 21.05 GiB (the log's text). Counting every linear
    layer at int4 gives about 19.1 GiB; the same card with only the routed experts at int4 (attention, linear
    attention, shared experts in bf16) gives within 1% of the load, and that is the high end the planner takes.
    A card whose own quantization_config names its format (no override) has no such alternative."""
    from capacity.engine import get_engine
    from capacity.engine.config import EngineConfig
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu
    from capacity.model.weights import experts_only_alternative, weight_bytes_per_rank

    base = load_model_card(ROOT / "tests/data/families/qwen3.5-35b-a3b.json")
    card = base.with_overrides(weight_dtype="int4", quant_group_size=128)
    alt = experts_only_alternative(card)
    assert alt is not None and experts_only_alternative(base) is None
    gib = 1024**3
    all_int4, experts_int4 = (sum(weight_bytes_per_rank(c).values()) / gib for c in (card, alt))
    assert all_int4 < 19.5 and abs(experts_int4 - 21.05) / 21.05 < 0.01
    b = get_engine("vllm@0.17").budget(card, get_gpu("rtx-5090"), EngineConfig(engine="vllm@0.17",
                                                                             kv_cache_dtype="fp8"))
    assert b.ranges["weights"][1] / gib == pytest.approx(experts_int4, rel=1e-9)
    assert b.planning_blocks < b.num_blocks


# The held-out group, scored once at the end of the session that collected it (2026-12-06) and pinned as it came
# out: 8 of 24 cases could be given to capacity, 7 passed, 6 of 6 KV figures within max(5%, 0.5 GiB).
HELD = GROUPS["heldout"]
# Its one miss, vLLM 0.4.2 on an RTX 3090 (KV 4.19 GiB predicted against 3.72 logged, the fit verdict flipped),
# passes since 2026-12-07: the one-rank NCCL communicator that 0.4.0-0.5.0's warm-up all_reduce creates after the
# baseline reading (capacity/engine/vllm/nontorch.py, docs/memory.md) was derived from vLLM's code and NVIDIA's
# measured single-rank figure on the development group's A6000 logs only; the held-out case was not looked at
# while it was built. It now predicts 3.71 GiB against 3.72 logged and "does not fit", as the engine said.
HELD_KNOWN: dict[str, str] = {}
HELD_SCORED = [k for k, c in HELD.items() if c["inputs"] and not c["inputs"].get("skip")]


@pytest.mark.parametrize("case_id", [
    pytest.param(k, marks=pytest.mark.xfail(reason=HELD_KNOWN[k], strict=True)) if k in HELD_KNOWN else k
    for k in HELD_SCORED])
def test_held_out_case(case_id):
    _check(HELD[case_id])


def test_every_held_out_case_has_inputs_or_a_reason():
    """The held-out inputs were written from each case's metadata (model, GPU, release, flags) before its figures
    were looked at; the 2080 Ti server's 21.66 GiB comes from the development group's logs of the same server."""
    assert HELD and all(c["inputs"] for c in HELD.values())
    assert yaml.safe_load((mu.V3 / "inputs.yaml").read_text())["cases"]
