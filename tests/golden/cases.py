"""The golden cases: CLI invocations whose JSON output was recorded before the run-pipeline restructuring
(issue 15, commit 033dba8) and must stay identical, figure for figure, except where `CHANGES` says why.

Record (only on purpose, and say why in the commit): `python -m tests.golden.record`.
"""
G = "tests/golden"

CASES: dict[str, list[str]] = {
    "memory_8b_h100": ["memory", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--json"],
    "memory_70b_a100_tp4_fp8": ["memory", "-m", "llama-3.1-70b", "-g", "a100-80gb", "--tp", "4", "--kv-dtype", "fp8",
                                "--max-model-len", "32768", "--json"],
    "memory_mixtral_h200_tp2": ["memory", "-m", "mixtral-8x7b", "-g", "h200", "--tp", "2", "--json"],
    "memory_deepseek_h200_tp8": ["memory", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "--max-model-len", "65536",
                                 "--json"],
    "simulate_continuous": ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "8", "-n", "1500", "--json"],
    "simulate_continuous_step": ["simulate", "-m", "llama-3.1-8b", "-g", "l40s", "--rate", "3", "-n", "400",
                                 "--no-fast-forward", "--max-num-seqs", "64", "--json"],
    "simulate_priority": ["simulate", "-m", "llama-3.1-8b", "-g", "l40s", "--workload", f"{G}/priority.yaml",
                          "--policy", "priority", "--max-num-seqs", "32", "--json"],
    "simulate_static": ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--policy", "static", "--max-batch", "16",
                        "--max-wait-ms", "50", "--rate", "4", "-n", "800", "--json"],
    "simulate_prefix": ["simulate", "-m", "qwen2.5-7b", "-g", "a100-80gb", "--workload", f"{G}/prefix.yaml",
                        "--prefix-caching", "--json"],
    "simulate_closed": ["simulate", "-m", "mistral-7b", "-g", "h100-sxm", "--arrival", "closed", "--users", "48",
                        "--think-s", "0.5", "-n", "1000", "--input-len", "128-2048", "--output-len",
                        "lognormal:300:0.6", "--json"],
    "simulate_replicas": ["simulate", "-m", "llama-3.1-8b", "-g", "l4", "--rate", "1.5", "-n", "600", "--replicas",
                          "2", "--router", "least_outstanding", "--max-num-seqs", "64", "--max-model-len", "8192",
                          "--json"],
    "simulate_kv_pressure": ["simulate", "-m", "llama-3.1-8b", "-g", "l4", "--rate", "0.05", "-n", "200",
                             "--input-len", "2048-6000", "--output-len", "600", "--max-model-len", "8192",
                             "--gpu-memory-utilization", "0.8", "--json"],
    "simulate_profile": ["simulate", "-m", "llama-3.1-8b", "--profile", "llama-3.1-8b-h200", "-g", "h200", "--rate", "8", "-n", "800",
                         "--json"],
    "simulate_saturated": ["simulate", "-m", "llama-3.1-8b", "-g", "l4", "--rate", "30", "-n", "3000", "--max-model-len", "8192", "--json"],
    "sweep_seqs": ["sweep", "-m", "llama-3.1-8b", "--vary", "engine.max_num_seqs=32,256", "--rate", "6", "--seeds", "1",
                   "--requests", "300", "--executor", "serial", "--json"],
    "sweep_lengths": ["sweep", "-m", f"{G}/plan_small.yaml", "--prefill-sweep", "512,4096", "--seeds", "2",
                      "--requests", "200", "--executor", "serial", "--json"],
    "plan_small": ["plan", "-m", f"{G}/plan_small.yaml", "--executor", "serial", "--json"],
    "plan_a100_classes": ["plan", "-m", f"{G}/plan_a100_classes.yaml", "--executor", "serial", "--json"],
}

# Keys whose values are not figures of the answer (timing, cache statistics) and are never compared.
VOLATILE = ("wall_s", "cache_hits", "simulations")

# Figures that changed on purpose, with the reason. Each entry: (case, path prefix) -> reason. A path prefix
# covers every figure below it. Anything not listed here must be identical to the recording.
_MNBT = ("defect fixed (issue 15): the frontier was simulated with max_num_batched_tokens 8192 while the recommendation, "
         "its verification and the printed command used the engine's default, 2048 on an A100; now every row is "
         "simulated with the configuration the command launches (so also more KV blocks: a smaller activation peak)")
_CMD = ("launch commands spell out every knob of the simulated configuration (--no-enable-prefix-caching: vLLM v1 "
        "enables prefix caching by default); the SGLang command is translated by meaning (--mem-fraction-static "
        "holds weights + the planned KV pool, --max-total-tokens pins the pool, --disable-radix-cache)")
_SAT = ("defect fixed (issue 17): an overloaded run's served rate was finishes per second at the last arrival (a "
        "short burst of long requests gave 'about 0 req/s'); it is now output tokens per second over the longest "
        "backlogged period over the mean output length. simulate_priority: 3.97 -> 2.91 req/s (the run served "
        "2.66 over its window); simulate_saturated: 0.832 -> 1.05 req/s")
_LEN = ("defect fixed (issue 17): the recommended max_model_len was the smallest that covered the test workload "
        "(4,096), so the printed command would reject longer production prompts; it is now the largest that keeps "
        "the SLO (32,768, the same latency with paged KV), with a trade-off line on its full-length concurrency "
        "(13 vs 110 requests); the budget's max_model_len-dependent figures and its batch x context table follow")
CHANGES: dict[tuple[str, str], str] = {
    ("plan_small", "recommended.max_model_len"): _LEN,
    ("plan_small", "budget.max_model_len"): _LEN,
    ("plan_small", "budget.max_concurrency"): _LEN,
    ("plan_small", "budget.contiguous_max_seqs"): _LEN,
    ("plan_small", "memory_table"): _LEN,
    ("plan_small", "tradeoffs"): _LEN,
    ("simulate_priority", "capacity_req_per_s"): _SAT,
    ("simulate_priority", "saturation"): _SAT,
    ("simulate_saturated", "capacity_req_per_s"): _SAT,
    ("simulate_saturated", "saturation"): _SAT,
    ("simulate_profile", "step_cost_source"): "a bundled profile is named by its name, not by an absolute path of the "
                                              "checkout it happened to be read from (not portable between machines)",
    ("plan_small", "vllm_command"): _CMD,
    ("plan_small", "sglang_command"): _CMD,
    ("plan_a100_classes", "vllm_command"): _CMD,
    ("plan_a100_classes", "sglang_command"): _CMD,
    ("plan_a100_classes", "frontier"): _MNBT,
    ("plan_a100_classes", "recommended"): _MNBT,
    ("plan_a100_classes", "tradeoffs"): _MNBT + " (the trade-off sentences quote the frontier)",
}
