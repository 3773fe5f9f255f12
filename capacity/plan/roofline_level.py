"""How far the roofline was from published runs, and what a plan on it says about that.

The figures are the benches' as recorded (tests/test_mlperf.py recomputes them from bench/results/, so a bench rerun
that moves them fails until they are updated here):

- `ROOFLINE_VS_MLPERF`: the simulated over the published max rate under LoadGen's limits, lowest and highest of the
  MLPerf Server runs at the modelled clocks outside the Interactive scenario (bench/mlperf.py);
- `ROOFLINE_VS_TRTLLM_FP8`: the throughput MAPE on TensorRT-LLM's FP8 table rows at trtllm-bench's batch settings
  (bench/published.py);
- `ROOFLINE_VS_TRTLLM_FP4`: on its B200 FP4 rows, the simulated over the published throughput, lowest, median and
  highest (FP4 GEMMs at 70% of the datasheet rate: the roofline's least certain figure, on the unsafe side).
"""
from __future__ import annotations

import math

from capacity.model.card import ModelCard
from capacity.model.compute import gemm_dtypes
from capacity.model.gpus import GPU

ROOFLINE_VS_MLPERF = (1.19, 1.35)
ROOFLINE_VS_TRTLLM_FP8 = 0.08
ROOFLINE_VS_TRTLLM_FP4 = (1.17, 1.34, 1.55)


def roofline_notes(card: ModelCard, gpu: GPU, headroom: float) -> list[str]:
    """The notes of a plan whose step costs come from the roofline (none for a measured profile: the caller's)."""
    lo, hi = ROOFLINE_VS_MLPERF
    notes = [f"step costs from the roofline, not measured: on published runs its max rate under the latency limits "
             f"was {lo:.2f}-{hi:.2f}x real TensorRT-LLM's (MLPerf Server) and "
             f"its throughput within {ROOFLINE_VS_TRTLLM_FP8:.0%} of TensorRT-LLM's "
             f"newer tables (docs/fidelity.md); replicas at {headroom:.0%} of the max rate absorb "
             + (f"up to {1 / headroom:.2f}x" if headroom < 1 else "none of it")
             + "; a measured profile (calibrate/) closes it"]
    if "fp4" in gemm_dtypes(card, gpu).values():
        lo, mid, hi = ROOFLINE_VS_TRTLLM_FP4
        notes.append(f"FP4 GEMMs on the roofline are its least certain figure: on TensorRT-LLM's B200 FP4 table its "
                     f"throughput was {lo:.2f}-{hi:.2f}x the published (median {mid:.2f}x; docs/fidelity.md), more "
                     f"than replicas at {headroom:.0%} of the max rate absorb"
                     + (f" ({1 / headroom:.2f}x)" if headroom < 1 else "")
                     + f": read these rates as an upper bound; --headroom {math.floor(100 / hi) / 100:.2f} covers "
                     "the highest")
    return notes
