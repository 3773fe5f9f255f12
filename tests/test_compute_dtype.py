"""FP8/FP4 compute: each GEMM family runs at the tensor-core rate of the dtype engines multiply in (issue 25, 1).

Numbers are hand-computed from the card shapes and the H100 datasheet (989.4 / 1978.9 TFLOP/s dense bf16 / fp8)."""
import json

import pytest

from capacity.cli.common import load_card
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.errors import ConfigError
from capacity.model.compute import gemm_dtype
from capacity.model.gpus import get_gpu
from capacity.model.hf import from_hf_config
from tests.conftest import run_cli

# Llama-3.1-8B, elements per layer: q 4096x4096, k/v 2 x 4096x1024, o 4096x4096, gate/up/down 3 x 4096x14336
LAYER_ELEMS = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
GEMM_ELEMS = 32 * LAYER_ELEMS  # 6.98e9


def gemm_ms(weight, gpu="h100-sxm", tokens=8192, kv=None, compute=None):
    # the roofline's rates alone: the measured floor under each GEMM shape is tests/test_gemm_efficiency.py's
    c = RooflineCost(load_card("llama-3.1-8b", weight, compute_dtype=compute), get_gpu(gpu), 1, kv_dtype=kv,
                     params=RooflineParams(measured_gemm_floor=False))
    return c, c.breakdown(StepPlan(prefills=(PrefillChunk(tokens, 0),)))


def test_fp8_prefill_gemms_run_at_the_fp8_rate():
    """8,192 prompt tokens are far past the ridge point: the layer GEMMs are compute-bound, 2 x 8192 x 6.98e9
    FLOPs at 59% of 1978.9 TFLOP/s (the efficiency FP8 GEMMs were measured to reach on an H100 SXM, below the
    default 70%: capacity/data/gemm_efficiency.yaml) = 97.9 ms (165.2 ms at 70% of the bf16 rate); the LM head
    samples one token and stays a bf16 read of 525M elements (0.39 ms at 80% of 3.35 TB/s)."""
    flops = 2 * 8192 * GEMM_ELEMS
    lm_ms = 128256 * 4096 * 2 / (3.35e12 * 0.8) * 1e3
    for weight, peak, eff in (("fp8", 1978.9e12, 0.59), (None, 989.4e12, 0.7)):
        cost, b = gemm_ms(weight)
        expect = flops / (peak * eff) * 1e3 + lm_ms
        assert b["gemm"] * 1e3 == pytest.approx(expect, rel=0.01), weight
    assert "fp8 GEMMs" in gemm_ms("fp8")[0].source


def test_fp8_weights_without_fp8_tensor_cores_run_weight_only():
    """An A100 has no FP8 tensor cores: vLLM runs Marlin W8A16, so compute-bound GEMMs cost what bf16 ones do, and
    only the weight reads (decode) get cheaper."""
    _, fp8 = gemm_ms("fp8", "a100-80gb")
    _, bf16 = gemm_ms(None, "a100-80gb")
    assert fp8["gemm"] == pytest.approx(bf16["gemm"], rel=2e-3)
    c8 = RooflineCost(load_card("llama-3.1-8b", "fp8"), get_gpu("a100-80gb"))
    c16 = RooflineCost(load_card("llama-3.1-8b"), get_gpu("a100-80gb"))
    one = StepPlan(decode_contexts=(1024,))
    assert c8.breakdown(one)["gemm"] < 0.55 * c16.breakdown(one)["gemm"]  # half the bytes (+ the bf16 LM head)
    with pytest.raises(ConfigError, match="compute_dtype fp8: gpu a100-80gb has no dense fp8"):
        RooflineCost(load_card("llama-3.1-8b", "fp8", compute_dtype="fp8"), get_gpu("a100-80gb"))


