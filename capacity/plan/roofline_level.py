"""How far the roofline was from published runs, and what a plan on it says about that.

The figures are the benches' as recorded (tests/test_mlperf.py recomputes them from bench/results/, so a bench rerun
that moves them fails until they are updated here):

- `ROOFLINE_VS_MLPERF`: the simulated over the published max rate under LoadGen's limits, lowest and highest of the
  MLPerf Server runs at the modelled clocks outside the Interactive scenario (bench/mlperf.py);
- `ROOFLINE_VS_TRTLLM_FP8`: the throughput MAPE on TensorRT-LLM's FP8 table rows at trtllm-bench's batch settings
  (bench/published.py);
- `ROOFLINE_VS_TRTLLM_FP4`: on its B200 FP4 rows, the simulated over the published throughput, lowest, median and
  highest (FP4 GEMMs at the efficiency measured for them on a B200, 0.38 of the datasheet: capacity/data/
  gemm_efficiency.yaml, and never faster than their measured latency per shape: capacity/data/gemm_latency.json;
  at the default 0.70 they were 1.17-1.55x);
- `PUBLISHED_OUTPUT_PLATEAU`: the most output tokens/s NVIDIA NIM's Llama-3.1-8B sweep reached on one H100, to the
  thousand (bench/results/published_nim.json): there its throughput stopped rising while its ITL grew with the
  batch, a limit of the server's per-token output handling, not of the GPU (docs/fidelity.md). Not a model term: a
  plan whose replicas would stream more says so (any step cost), unless the server's figure is set.
"""
from __future__ import annotations

import math

from capacity.model.card import ModelCard
from capacity.model.compute import gemm_dtypes
from capacity.model.gpus import GPU

ROOFLINE_VS_MLPERF = (0.77, 1.14)
ROOFLINE_VS_TRTLLM_FP8 = 0.11
ROOFLINE_VS_TRTLLM_FP4 = (0.8, 0.9, 1.12)
PUBLISHED_OUTPUT_PLATEAU = 13_000


def roofline_notes(card: ModelCard, gpu: GPU, headroom: float) -> list[str]:
    """The notes of a plan whose step costs come from the roofline (none for a measured profile: the caller's)."""
    lo, hi = ROOFLINE_VS_MLPERF
    notes = [f"step costs from the roofline, not measured: on published runs its max rate under the latency limits "
             f"was {lo:.2f}-{hi:.2f}x real TensorRT-LLM's (MLPerf Server) and "
             f"its throughput within {ROOFLINE_VS_TRTLLM_FP8:.0%} of TensorRT-LLM's "
             f"newer tables (docs/fidelity.md); replicas at {headroom:.0%} of the max rate absorb "
             + (f"up to {1 / headroom:.2f}x" if headroom < 1 else "none of it")
             + "; a measured profile (calibrate/) closes it"]
    lo, mid, hi = ROOFLINE_VS_TRTLLM_FP4
    if "fp4" in gemm_dtypes(card, gpu).values() and hi * headroom > 1:  # more than the headroom absorbs
        notes.append(f"FP4 GEMMs on the roofline: on TensorRT-LLM's B200 FP4 table its throughput was "
                     f"{lo:.2f}-{hi:.2f}x the published (median {mid:.2f}x; docs/fidelity.md), more than replicas at "
                     f"{headroom:.0%} of the max rate absorb"
                     + (f" ({1 / headroom:.2f}x)" if headroom < 1 else "")
                     + f": read these rates as an upper bound; --headroom {math.floor(100 / hi) / 100:.2f} covers "
                     "the highest")
    return notes


def output_handling_notes(max_rate: float, mean_output_tokens: float, set_: bool) -> list[str]:
    """A note when a replica's max rate means streaming more output tokens/s than a published server managed."""
    tok_s = max_rate * mean_output_tokens
    if set_ or tok_s <= PUBLISHED_OUTPUT_PLATEAU:
        return []
    return [f"at its max rate a replica streams {tok_s:,.0f} output tokens/s: a server's per-token output handling "
            f"(detokenising and streaming on its CPU) can stop it first (NVIDIA NIM's Llama-3.1-8B stopped at "
            f"{PUBLISHED_OUTPUT_PLATEAU:,} on one H100, its ITL then growing with the batch; docs/fidelity.md): "
            "measure the server's and set --output-cpu-us, or read the rate as an upper bound"]
