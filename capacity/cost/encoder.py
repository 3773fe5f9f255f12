"""The vision encoder's time in a step: a roofline of the ViT (and its projector) over the images a step encodes.

vLLM V1 runs the encoder inside the step that schedules an image, before the language model's forward
(`GPUModelRunner.execute_model` -> `_execute_mm_encoder`, vllm/v1/worker/gpu_model_runner.py), batching the
step's images; the scheduler picks them (`Scheduler._try_schedule_encoder_inputs`, vllm/v1/core/sched/scheduler.py:
an image whose placeholder range overlaps the chunk being prefilled and is not in the encoder cache). So the
encoder's time adds to that step (`StepPlan.encoder_s`, added by `EncoderStepCost`).

Per image of `seq` encoder tokens in `n` sequences (tiles), per layer: the linear layers 2 x seq x n x (4 h^2 +
2 or 3 x h x i) FLOPs (3 for a gated MLP: Qwen2.5-VL, Pixtral), attention 4 x seq x keys x h x n with keys = seq
(full attention) or the window (Qwen2.5-VL: window_size / patch squared patches, except its full-attention
layers); plus the patch embedding (2 x 3 x p^2 x h per patch, twice for Qwen's two-frame patches) and the
projector (2 x its params per output token). Time = max(FLOPs / (peak x efficiency), the encoder's weight
bytes / (bandwidth x efficiency)) over the whole step's images, sharded over TP ranks as vLLM does by default
(`mm_encoder_tp_mode` "weights"), plus a kernel launch per operator per layer and, at TP > 1, two all-reduces
per layer. The efficiencies are the language model roofline's (`RooflineParams`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from capacity.cost.roofline import RooflineParams
from capacity.cost.step import StepPlan
from capacity.model.card import VisionTower
from capacity.model.gpus import GPU
from capacity.units import DTYPE_BYTES

OPS_PER_LAYER = 8  # norms, qkv, attention, o, MLP up/gate, act, down, residual: kernel launches per layer


@dataclass
class EncoderRoofline:
    """Roofline time of a vision tower on one GPU at one TP size (module docstring)."""

    vision: VisionTower
    gpu: GPU
    tp: int = 1
    dtype: str = "bf16"
    params: RooflineParams = field(default_factory=RooflineParams)

    def __post_init__(self) -> None:
        v = self.vision
        self.layers = v.num_layers + v.num_global_layers
        self.linear_per_token = 4 * v.hidden_size ** 2 + (3 if v.gated_mlp else 2) * v.hidden_size * v.intermediate_size
        self.embed_per_token = 3 * v.patch_frames * v.patch_size ** 2 * v.hidden_size
        self.window = (v.window_size // v.patch_size) ** 2 if v.window_size else 0
        self.weight_bytes = v.params() * DTYPE_BYTES.get(self.dtype, 2)
        self.peak = self.gpu.peak_flops(self.dtype)

    def flops(self, seq: int, seqs: int = 1) -> tuple[float, float]:
        """(linear, attention) FLOPs of one image: `seqs` sequences of `seq` encoder tokens."""
        v, n = self.vision, seq * seqs
        linear = 2.0 * n * (self.layers * self.linear_per_token + self.embed_per_token)
        linear += 2.0 * (n // (v.merge_size ** 2)) * v.projector_params
        if self.window and seq > self.window:
            full = v.full_attention_layers
            pairs = full * seq * seq + (self.layers - full) * seq * self.window
        else:
            pairs = self.layers * seq * seq
        return linear, 4.0 * pairs * v.hidden_size * seqs

    def images_s(self, images: Iterable[tuple[int, int]]) -> float:
        """Seconds to encode a step's images, each (sequence length, sequences)."""
        lin = att = 0.0
        for seq, seqs in images:
            a, b = self.flops(seq, seqs)
            lin += a
            att += b
        if lin == 0.0:
            return 0.0
        p = self.params
        compute = (lin / (self.peak * p.gemm_flops_eff) + att / (self.peak * p.attn_flops_eff)) / self.tp
        memory = self.weight_bytes / self.tp / (self.gpu.mem_bw_bytes_per_s * p.mem_bw_eff)
        fixed = self.layers * OPS_PER_LAYER * p.kernel_launch_s
        if self.tp > 1:
            fixed += self.layers * 2 * p.allreduce_latency_s
        return max(compute, memory) + fixed


class EncoderStepCost:
    """A step cost plus the vision encoder's time of the step (`StepPlan.encoder_s`); everything else is the
    wrapped cost's (decode-only steps never encode, so its exact decode runs stay)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.source = f"{getattr(inner, 'source', type(inner).__name__)}; vision encoder roofline"

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def step_s(self, plan: StepPlan) -> float:
        return math.fsum((self.inner.step_s(plan), plan.encoder_s))

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        out = dict(self.inner.breakdown(plan))
        enc = plan.encoder_s
        if enc:
            out["vision encoder"] = enc
        return out
