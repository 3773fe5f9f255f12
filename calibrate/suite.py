"""The calibration suite: op tables over grids, whole-step timings, the fit, and the profile JSON.

    python -m calibrate --model models/tiny.yaml --device cpu --out calibrate/profiles/tiny-cpu.json
(or `capacity calibrate ...`). Grids depend on the device (GPUs get larger token counts) and on --quick.
Every point is timed with `calibrate.timing.measure`; out-of-memory points are recorded as null. On a CPU
every point is measured in 3 round-robin passes and the fastest pass kept (shared hosts have slow phases). Whole-step
shapes are random mixes of prefill chunks and decodes drawn from a seeded generator; "fit" and "holdout"
shapes come from different seeds, and only "fit" shapes enter the fit of scale and overhead.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
from pathlib import Path

import numpy as np

from calibrate.grid import default_grid, random_steps
from capacity.cost.profile import SCHEMA_VERSION, Profile, model_shape, shape_fingerprint, to_plan
from capacity.errors import ConfigError
from capacity.model.card import ModelCard


def device_info(device: str) -> dict:
    import torch

    from capacity.model.gpus import match_gpu

    info = {"device": device, "torch_version": torch.__version__, "cpu_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda_version"] = torch.version.cuda
        info["gpu"] = match_gpu(info["device_name"], props.total_memory)
        try:
            import subprocess

            info["driver_version"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            info["driver_version"] = None
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        info["device_name"] = f"{name} ({os.cpu_count()} logical CPUs)"
    return info


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False)


def run_suite(card: ModelCard, device: str, out: Path | None = None, *, tp: int = 1, quick: bool = False,
              threads: int | None = None, max_context: int | None = None, seed: int = 0,
              progress: bool = True, command: str = "", passes: int | None = None,
              cuda_graphs: bool | None = None, attention: str = "auto", compile_layers: bool = False) -> Profile:
    """Measure every table for `card` on `device`, fit, validate and (optionally) write the profile.

    `cuda_graphs` (default: on for CUDA devices when the stack can be captured) times every op-table point
    and whole step as the replay of a captured CUDA graph, as serving engines run their steps; eager
    timing on a GPU is dominated by Python launch time for small steps (measured on an H200, Llama-3.1-8B,
    one decode at 1k context: 19.3 ms eager vs 7.5 ms replayed). MoE routing reads expert counts on the
    host, which capture forbids; on a GPU whose torch runs `torch._grouped_mm` (and agrees with the loop)
    the stack routes on the device and runs the experts as two grouped GEMMs, which can be captured; else
    MoE cards are timed eagerly (a point whose capture fails falls back to eager timing, and the profile
    counts those in its notes).

    `attention` (calibrate/paged.py): "paged" times one FlashAttention varlen call per layer over a paged KV
    pool, as vLLM runs attention (on a CPU, the reference kernel: a rehearsal); "sdpa" the padded SDPA
    layout; "auto" (default) paged where the device runs FlashAttention, else sdpa. `compile_layers` runs each
    layer's work around attention through torch.compile, as vLLM does (calibrate/fusion.py)."""
    import torch

    from calibrate.stack import DecoderStack, resolve_device
    from calibrate.timing import maybe_graph, measure

    device = resolve_device(device)
    if cuda_graphs and not device.startswith("cuda"):
        raise ConfigError(f"--cuda-graphs: needs a CUDA device (got --device {device})")
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads: must be >= 1 (got {threads})")
        torch.set_num_threads(threads)
    max_context = min(max_context or card.max_position_embeddings, card.max_position_embeddings)
    grid = default_grid(device, quick, max_context)
    stack = DecoderStack(card, device, tp=tp, seed=seed, max_context=max_context, attention=attention)
    paged = stack.attention == "paged"
    compile_why = None
    if compile_layers:
        from calibrate.fusion import compile_layers as _compile

        compile_why = _compile(stack)
    compiled = compile_layers and compile_why is None
    if cuda_graphs is None:  # graphs when the stack can be captured (dense, or MoE with grouped GEMMs)
        cuda_graphs = device.startswith("cuda") and stack.capturable
    s, dt, dev = stack.s, stack.dtype, device
    g = torch.Generator(device=dev).manual_seed(seed + 1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=dt)

    dense = next((x for x in stack.layers if not x.moe), None)
    moe = next((x for x in stack.layers if x.moe), None)
    # Process warm-up: thread pools, oneDNN/cuBLAS kernel selection for the first shapes.
    with torch.inference_mode():
        warm = stack.prepare([(min(64, max_context), 0)], [min(64, max_context - 1)] * 4)
        for _ in range(3):
            stack.forward(warm)
    fit_steps = random_steps(grid, grid.fit_steps, seed + 100, max_context)
    hold_steps = random_steps(grid, grid.holdout_steps, seed + 200, max_context)
    families = ["qkv", "o"] + (["elementwise"] if dense else [])
    families += ["gate_up", "down"] if dense or (moe and s.shared_intermediate) else []
    if moe:
        families += ["router", "elementwise_moe"]
    # Whole non-attention layer bodies, in context: isolated ops miss what interleaving costs (caches,
    # kernel/ISA switches); these are what the predictor sums, the per-op tables split them for display.
    families += (["layer"] if dense else []) + (["layer_moe"] if moe else [])
    mt = grid.min_time_s
    jobs: list[tuple[tuple, str, object]] = []  # (result key, description, make() -> fn to time)

    def op_inputs(n):
        x, r, a_in = rnd(n, s.hidden), rnd(n, s.hidden), rnd(n, s.q_heads * s.head_dim)
        q, k = rnd(n, s.q_heads, s.head_dim), rnd(n, s.kv_heads, s.head_dim)
        pos = torch.arange(n, device=dev) % max_context
        return x, r, a_in, q, k, stack.cos[pos].unsqueeze(1), stack.sin[pos].unsqueeze(1)

    def linear_job(f, n):
        def make():
            x, r, a_in, q, k, cos, sin = op_inputs(n)
            lay = dense or moe
            if f == "qkv":
                return lambda: lay.qkv(r)
            if f == "o":
                return lambda: lay.o(a_in)
            if f in ("gate_up", "down"):
                w = dense or moe
                width = s.intermediate if dense else s.shared_intermediate
                m_in = rnd(n, width)
                return (lambda: w.gate_up(r)) if f == "gate_up" else (lambda: w.down(m_in))
            if f in ("elementwise", "elementwise_moe"):
                target = dense if f == "elementwise" else moe
                width = s.intermediate if f == "elementwise" else s.shared_intermediate
                gu = rnd(n, 2 * width) if width else None
                return lambda: target.elementwise(x, q, k, cos, sin, gu)
            if f == "router":
                return (lambda: moe.route_on_device(r)) if stack.moe_impl == "grouped" else (lambda: moe.route(r))
            if f in ("layer", "layer_moe"):
                target = dense if f == "layer" else moe

                def body():
                    target.pre(x, cos, sin)
                    return target.post(x, a_in)
                return body
            if f == "embed":
                ids = torch.randint(0, s.vocab, (n,), generator=g, device=dev)
                return lambda: stack.embed(ids)
            if f == "lm_head":
                rows = torch.arange(n, device=dev)
                return lambda: stack.lm_head(x, rows)
            if f == "expert":
                tok, w, outb = torch.arange(n, device=dev), rnd(n), torch.zeros(n, s.hidden, device=dev, dtype=dt)
                return lambda: moe.expert(0, r, tok, w, outb)
            raise AssertionError(f)
        return make

    for i, n in enumerate(grid.tokens):
        for f in families + ["embed", "lm_head"] + (["expert"] if moe else []):
            jobs.append(((f, i), f"{f} n={n}", linear_job(f, n)))

    def prefill_job(c, k_):
        def make():
            qp, kn, vn = rnd(c, s.q_heads, s.head_dim), rnd(c, s.kv_heads, s.head_dim), rnd(c, s.kv_heads, s.head_dim)
            if paged:
                st = stack.paged_step([(c, k_)], g)
                return lambda: stack.attention_paged(qp, kn, vn, st)
            kv = rnd(2, s.kv_heads, k_ + c, s.head_dim)
            return lambda: stack.attention_prefill(qp, kn, vn, kv, k_)
        return make

    def decode_job(b, ctx):
        def make():
            qd, kn, vn = rnd(b, s.q_heads, s.head_dim), rnd(b, s.kv_heads, s.head_dim), rnd(b, s.kv_heads, s.head_dim)
            if paged:
                st = stack.paged_step([(1, ctx)] * b, g)
                return lambda: stack.attention_paged(qd, kn, vn, st)
            kv = rnd(2, b, s.kv_heads, ctx + 1, s.head_dim)
            posd = torch.full((b,), ctx, device=dev)
            mask = torch.ones(b, 1, 1, ctx + 1, dtype=torch.bool, device=dev)
            return lambda: stack.attention_decode(qd, kn, vn, kv, posd, mask)
        return make

    for i, c in enumerate(grid.prefill_chunk):
        for j, k_ in enumerate(grid.prefill_cached):
            if c + k_ <= max_context:
                jobs.append((("prefill", i, j), f"prefill c={c} k={k_}", prefill_job(c, k_)))
    for i, b in enumerate(grid.decode_batch):
        for j, ctx in enumerate(grid.decode_context):
            if grid.max_kv_tokens is not None and b * (ctx + 1) > grid.max_kv_tokens:
                continue  # left null: filled from measured neighbours by KV bytes read
            jobs.append((("decode", i, j), f"decode b={b} ctx={ctx}", decode_job(b, ctx)))

    def step_job(pf, dc, i):
        def make():
            st = stack.prepare(pf, dc, gen_seed=seed + i)
            return lambda: stack.forward(st)
        return make

    shapes = [("fit", sh) for sh in fit_steps] + [("holdout", sh) for sh in hold_steps]
    for i, (role, (pf, dc)) in enumerate(shapes):
        jobs.append((("step", i), f"{role} step {i + 1}", step_job(pf, dc, i)))

    # Passes: every job once per pass, round-robin; keep the fastest pass's median. This host (a shared VM)
    # has slow phases lasting seconds in which everything runs up to 2x slower (measured: the same step,
    # same inputs, 2.4 ms or 4.6 ms depending on when); the fastest of 3 passes is the machine's own speed,
    # and tables and whole steps use the same estimator, so they stay comparable. GPUs: one pass, median.
    passes = passes or (1 if dev.startswith("cuda") or quick else 3)
    results: dict[tuple, list[float]] = {}
    spreads: dict[tuple, list[float]] = {}
    done: dict[tuple, int] = {}  # passes completed per job (a point that ran out of memory is done too)
    # Resume: an interrupted run leaves `<out>.partial.json`; a rerun with the same model, device, grid and
    # settings continues from it and measures only what is missing. Written atomically after each point.
    import hashlib

    ident = json.dumps({"shape": model_shape(card), "device": dev, "tp": tp, "quick": quick, "seed": seed,
                        "cuda_graphs": cuda_graphs, "attention": [stack.attention, stack.attn_kernel, stack.page],
                        "compiled": compiled, "fp8_blocks": stack.block_kernel, "passes": passes,
                        "threads": torch.get_num_threads(), "grid": grid.__dict__, "max_context": max_context},
                       sort_keys=True, default=str)
    ident = hashlib.sha256(ident.encode()).hexdigest()[:16]
    partial = Path(str(out) + ".partial.json") if out is not None else None
    if partial is not None and partial.is_file():
        try:
            saved = json.loads(partial.read_text())
        except json.JSONDecodeError:
            saved = {}
        if saved.get("ident") == ident:
            for k, v in saved["results"].items():
                results[tuple(json.loads(k))] = v
            for k, v in saved["spreads"].items():
                spreads[tuple(json.loads(k))] = v
            for k, v in saved["done"].items():
                done[tuple(json.loads(k))] = v

    def checkpoint() -> None:
        if partial is None:
            return
        from capacity.files import write_atomic

        write_atomic(partial, json.dumps({"ident": ident, "results": {json.dumps(k): v for k, v in results.items()},
                                          "spreads": {json.dumps(k): v for k, v in spreads.items()},
                                          "done": {json.dumps(k): v for k, v in done.items()}}), "--out")

    from contextlib import nullcontext

    eager_fallbacks = 0
    bar = _progress() if progress else None
    with bar or nullcontext(), torch.inference_mode():
        task = bar.add_task("calibrating", total=len(jobs) * passes) if bar else None
        order_rng = np.random.default_rng(seed + 300)
        for p_ in range(passes):
            # A fresh random order each pass: slow drift of the host's speed (measured: held-out steps timed
            # after the fit steps came out 12% slower) must not line up with one table or one step set.
            for idx in order_rng.permutation(len(jobs)):
                key, desc, make = jobs[idx]
                if done.get(key, 0) > p_:  # measured before an interruption
                    if bar:
                        bar.update(task, advance=1)
                    continue
                try:
                    fn, fell_back = maybe_graph(make(), dev, cuda_graphs)
                    eager_fallbacks += fell_back
                    t = measure(fn, dev, min_time_s=(3 * mt if key[0] == "step" else mt))
                    del fn
                except (RuntimeError, MemoryError) as exc:
                    t = _oom_or_raise(exc, dev)
                if t is not None:
                    results.setdefault(key, []).append(t.median_s)
                    spreads.setdefault(key, []).append(t.spread)
                done[key] = done.get(key, 0) + 1
                checkpoint()
                if bar:
                    bar.update(task, advance=1, description=f"{desc} ({p_ + 1}/{passes})")

    def val(key):
        v = results.get(key)
        return float(min(v)) if v else None

    linear = {f: [val((f, i)) for i in range(len(grid.tokens))] for f in families}
    embed = [val(("embed", i)) for i in range(len(grid.tokens))]
    lm = [val(("lm_head", i)) for i in range(len(grid.tokens))]
    expert = [val(("expert", i)) for i in range(len(grid.tokens))] if moe else []
    prefill = [[val(("prefill", i, j)) for j in range(len(grid.prefill_cached))] for i in range(len(grid.prefill_chunk))]
    decode = [[val(("decode", i, j)) for j in range(len(grid.decode_context))] for i in range(len(grid.decode_batch))]
    steps = []
    for i, (role, (pf, dc)) in enumerate(shapes):
        v = val(("step", i))
        if v is not None:
            steps.append({"prefills": pf, "decodes": dc, "measured_s": v,
                          "spread": round(float(np.median(spreads[("step", i)])), 4), "role": role})

    info = device_info(dev)
    notes = []
    if stack.gemm == "fp8":
        scales = {None: "torch._scaled_mm, per-tensor scales",
                  "scaled_mm": "scaled_mm with 128 x 128 weight blocks and 1 x 128 activation groups",
                  "reference": f"128 x 128 weight blocks and 1 x 128 activation groups through the reference matmul "
                               f"(no block-scaled kernel on {dev}: a rehearsal)"}[stack.block_kernel]
        notes.append(f"FP8 GEMMs ({scales}, activations quantised on the fly) for the dense projections"
                     + ("; routed experts in " + card.dtype if card.moe else ""))
        if card.quant_group_size and stack.block_kernel is None:
            notes.append(f"the card's FP8 blocks ran with per-tensor scales: no block-scaled kernel in torch on {dev}")
    elif card.weight_format != card.dtype:
        notes.append(f"weights stored as {card.weight_format} in the card were run in {card.dtype}: quantised "
                     "GEMM kernels are not benchmarked")
    if stack.distinct_layers < card.num_layers:
        notes.append(f"{stack.distinct_layers} distinct layers' weights cycled over {card.num_layers} layers (memory)")
    if cuda_graphs:
        notes.append("CUDA graphs: every point timed as a graph replay (no Python launch time)"
                     + (f"; {eager_fallbacks} points could not be captured and were timed eagerly"
                        if eager_fallbacks else ""))
    elif dev.startswith("cuda"):
        notes.append("eager mode (no CUDA graphs): small steps include Python launch time"
                     + ("; MoE routing synchronises with the host, which graph capture forbids"
                        if card.moe and not stack.capturable else ""))
    if paged:
        notes.append(f"attention: one call per layer over a paged KV pool ({stack.page}-token pages, scattered), "
                     + ("FlashAttention varlen with a block table (torch.nn.attention.varlen.varlen_attn), as "
                        "vLLM's FLASH_ATTN backend" if stack.attn_kernel == "flash" else
                        f"the reference kernel (pages gathered, SDPA per sequence): {dev} has no paged attention "
                        "kernel in torch; a rehearsal of the GPU path, not a measure of any kernel"))
    else:
        notes.append("attention: SDPA; decodes padded to the longest context with a mask, each prefill chunk alone"
                     " (no paged kernel)")
    if compiled:
        notes.append("torch.compile: each layer's work around attention (norm, qkv, RoPE; o, residual, norm, MLP) "
                     "compiled by Inductor with a dynamic token count, elementwise ops fused, as vLLM compiles")
    elif compile_layers:
        notes.append(f"--compile asked for, but {compile_why}")
    if card.moe is not None:
        notes.append(f"MoE experts: {'two grouped GEMMs (torch._grouped_mm), routing on the device' if stack.moe_impl == 'grouped' else 'a per-expert loop (expert counts read on the host)'}")
    shape = model_shape(card)
    data = {
        "schema_version": SCHEMA_VERSION,
        "provenance": {**info, "dtype": card.dtype, "gemm_dtype": stack.gemm,
                       "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                       "host": socket.gethostname(), "command": command or " ".join(sys.argv), "quick": quick,
                       "cuda_graphs": cuda_graphs, "attention_kernel": stack.attn_kernel,
                       "compiled": compiled,
                       "notes": notes},
        "model": {"name": card.name, "shape": shape, "fingerprint": shape_fingerprint(shape)},
        "tp": tp, "decode_layout": "paged" if paged else "padded", "prefill_layout": "per_sequence",
        "tokens": grid.tokens, "linear": linear, "embed": embed, "lm_head": lm,
        "expert_tokens": grid.tokens if moe else [], "expert": expert,
        "prefill_chunk": grid.prefill_chunk, "prefill_cached": grid.prefill_cached, "prefill_attn": prefill,
        "decode_batch": grid.decode_batch, "decode_context": grid.decode_context, "decode_attn": decode,
        "steps": steps,
    }
    profile = Profile.model_validate(data)
    profile = fit_profile(profile, card)
    if out is not None:
        write_profile(profile, out)
        if partial is not None:
            partial.unlink(missing_ok=True)
    return profile


