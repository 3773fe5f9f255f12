"""Microbenchmark of a ViT-sized encoder block against the vision encoder roofline (capacity.cost.encoder).

    python bench/vision_encoder.py --device cuda:0 --out bench/results/vision_encoder-h100-sxm.json
    python bench/vision_encoder.py --device cpu --layers 1 --patches 256 1024       # a CPU rehearsal (seconds)

Times `--layers` pre-norm transformer blocks the shape of Qwen2.5-VL-7B's ViT (hidden 1280, gated MLP 3420,
16 heads, full attention through torch's scaled_dot_product_attention) over one image of each `--patches`
count, in bf16 on a GPU (fp32 on a CPU), median of `--repeats` after a warm-up, and writes per-layer seconds beside
the roofline's per-layer time of the same shape (full attention; no launch term on either side: the roofline's
per-layer compute and memory terms at the GPU's datasheet peaks x the language model's efficiencies). On a CPU
the roofline column is the H100's and the ratio means nothing: the run checks the script, not the model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def block(torch, h: int, i: int, heads: int, dtype, device):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
            self.qkv, self.o = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.gate_up, self.down = nn.Linear(h, 2 * i), nn.Linear(i, h)

        def forward(self, x):
            s = x.shape[0]
            q, k, v = self.qkv(self.n1(x)).view(s, 3, heads, h // heads).permute(1, 2, 0, 3)
            a = F.scaled_dot_product_attention(q[None], k[None], v[None])[0].transpose(0, 1).reshape(s, h)
            x = x + self.o(a)
            g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    return Block().to(device=device, dtype=dtype).eval()


def roofline_layer_s(patches: int, gpu_name: str) -> float:
    from capacity.cost.encoder import EncoderRoofline
    from capacity.model.card import VisionTower
    from capacity.model.gpus import get_gpu

    v = VisionTower(kind="qwen2_5_vl", num_layers=1, hidden_size=1280, intermediate_size=3420, num_heads=16,
                    patch_size=14, image_size=3584, tokens_per_image=16384, merge_size=2)
    enc = EncoderRoofline(v, get_gpu(gpu_name))
    lin, att = enc.flops(patches)
    lin -= 2.0 * patches * enc.embed_per_token  # the block alone: no patch embedding, no merger
    lin -= 2.0 * (patches // 4) * v.projector_params
    p = enc.params
    layer_bytes = (4 * 1280 ** 2 + 3 * 1280 * 3420) * 2
    return max(lin / (enc.peak * p.gemm_flops_eff) + att / (enc.peak * p.attn_flops_eff),
               layer_bytes / (enc.gpu.mem_bw_bytes_per_s * p.mem_bw_eff))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--patches", type=int, nargs="+", default=[1024, 3996, 16384])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from capacity.model.gpus import match_gpu

    cuda = a.device.startswith("cuda") and torch.cuda.is_available()
    device = a.device if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    gpu = (match_gpu(torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory)
           if cuda else None) or "h100-sxm"
    blocks = [block(torch, 1280, 3420, 16, dtype, device) for _ in range(a.layers)]
    rows = []
    for n in a.patches:
        x = torch.randn(n, 1280, device=device, dtype=dtype)
        times = []
        with torch.inference_mode():
            for r in range(a.repeats + 2):
                if cuda:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                y = x
                for b in blocks:
                    y = b(y)
                if cuda:
                    torch.cuda.synchronize(device)
                if r >= 2:  # two warm-up passes
                    times.append(time.perf_counter() - t0)
        per_layer = statistics.median(times) / a.layers
        model = roofline_layer_s(n, gpu)
        rows.append({"patches": n, "measured_layer_s": per_layer, "roofline_layer_s": model,
                     "measured_over_roofline": per_layer / model})
        print(f"{n:>6} patches: {per_layer * 1e3:8.3f} ms/layer measured, {model * 1e3:8.3f} roofline "
              f"({gpu}), x{per_layer / model:.2f}", flush=True)
    out = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "gpu": gpu if cuda else None,
           "dtype": str(dtype), "torch": torch.__version__, "layers": a.layers,
           "shape": {"hidden": 1280, "intermediate": 3420, "heads": 16, "mlp": "gated", "attention": "full (SDPA)"},
           "rows": rows}
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
