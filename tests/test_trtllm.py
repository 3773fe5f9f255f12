"""The TensorRT-LLM engine model (capacity.engine.trtllm) against what its code does and what its start-up logs show
(tests/data/trtllm_startup/logs.yaml; hand checks in docs/trtllm.md): the KV formula fed a log's own readings,
the weights and bytes per token of a log's model, a one-sided check of the estimated peak, hand-computed budgets,
the no-evict admission, the launch command, and one-line refusals of settings it has no meaning for."""

import numpy as np
import pytest
import yaml

from capacity.cli.common import load_card
from capacity.cost.step import LinearCost
from capacity.engine import get_engine
from capacity.engine.budget import SchedLimits, kv_bytes_per_token
from capacity.engine.config import EngineConfig
from capacity.engine.memory import budget
from capacity.engine.trtllm.engine import CUDA_GRAPH_SIZES, Trtllm, kv_tokens
from capacity.errors import ConfigError
from capacity.model.gpus import get_gpu
from capacity.model.weights import weight_bytes_per_rank
from capacity.sim.simulator import SimConfig, simulate
from capacity.units import GiB
from capacity.workload import Arrivals, WorkloadSpec, fixed
from tests.conftest import ROOT, run_cli

LOGS = {r["id"]: r for r in yaml.safe_load((ROOT / "tests/data/trtllm_startup/logs.yaml").read_text())["records"]}