def _oom_or_raise(exc: BaseException, dev: str):
    from calibrate.timing import is_oom

    if isinstance(exc, MemoryError) or is_oom(exc):
        if dev.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        return None
    raise exc


def measure_step(stack, prefills, decodes, device: str, min_time_s: float = 0.03, seed: int = 0):
    """Time one whole step of the real stack (inputs prepared outside the timed region)."""
    import torch

    from calibrate.timing import measure

    try:
        st = stack.prepare(prefills, decodes, gen_seed=seed)
    except (RuntimeError, MemoryError) as exc:
        return _oom_or_raise(exc, device)
    with torch.inference_mode():
        return measure(lambda: stack.forward(st), device, min_time_s=min_time_s, min_repeats=5)


def fit_profile(profile: Profile, card: ModelCard) -> Profile:
    """Fit per-component scales and the per-step overhead on the profile's "fit" steps only.

    Robust least squares on relative residuals (a few noisy steps on a shared machine must not drag the fit);
    scales are bounded to [0.25, 4]: outside that the op tables do not describe the stack and the accuracy
    benchmark should say so rather than the fit hiding it. Components a card never exercises keep scale 1."""
    from scipy.optimize import least_squares

    from capacity.cost.calibrated import CalibratedCost
    from capacity.cost.profile import FIT_COMPONENTS

    fit_steps = [st for st in profile.steps if st.role == "fit"]
    if len(fit_steps) < len(FIT_COMPONENTS) + 1:
        raise ConfigError(f"only {len(fit_steps)} whole steps could be measured; the fit needs at least "
                          f"{len(FIT_COMPONENTS) + 1}")
    raw = CalibratedCost(profile.model_copy(update={"fit": None}), card, tp=profile.tp, use_fit=False)
    comps = [raw.components(to_plan(st.prefills, st.decodes)) for st in fit_steps]
    X = np.array([[c[k] for k in FIT_COMPONENTS] for c in comps])
    fixed = np.array([c["communication"] for c in comps])
    meas = np.array([st.measured_s for st in fit_steps])
    used = X.max(axis=0) > 0
    k = int(used.sum())

    def model(p):
        scales = np.ones(len(FIT_COMPONENTS))
        scales[used] = p[:k]
        return X @ scales + fixed + p[k]

    res = least_squares(lambda p: (model(p) - meas) / meas, x0=[1.0] * k + [float(meas.min()) * 0.1],
                        bounds=([0.25] * k + [0.0], [4.0] * k + [np.inf]), loss="soft_l1", f_scale=0.05)
    err = np.abs(model(res.x) - meas) / meas
    scales = dict(zip([c for c, u in zip(FIT_COMPONENTS, used) if u], (float(v) for v in res.x[:k])))
    fit = {"scales": scales, "overhead_s": float(res.x[k]), "median_abs_rel_err": float(np.median(err)),
           "n_fit": len(fit_steps)}
    return Profile.model_validate({**profile.model_dump(), "fit": fit})


def write_profile(profile: Profile, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from capacity.files import write_atomic

    write_atomic(out, json.dumps(profile.model_dump(mode="json"), indent=1) + "\n", "--out")
