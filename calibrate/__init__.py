"""Microbenchmarks that measure step costs with real torch kernels on a device (`cuda:N` or `cpu`).

`stack.py` is a Llama-shaped decoder (GQA, optional biases/qk-norm, optional MoE) with random weights whose
per-op functions are what the suite times, and whose forward over a mixed prefill+decode step is what the
whole-step timings and the accuracy benchmark run. `timing.py` is the timer; `suite.py` runs the grids and
writes a profile (schema: `capacity/profile.py`). torch is imported here, never by `capacity/` at import time.
"""
