"""Build the packaged GPU catalogue (capacity/data/gpus.yaml) from the datasheet file.

Source: ../shared/data/gpu_specs.yaml (vendor units: GB, GB/s, TFLOP/s, with sources), plus two repo-local files
in the same schema: scripts/gpu_specs_extra.yaml and scripts/gpu_specs_more.yaml (on a name clash the shared file
wins over gpu_specs_more.yaml).
Output: SI units only (bytes, bytes/s, FLOP/s), one `source` per GPU, and an explicit
`usable_memory_bytes` = the total that torch.cuda.mem_get_info() reports and vLLM multiplies by
gpu_memory_utilization. Where a real log gave that total we use it (`usable_memory_basis: observed`);
elsewhere we estimate it from the marketing size (`estimate`, see USABLE_ESTIMATES below).

Run:  python scripts/build_gpu_catalogue.py [path/to/gpu_specs.yaml]
The output is committed; the package never reads ../shared at run time.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

GIB = 1024**3
GB = 1e9
ROOT = Path(__file__).resolve().parents[1]

# Catalogue key -> (datasheet key, aliases)
NAMES = {
    "a100-40gb": ("A100-40GB-SXM", ["a100-40gb-sxm", "a100-40g"]),
    "a100-80gb": ("A100-80GB-SXM", ["a100-80gb-sxm", "a100", "a100-80g"]),
    "h100-sxm": ("H100-SXM-80GB", ["h100", "h100-sxm-80gb", "h100-80gb"]),
    "h100-pcie": ("H100-PCIe-80GB", ["h100-pcie-80gb"]),
    "h200": ("H200-SXM-141GB", ["h200-sxm", "h200-sxm-141gb"]),
    "b200": ("B200-SXM-180GB", ["b200-sxm", "b200-sxm-180gb"]),
    "l40s": ("L40S", []),
    "l4": ("L4", []),
    "a10g": ("A10G", []),
    "rtx-4090": ("RTX-4090", ["4090", "rtx4090"]),
    "mi300x": ("MI300X", []),
    "t4": ("T4", ["tesla-t4"]),
    "a10": ("A10", []),
    "rtx-3090": ("RTX-3090", ["3090", "rtx3090"]),
    # scripts/gpu_specs_more.yaml
    "rtx-a6000": ("RTX-A6000", ["a6000", "rtxa6000"]),
    "a40": ("A40", []),
    "l40": ("L40", []),
    "rtx-6000-ada": ("RTX-6000-Ada", ["rtx6000-ada", "6000-ada", "rtx-6000-ada-generation"]),
    "rtx-4080": ("RTX-4080", ["4080", "rtx4080"]),
    "rtx-4060-ti-16gb": ("RTX-4060-Ti-16GB", ["4060-ti-16gb", "rtx-4060-ti", "4060ti"]),
    "rtx-3080": ("RTX-3080-10GB", ["3080", "rtx3080", "rtx-3080-10gb"]),
    "rtx-5090": ("RTX-5090", ["5090", "rtx5090"]),
    "rtx-5080": ("RTX-5080", ["5080", "rtx5080"]),
    "rtx-pro-6000": ("RTX-PRO-6000-Blackwell", ["rtx-pro-6000-blackwell", "pro-6000", "rtx-pro-6000-server",
                                                 "rtx-pro-6000-workstation"]),
    "v100-32gb": ("V100-SXM2-32GB", ["v100", "v100-sxm2-32gb", "v100-32g"]),
    "v100-16gb": ("V100-SXM2-16GB", ["v100-sxm2-16gb", "v100-16g"]),
    "a800-80gb": ("A800-80GB-SXM", ["a800", "a800-sxm4-80gb", "a800-80g"]),
    "h800": ("H800-SXM-80GB", ["h800-sxm", "h800-80gb"]),
    "h20": ("H20-96GB", ["h20-96gb", "hgx-h20"]),
    "gh200": ("GH200-96GB", ["gh200-96gb", "gh200-480gb"]),
    "h100-nvl": ("H100-NVL-94GB", ["h100-nvl-94gb", "h100nvl"]),
    "gb10": ("GB10", ["dgx-spark"]),
    "mi250x": ("MI250X-GCD", ["mi250x-gcd"]),
    "mi325x": ("MI325X", []),
    "a100-pcie-80gb": ("A100-PCIe-80GB", ["a100-80gb-pcie", "a100-pcie"]),
    "l20": ("L20", []),
    "b300": ("B300-SXM-288GB", ["b300-sxm", "b300-sxm-288gb", "hgx-b300", "dgx-b300"]),
    "gb300": ("GB300-279GB", ["gb300-nvl72"]),
}

# What torch.cuda.get_device_name() returns (vLLM's default rules match words in it), the number of SMs (CUs
# on AMD: the Triton top-k/top-p buffer is sized by it) and whether the board's NVSwitch does NVLink SHARP
# (NCCL's NVLS buffers appear at tp > 1). From the vendors' architecture documents.
DEVICE = {
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 108, False),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 108, False),
    "h100-sxm": ("NVIDIA H100 80GB HBM3", 132, True),
    "h100-pcie": ("NVIDIA H100 PCIe", 114, False),
    "h200": ("NVIDIA H200", 132, True),
    "b200": ("NVIDIA B200", 148, True),
    "l40s": ("NVIDIA L40S", 142, False),
    "l4": ("NVIDIA L4", 58, False),
    "a10g": ("NVIDIA A10G", 80, False),
    "rtx-4090": ("NVIDIA GeForce RTX 4090", 128, False),
    "mi300x": ("AMD Instinct MI300X", 304, False),
    "t4": ("Tesla T4", 40, False),
    "a10": ("NVIDIA A10", 72, False),
    "rtx-3090": ("NVIDIA GeForce RTX 3090", 82, False),
    "rtx-a6000": ("NVIDIA RTX A6000", 84, False),
    "a40": ("NVIDIA A40", 84, False),
    "l40": ("NVIDIA L40", 142, False),
    "rtx-6000-ada": ("NVIDIA RTX 6000 Ada Generation", 142, False),
    "rtx-4080": ("NVIDIA GeForce RTX 4080", 76, False),
    "rtx-4060-ti-16gb": ("NVIDIA GeForce RTX 4060 Ti", 34, False),
    "rtx-3080": ("NVIDIA GeForce RTX 3080", 68, False),
    "rtx-5090": ("NVIDIA GeForce RTX 5090", 170, False),
    "rtx-5080": ("NVIDIA GeForce RTX 5080", 84, False),
    "rtx-pro-6000": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 188, False),  # or "... Workstation Edition"
    "v100-32gb": ("Tesla V100-SXM2-32GB", 80, False),
    "v100-16gb": ("Tesla V100-SXM2-16GB", 80, False),
    "a800-80gb": ("NVIDIA A800-SXM4-80GB", 108, False),
    "h800": ("NVIDIA H800", 132, True),  # HGX H800: third-generation NVSwitch as HGX H100
    "h20": ("NVIDIA H20", 78, True),  # HGX H20, 900 GB/s NVLink through NVSwitch
    "gh200": ("NVIDIA GH200 480GB", 132, False),
    "h100-nvl": ("NVIDIA H100 NVL", 132, False),
    "gb10": ("NVIDIA GB10", 48, False),
    "mi250x": ("AMD Instinct MI250X", 110, False),  # per GCD; some ROCm builds say "AMD Instinct MI250X/MI250"
    "mi325x": ("AMD Instinct MI325X", 304, False),
    "a100-pcie-80gb": ("NVIDIA A100 80GB PCIe", 108, False),
    "l20": ("NVIDIA L20", 92, False),
    "b300": ("NVIDIA B300 SXM6 AC", 148, True),  # the name public reports show; SMs as B200 (not published here)
    "gb300": ("NVIDIA GB300", 148, True),  # the name nvidia-smi prints (code-index id 54575140392)
}
EXTRA = ROOT / "scripts" / "gpu_specs_extra.yaml"
MORE = ROOT / "scripts" / "gpu_specs_more.yaml"

# GiB that mem_get_info reports, for GPUs the datasheet file has no observed total for.
# Rule used: HBM parts report ~99% of the nominal size read as GiB (A100-80GB: 79.15 of 80, H200:
# 139.80 of 141); GDDR parts with ECC on by default lose ~1/16 more (A10G: 22.07 of 24).
USABLE_ESTIMATES = {
    "H100-PCIe-80GB": (79.15, "same HBM2e stack as A100-80GB/H100-SXM, which report 79.1-79.2 GiB"),
    "B200-SXM-180GB": (178.4, "99% of 180 read as GiB (HBM rule); no log seen"),
    "L40S": (44.4, "48 GiB GDDR6 with ECC on (as A10G: 22.07 of 24 GiB)"),
    "L4": (22.1, "24 GiB GDDR6 with ECC on (as A10G: 22.07 of 24 GiB)"),
    "MI300X": (191.5, "99.7% of 192 GiB as ROCm reports HBM parts; no log seen"),
}


def usable_gib(key: str, spec: dict) -> tuple[float, str, str]:
    # gpu_specs_more.yaml states where each total comes from
    if "reported_total_note" in spec:
        return float(spec["reported_total_gib"]), "observed", spec["reported_total_note"]
    if "usable_estimate_gib" in spec:
        return float(spec["usable_estimate_gib"]), "estimate", spec["usable_estimate_note"]
    if "reported_total_gib" in spec:
        return float(spec["reported_total_gib"]), "observed", "reported_total_gib in gpu_specs.yaml"
    for field in ("reported_total_gib_seen", "reported_total_gib_seen_for_A10"):
        if field in spec:
            seen = [float(v) for v in spec[field]]
            return statistics.median(seen), "observed", f"median of {field} {seen} in gpu_specs.yaml"
    if "nvidia_smi_total_mib" in spec:
        # nvidia-smi's total includes memory the driver keeps; torch sees about 0.35 GiB less on a 4090
        # (a 4090 vLLM log shows total_gpu_memory 23.58-23.65 GiB against 24564 MiB).
        gib = spec["nvidia_smi_total_mib"] / 1024 - 0.36
        return round(gib, 2), "observed", "nvidia-smi 24564 MiB less ~0.36 GiB driver reserve"
    gib, why = USABLE_ESTIMATES[key]
    return gib, "estimate", why


def tera(value) -> float | None:
    return None if value is None else float(value) * 1e12


# GPU-to-GPU topology where the interconnect label alone misleads (capacity.model.gpus.GPU.topology): which GPUs of a
# host share NVLink. Other parts: "fully-connected" when the catalogue says nvlink, else "pcie" (no field written).
TOPOLOGY = {
    "h100-pcie": ("pairs", "NVIDIA H100 PCIe product brief: an NVLink bridge joins two cards (600 GB/s); beyond "
                           "a pair the GPUs talk over PCIe Gen5"),
    "h100-nvl": ("pairs", "NVIDIA H100 NVL product brief: two cards joined by three NVLink bridges (600 GB/s); "
                          "beyond a pair the GPUs talk over PCIe Gen5"),
    "v100-32gb": ("cube-mesh", "NVIDIA DGX-1 (V100) system architecture whitepaper: hybrid cube-mesh, each quad of "
                               "GPUs fully NVLink-connected, one link to the other quad: full NVLink up to 4 GPUs"),
    "v100-16gb": ("cube-mesh", "NVIDIA DGX-1 (V100) system architecture whitepaper: hybrid cube-mesh, each quad of "
                               "GPUs fully NVLink-connected, one link to the other quad: full NVLink up to 4 GPUs"),
}


# GeForce cards: NVIDIA's driver reports no PCIe peer access between them (cudaDeviceCanAccessPeer false), so vLLM's and
# SGLang's `CustomAllreduce` (`_can_p2p` / `gpu_p2p_access_check`) disables itself and every TP call runs NCCL
# (capacity.model.gpus.GPU.p2p). Other parts: P2P (NVLink, or PCIe P2P on datacenter and workstation boards).
_GEFORCE_P2P = ("GeForce: the driver disables PCIe peer-to-peer (cudaDeviceCanAccessPeer false): "
                "sgl-project/sglang#4814 (RTX 4090 TP 2: 'peer access is not supported between these two devices'), "
                "NVIDIA/nccl-tests#117 (RTX 4090), NVIDIA/nccl#1127 (RTX 3090 on recent drivers), NVIDIA/nccl#1637 (RTX 5090)")
NO_P2P = {name: _GEFORCE_P2P for name in ("rtx-3080", "rtx-3090", "rtx-4060-ti-16gb", "rtx-4080", "rtx-4090",
                                           "rtx-5080", "rtx-5090")}


def build(src: Path) -> dict:
    data = yaml.safe_load(src.read_text())
    data["gpus"].update(yaml.safe_load(EXTRA.read_text())["gpus"])
    for key, spec in yaml.safe_load(MORE.read_text())["gpus"].items():
        data["gpus"].setdefault(key, spec)  # the shared file wins on a name clash
    out = {}
    for name, (key, aliases) in NAMES.items():
        spec = data["gpus"][key]
        gib, basis, why = usable_gib(key, spec)
        link = spec.get("nvlink_gbs")
        pcie = spec["pcie"]["gbs"]
        out[name] = {
            "datasheet_name": key,
            "aliases": aliases,
            "arch": spec["arch"],
            "device_name": DEVICE[name][0],
            "sm_count": DEVICE[name][1],
            "nvls": DEVICE[name][2],
            "memory_bytes": int(spec["memory_gb"] * GB),  # marketing size, GB = 1e9 B
            "usable_memory_bytes": int(round(gib * GIB)),  # what mem_get_info reports
            "usable_memory_basis": basis,
            "usable_memory_note": why,
            "mem_bw_bytes_per_s": spec["hbm_bw_gbs"] * GB,
            "bf16_flops": tera(spec.get("bf16_dense_tflops")),  # dense, FLOP/s
            "fp16_flops": tera(spec.get("fp16_dense_tflops")),
            "fp8_flops": tera(spec.get("fp8_dense_tflops")),
            "fp4_flops": tera(spec.get("fp4_dense_tflops")),
            "int8_ops": tera(spec.get("int8_dense_tops")),
            # GPU-to-GPU bandwidth per direction (datasheets give the bidirectional total).
            "interconnect_bytes_per_s": (link if link else pcie) * GB / 2,
            "interconnect": "nvlink/infinity-fabric" if link else "pcie",
            **({"topology": TOPOLOGY[name][0], "topology_source": TOPOLOGY[name][1],
                **({"pcie_bytes_per_s": pcie * GB / 2} if TOPOLOGY[name][0] == "pairs" else {})}
               if name in TOPOLOGY else {}),
            **({"p2p": False, "p2p_source": NO_P2P[name]} if name in NO_P2P else {}),
            "tdp_w": spec.get("tdp_w"),
            "source": spec["source"],
            "confidence": spec["confidence"],
        }
    return {"schema_version": 1, "units": "SI: bytes, bytes/s, FLOP/s; dense (no 2:4 sparsity)", "gpus": out}


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "data" / "gpu_specs.yaml"
    dst = ROOT / "capacity" / "data" / "gpus.yaml"
    header = ("# Generated by scripts/build_gpu_catalogue.py from shared/data/gpu_specs.yaml, scripts/gpu_specs_extra.yaml "
              "and scripts/gpu_specs_more.yaml. Edit the sources, not this.\n")
    dst.write_text(header + yaml.safe_dump(build(src), sort_keys=False, width=120))
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
