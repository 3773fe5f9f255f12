"""GPU catalogue: datasheet figures in SI units, shipped as capacity/data/gpus.yaml.

`usable_memory_bytes` is what the engine sees (torch.cuda.mem_get_info's total, e.g. 79.2 GiB on an
"80 GB" H100), not the marketing size: vLLM multiplies *that* by gpu_memory_utilization. Its basis is
recorded ("observed" in a real log, or "estimate"). Users can pass their own GPU YAML with the same
fields (`capacity memory --gpu my-gpu.yaml`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from capacity.errors import ConfigError
from capacity.files import read_mapping, validate

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
CATALOGUE = Path(__file__).resolve().parents[1] / "data" / "gpus.yaml"


class GPU(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    datasheet_name: str | None = None  # the vendor's name for the part
    aliases: list[str] = []  # other names accepted for --gpu
    arch: str = ""  # architecture (Hopper, Ada ...)
    device_name: str | None = None  # what torch.cuda.get_device_name() says (vLLM's default rules read it)
    sm_count: Annotated[int, Field(gt=0, le=10_000)] | None = None  # SMs (CUs on AMD)
    nvls: bool = False  # NVSwitch with NVLink SHARP: NCCL allocates NVLS buffers at tp > 1
    memory_bytes: PosFloat  # marketing size (1 GB = 1e9 B)
    usable_memory_bytes: PosFloat  # total the engine sees (mem_get_info)
    usable_memory_basis: Literal["observed", "estimate", "given"] = "estimate"  # observed: from a real engine log; estimate: from the datasheet; given: --gpu-memory-gib
    usable_memory_note: str = ""  # where the usable memory figure comes from
    mem_bw_bytes_per_s: PosFloat  # peak DRAM bandwidth
    bf16_flops: PosFloat | None = None  # dense tensor-core peak, FLOP/s
    fp16_flops: PosFloat | None = None
    fp8_flops: PosFloat | None = None
    fp4_flops: PosFloat | None = None  # NVFP4/MXFP4 tensor cores (Blackwell)
    int8_ops: PosFloat | None = None
    interconnect_bytes_per_s: PosFloat  # GPU-to-GPU, per direction
    interconnect: str = "pcie"  # GPU-to-GPU link (nvlink, pcie, infinity-fabric)
    # Which GPUs of a host share that link (the engines' custom all-reduce needs every pair NVLink-connected):
    # fully-connected (NVSwitch, xGMI mesh), pairs (NVLink bridges two by two), cube-mesh (DGX-1: full up to 4),
    # pcie. None: fully-connected where `interconnect` says nvlink, else pcie. `topology_source` says where from.
    topology: Literal["fully-connected", "pairs", "cube-mesh", "pcie"] | None = None
    topology_source: str = ""  # where the topology comes from (a product brief, a system whitepaper)
    pcie_bytes_per_s: PosFloat | None = None  # per direction; NCCL's ring beyond an NVLink-bridged pair
    tdp_w: PosFloat | None = None  # board power, W
    source: str = ""  # datasheet the figures come from
    confidence: str = ""  # how sure the datasheet figures are

    def full_nvlink(self, tp: int) -> bool:
        """Whether `tp` GPUs of this kind are all NVLink-connected pair by pair (what vLLM's and SGLang's
        `is_full_nvlink` and TensorRT-LLM's NVLink check ask of the devices)."""
        topo = self.topology or ("fully-connected" if "nvlink" in self.interconnect else "pcie")
        return {"fully-connected": True, "pairs": tp <= 2, "cube-mesh": tp <= 4}.get(topo, False)

    def nvlink_ring(self, tp: int) -> bool:
        """Whether NCCL's ring over `tp` GPUs runs on NVLink: inside a fully connected group, and on a DGX-1 cube-mesh
        at 8 GPUs too (its NVLinks close a ring through all 8; only the custom all-reduce needs every pair)."""
        return self.full_nvlink(tp) or self.topology == "cube-mesh"

    def ring_bytes_per_s(self, tp: int) -> float:
        """Per-direction bandwidth of a ring over `tp` GPUs: the NVLink figure on an NVLink ring, PCIe otherwise."""
        if self.nvlink_ring(tp) or self.pcie_bytes_per_s is None:
            return self.interconnect_bytes_per_s
        return self.pcie_bytes_per_s

    def peak_flops(self, dtype: str) -> float:
        """The dense tensor rate for `dtype`. A part without BF16 units (Turing, Volta) serves a bf16 model in
        fp16: vLLM's `_resolve_auto_dtype` takes the platform's first supported dtype when the config's is not
        supported (sm < 80: float16, with a warning), so bf16 runs at the FP16 rate on the same 2 bytes."""
        value = {"bf16": self.bf16_flops or self.fp16_flops, "fp16": self.fp16_flops, "fp8": self.fp8_flops,
                 "fp4": self.fp4_flops, "int8": self.int8_ops}.get(dtype)
        if value is None:
            raise ConfigError(f"gpu {self.name}: no dense {dtype} tensor rate in the catalogue (the part lacks it)")
        return value


@lru_cache(maxsize=1)
def catalogue() -> dict[str, GPU]:
    # the bundled file, read with libyaml's parser where PyYAML has it (0.13 s -> 0.01 s, on every command's
    # critical path): the same safe constructor, the same data (tests/test_gpus.py)
    data = yaml.load(CATALOGUE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {name: GPU(name=name, **spec) for name, spec in data["gpus"].items()}


def _normalise(s: str) -> str:
    return s.strip().lower().replace("_", "-").replace(" ", "-")


def get_gpu(name_or_path: str) -> GPU:
    """A catalogue name or alias (case-insensitive), or the path of a user GPU YAML."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.is_file():
        data = read_mapping(p)
        data.setdefault("name", p.stem)
        return validate(GPU, data, str(p))
    key = _normalise(name_or_path)
    for gpu in catalogue().values():
        if key == gpu.name or key in (_normalise(a) for a in gpu.aliases) or key == _normalise(gpu.datasheet_name or ""):
            return gpu
    raise ConfigError(f"gpu {name_or_path!r} is not in the catalogue; known: {', '.join(catalogue())} (or pass a GPU YAML)")


def with_memory(gpu: GPU, gib: float | None) -> GPU:
    """The GPU with the total memory the engine sees set to `gib` GiB (--gpu-memory-gib), or unchanged."""
    if gib is None:
        return gpu
    if not math.isfinite(gib) or not 0.5 <= gib <= 4096:
        raise ConfigError(f"--gpu-memory-gib {gib}: expected the GiB the engine sees, 0.5 to 4096")
    return gpu.model_copy(update={"usable_memory_bytes": gib * 1024**3, "usable_memory_basis": "given",
                                  "usable_memory_note": f"{gib} GiB as given"})


def resolve_gpu(spec: str | dict) -> GPU:
    """A GPU from a catalogue name, a GPU YAML path, or a GPU's fields (what a planner task carries)."""
    if isinstance(spec, dict):
        return validate(GPU, spec, "gpu")
    return get_gpu(spec)


def match_gpu(device_name: str, total_memory_bytes: float | None = None) -> str | None:
    """Catalogue name for a device as torch names it ('NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-40GB'),
    or None. The family token must appear in the name; PCIe-vs-SXM and memory size break ties."""
    words = set(_normalise(device_name).replace("-", " ").split())
    joined = _normalise(device_name)
    best: tuple[float, str] | None = None
    for gpu in catalogue().values():
        family = gpu.name.split("-")[0]  # h100, a100, rtx, l40s, ...
        if gpu.name.startswith("rtx-"):
            ok = gpu.name[4:] in words
        else:
            ok = family in words or family in joined.split("-")
        if not ok:
            continue
        score = 0.0
        if ("pcie" in joined) != ("pcie" in gpu.name):
            score += 1e15
        if total_memory_bytes:
            score += abs(gpu.usable_memory_bytes - total_memory_bytes)
        sizes = [int(w[:-2]) for w in words if w.endswith("gb") and w[:-2].isdigit()]  # "80gb" in the name
        if sizes and not total_memory_bytes:
            score += abs(gpu.memory_bytes / 1e9 - sizes[0]) * 1e9
        if best is None or score < best[0]:
            best = (score, gpu.name)
    return best[1] if best else None
