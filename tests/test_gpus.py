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
