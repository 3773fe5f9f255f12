"""The `capacity` commands, in the order `capacity --help` lists them: each command's module (under capacity/cli)
and its help's first paragraph (what the listing shortens to one line). `capacity --help` reads this table and
imports no command module; a command's module is imported only when that command runs or shows its own help
(common.LazyGroup). tests/test_cli_lazy.py checks each entry against the command's real help."""
from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "autoscale": ("autoscale", "Autoscaling over a load curve: replicas over time, P99 TTFT/TPOT per window against "
                  "the SLO (violation minutes), GPU-hours and cost, against static provisioning for the peak. With "
                  "--decode-tp, a prefill pool and a decode pool, each with its own controller."),
    "calibrate": ("costs", "Measure step costs with real torch kernels on a device and write a profile (needs torch: "
                  "`pip install torch==2.13.0`); or, with --from-run, fit an engine's step-cost terms to measured "
                  "runs."),
    "step-cost": ("costs", "Time of one engine step (ms) with its breakdown, from the roofline or a calibrated "
                  "profile."),
    "profiles": ("costs", "List the bundled calibration profiles (calibrate/profiles): model, device, torch/CUDA, "
                 "eager or CUDA graphs, and held-out whole-step accuracy. Pass a name to --profile of plan, "
                 "simulate, step-cost."),
    "disagg": ("disagg", "Aggregated vs disaggregated prefill/decode on a unit of GPUs: every layout's max rate "
               "under the P99 SLOs, the GPUs and cost for a target rate, and which wins and why; with --tune, each "
               "role's settings searched."),
    "colocate": ("fleet", "Several models on GPUs of their own, sharing GPUs (their steps taking turns, memory split "
                 "by shares) or swapped in and out of GPUs (one resident at a time, vLLM sleep mode): GPUs, each "
                 "model's KV blocks and P99 TTFT/TPOT against its SLO, in each layout."),
    "pools": ("fleet", "Interactive and batch traffic of one model: one pool with priority scheduling vs two pools, "
              "each sized to the fewest replicas that hold the interactive SLO and the batch deadline; the cheaper "
              "one recommended."),
    "fleet-day": ("fleet", "Several models over a day: static provisioning for the peak, reactive and predictive "
                  "autoscaling per model, and the models sharing GPUs; GPU-hours, cost and SLO-miss minutes per "
                  "model and for the fleet."),
    "memory": ("memory", "VRAM budget per rank (weights, activations, non-torch, CUDA graphs, KV), blocks, "
               "concurrency, and the batch x context table, as vLLM would reserve it at start-up (`--engine "
               "sglang[@X.Y]`: as SGLang sizes its KV pool)."),
    "fleet": ("memory", "Memory-only fleet sizing across GPUs: for each GPU, the smallest TP that serves the model, "
              "its KV capacity, and the replicas and GPUs needed to hold `concurrency` sequences of `context` "
              "tokens (no latency: `capacity plan` adds the simulator)."),
    "gpus": ("memory", "List the GPU catalogue (SI units inside; GiB and TB/s shown)."),
    "models": ("memory", "List bundled model cards with their parameter counts and KV bytes per token."),
    "engines": ("memory", "The vLLM releases the memory model knows (`--engine vllm@X.Y`), how each accounts for "
                "start-up memory, and whether that accounting was checked against real start-up logs; then the "
                "other engines (SGLang's releases, TensorRT-LLM)."),
    "schema": ("memory", "Print the reference of every file format (scenario, workload, engine, model card, GPU), "
               "generated from the code: every field with its type, default and meaning (this is docs/schema.md)."),
    "plan": ("plan", "The capacity plan: memory budget, max batch x max context frontier with P99 and capacity, max "
             "sustainable rate under the SLOs, TP/replicas/GPUs for the target rate with cost, a verified "
             "recommended `vllm serve` configuration, and trade-offs."),
    "sweep": ("plan", "Simulate a grid over any scenario fields (dotted paths) and tabulate P50/P99 TTFT, TPOT and "
              "tokens/s."),
    "export": ("plan", "Write the capacity-review workbook from a saved plan, sweep, autoscale and/or fleet-day "
               "report."),
    "simulate": ("simulate", "Simulate serving: percentiles of TTFT, TPOT, ITL, E2E and queue wait (ms), throughput, "
                 "goodput."),
    "loadtest": ("truth", "Load-test an OpenAI-compatible server; report the simulator's metrics (vllm bench serve "
                 "conventions)."),
    "compare": ("truth", "A/B two runs: each metric's change with a bootstrap interval and a verdict (better, worse, "
                "no significant change); with --fail-on, a regression gate for CI (exit 3)."),
    "validate": ("truth", "Replay a measured run (same arrivals and lengths) through the simulator and compare "
                 "percentiles."),
    "fit-engine": ("truth", "The guided engine fit: warm up, run four probes (single stream, short- and long-prompt "
                   "bursts, a decode burst) against a live server, fit the step-cost terms with their uncertainty, "
                   "and check the fit on a held-out run at a rate derived from the probes."),
    "trace": ("trace", "Read public LLM-serving traces (Mooncake, Azure, BurstGPT) as published."),
}
