"""bench/allreduce_sweep.py and bench/eager_step.py, the device run's stages 6 and 7, on their CPU paths: gloo over
2 processes for the all-reduce, the tiny card for the eager layer. The numbers the model columns pin are worked by
hand from NCCL's tuning constants and the GPU catalogue; the measured columns are only checked for shape."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from bench import allreduce_sweep, eager_step  # noqa: E402

TOPO = ("\t\x1b[4mGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "\x1b[4mGPU0\x1b[0m\t X \tNV18\tSYS\t0-47\t0\t\tN/A\n"
        "\x1b[4mGPU1\x1b[0m\tNV18\t X \tPHB\t0-47\t0\t\tN/A\n"
        "\x1b[4mGPU2\x1b[0m\tSYS\tPHB\t X \t0-47\t0\t\tN/A\n")


def test_topology_matrix_read_as_nvlink_or_pcie():
    assert allreduce_sweep.link_of(TOPO, 2) == "nvlink"  # GPU0-GPU1: NV18 both ways
    assert allreduce_sweep.link_of(TOPO, 3) == "pcie"  # GPU2 reaches the others over SYS / PHB
    assert allreduce_sweep.link_of(TOPO, 4) is None  # no GPU3 in the matrix
    assert allreduce_sweep.link_of("", 2) is None


def test_sizes_and_iterations():
    assert allreduce_sweep.SIZES[0] == 2048 and allreduce_sweep.SIZES[-1] == 64 * 1024 * 1024
    assert len(allreduce_sweep.SIZES) == 16  # 2 KiB .. 64 MiB, powers of 2
    assert allreduce_sweep.iters_for(2048, 50) == 50
    assert allreduce_sweep.iters_for(4 * 1024 * 1024, 50) == 12  # 50 x 1 MiB / 4 MiB
    assert allreduce_sweep.iters_for(64 * 1024 * 1024, 50) == 5  # the floor
    assert allreduce_sweep.iters_for(64 * 1024 * 1024, 3) == 3  # never above what was asked


def test_model_columns_by_hand():
    # H100 SXM at TP 2, 2 KiB, NCCL: 6.6 us + 2 hops x 0.6 us (NVLink) + 2 x 1/2 x 2048 B / (450 GB/s x 0.7)
    m = allreduce_sweep.model_rows("h100-sxm", None, 2, 2048, 8192)
    assert m["model_nccl_s"] == pytest.approx(7.8e-6 + 2048 / 315e9, rel=1e-9)
    # vLLM's custom kernel, one-shot at TP 2: 8 us + 1 x 2048 / 315 GB/s; (c') pulls at 1 MiB / 17.1 us instead
    assert m["vllm_algo"] == "one-shot"
    assert m["vllm_s"] == pytest.approx(8e-6 + 2048 / 315e9, rel=1e-9)
    assert m["vllm_pull_s"] == pytest.approx(8e-6 + 2048 * 17.1e-6 / 1048576, rel=1e-9)
    # TP 8 at 8 MiB: over CustomAllreduce's 8 MiB max_size -> NCCL for vLLM; over TRT-LLM's 8 MB workspace too
    m = allreduce_sweep.model_rows("h100-sxm", None, 8, 8 * 1024 * 1024, 8192)
    assert m["vllm_algo"] == "nccl" and m["trtllm_algo"] == "nccl"
    assert m["vllm_s"] == pytest.approx(m["model_nccl_s"])
    # the measured topology overrides the catalogue: H100 PCIe cards measured without a bridge, TP 2 -> PCIe ring
    # at 64 GB/s x 0.7 and 1 us hops; vLLM's custom kernel still runs at 2 GPUs (no full NVLink needed at TP 2)
    m = allreduce_sweep.model_rows("h100-pcie", "pcie", 2, 1048576, 8192)
    assert m["model_nccl_s"] == pytest.approx(6.6e-6 + 2e-6 + 1048576 / 44.8e9, rel=1e-9)
    assert m["vllm_algo"] == "one-shot"


@pytest.mark.slow  # over 5 s (two processes each import torch): in CI's slow group
def test_allreduce_sweep_cpu_rehearsal(tmp_path, capsys):
    out = tmp_path / "ar.json"
    rc = allreduce_sweep.main(["measure", "--device", "cpu", "--world-sizes", "2", "4", "--max-bytes", "8192",
                               "--repeats", "2", "--iters", "3", "--gpu", "h100-sxm", "--out", str(out)])
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["backend"] == "gloo" and got["device"] == "cpu"
    rows = got["rows"]
    assert [(r["world_size"], r["bytes"], r["mode"]) for r in rows] == [(2, b, "eager") for b in (2048, 4096, 8192)]
    assert all(r["median_s"] > 0 and r["repeats"] == 2 and r["iters"] == 3 for r in rows)
    assert "world sizes [4] skipped" in capsys.readouterr().out  # 2 processes allowed by default
    report = json.loads((tmp_path / "ar.report.json").read_text())
    assert report["model_gpu"] == "h100-sxm" and len(report["rows"]) == 3
    assert report["rows"][0]["model_nccl_s"] == pytest.approx(7.8e-6 + 2048 / 315e9, rel=1e-9)
    assert report["rows"][0]["graph"] is None  # no graphs on a CPU
    # the report command on the same file
    assert allreduce_sweep.main(["report", "--measured", str(out), "--gpu", "h100-sxm"]) == 0


def test_allreduce_sweep_world_size_killed_after_its_limit(tmp_path):
    # a world size that outlives --ws-timeout (here: the processes are still importing torch) is killed and
    # recorded; the run still ends 0 with its (empty) file and report
    out = tmp_path / "ar.json"
    assert allreduce_sweep.main(["measure", "--device", "cpu", "--world-sizes", "2", "--max-bytes", "2048",
                                 "--ws-timeout", "0.01", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["rows"] == [] and got["errors"]["2"].startswith("TimeoutError: world size 2 still running")


def test_allreduce_sweep_one_gpu_or_none_skips(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert allreduce_sweep.main(["measure", "--out", "/nonexistent/x.json"]) == 0
    assert "needs >= 2" in capsys.readouterr().out


@pytest.mark.parametrize("argv, field", [
    (["measure", "--device", "cpu", "--repeats", "0", "--out", "x"], "--repeats"),
    (["measure", "--device", "cpu", "--world-sizes", "1", "--out", "x"], "--world-sizes"),
    (["measure", "--device", "cpu", "--ws-timeout", "0", "--out", "x"], "--ws-timeout"),
    (["report", "--measured", "/nonexistent.json"], "--measured"),
    (["report", "--measured", "/nonexistent.json", "--hidden", "0"], "--hidden"),
])
def test_allreduce_bad_input_one_line(argv, field, capsys):
    assert allreduce_sweep.main(argv) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith(field) and "\n" not in out


def test_eager_step_cpu_rehearsal(tmp_path):
    out = tmp_path / "e.json"
    assert eager_step.main(["--device", "cpu", "--model", "tiny", "--quick", "--calls", "200",
                            "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["dispatch"]) == {"view", "reshape", "slice", "split", "unbind", "empty", "module_call",
                                    "launch_add_"}
    assert all(v["median_s"] > 0 for v in got["dispatch"].values())
    lay, cap = got["layer"], got["capacity"]
    assert lay["layers_timed"] == [1, 2] and lay["attention"] == "sdpa" and "graph_1" not in lay
    # what capacity charges now for a Llama-shaped layer at tp 1 (docs/fidelity.md "One eager step"): 10 calls x
    # (42 x 14.37 us - 12 x 5 us) / 42 + 25 x 5 us; the tiny card has Llama's kernel count
    op = 19.308e-3 / (32 * 42)
    assert cap["layer_eager_s_now"] == pytest.approx(10 * (42 * op - 12 * 5e-6) / 42 + 25 * 5e-6, rel=1e-9)
    assert cap["layer_eager_s_now"] == pytest.approx(254.4e-6, abs=0.1e-6)
    assert cap["view_range_s"] == [0.0, 5e-6]


def test_eager_step_bad_input(capsys):
    assert eager_step.main(["--device", "cpu", "--layers", "1", "--out", "x"]) == 1
    assert capsys.readouterr().out.strip() == "--layers: must be >= 2, got 1"
    assert eager_step.main(["--device", "cpu", "--model", "no-such-model", "--out", "x"]) == 1
    assert capsys.readouterr().out.startswith("--model/--device:")
