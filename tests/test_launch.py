"""Every launch command a plan prints is one the memory model itself fits (issue 48): the model it names stores
the planned weight format (a published checkpoint, or vLLM/SGLang's online FP8), and the command read back
(capacity.engine.launch.parse_launch_command) gives the planned GPU, TP and KV pool."""
import json

import pytest

from capacity.engine import get_engine
from capacity.engine.config import EngineConfig
from capacity.engine.launch import launch_fit, model_reference, parse_launch_command
from capacity.engine.sglang.engine import launch_command as sglang_translation
from capacity.errors import ConfigError
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu
from tests.conftest import run_cli

CASES = [  # model, weight format (None: the card's own), GPU, TP, KV dtype
    ("llama-3.1-8b", None, "l40s", 1, "auto"),
    ("llama-3.1-8b", "fp8", "l4", 1, "fp8"),
    ("llama-3.1-8b", "int4", "a10g", 1, "auto"),
    ("llama-3.1-70b", None, "h100-sxm", 4, "auto"),
    ("llama-3.1-70b", "fp8", "h100-sxm", 2, "fp8"),
    ("llama-3.1-70b", "int4", "a100-80gb", 1, "auto"),
    ("qwen2.5-7b", "int4", "l4", 1, "auto"),
    ("qwen3-32b", "fp8", "h100-sxm", 1, "auto"),
    ("mistral-7b", "fp8", "l4", 1, "auto"),  # no published FP8 checkpoint listed: online FP8 on vLLM/SGLang
]


def _card(model, fmt):
    card = load_named_card(model)
    return card.with_overrides(weight_dtype=fmt, quant_group_size=128 if fmt == "int4" else None) if fmt else card


@pytest.mark.parametrize("model,fmt,gpu,tp,kv", CASES)
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_each_printed_command_read_back_fits_with_the_planned_pool(model, fmt, gpu, tp, kv, engine):
    card, g = _card(model, fmt), get_gpu(gpu)
    cfg = EngineConfig(engine=engine, tensor_parallel_size=tp, max_model_len=8192, kv_cache_dtype=kv)
    em = get_engine(engine)
    b = em.budget(card, g, cfg)
    commands = [em.launch_command(card, cfg, b)]
    if engine == "vllm":  # a vLLM plan also prints its SGLang translation
        commands.append(sglang_translation(card, cfg, b))
    for cmd in commands:
        if "<" in cmd.split("\n")[-1]:  # a placeholder: only where no engine loads that format from what exists
            assert cmd.startswith("# no published") and (fmt in ("int4", "int8") or engine == "trtllm"), cmd
            with pytest.raises(ConfigError, match="placeholder"):
                launch_fit(parse_launch_command(cmd), g)
            continue
        spec = parse_launch_command(cmd)
        assert spec.tp == tp
        read = load_named_card(spec.model)
        stored = "fp8" if spec.quantization == "fp8" else read.weight_format
        assert stored == card.weight_format, (spec.model, stored)  # the checkpoint holds the planned format
        fit = launch_fit(spec, g)
        assert fit.fits, (cmd, fit.why)
        assert fit.holds_pinned_pool, (cmd, fit.kv_tokens, fit.pinned_kv_tokens)
        if spec.engine == engine and spec.pinned_kv_tokens is None:  # vLLM: the same budget as planned
            assert fit.kv_tokens >= b.planning_tokens


def test_a_bf16_checkpoint_named_for_fp8_weights_would_not_fit():
    """The fault the issue reported: FP8 weights planned at TP=2 on H100s, the bf16 repo printed; read back as
    bf16 it has no room for a 128k request's KV. Named as the FP8 checkpoint it fits."""
    g = get_gpu("h100-sxm")
    line = ("vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 2 --max-model-len 131072 "
            "--kv-cache-dtype fp8")
    assert not launch_fit(parse_launch_command(line), g).fits
    assert launch_fit(parse_launch_command(line.replace("meta-llama/Llama-3.1-70B-Instruct",
                                                        "nvidia/Llama-3.1-70B-Instruct-FP8")), g).fits
    assert launch_fit(parse_launch_command(line + " --quantization fp8"), g).fits


def test_a_checkpoint_id_loads_the_card_in_its_format():
    assert load_named_card("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4").weight_format == "int4"
    assert load_named_card("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8").weight_format == "fp8"
    assert load_named_card("meta-llama/Llama-3.1-8B-Instruct").weight_format == "bf16"


def test_a_config_without_a_hub_id_is_a_placeholder_not_the_file_name(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
           "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 5632,
           "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    (tmp_path / "qwen14b_config.json").write_text(json.dumps(cfg))
    card = load_named_card(str(tmp_path / "qwen14b_config.json"))
    ref = model_reference(card, "vllm")
    assert ref.model.startswith("<") and ref.comment.startswith("# ")
    cfg["_name_or_path"] = "org/some-model"
    (tmp_path / "b.json").write_text(json.dumps(cfg))
    assert model_reference(load_named_card(str(tmp_path / "b.json")), "vllm").model == "org/some-model"


@pytest.mark.parametrize("bad", ["vllm serve m --tensor-parallel-size two", "vllm serve m --made-up-flag 3",
                                 "docker run x", "vllm serve a\nvllm serve b"])
def test_an_unreadable_command_is_an_error_naming_it(bad):
    with pytest.raises(ConfigError, match="launch command"):
        parse_launch_command(bad)


def test_the_issues_plan_prints_commands_that_fit(tmp_path):
    """`plan -m llama-3.1-70b --weight-dtype fp8 --kv-dtype fp8` end to end: each printed line, read back, fits
    on the planned GPU and TP with the planned pool."""
    out = run_cli("plan", "-m", "llama-3.1-70b", "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    g = get_gpu(plan["gpu"])
    for key in ("vllm_command", "sglang_command"):
        spec = parse_launch_command(plan[key])
        assert spec.tp == plan["tp"] and "FP8" in spec.model
        fit = launch_fit(spec, g)
        assert fit.fits and fit.holds_pinned_pool


def test_a_user_gpu_yaml_gets_its_sglang_translation(tmp_path):
    """A GPU from the user's YAML has no catalogue name: the SGLang translation sizes F on that GPU (it looked
    the name up in the catalogue and failed: the CI run of 2026-12-06)."""
    from capacity.model.gpus import GPU

    f = tmp_path / "gpu.yaml"
    f.write_text("name: mygpu\nmemory_bytes: 80000000000\nusable_memory_bytes: 79000000000\n"
                 "mem_bw_bytes_per_s: 3.35e12\nbf16_flops: 9.89e14\ninterconnect_bytes_per_s: 4.5e11\n")
    g = get_gpu(str(f))
    assert isinstance(g, GPU) and g.name == "mygpu"
    card = load_named_card("llama-3.1-8b")
    cfg = EngineConfig(max_model_len=8192)
    b = get_engine("vllm").budget(card, g, cfg)
    cmd = sglang_translation(card, cfg, b, g)
    spec = parse_launch_command(cmd)
    assert spec.pinned_kv_tokens == b.planning_tokens
    with pytest.raises(ConfigError, match="not in the catalogue"):  # without the GPU, the name alone is unknown
        sglang_translation(card, cfg, b)
