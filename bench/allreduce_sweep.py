"""All-reduce by world size and message size, measured, against capacity's all-reduce model (issue 47).

    # on a machine with >= 2 GPUs: NCCL all-reduce of bf16 messages 2 KiB-64 MiB at world sizes 2, 4, 8 (those
    # available), eager and replayed from a CUDA graph -> JSON (and the comparison, printed and written beside it)
    python bench/allreduce_sweep.py measure --out bench/results/allreduce-h100-sxm.json
    # anywhere: the measured file against the model (capacity/cost/kernels.py allreduce_call_s / allreduce_plan)
    python bench/allreduce_sweep.py report --measured bench/results/allreduce-h100-sxm.json --out /tmp/ar.json
    # a CPU rehearsal of the same code (gloo, 2 processes, seconds): checks the script, not the model
    python bench/allreduce_sweep.py measure --device cpu --world-sizes 2 --max-bytes 65536 --out /tmp/ar-cpu.json

What it settles (docs/fidelity.md, "(c') The custom all-reduce by world size"): the model's NCCL term (NCCL's own
tuning latency + the ring's bytes at the link rate x comm_bw_eff) has never been checked against a timing on the
project's GPUs, on PCIe in particular, and the (c') pull rate is supported by published tables up to 1-2 MiB only
(the 2-8 MiB gap, where vLLM's one-shot at TP 2 and its two-shot run). Each world size runs in its own group of
processes (one per GPU, torch.distributed, NCCL; gloo on a CPU), `--repeats` timings of `--iters` back-to-back
calls after a warm-up, median and spread ((p90 - p10) / median over the repeats). "graph": the same calls captured
in one CUDA graph and replayed, as vLLM and SGLang decode. "symm-one-shot"/"symm-two-shot": torch's
symmetric-memory all-reduce (torch.ops.symm_mem, P2P loads from the peers' buffers like vLLM's custom kernel:
the nearest kernel to vLLM's `cross_device_reduce_1stage`/`_2stage` that torch ships; recorded where it runs,
skipped with its reason where not, e.g. without P2P). The measured NCCL rows compare with the model's "nccl"
branch directly; the engines' rules (which kernel vLLM / SGLang / TensorRT-LLM would run for that message) are
printed beside them for reference: a custom-kernel row of the model is compared with a symm-mem row, not NCCL.

One GPU: the stage says so and exits 0 (the lent device has one GPU; the stage needs a multi-GPU machine).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KIB = 1024
SIZES = [2 * KIB * 2 ** i for i in range(16)]  # 2 KiB .. 64 MiB
GRAPH_CALLS = 10  # all-reduce calls captured in one graph; a replay's time / GRAPH_CALLS is one call



def summarise(times: list[float]) -> dict:
    """Median, p10, p90, spread ((p90 - p10) / median), min and max of per-call times."""
    med = statistics.median(times)
    p10, p90 = (float(x) for x in np.percentile(times, [10, 90]))  # linear interpolation
    return {"median_s": med, "p10_s": p10, "p90_s": p90, "spread": (p90 - p10) / med if med > 0 else 0.0,
            "min_s": min(times), "max_s": max(times), "repeats": len(times)}


def iters_for(nbytes: int, base: int) -> int:
    """Back-to-back calls per timing: `base` up to 1 MiB, fewer above (at least 5, or `base` if fewer), so a 64 MiB
    repeat stays short."""
    return max(min(5, base), min(base, base * 1024 * KIB // max(1, nbytes)))


def why_failed(exc: BaseException) -> str:
    """The exception's type and first line (200 characters), for a row that could not be measured."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _worker(rank: int, world: int, port: int, device: str, sizes: list[int], repeats: int, base_iters: int,
            graphs: bool, symm: bool, out: str) -> None:
    import torch
    import torch.distributed as dist

    cuda = device == "cuda"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": torch.device("cuda", rank)} if cuda else {}))
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    rows: list[dict] = []

    def save(got: list[dict]) -> None:
        Path(out + ".w").write_text(json.dumps(got) + "\n")
        os.replace(out + ".w", out)  # whole or not at all, should the process be killed

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(fn, iters: int) -> list[float]:
        """Per-call seconds of `iters` calls of fn, `repeats` times; ranks start together (barrier)."""
        got = []
        for _ in range(repeats):
            dist.barrier()
            sync()
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(iters):
                    fn()
                b.record()
                b.synchronize()
                got.append(a.elapsed_time(b) / 1e3 / iters)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                got.append((time.perf_counter() - t0) / iters)
        return got

    def slowest(times: list[float]) -> list[float]:
        """Each repeat's slowest rank (an all-reduce ends when the last rank has it)."""
        t = torch.tensor(times, dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    for nbytes in sizes:
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev)
        iters = iters_for(nbytes, base_iters)
        for _ in range(3):  # warm-up: NCCL's channels and buffers for this size
            dist.all_reduce(x)
        sync()
        rows.append({"world_size": world, "bytes": nbytes, "mode": "eager", "iters": iters,
                     **summarise(slowest(timed(lambda x=x: dist.all_reduce(x), iters)))})
        if graphs and cuda:
            try:
                side = torch.cuda.Stream(dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    for _ in range(3):
                        dist.all_reduce(x)
                torch.cuda.current_stream(dev).wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(GRAPH_CALLS):
                        dist.all_reduce(x)
                for _ in range(2):
                    g.replay()
                reps = max(1, iters // GRAPH_CALLS)
                per = [t / GRAPH_CALLS for t in slowest(timed(g.replay, reps))]
                rows.append({"world_size": world, "bytes": nbytes, "mode": "graph", "iters": reps * GRAPH_CALLS,
                             **summarise(per)})
                del g
            except Exception as exc:
                rows.append({"world_size": world, "bytes": nbytes, "mode": "graph",
                             "error": why_failed(exc)})
        del x
        if rank == 0:  # after every size: a hang further on (a capture one rank refused) keeps these rows
            save(rows)
    symm_state = None
    if symm and cuda:
        try:
            import torch.distributed._symmetric_memory as symm_mem

            if hasattr(symm_mem, "enable_symm_mem_for_group"):  # torch < 2.8 wants the group enabled first
                symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
            buf = symm_mem.empty(max(sizes) // 2, dtype=torch.bfloat16, device=dev)
            symm_mem.rendezvous(buf, group=dist.group.WORLD.group_name)
            symm_state = (buf, dist.group.WORLD.group_name, None)
        except Exception as exc:  # no P2P, an old torch: recorded, not fatal
            symm_state = (None, None, why_failed(exc))
    if symm_state is not None:
        buf, group, why = symm_state
        for nbytes in sizes:
            iters = iters_for(nbytes, base_iters)
            for mode, op in (("symm-one-shot", "one_shot_all_reduce"), ("symm-two-shot", "two_shot_all_reduce_")):
                if why is not None:
                    rows.append({"world_size": world, "bytes": nbytes, "mode": mode, "error": why})
                    continue
                try:
                    view = buf[: nbytes // 2]
                    fn = getattr(torch.ops.symm_mem, op)
                    for _ in range(3):
                        fn(view, "sum", group)
                    sync()
                    per = slowest(timed(lambda fn=fn, view=view, group=group: fn(view, "sum", group), iters))
                    rows.append({"world_size": world, "bytes": nbytes, "mode": mode, "iters": iters, **summarise(per)})
                except Exception as exc:
                    rows.append({"world_size": world, "bytes": nbytes, "mode": mode,
                                 "error": why_failed(exc)})
    if rank == 0:
        save(rows)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def topology() -> str:
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(nvidia-smi topo -m unavailable: {exc})"


def link_of(topo: str, world: int) -> str | None:
    """'nvlink' when every pair of the first `world` GPUs in `nvidia-smi topo -m` is an NV# link, 'pcie' when
    the matrix is there and some pair is not, None without a matrix."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # nvidia-smi underlines the labels
    rows = [ln.split() for ln in plain.splitlines() if ln.startswith("GPU")]
    cells = {r[0]: r[1:] for r in rows if len(r) > world and r[0][3:].isdigit()}
    if not all(f"GPU{i}" in cells for i in range(world)):
        return None
    pairs = [cells[f"GPU{i}"][j] for i in range(world) for j in range(world) if i != j]
    return "nvlink" if all(p.startswith("NV") for p in pairs) else "pcie"


def measure_cmd(a) -> int:
    import torch
    import torch.multiprocessing as mp

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("allreduce: no CUDA device; nothing measured (DEVICE=cpu rehearses the gloo path)")
        return 0
    n = torch.cuda.device_count() if cuda else a.cpu_procs
    worlds = [w for w in a.world_sizes if w <= n]
    if not worlds:
        print(f"allreduce: {n} GPU(s) here; the stage needs >= 2 (world sizes {a.world_sizes}): skipped, "
              "run it on a multi-GPU machine")
        return 0
    if len(worlds) < len(a.world_sizes):
        print(f"allreduce: {n} {'GPUs' if cuda else 'processes'}: world sizes {[w for w in a.world_sizes if w > n]} "
              "skipped", flush=True)
    sizes = [s for s in SIZES if a.min_bytes <= s <= a.max_bytes]
    from capacity.model.gpus import match_gpu

    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    gpu = match_gpu(name, torch.cuda.get_device_properties(0).total_memory) if cuda else None
    topo = topology() if cuda else ""
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda and hasattr(torch.cuda, "nccl") else None
    result = {"device": name, "gpu": gpu, "gpus_on_host": n, "host": socket.gethostname(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "nccl": nccl, "backend": "nccl" if cuda else "gloo", "dtype": "bfloat16",
              "topology": topo, "links": {str(w): link_of(topo, w) for w in worlds} if cuda else {},
              "repeats": a.repeats, "graph_calls": GRAPH_CALLS, "rows": []}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for w in worlds:
        t0 = time.perf_counter()
        part = out.with_suffix(f".ws{w}.tmp")
        ctx = mp.spawn(_worker, args=(w, free_port(), a.device, sizes, a.repeats, a.iters, not a.no_graphs,
                                      not a.no_symm_mem, str(part)), nprocs=w, join=False)
        try:
            while not ctx.join(timeout=2):
                if time.perf_counter() - t0 > a.ws_timeout:  # a hung collective: keep what rank 0 wrote
                    for p in ctx.processes:
                        p.kill()
                    raise TimeoutError(f"world size {w} still running after {a.ws_timeout} s: killed")
        except Exception as exc:  # one world size failing keeps the others
            result.setdefault("errors", {})[str(w)] = why_failed(exc)
            print(f"world size {w}: {result['errors'][str(w)]}", flush=True)
        if part.exists():
            try:
                result["rows"] += json.loads(part.read_text())
            except ValueError:  # rank 0 killed mid-write
                result.setdefault("errors", {})[f"{w}-rows"] = "rank 0's rows unreadable"
            part.unlink()
        print(f"world size {w}: {len(sizes)} sizes in {time.perf_counter() - t0:.1f} s", flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")  # saved after each world size
    print(f"wrote {out}")
    report = compare(result, a.gpu)
    print_table(report)
    Path(str(out).removesuffix(".json") + ".report.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


def model_rows(gpu_name: str, link: str | None, world: int, nbytes: int, hidden: int) -> dict:
    """What capacity charges for one all-reduce of `nbytes` at TP `world` (capacity/cost/roofline.py
    `_allreduce_s` passes these arguments; RooflineParams' defaults): NCCL's branch, and each engine's choice."""
    from capacity.cost.kernels import allreduce_call_s, allreduce_plan
    from capacity.cost.roofline_params import RooflineParams
    from capacity.model.gpus import get_gpu

    g = get_gpu(gpu_name)
    if link is not None:  # the measured topology overrides the catalogue's (a PCIe box of an NVLink part)
        g = g.model_copy(update={"topology": "fully-connected" if link == "nvlink" else "pcie"})
    p = RooflineParams()
    bw = g.ring_bytes_per_s(world) * p.comm_bw_eff
    amd = (g.device_name or "").startswith("AMD")
    tokens = max(1, nbytes // (2 * hidden))
    common = (world, nbytes, g.interconnect, bw, p.allreduce_latency_s)
    kw = dict(full_nvlink=g.full_nvlink(world), tokens=tokens, nvlink_ring=g.nvlink_ring(world), amd=amd)
    row = {"model_nccl_s": allreduce_call_s(*common, "vllm", p2p=False, **kw)}  # p2p False: the NCCL branch
    for eng in ("vllm", "trtllm"):  # SGLang carries vLLM's rules (kernels.py): the same numbers
        row[f"{eng}_algo"] = allreduce_plan(world, nbytes, g.interconnect, eng, g.full_nvlink(world), tokens, g.p2p)
        row[f"{eng}_s"] = allreduce_call_s(*common, eng, p2p=g.p2p, pull=False, **kw)
    row["vllm_pull_s"] = allreduce_call_s(*common, "vllm", p2p=g.p2p, pull=True, **kw)  # (c') on
    return row


def compare(result: dict, gpu_override: str | None = None, hidden: int = 8192) -> dict:
    """The measured rows beside the model's: measured / model for NCCL (eager and graph), and the custom kernels."""
    gpu = gpu_override or result.get("gpu") or "h100-sxm"
    by = {}
    for r in result["rows"]:
        if "median_s" in r:
            by[(r["world_size"], r["bytes"], r["mode"])] = r["median_s"]
    out = []
    for w, b in sorted({(r["world_size"], r["bytes"]) for r in result["rows"]}):
        m = model_rows(gpu, result.get("links", {}).get(str(w)), w, b, hidden)
        row = {"world_size": w, "bytes": b, **{k: by.get((w, b, k)) for k in
                                                 ("eager", "graph", "symm-one-shot", "symm-two-shot")}, **m}
        for k in ("eager", "graph"):
            if row[k]:
                row[f"{k}_over_model_nccl"] = row[k] / m["model_nccl_s"]
        custom = row["symm-one-shot"] if m["vllm_algo"] == "one-shot" else row["symm-two-shot"]
        if custom and m["vllm_algo"] != "nccl":
            row["symm_over_vllm"] = custom / m["vllm_s"]
            row["symm_over_vllm_pull"] = custom / m["vllm_pull_s"]
        out.append(row)

    def mape(key: str) -> float | None:
        xs = [abs(r[key] - 1) for r in out if r.get(key)]
        return 100 * sum(xs) / len(xs) if xs else None

    return {"model_gpu": gpu, "measured_device": result.get("device"), "hidden_for_tokens": hidden,
            "note": "model: capacity/cost/kernels.py allreduce_call_s with RooflineParams defaults (comm_bw_eff, "
                    "allreduce_latency_s 8 us); model_nccl_s is its NCCL branch, what the eager/graph NCCL rows "
                    "measure; vllm_s / trtllm_s are what each engine's rule charges ((c') off), vllm_pull_s with "
                    "pull=True; symm rows (torch symmetric memory) stand in for vLLM's custom kernel",
            "mape_pct": {k: mape(k) for k in ("eager_over_model_nccl", "graph_over_model_nccl", "symm_over_vllm",
                                              "symm_over_vllm_pull")},
            "rows": out}


def print_table(report: dict) -> None:
    def us(x):
        return f"{x * 1e6:9.1f}" if x else "        -"

    print(f"measured on {report['measured_device']}; model for {report['model_gpu']} (us per call)")
    print(f"{'ws':>2} {'bytes':>9} {'eager':>9} {'graph':>9} {'model':>9} {'symm1':>9} {'symm2':>9} "
          f"{'vllm':>15} {'vllm+pull':>9} {'trtllm':>15}")
    for r in report["rows"]:
        print(f"{r['world_size']:>2} {r['bytes']:>9} {us(r['eager'])} {us(r['graph'])} {us(r['model_nccl_s'])} "
              f"{us(r['symm-one-shot'])} {us(r['symm-two-shot'])} {r['vllm_algo']:>8}{us(r['vllm_s'])[2:]} "
              f"{us(r['vllm_pull_s'])} {r['trtllm_algo']:>8}{us(r['trtllm_s'])[2:]}")
    print("MAPE %: " + ", ".join(f"{k} {v:.1f}" for k, v in report["mape_pct"].items() if v is not None))


def report_cmd(a) -> int:
    path = Path(a.measured)
    try:
        result = json.loads(path.read_text())
        result["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"--measured: cannot read {path}: {exc}")
        return 1
    from capacity.errors import ConfigError

    try:
        report = compare(result, a.gpu, a.hidden)
    except (ConfigError, KeyError) as exc:
        print(f"--gpu: {a.gpu or result.get('gpu')}: {exc}")
        return 1
    print_table(report)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    m.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8])
    m.add_argument("--cpu-procs", type=int, default=2, help="processes a CPU rehearsal may start")
    m.add_argument("--min-bytes", type=int, default=SIZES[0])
    m.add_argument("--max-bytes", type=int, default=SIZES[-1])
    m.add_argument("--repeats", type=int, default=7)
    m.add_argument("--iters", type=int, default=50, help="calls per timing up to 1 MiB (fewer above)")
    m.add_argument("--ws-timeout", type=float, default=90.0, help="seconds one world size may take")
    m.add_argument("--no-graphs", action="store_true")
    m.add_argument("--no-symm-mem", action="store_true")
    m.add_argument("--gpu", default=None, help="the catalogue GPU to model in the report (default: the measured one)")
    m.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--measured", required=True)
    r.add_argument("--gpu", default=None, help="the catalogue GPU to model (default: the measured one)")
    r.add_argument("--hidden", type=int, default=8192, help="hidden size that turns bytes into tokens (TRT-LLM)")
    r.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if getattr(a, "ws_timeout", 1) <= 0:
        print(f"--ws-timeout: must be > 0, got {a.ws_timeout}")
        return 1
    for field in ("repeats", "iters", "cpu_procs"):
        if getattr(a, field, 1) < 1:
            print(f"--{field.replace('_', '-')}: must be >= 1, got {getattr(a, field)}")
            return 1
    if a.cmd == "measure" and any(w < 2 for w in a.world_sizes):
        print(f"--world-sizes: each must be >= 2, got {a.world_sizes}")
        return 1
    if a.cmd == "report" and a.hidden < 1:
        print(f"--hidden: must be >= 1, got {a.hidden}")
        return 1
    return measure_cmd(a) if a.cmd == "measure" else report_cmd(a)


if __name__ == "__main__":
    sys.exit(main())
