"""GPU catalogue: every required part, dense (not sparse) rates, usable memory below the nominal size."""
import pytest

from capacity.errors import ConfigError
from capacity.model.gpus import catalogue, get_gpu
from capacity.units import GiB

REQUIRED = ["a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "l4", "a10g", "rtx-4090",
            "mi300x"]


def test_catalogue_has_required_gpus():
    assert set(REQUIRED) <= set(catalogue())


@pytest.mark.parametrize("name", REQUIRED)
def test_usable_memory_is_below_nominal(name):
    g = get_gpu(name)
    nominal_gib = g.memory_bytes / 1e9  # vendors' "80 GB" HBM parts are 80 GiB stacks
    assert 0.90 * nominal_gib * GiB < g.usable_memory_bytes < nominal_gib * GiB
    assert g.source.startswith("http")


def test_dense_not_sparse():
    # H100 SXM: 989.4 TFLOP/s dense BF16 (1978.9 is the 2:4-sparse headline); H100 reports ~79.2 GiB.
    h = get_gpu("H100-SXM")
    assert h.bf16_flops == pytest.approx(989.4e12) and h.fp8_flops == pytest.approx(1978.9e12)
    assert h.usable_memory_bytes / GiB == pytest.approx(79.2, abs=0.1)
    assert get_gpu("a100").fp8_flops is None
    with pytest.raises(ConfigError, match="no dense fp8 tensor rate"):
        get_gpu("a100").peak_flops("fp8")


def test_unknown_gpu():
    with pytest.raises(ConfigError, match="gpu 'h900' is not in the catalogue"):
        get_gpu("h900")


def test_user_gpu_yaml(tmp_path):
    p = tmp_path / "my-gpu.yaml"
    p.write_text("memory_bytes: 96e9\nusable_memory_bytes: 94.5e9\nmem_bw_bytes_per_s: 4.0e12\n"
                 "bf16_flops: 900e12\ninterconnect_bytes_per_s: 450e9\n")
    g = get_gpu(str(p))
    assert g.name == "my-gpu" and g.mem_bw_bytes_per_s == 4.0e12
    p.write_text("memory_bytes: -1\nusable_memory_bytes: 1\nmem_bw_bytes_per_s: 1\ninterconnect_bytes_per_s: 1\n")
    with pytest.raises(ConfigError, match="memory_bytes: Input should be greater than 0"):
        get_gpu(str(p))


# GPUs from scripts/gpu_specs_more.yaml -> the CUDA capability code parses from `arch` (None on AMD).
MORE = {"rtx-a6000": 86, "a40": 86, "l40": 89, "rtx-6000-ada": 89, "rtx-4080": 89, "rtx-4060-ti-16gb": 89,
        "rtx-3080": 86, "rtx-5090": 120, "rtx-5080": 120, "rtx-pro-6000": 120, "v100-32gb": 70, "v100-16gb": 70,
        "a800-80gb": 80, "h800": 90, "h20": 90, "gh200": 90, "h100-nvl": 90, "gb10": 121, "mi250x": None,
        "mi325x": None, "a100-pcie-80gb": 80, "l20": 89}


@pytest.mark.parametrize("name", MORE)
def test_more_gpus_arch_and_memory(name):
    from capacity.engine.vllm.layout import compute_capability

    g = get_gpu(name)
    assert compute_capability(g) == MORE[name]
    if MORE[name] is None:
        assert "cdna" in g.arch.lower() and g.device_name.startswith("AMD Instinct")
    nominal_gib = g.memory_bytes / 1e9
    assert 0.90 * nominal_gib * GiB < g.usable_memory_bytes < nominal_gib * GiB
    assert g.source.startswith("http") and g.device_name and g.sm_count
    assert g.usable_memory_note


@pytest.mark.parametrize("name", list(catalogue()))
def test_dense_bf16_not_above_fp8(name):
    g = get_gpu(name)
    if g.bf16_flops and g.fp8_flops:
        assert g.bf16_flops <= g.fp8_flops
    if g.fp8_flops and g.fp4_flops:
        assert g.fp8_flops <= g.fp4_flops


def test_more_gpus_dense_figures():
    # Dense, FP32-accumulate on GeForce: the 5090's 209.5 (419 with FP16 accumulate, 838 sparse).
    assert get_gpu("rtx-5090").bf16_flops == pytest.approx(209.5e12)
    assert get_gpu("h20").bf16_flops == pytest.approx(148e12)
    v100 = get_gpu("v100")
    assert v100.name == "v100-32gb" and v100.bf16_flops is None and v100.fp16_flops == pytest.approx(125e12)
    # no BF16 units: vLLM serves a bf16 model in fp16 there (_resolve_auto_dtype), at the FP16 rate
    assert v100.peak_flops("bf16") == v100.fp16_flops
    with pytest.raises(ConfigError, match="no dense fp8 tensor rate"):
        v100.peak_flops("fp8")
    assert get_gpu("dgx-spark").name == "gb10" and get_gpu("a100-pcie").interconnect == "pcie"


def test_catalogue_reads_as_safe_load_does():
    """catalogue() parses with libyaml's CSafeLoader where present: the bundled file must read the same as with
    PyYAML's pure-Python safe_load, value for value."""
    import yaml

    from capacity.model.gpus import CATALOGUE, GPU

    text = CATALOGUE.read_text()
    data = yaml.safe_load(text)
    assert yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == data
    assert catalogue() == {name: GPU(name=name, **spec) for name, spec in data["gpus"].items()}