def test_kv_formula_gives_the_logs_pool_from_its_own_readings():
    """gpt-oss-120b on a GB10: (119.70 - 113.65 + 0.56) x 0.9 = 5.949 GiB, the log's 5.95; / 73,728 bytes =
    86,638 tokens against the log's 86,711: each GiB reading is rounded to 0.005, so the three readings bound the
    count within 0.9 x 0.015 GiB / 73,728 = +-196 tokens. The count is then rounded *up* to 32: 86,711 -> 86,720,
    and 86,720 x 73,728 bytes is the 5.95 GiB allocated."""
    r = LOGS["gpt-oss-120b-gb10-1.1.0rc3"]["readings"]
    mem, tokens = kv_tokens(r["total_gib"] * GiB, r["peak_gib"] * GiB, r["kv_bytes_per_token"], r["fraction"],
                            tmp_kv_bytes=r["tmp_kv_gib"] * GiB)
    assert mem / GiB == pytest.approx(r["estimated_kv_gib"], abs=0.005)
    assert abs(tokens - r["estimated_tokens"]) <= 196 + 32
    # the peak is the sum of the three profile readings (as the code adds them)
    assert r["weights_gib"] + r["activation_gib"] + r["outside_torch_gib"] == pytest.approx(r["peak_gib"], abs=0.011)
    # the final count: the estimate as max_tokens, rounded up to whole blocks
    _, alloc = kv_tokens(r["total_gib"] * GiB, 0.0, r["kv_bytes_per_token"], max_tokens=r["estimated_tokens"])
    assert alloc == r["allocated_tokens"] == 86720
    assert alloc * r["kv_bytes_per_token"] / GiB == pytest.approx(r["allocated_gib"], abs=0.005)
    # the temporary pool of the dummy requests: 8,192 prompt tokens + 2 per request, rounded up to a block
    assert -(-(8192 + 2) // 32) * 32 == r["tmp_tokens"]


def test_the_logs_8b_fp8_model_weights_and_kv_bytes():
    """Llama-3.1-8B FP8 on an H100 PCIe: the log's 8.46 (GiB, printed 'GB') of weights within 0.5% of the card's
    count; FP8 KV = 2 x 32 layers x 8 heads x 128 x 1 byte = 65,536 bytes a token, and 860,320 tokens of it are
    the 52.51 GiB allocated."""
    r = LOGS["llama-3.1-8b-fp8-h100-pcie-0.20.0"]["readings"]
    card = load_card("llama-3.1-8b", "fp8", None, None)
    assert sum(weight_bytes_per_rank(card, 1).values()) / GiB == pytest.approx(r["weights_gib"], rel=0.005)
    assert kv_bytes_per_token(card, "fp8", 1) == 2 * 32 * 8 * 128 == 65536
    assert r["allocated_tokens"] * 65536 / GiB == pytest.approx(r["allocated_gib"], abs=0.005)
    assert -(-r["max_tokens"] // 32) * 32 == r["allocated_tokens"]


def test_the_estimated_peak_agrees_with_the_8b_logs_one_sided_bound():
    """trtllm-bench's max_tokens was the smaller, so 0.8 x (total - peak) >= 52.51 GiB on that H100 PCIe: the
    peak was at most total - 65.64 GiB. The middle estimate at the log's settings (max_num_tokens 23,552) is
    under it; the conservative end may be over it (it is the safe side), but not by more than its range."""
    log = LOGS["llama-3.1-8b-fp8-h100-pcie-0.20.0"]
    s, r = log["settings"], log["readings"]
    card = load_card("llama-3.1-8b", "fp8", None, None)
    gpu = get_gpu("h100-pcie")
    cfg = EngineConfig(engine="trtllm", kv_cache_dtype="fp8", max_num_seqs=s["max_batch_size"],
                       max_num_batched_tokens=s["max_num_tokens"], max_model_len=s["max_seq_len"])
    tr = Trtllm()
    pk = tr.peak(card, gpu, tr.resolve(cfg, card, gpu))
    bound = gpu.usable_memory_bytes - r["allocated_gib"] * GiB / s["free_gpu_memory_fraction"]
    assert pk.total(0) < bound
    assert pk.total(1) <= pk.total(0) <= pk.total(2)


def test_hand_computed_budget_with_measured_terms():
    """Llama-3.1-8B bf16 on an H100 SXM, every term given: peak = weights + 1 + 0.5 + 0.25 GiB; KV = 0.9 x
    (total - peak); tokens = int(KV // 131,072), rounded up to 32; the middle and both ends agree (nothing
    estimated but the weights' +0.2% at the high end)."""
    card = load_card("llama-3.1-8b", None, None, None)
    gpu = get_gpu("h100-sxm")
    cfg = EngineConfig(engine="trtllm", max_model_len=8192, activation_bytes=1 * GiB, non_torch_bytes=0.5 * GiB,
                       cuda_graph_bytes=0.25 * GiB, kv_estimate="middle")
    b = budget(card, gpu, cfg)
    w = sum(weight_bytes_per_rank(card, 1).values())
    kv = 0.9 * (gpu.usable_memory_bytes - w - 1.75 * GiB)
    assert b.kv_budget_bytes == pytest.approx(kv, rel=1e-12)
    tokens = -(-int(kv // 131072) // 32) * 32
    assert b.kv_tokens == tokens and b.num_blocks == tokens // 32 == b.planning_blocks
    assert b.block_size == 32 and b.max_num_seqs == 2048 and b.max_num_batched_tokens == 8192
    assert not b.chunked_prefill and b.engine == "trtllm"
    # the same configuration under vLLM: 0.9 of the device, less everything -> a smaller pool by 0.1 x the rest
    v = budget(card, gpu, EngineConfig(**{**cfg.model_dump(exclude_unset=True), "engine": "vllm", "block_size": 32}))
    assert v.kv_budget_bytes < b.kv_budget_bytes


def test_a_plan_counts_on_the_conservative_end_and_max_tokens_caps_it():
    card = load_card("llama-3.1-70b", "fp8", None, None)
    gpu = get_gpu("h100-sxm")
    base = EngineConfig(engine="trtllm", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=8192)
    b = budget(card, gpu, base)
    lo, hi = b.num_blocks_range
    assert lo < b.num_blocks < hi and b.planning_blocks == lo
    capped = budget(card, gpu, base.model_copy(update={"num_gpu_blocks_override": 1000}))
    assert capped.num_blocks == capped.planning_blocks == 1000  # TensorRT-LLM keeps the smaller
    more = budget(card, gpu, base.model_copy(update={"num_gpu_blocks_override": 10**7}))
    assert more.num_blocks == b.num_blocks and any("keeps the smaller" in w for w in more.warnings)


def test_a_pool_smaller_than_max_model_len_lowers_it_as_trtllm_does():
    card = load_card("llama-3.1-8b", None, None, None)
    b = budget(card, get_gpu("h100-sxm"), EngineConfig(engine="trtllm", num_gpu_blocks_override=100))
    assert b.max_model_len == 3200 and any("Adjusted max_seq_len to 3200" in w for w in b.warnings)


def test_cuda_graph_sizes_are_the_logged_ones():
    """The 1.1.0rc3 log's cuda_graph_batch_sizes with padding: 1, 2, 4, 8, 16, 24, ..., 128."""
    assert list(CUDA_GRAPH_SIZES) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128]


def test_no_evict_admission_through_the_engines_scheduler():
    """The hand-computed case of test_simulator's no-evict test, through the engine model's own scheduler: two
    requests of 16 + 32 tokens, blocks of 16, a pool of 4: the second waits for the first (makespan 734 ms with
    the overlap scheduler off), and nothing is preempted with it on."""
    cost = LinearCost(fixed_s=0.01, per_token_s=0.001)
    spec = WorkloadSpec(arrivals=Arrivals(kind="offline"), input_len=fixed(16), output_len=fixed(32), num_requests=2)
    limits = SchedLimits(max_num_seqs=8, max_num_batched_tokens=512, block_size=16, num_blocks=4, max_model_len=64)
    for overlap in (False, True):
        cfg = EngineConfig(engine="trtllm", async_scheduling=overlap, enable_chunked_prefill=True)
        res = simulate(spec, cost, Trtllm().scheduler_factory(cfg, limits), np.random.default_rng(0), SimConfig())
        assert res.preemptions == 0
        if not overlap:
            assert res.records.finish.max() == pytest.approx(0.734, abs=1e-12)
        else:
            assert res.records.finish.max() >= 0.734 - 1e-12


def test_prompts_over_the_token_budget_are_rejected_without_chunked_prefill():
    cfg = EngineConfig(engine="trtllm", async_scheduling=False)
    limits = SchedLimits(max_num_seqs=8, max_num_batched_tokens=256, block_size=32, num_blocks=100, max_model_len=2048)
    sched = Trtllm().scheduler_factory(cfg, limits)()
    from capacity.workload import Request

    why = sched.admissible(Request(id=0, arrival_s=0.0, prompt_tokens=300, output_tokens=10))
    assert why and "max_num_batched_tokens 256" in why


def test_launch_command_pins_the_planned_pool():
    card = load_card("llama-3.1-70b", "fp8", None, None)
    cfg = EngineConfig(engine="trtllm", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=8192,
                       max_num_seqs=256)
    b = budget(card, get_gpu("h100-sxm"), cfg)
    cmd = get_engine("trtllm").launch_command(card, cfg, b)
    import shlex

    words = shlex.split(cmd)
    assert words[0] == "echo" and words[2:4] == [">", "extra.yaml"] and words[4] == "&&" and "\n" not in cmd
    extra = yaml.safe_load(words[1])  # the options file TensorRT-LLM reads
    assert extra == {"kv_cache_config": {"max_tokens": b.planning_tokens, "tokens_per_block": 32,
                                         "enable_block_reuse": False, "dtype": "fp8"},
                     "enable_chunked_prefill": False, "disable_overlap_scheduler": False}
    serve = " ".join(words[5:])
    for flag in ("trtllm-serve", "--tp_size 2", "--max_batch_size 256", "--max_num_tokens 8192",
                 "--max_seq_len 8192", "--kv_cache_free_gpu_memory_fraction 0.9", "--extra_llm_api_options extra.yaml"):
        assert flag in serve, flag


@pytest.mark.parametrize("update, field", [
    ({"gpu_memory_utilization": 0.8}, "gpu_memory_utilization 0.8"),
    ({"policy": "priority"}, "policy priority"),
    ({"kv_cache_dtype": "int8"}, "kv_cache_dtype int8"),
    ({"paged_kv": False}, "paged_kv"),
    ({"large_gpu_defaults": True}, "large_gpu_defaults"),
])
def test_settings_without_a_trtllm_meaning_are_one_line(update, field):
    """A shared setting TensorRT-LLM cannot take is refused by its engine model; vLLM's own (paged_kv,
    large_gpu_defaults) are no TrtllmConfig fields, refused when the configuration is read."""
    from capacity.files import validate

    card = load_card("llama-3.1-8b", None, None, None)
    with pytest.raises(ConfigError) as e:
        budget(card, get_gpu("h100-sxm"), validate(EngineConfig, {"engine": "trtllm", **update}, "engine"))
    assert field in str(e.value) and "\n" not in str(e.value)


def test_the_cli_simulates_and_refuses_in_one_line():
    r = run_cli("simulate", "--model", str(ROOT / "models/llama-3.1-8b.yaml"), "--gpu", "h100-sxm", "--engine",
                 "trtllm", "--rate", "2", "--requests", "60", "--json")
    assert r.returncode == 0, r.stderr
    r = run_cli("simulate", "--model", str(ROOT / "models/llama-3.1-8b.yaml"), "--gpu", "h100-sxm", "--engine",
                 "trtllm", "--gpu-memory-utilization", "0.8", "--rate", "2", "--requests", "20")
    assert r.returncode == 1 and "gpu_memory_utilization 0.8" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_memory_table_shows_the_fraction_of_what_is_free():
    """`capacity memory --engine trtllm` shows TensorRT-LLM's arithmetic: no 'usable = total x' row, the memory
    free after the profile and 0.9 of it; its numbers add up as printed."""
    r = run_cli("memory", "--model", str(ROOT / "models/llama-3.1-70b.yaml"), "--weight-dtype", "fp8", "--gpu",
                "h100-sxm", "--tp", "2", "--engine", "trtllm", "--kv-dtype", "fp8", "--max-model-len", "8192")
    assert r.returncode == 0, r.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in r.stdout.splitlines()
            if line.count("│") >= 4}
    assert "usable = total x 1.0" not in r.stdout
    free = float(rows["= free after the profile"])
    terms = [float(rows[k]) for k in ("- weights", "- activation peak", "- CUDA context + NCCL", "- CUDA graphs")]
    assert free == pytest.approx(float(rows["GPU total (engine's view)"]) - sum(terms), abs=0.03)
    assert float(rows["= KV cache budget (x 0.9)"]) == pytest.approx(0.9 * free, abs=0.02)
    assert "KV tokens (as TensorRT-LLM logs)" in r.stdout


def test_a_setting_refused_at_every_tp_is_said_once():
    """The planner tries every TP; a setting the engine refuses whatever the TP is one line, said once (not once
    per TP, cut off at the terminal's width)."""
    r = run_cli("plan", "--model", str(ROOT / "models/llama-3.1-8b.yaml"), "--gpu", "h100-sxm", "--engine", "trtllm",
                "--gpu-memory-utilization", "0.8", "--target-rate", "5")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: gpu_memory_utilization 0.8: no TensorRT-LLM meaning") and "tp=" not in r.stderr


def test_max_utilization_admits_the_prompt_and_pauses_when_the_cache_fills():
    """kv_reservation prompt on TensorRT-LLM is its MAX_UTILIZATION policy: the case of the no-evict test (two
    requests of 16 + 32 tokens, a pool of 4 blocks of 16) admits both and must pause one when their outputs outgrow
    the pool; the launch command names the policy."""
    cost = LinearCost(fixed_s=0.01, per_token_s=0.001)
    spec = WorkloadSpec(arrivals=Arrivals(kind="offline"), input_len=fixed(16), output_len=fixed(32), num_requests=2)
    limits = SchedLimits(max_num_seqs=8, max_num_batched_tokens=512, block_size=16, num_blocks=4, max_model_len=64)
    cfg = EngineConfig(engine="trtllm", async_scheduling=False, kv_reservation="prompt")
    res = simulate(spec, cost, Trtllm().scheduler_factory(cfg, limits), np.random.default_rng(0), SimConfig())
    assert res.preemptions > 0 and np.isfinite(res.records.finish).all()
    card = load_card("llama-3.1-8b", None, None, None)
    b = budget(card, get_gpu("h100-sxm"), cfg.model_copy(update={"max_model_len": 8192}))
    import shlex

    extra = yaml.safe_load(shlex.split(get_engine("trtllm").launch_command(card, cfg, b))[1])
    assert extra["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION"}


def test_disaggregated_hints_are_not_vllm_flags_on_another_engines_command():
    """`simulate --disagg` on TensorRT-LLM: vLLM's NIXL connector flags glued onto trtllm-serve would be a wrong
    command, so the hints say they are not generated and give each pool's own command."""
    import json

    r = run_cli("simulate", "--model", str(ROOT / "models/llama-3.1-8b.yaml"), "--gpu", "h100-sxm", "--engine",
                "trtllm", "--disagg", "1:1", "--rate", "2", "--requests", "60", "--json")
    assert r.returncode == 0, r.stderr
    hints = json.loads(r.stdout)["disaggregated"]["launch_hints"]
    assert hints.startswith("# not generated for trtllm") and "trtllm-serve disaggregated" in hints
    assert "NixlConnector" not in hints and "VLLM_" not in hints and hints.count("trtllm-serve meta-llama") == 2
