"""A layer's work around attention compiled with torch.compile, as vLLM compiles its models.

vLLM (v1) runs the model through torch.compile with the attention op left out of the graph ("piecewise"): what
lies between two attention calls is one compiled piece, and Inductor fuses its elementwise work (residual add +
RMSNorm, SiLU x up, RoPE, FP8 quantisation of activations) around the GEMMs, which it leaves to cuBLAS. The token
count is a dynamic dimension, so one compilation serves every batch size. The stack's pieces are the same:
`Layer.pre` (norm -> qkv -> RoPE) and `Layer.post` (o-proj -> residual -> norm -> MLP -> residual). Both are
compiled once with `dynamic=True` and shared by every layer (the weights are arguments, so no per-layer
recompilation); attention stays as it is.

Compiling runs Inductor: Triton kernels on a GPU, C++ on a CPU (a compiler must be installed). A start-up check
compares the compiled halves with the eager ones on random inputs; if compiling fails or they disagree, the
stack stays eager and says why.
"""
from __future__ import annotations

import functools


def compile_layers(stack) -> str | None:
    """Route every distinct layer's `pre` and `post` through one compiled function each. Returns None when the
    compiled halves agree with the eager ones on a 17-token check, else the reason the stack stayed eager."""
    import torch

    from calibrate.stack import Layer

    pre = torch.compile(Layer.pre, dynamic=True)
    post = torch.compile(Layer.post, dynamic=True)
    s, dev, dt = stack.s, stack.device, stack.dtype
    g = torch.Generator(device=dev).manual_seed(7)
    n = 17
    checked = {layer.moe: layer for layer in stack.layers}  # one dense and one MoE layer, where present
    try:
        # Inference tensors, as the timed steps pass (guards tell them apart: others would compile a graph for nothing)
        with torch.inference_mode():
            x = torch.randn(n, s.hidden, generator=g, device=dev, dtype=dt)
            a = torch.randn(n, s.q_heads * s.head_dim, generator=g, device=dev, dtype=dt)
            pos = torch.arange(n, device=dev)
            cos, sin = stack.cos[pos].unsqueeze(1), stack.sin[pos].unsqueeze(1)
            for layer in checked.values():
                want = [*layer.pre(x, cos, sin), layer.post(x, a)]
                got = [*pre(layer, x, cos, sin), post(layer, x, a)]
                for w, h in zip(want, got):
                    err = (w.float() - h.float()).abs().max()
                    if not bool(err <= 0.02 * w.float().abs().max().clamp(min=1e-3)):
                        return f"compiled layer disagrees with eager (max abs error {float(err):.3g}): stayed eager"
    except Exception as exc:  # Inductor raises many types (BackendCompilerFailed, missing compiler, ...)
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return f"torch.compile failed ({type(exc).__name__}: {first}): stayed eager"
    for layer in stack.layers:
        layer.pre = functools.partial(pre, layer)
        layer.post = functools.partial(post, layer)
    return None
