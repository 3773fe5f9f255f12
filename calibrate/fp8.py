"""FP8 GEMMs of the calibration stack: which dtype the dense projections run in, and the two scale schemes engines
use for FP8 checkpoints.

- Per tensor (ModelOpt/`fp8` checkpoints, vLLM's dynamic scheme): one scale for the weight, one for the
  activations, computed from their absolute maximum on the fly; `torch._scaled_mm`.
- Blocks (DeepSeek-V3 and Qwen3 FP8 checkpoints: `weight_block_size: [128, 128]`, the card's `quant_group_size`):
  a scale per 128 x 128 block of the weight and per 1 x 128 group of each token's activations (vLLM's
  `W8A8BlockFp8LinearOp`, which quantises activations per token group on the fly); `torch.nn.functional.scaled_mm`
  with `BlockWise1x128` x `BlockWise128x128` scales, a CUDA (sm90) kernel. A probe checks it against the
  reference at start-up. Where it does not run (a CPU, an older torch), the reference runs the same quantised
  operands instead: scales applied to e4m3 values, then a plain matmul. On a CPU that is a rehearsal of the
  GPU path; on a GPU it falls back to per-tensor scales, and the profile says so.

The scale layouts are what torch's own argument checks ask for (a test runs them on meta tensors): the activation
scales [M, K/128] with stride [1, M]; the weight's [round_up(K/128, 4), N/128] with stride [1, round_up(K/128, 4)].
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.card import ModelCard

FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK = 128  # the only block size torch's block-scaled kernel takes


def fp8_supported(device: str) -> bool:
    """Whether this torch runs FP8 GEMMs (`torch._scaled_mm`) on `device`: CUDA sm89+ (Ada, Hopper, Blackwell);
    CPU builds run them too (slowly: a rehearsal of the GPU path, not a measure of any GPU)."""
    import torch

    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False
    if device.startswith("cuda"):
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return True


def stack_gemm_dtype(card: ModelCard, device: str) -> str:
    """The dtype the stack's dense GEMMs run in: FP8 for FP8 weights where the device has it and the card does
    not ask for weight-only kernels (capacity.model.compute's rule), else the activation dtype."""
    if card.weight_format == "fp8" and card.gemm_dtype in ("auto", "fp8") and fp8_supported(device):
        return "fp8"
    if card.gemm_dtype == "fp8":
        raise ConfigError(f"compute_dtype fp8: torch on {device} cannot run FP8 GEMMs (torch._scaled_mm needs sm89+)")
    return card.dtype


def check_block_dims(card: ModelCard, dims: dict[str, int]) -> None:
    """Block scales need every GEMM dimension of this rank to be whole blocks (one line naming the first that
    is not)."""
    if card.quant_group_size != BLOCK:
        raise ConfigError(f"quant_group_size {card.quant_group_size}: the stack's block-scaled FP8 GEMMs take "
                          f"{BLOCK} x {BLOCK} blocks only")
    for name, d in dims.items():
        if d % BLOCK:
            raise ConfigError(f"fp8 block scales: {name} {d} on this rank is not a multiple of {BLOCK}")


def quantize_weight_blocks(t):
    """A weight [N, K] -> (e4m3 [K, N] column-major, scales in the kernel's layout [round_up(K/128, 4), N/128])."""
    import torch

    n, k = t.shape
    nb, kb = n // BLOCK, k // BLOCK
    s = t.float().reshape(nb, BLOCK, kb, BLOCK).abs().amax(dim=(1, 3)).clamp_(min=1e-12) / FP8_MAX  # [nb, kb]
    q = (t.float().reshape(nb, BLOCK, kb, BLOCK) / s[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
    l4 = -(-kb // 4) * 4
    padded = torch.ones(nb, l4, device=t.device, dtype=torch.float32)
    padded[:, :kb] = s
    return q.t(), padded.t()  # [K, N] with stride [1, K]; [l4, nb] with stride [1, l4]


def quantize_act_blocks(x):
    """Activations [M, K] -> (e4m3 [M, K], scales [M, K/128] with stride [1, M]), one per token per 128 inputs."""
    import torch

    m, k = x.shape
    kb = k // BLOCK
    s = x.float().reshape(m, kb, BLOCK).abs().amax(-1).clamp_(min=1e-12) / FP8_MAX  # [m, kb]
    q = (x.float().reshape(m, kb, BLOCK) / s[..., None]).reshape(m, k).to(torch.float8_e4m3fn)
    return q, s.t().contiguous().t()


def block_mm(x, w8, sw, out_dtype, kernel: str):
    """x [M, K] @ a block-quantised weight: the activations quantised per 1 x 128 group, then the block-scaled
    kernel ("scaled_mm") or the reference (the same e4m3 operands with their scales applied, a plain matmul)."""
    import torch.nn.functional as F

    x8, sx = quantize_act_blocks(x)
    if kernel == "scaled_mm":
        return F.scaled_mm(x8, w8, sx, F.ScalingType.BlockWise1x128, sw, F.ScalingType.BlockWise128x128,
                           output_dtype=out_dtype)
    m, k = x8.shape
    n = w8.shape[1]
    kb = k // BLOCK
    xd = (x8.float().reshape(m, kb, BLOCK) * sx[..., None]).reshape(m, k)
    wd = (w8.t().float().reshape(n // BLOCK, BLOCK, kb, BLOCK) * sw.t()[:, None, :kb, None]).reshape(n, k)
    return (xd @ wd.t()).to(out_dtype)


def probe_block_kernel(device: str, dtype) -> str:
    """"scaled_mm" where the block-scaled kernel runs on `device` and agrees with the reference, else "reference"."""
    import torch

    if not device.startswith("cuda"):
        return "reference"
    g = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(64, 2 * BLOCK, generator=g, device=device, dtype=dtype)
    w8, sw = quantize_weight_blocks(torch.randn(3 * BLOCK, 2 * BLOCK, generator=g, device=device, dtype=dtype))
    try:
        got = block_mm(x, w8, sw, dtype, "scaled_mm").float()
        ref = block_mm(x, w8, sw, dtype, "reference").float()
    except (RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError):
        return "reference"
    return "scaled_mm" if bool((got - ref).abs().max() <= 0.02 * ref.abs().max()) else "reference"