def test_weight_only_override_and_formats():
    card = load_card("llama-3.1-8b", "fp8")
    h100, b200 = get_gpu("h100-sxm"), get_gpu("b200")
    assert gemm_dtype(card, "dense_mlp", h100) == "fp8"
    assert gemm_dtype(card.with_overrides(gemm_dtype="bf16"), "dense_mlp", h100) == "bf16"
    assert gemm_dtype(load_card("llama-3.1-8b", "int4"), "dense_mlp", h100) == "bf16"  # Marlin W4A16
    nvfp4 = load_card("llama-3.1-8b", "nvfp4")
    assert (gemm_dtype(nvfp4, "dense_mlp", b200), gemm_dtype(nvfp4, "dense_mlp", h100)) == ("fp4", "bf16")
    oss = load_card("gpt-oss-20b")  # MXFP4 experts, bf16 attention: W4A16 (the slower rate, on the safe side)
    assert {gemm_dtype(oss, f, b200) for f in ("attention", "experts")} == {"bf16"}
    with pytest.raises(ConfigError, match="gemm_dtype fp8 needs quantised weights"):
        load_card("llama-3.1-8b", compute_dtype="fp8")


def test_fp8_kv_runs_fp8_attention_on_hopper_only():
    """Prefill attention of 8,192 tokens is compute-bound: FP8 KV halves it on an H100 (FlashAttention-3 quantises q
    too), not on an L40S (Ada: no FA3 path, so the bf16 rate is kept: the safe side)."""
    _, bf = gemm_ms(None)
    _, f8 = gemm_ms(None, kv="fp8")
    assert f8["attention"] == pytest.approx(bf["attention"] / 2, rel=0.02)
    _, bf = gemm_ms(None, "l40s")
    _, f8 = gemm_ms(None, "l40s", kv="fp8")
    assert f8["attention"] == pytest.approx(bf["attention"], rel=0.02)


def _ct(weights: dict, acts: dict | None) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    group = {"targets": ["Linear"], "weights": weights}
    if acts is not None:
        group["input_activations"] = acts
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group},
                                  "ignore": ["lm_head"]}
    return cfg


@pytest.mark.parametrize("weights, acts, want", [
    ({"num_bits": 8, "type": "float", "strategy": "channel"}, {"num_bits": 8, "type": "float", "dynamic": True}, "fp8"),
    ({"num_bits": 8, "type": "float", "strategy": "channel"}, None, "bf16"),  # FP8 W8A16
    ({"num_bits": 8, "type": "int", "strategy": "channel"}, {"num_bits": 8, "type": "int", "dynamic": True}, "int8"),
    ({"num_bits": 4, "type": "int", "group_size": 128}, None, "bf16"),  # W4A16
])
def test_compressed_tensors_activation_scheme(weights, acts, want):
    card = from_hf_config(_ct(weights, acts), name="ct")
    assert gemm_dtype(card, "dense_mlp", get_gpu("h100-sxm")) == want


def test_cli_takes_compute_dtype_and_refuses_a_bf16_profile_for_fp8_gemms():
    r = run_cli("step-cost", "-m", "llama-3.1-8b", "--weight-dtype", "fp8", "--compute-dtype", "bf16",
                "--prefill", "2048", "--json")
    assert r.returncode == 0, r.stderr
    assert "bf16 GEMMs" in json.loads(r.stdout)["source"]
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--profile", "llama-3.1-8b-h200", "--weight-dtype", "fp8",
                "--rate", "1", "-n", "20")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "measured bf16 GEMMs; llama-3.1-8b multiplies in fp8 on h200" in r.stderr


def test_real_checkpoint_configs():
    """RedHatAI's Llama-3.3-70B FP8-dynamic (compressed-tensors, FP8 per-token activations: W8A8) and Qwen3-8B-FP8
    (vLLM's fp8 method, dynamic activation scheme) run FP8 GEMMs on an H100 and weight-only on an A100; the
    W4A16 checkpoint is weight-only everywhere (tests/data/hf, sources in SOURCES.md)."""
    for name in ("llama-3.3-70b-fp8-dynamic", "qwen3-8b-fp8"):
        card = from_hf_config(json.loads(open(f"tests/data/hf/{name}.json").read()), name=name)
        assert gemm_dtype(card, "dense_mlp", get_gpu("h100-sxm")) == "fp8", name
        assert gemm_dtype(card, "dense_mlp", get_gpu("a100-80gb")) == "bf16", name
    w4 = from_hf_config(json.loads(open("tests/data/hf/llama-3.1-8b-w4a16.json").read()), name="w4a16")
    assert w4.dtype == "fp16" and gemm_dtype(w4, "dense_mlp", get_gpu("h100-sxm")) == "fp16"  # its activation dtype
