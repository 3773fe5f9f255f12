"""The real `capacity` entry point: JSON output equals the library's numbers; bad input is one line, exit 1."""
import json
import subprocess
import sys

import pytest

from .conftest import ROOT, run_cli


def test_help_does_not_import_torch():
    code = ("import sys; from capacity.cli import app; from typer.testing import CliRunner;"
            "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output;"
            "assert not {'torch', 'streamlit', 'plotly', 'ray', 'openpyxl'} & set(sys.modules), sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_memory_json_matches_library(card):
    from capacity.engine import memory as mem
    from capacity.engine.config import EngineConfig
    from capacity.model.gpus import get_gpu

    r = run_cli("memory", "--model", "models/llama-3.1-8b.yaml", "--gpu", "h100-sxm", "--tp", "2",
                "--kv-dtype", "fp8", "--max-model-len", "16384", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    b = mem.budget(card("llama-3.1-8b"), get_gpu("h100-sxm"),
                   EngineConfig(tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=16384))
    assert out["budget"]["num_blocks"] == b.num_blocks
    assert out["budget"]["kv_bytes_per_token"] == 32768  # 2 x 32 x (8/2) x 128 x 1 B
    assert {"activation", "non_torch"} <= set(out["budget"]["estimates"])
    assert any(not row["fits"] for row in out["batch_context_table"])


def test_memory_table_and_inverse_human_output():
    r = run_cli("memory", "-m", "llama-3.1-8b", "--max-model-len", "8192", "--target-concurrency", "64",
                "--at-context", "4096")
    assert r.returncode == 0, r.stderr
    for needle in ("weights", "activation peak", "estimate", "GPU blocks", "Batch x context",
                   "min_gpu_memory_utilization", "min_tp for 64", "max_model_len for 64"):
        assert needle in r.stdout


def test_fleet_runs_on_bundled_card():
    r = run_cli("fleet", "--model", "models/llama-3.1-8b.yaml", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["gpu"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["h100-sxm"]["tp"] == 1 and rows["l4"]["tp"] in (1, 2)
    assert all(row["gpus"] >= row["tp"] for row in rows.values() if row["tp"])


@pytest.mark.parametrize("args, needle", [
    (["--model", "models/llama-3.1-70b.yaml"], "weights need 131.4 GiB per rank, usable is 71.2 GiB"),
    (["--model", "models/llama-3.1-8b.yaml", "--tp", "3"], "not divisible by 3"),
    (["--model", "models/llama-3.1-8b.yaml", "--gpu", "h900"], "gpu 'h900' is not in the catalogue"),
    (["--model", "models/llama-3.1-8b.yaml", "--kv-dtype", "fp4"], "kv_cache_dtype"),
    (["--model", "models/llama-3.1-8b.yaml", "--weight-dtype", "fp3"], "weight_dtype"),
    (["--model", "models/llama-3.1-8b.yaml", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    (["--model", "models/llama-3.1-8b.yaml", "--max-num-seqs", "0"], "max_num_seqs"),
    (["--model", "models/llama-3.1-8b.yaml", "--max-model-len", "-5"], "max_model_len"),
    (["--model", "models/llama-3.1-8b.yaml", "--gpu", "a10g"], "largest max_model_len sure to fit"),
    (["--model", "models/llama-3.1-8b.yaml", "--activation-gib", "nan"], "--activation-gib"),
    (["--model", "nope.yaml"], "no such file or bundled card"),
    (["--model", "configs/missing.json"], "model 'configs/missing.json': no such file or bundled card"),
    (["--model", "org/missing-model-7b"], "no bundled card carries this Hugging Face id"),
    (["--model", "models/llama-3.1-8b.yaml", "--tp", "two"], "Invalid value for '--tp'"),
])
def test_bad_input_is_one_line_exit_1(args, needle):
    r = run_cli("memory", *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_bad_card_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text((ROOT / "models" / "tiny.yaml").read_text() + "num_expertz: 3\n")
    r = run_cli("memory", "--model", str(p))
    assert r.returncode == 1 and "num_expertz: unknown field" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_fleet_context_past_max_model_len():
    r = run_cli("fleet", "-m", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "200000")
    assert r.returncode == 1 and "--context 200000 exceeds max_model_len 131072" in r.stderr


def test_simulate_cli_json_and_saturation():
    import json

    r = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "4", "--requests", "400", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["saturated"] is False and out["summary"]["n_requests"] == 360  # 10% warm-up excluded
    assert out["step_cost_source"].startswith("roofline")
    assert out["littles_law"]["L"] > 0
    r = run_cli("simulate", "--model", "tiny", "--gpu", "h100", "--rate", "5000", "--requests", "200000",
                "--max-num-seqs", "4", "--input-len", "2048", "--output-len", "512")
    assert r.returncode == 0, r.stderr
    assert "saturated: replica 0's queue reached" in r.stdout


def test_simulate_cli_bad_input_is_one_line():
    for args, msg in ((["--rate", "-1"], "rate_per_s"), (["--input-len", "abc", "--rate", "1"], "--input-len 'abc'"),
                      (["--policy", "fifo", "--rate", "1"], "policy: unknown policy 'fifo': use continuous, priority, sjf, static"), ([], "--rate is required")):
        r = run_cli("simulate", "--model", "tiny", *args)
        assert r.returncode == 1 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_the_sweep_table_fits_80_columns_without_cutting_a_heading():
    """Two dotted axes used to be cut to "engine…" / "worklo…" at 80 columns: each is headed by its last field
    name, the full paths listed under the table."""
    import os

    env = dict(os.environ, COLUMNS="80", CAPACITY_CACHE_DIR="off")
    r = subprocess.run([sys.executable, "-c", "from capacity.cli import main; main()", "sweep", "-m", "llama-3.1-8b",
                        "--vary", "engine.max_num_seqs=64", "--prefill-sweep", "512,2048", "--requests", "100",
                        "--seeds", "1", "--rate", "30", "--executor", "serial"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in r.stdout
    assert "max_num_seqs = engine.max_num_seqs; input_len = workload.input_len" in r.stdout
    assert "sat. = saturated" in r.stdout  # 64 sequences of 2,048-token prompts do not keep up with 30 req/s


def test_catalogue_listings_read_as_a_newcomer_needs_them():
    """Issue 48: `gpus` showed T4's BF16 rate as 0 and `models` listed the test shapes as if servable. A part
    without BF16 units shows '-' and its FP16 rate, at which vLLM serves a bf16 model there (T4: 65 TFLOP/s,
    NVIDIA's T4 datasheet); the card names fit 80 columns; the synthetic cards are named once, below."""
    from capacity.model.gpus import get_gpu

    assert get_gpu("t4").peak_flops("bf16") == 65e12 and get_gpu("a100-80gb").peak_flops("bf16") == 312e12
    g = run_cli("gpus")
    t4 = next(line for line in g.stdout.splitlines() if "│ t4 " in line)
    assert [c.strip() for c in t4.split("│")][5] == "-", t4
    assert "t4 (FP16 65)" in g.stdout
    m = run_cli("models")
    assert m.returncode == 0
    rows = [line.split("│")[1].strip() for line in m.stdout.splitlines() if line.startswith("│")]
    assert "llama-3.2-11b-vision" in rows and "tiny" not in rows and "tiny-moe" not in rows
    assert "no checkpoint to serve: tiny-moe, tiny" in " ".join(m.stdout.split())
    import os
    import subprocess
    import sys

    narrow = subprocess.run([sys.executable, "-c", "from capacity.cli import main; main()", "models"], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, COLUMNS="80", CAPACITY_CACHE_DIR="off"))
    assert "llama-3.2-11b-vision " in narrow.stdout  # whole, not cut with "…"
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
