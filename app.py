"""What-if dashboard: `streamlit run app.py`.

Thin on purpose: widgets -> a scenario -> the same functions the CLI uses (memory.budget, run_task /
run_scenario, make_plan, plan.autoscale.autoscale_report, export.write_review), cached by their inputs -> plotly figures. No formulas here.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from capacity.errors import CapacityError
from capacity.io.controls import Control, engine_controls
from capacity.io.dashboard import SharedStore, ab_rows, legend_below, load_levels, saturated_label

ROOT = Path(__file__).resolve().parent
MAX_UPLOAD_BYTES = 1_000_000  # a card or config.json is a few KB
st.set_page_config(page_title="capacity: LLM serving what-if", layout="wide")


# ---- cached computations (inputs are plain data, so the cache keys are exact) -------------------------
@st.cache_data(show_spinner=False)
def load_card(source: str, text: str | None):
    from capacity.files import validate
    from capacity.model.card import ModelCard, from_hf_config, load_named_card

    if text is None:  # a bundled card's name, a path or a Hugging Face id (a checkpoint's id: its format)
        return load_named_card(source).model_dump()
    if len(text) > MAX_UPLOAD_BYTES:
        raise CapacityError(f"{source}: {len(text):,} bytes is more than the {MAX_UPLOAD_BYTES:,} a model card may be")
    from capacity.files import parse_text

    data = parse_text(text, source)  # aliases refused, depth and size bounded, as for a file
    if not isinstance(data, dict):
        raise CapacityError(f"{source}: expected a mapping of model-card fields")
    if "model_type" in data or "architectures" in data:
        return from_hf_config(data, name=Path(source).stem or "uploaded").model_dump()
    return validate(ModelCard, data, source).model_dump()


@st.cache_data(show_spinner=False)
def memory_budget(card: dict, gpu: str, engine: dict):
    from capacity.engine.config import EngineConfig
    from capacity.engine.memory import batch_context_table, budget, default_batches, default_contexts
    from capacity.files import validate
    from capacity.model.card import ModelCard
    from capacity.model.gpus import get_gpu

    b = budget(ModelCard.model_validate(card), get_gpu(gpu), validate(EngineConfig, engine, "engine"))
    return b.as_dict(), batch_context_table(b, default_batches(b.max_num_seqs), default_contexts(b.max_model_len))


@st.cache_data(show_spinner=False)
def simulate(card: dict, gpu: str, engine: dict, workload: dict, seed: int, profile: str | None):
    """One simulation with timelines (for the latency and timeline views), through the run pipeline."""
    from capacity.engine.config import EngineConfig
    from capacity.files import validate
    from capacity.model.card import ModelCard
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, RunOptions, run
    from capacity.workload import WorkloadSpec

    dep = Deployment(ModelCard.model_validate(card), get_gpu(gpu), validate(EngineConfig, engine, "engine"),
                     profile=profile)
    res = run(dep, WorkloadSpec.model_validate(workload), RunOptions(seed=seed, capacity_check=True))
    r = res.sim.records
    return {"summary": res.summary.as_dict(), "ttft": (r.first_token - r.arrival).tolist(),
            "e2e": (r.finish - r.arrival).tolist(),
            "tpot": np.where(r.output_tokens > 1, (r.finish - r.first_token) / np.maximum(r.output_tokens - 1, 1),
                             np.nan).tolist(),
            "timeseries": res.sim.timeseries.tolist(), "saturated": res.sim.saturated, "saturation": res.sim.saturation,
            "source": res.cost_source, "num_blocks": res.budget.planning_blocks, "notes": res.notes,
            "capacity": None if res.capacity is None else res.capacity.as_dict(res.offered_rate_per_s),
            # the run in `capacity compare`'s terms (an A/B of two configurations with the same seed pairs requests)
            "sent": r.arrival.tolist(), "first_token": r.first_token.tolist(), "finish": r.finish.tolist(),
            "output_tokens": r.output_tokens.tolist()}


@st.cache_data(show_spinner=False)
def sim_points(card: dict, gpu: str, engines: list[dict], workloads: list[dict], profile: str | None):
    from capacity.plan.tasks import SimTask, run_task

    return [run_task(SimTask(card, gpu, e, w, 0, profile=profile)) for e, w in zip(engines, workloads)]


@st.cache_resource(show_spinner=False)
def plan_store():
    """Finished plans (plain data) shared by every session of this process: see capacity.io.dashboard.SharedStore."""
    return SharedStore(max_entries=32)


def full_plan(scenario: dict, card: dict, progress=None) -> dict:
    """The plan as `capacity plan --json` writes it. Not st.cache_data: `progress` draws into a bar of the calling
    run, and a cached call would replay that bar into a block of another run (CacheReplayClosureError on every
    cache hit). A plan found in plan_store() is returned as it is; else it is computed here, uncached, and kept."""
    store = plan_store()
    key = store.key(scenario, card)
    found = store.get(key)
    if found is not None:
        return found
    from capacity.files import strict_json
    from capacity.model.card import ModelCard
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Scenario, make_plan

    ex = SerialExecutor(cache=True)
    ex.on_task = None if progress is None else (lambda n: progress(n, ex.phases))
    p = strict_json(make_plan(Scenario.model_validate(scenario), ModelCard.model_validate(card), ex).as_dict())
    store.put(key, p)
    return p


# ---- inputs --------------------------------------------------------------------------------------------
@st.cache_data(show_spinner=False)
def matching_profiles(model: str, gpu: str) -> list[str]:
    """Names of the bundled profiles measured for this model on this GPU (others would be refused)."""
    from capacity.cost.profile import bundled_profiles

    return [name for name, _, _ in bundled_profiles(model, gpu)]


def control(where, c: Control, **kw):
    """One engine setting's widget, as its declaration (capacity/io/controls.py) describes it; its value."""
    kw.setdefault("help", c.help)
    if c.kind == "select_slider":
        return where.select_slider(c.label, list(c.options or ()), value=c.value, **kw)
    if c.kind == "slider":
        return where.slider(c.label, c.min, c.max, c.value, c.step, **kw)
    if c.kind == "checkbox":
        return where.checkbox(c.label, value=bool(c.value), **kw)
    if c.kind == "radio":
        return where.radio(c.label, list(c.options or ()), index=list(c.options or ()).index(c.value), **kw)
    if c.kind == "selectbox":
        choices = kw.pop("options", None) or c.choices()
        return c.to_value(where.selectbox(c.label, choices, **kw))
    if c.kind == "number":
        return where.number_input(c.label, c.min, c.max, value=c.value, step=c.step, **kw)
    return where.text_input(c.label, value=c.value or "", **kw) or None


def sidebar():
    from capacity.model.gpus import catalogue

    sb = st.sidebar
    sb.header("Model")
    cards = sorted(p.stem for p in (ROOT / "models").glob("*.yaml"))
    name = sb.selectbox("Bundled model card", cards, index=cards.index("llama-3.1-8b"))
    upload = sb.file_uploader("...or upload a card YAML / HF config.json", type=["yaml", "yml", "json"])
    pasted = sb.text_area("...or paste a card YAML", value="", height=80, key="pasted_card")
    if upload is not None:
        card = load_card(upload.name, upload.getvalue().decode("utf-8", errors="replace"))
        origin = f"uploaded {upload.name}"
    elif pasted.strip():
        card = load_card("pasted card", pasted)
        origin = "pasted card"
    else:
        card = load_card(name, None)
        origin = "bundled card"
    sb.success(f"Active model: {card.get('name')} ({origin})")
    sb.header("Hardware and engine")
    gpus = list(catalogue())
    gpu = sb.selectbox("GPU", gpus, index=gpus.index("h100-sxm"))
    ctl = engine_controls()  # labels, help, offered values and bounds: EngineConfig's declarations
    tp = control(sb, ctl["tensor_parallel_size"])
    weight = sb.selectbox("Weight dtype", ["as card", "bf16", "fp8", "int4"])
    if weight != "as card":
        card = {**card, "weight_dtype": weight, "quant_group_size": 128 if weight == "int4" else None}
    compute = sb.selectbox("GEMM compute dtype", ["auto", "bf16", "fp8"],
                           help="auto: what engines run for the weight format on this GPU (FP8 weights: FP8 GEMMs "
                           "where the GPU has FP8 tensor cores); bf16: weight-only kernels (W8A16, W4A16)")
    if compute != "auto":
        card = {**card, "gemm_dtype": compute}
    kv = control(sb, ctl["kv_cache_dtype"])
    seqs = control(sb, ctl["max_num_seqs"], key="seqs")
    max_len = control(sb, ctl["max_model_len"], key="max_len")
    mnbt = control(sb, ctl["max_num_batched_tokens"])
    from capacity.engine.vllm.release import LAST_PATCH

    releases = ["vllm"] + [f"vllm@{a}.{b}" for (a, b) in sorted(LAST_PATCH, reverse=True) if (a, b) >= (0, 10)]
    release = control(sb, ctl["engine"], options=[*releases, "sglang", "trtllm"])
    vllm_engine = release.startswith("vllm")
    # SGLang and TensorRT-LLM size their pools by their own fractions (of free memory) and pick their own page
    # sizes: the engine model refuses a vLLM utilisation, so these two are vLLM's only
    util = control(sb, ctl["gpu_memory_utilization"], disabled=not vllm_engine,
                   **({} if vllm_engine else {"help": f"{release} sizes its KV pool by its own rule (capacity memory "
                                                      f"--engine {release})"}))
    block = control(sb, ctl["block_size"], disabled=not vllm_engine,
                    **({} if vllm_engine else {"help": f"{release}'s own page size"}))
    chunked = control(sb, ctl["enable_chunked_prefill"])
    kv_end = control(sb, ctl["kv_estimate"], horizontal=True)
    what_if: dict = {}
    with sb.expander("Engine what-ifs (as simulate/plan flags)"):
        # the what-ifs the declarations give a dashboard control, and any other declared with one (`ui`)
        for c in [ctl[k] for k in WHAT_IFS] + [c for c in ctl.values() if c.placed and c.field not in PLACED]:
            v = control(st, c)
            if v is not None:
                what_if[c.field] = float(v) if c.kind == "number" and isinstance(v, int | float) else v
    sb.header("Workload and SLOs")
    rate = sb.slider("arrival rate (req/s)", 0.5, 64.0, 8.0, 0.5, key="rate")
    arrival = sb.selectbox("arrival process", ["poisson", "gamma", "constant"])
    cv = sb.slider("burstiness (gamma CV)", 0.5, 4.0, 2.0, 0.1) if arrival == "gamma" else 1.0
    inp = sb.number_input("input tokens (mean)", 16, 131072, 1024, 64)
    out = sb.number_input("output tokens (mean)", 1, 32768, 256, 16)
    lengths = sb.selectbox("length distribution", ["fixed", "lognormal"])
    requests = sb.select_slider("requests simulated", [300, 1000, 2000, 5000], value=1000)
    images = None
    if card.get("vision"):  # a vision-language card: the images its requests carry (docs/vision_datasets.md)
        from capacity.vision_datasets import NAMES

        shown = sb.selectbox("images per request", ["none", "one image", *NAMES],
                             help="none: text only; one image of the size below in every request; or a benchmark "
                             "dataset's images (real-image datasets: the end of their size bracket that gives "
                             "this model more image tokens)")
        if shown == "one image":
            size = sb.selectbox("image size (WxH)", ["640x480", "1024x768", "1280x720", "1920x1080", "3840x2160"],
                                index=1)
            images = {"sizes": [size]}
        elif shown != "none":
            images = {"dataset": shown}
    ttft = sb.number_input("SLO P99 TTFT (ms)", 10, 60000, 1500, 50)
    tpot = sb.number_input("SLO P99 TPOT (ms)", 1, 1000, 50, 1)
    sb.header("Step costs and price")
    profiles = ["roofline"] + matching_profiles(card.get("name", ""), gpu)
    source = sb.selectbox("step-cost source", profiles,
                          help="the roofline, or a bundled profile measured for this model on this GPU")
    price = sb.number_input("price per GPU-hour (USD)", 0.0, 100.0, 2.5, 0.1)

    engine = {"tensor_parallel_size": tp, "max_num_seqs": seqs, "max_model_len": max_len,
              "max_num_batched_tokens": max(mnbt, seqs), "gpu_memory_utilization": util, "block_size": block,
              "kv_cache_dtype": kv, "enable_chunked_prefill": chunked, "engine": release, "kv_estimate": kv_end,
              **what_if}
    if not vllm_engine:
        engine = {k: v for k, v in engine.items() if k not in VLLM_ONLY}
    if not chunked:
        engine["max_num_batched_tokens"] = max(engine["max_num_batched_tokens"], max_len)

    def dist(mean):
        return ({"kind": "fixed", "value": int(mean)} if lengths == "fixed"
                else {"kind": "lognormal", "mean": float(mean), "cv": 0.8, "high": int(max_len)})

    workload = {"arrivals": {"kind": arrival, "rate_per_s": rate, "cv": cv}, "input_len": dist(inp),
                "output_len": dist(out), "num_requests": requests,
                "classes": [{"slo_ttft_s": ttft / 1e3, "slo_tpot_s": tpot / 1e3}],
                **({"images": images} if images else {})}
    return card, gpu, engine, workload, {"ttft_s": ttft / 1e3, "tpot_s": tpot / 1e3}, \
        (None if source == "roofline" else str(ROOT / "calibrate/profiles" / f"{source}.json")), price


# ---- views ---------------------------------------------------------------------------------------------
def memory_view(b: dict, table: list[dict]):
    g = 2**30
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("KV tokens", f"{b['kv_tokens']:,}")
    c2.metric("KV blocks", f"{b['num_blocks']:,}", help=f"range {b['num_blocks_range'][0]:,}-{b['num_blocks_range'][1]:,}; "
              f"the simulation uses {b['planning_blocks']:,} (the {b['kv_estimate']} end)")
    c3.metric("Weights (GiB/rank)", f"{b['weights_bytes'] / g:.2f}")
    c4.metric("Max concurrency at max_model_len", f"{b['max_concurrency']:.1f}")
    fig = go.Figure()
    for name, key in (("weights", "weights_bytes"), ("activations", "activation_bytes"),
                      ("non-torch", "non_torch_bytes"), ("CUDA graphs", "cuda_graph_bytes"), ("KV cache", "kv_budget_bytes")):
        fig.add_bar(name=name, x=[b[key] / g], y=[b["gpu"]], orientation="h")
    fig.update_layout(barmode="stack", height=280, xaxis=dict(title="GiB per rank", type="linear"), margin=dict(t=40),
                      title=f"Memory per rank: {b['usable_bytes'] / g:,.1f} GiB usable of {b['total_bytes'] / g:,.1f} GiB")
    legend_below(fig, 40)
    st.plotly_chart(fig, width="stretch")
    st.caption("Batch x context: KV needed and whether it fits (paged blocks)")
    st.dataframe([{"batch": r["batch"], "context": r["context"], "KV GiB": round(r["kv_bytes"] / g, 2),
                   "share of KV": f"{r['kv_fraction']:.0%}", "fits": r["reason"]} for r in table],
                 width="stretch", height=240)


@st.cache_data(show_spinner=False)
def context_map(card: dict, gpu: str, engine: dict, workload: dict, slo: dict, profile: str | None):
    """The planner's request-context x max_num_seqs trade-off for the sidebar's settings (small grids)."""
    from capacity.model.card import ModelCard
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Planner, Scenario

    sc = Scenario.model_validate({
        "model": card, "gpu": gpu, "profile": profile, "slo": {**slo, "percentile": 99},
        "engine": {k: v for k, v in engine.items() if k not in ("max_num_seqs", "max_model_len")},
        "workload": {k: v for k, v in workload.items() if k != "num_requests"},
        "target_rate_per_s": workload["arrivals"]["rate_per_s"],
        "search": {"seeds": 1, "requests": 200, "max_num_seqs": [16, 64, 256], "contexts": [1024, 4096, 16384]}})
    planner = Planner(sc, ModelCard.model_validate(card), SerialExecutor(cache=True))
    return [c.__dict__ for c in planner.context_frontier(engine["tensor_parallel_size"])]


def tradeoff_view(card, gpu, engine, workload, slo, profile, sim: dict):
    from plotly.subplots import make_subplots

    seqs = [16, 32, 64, 128, 256, 512]
    engines = [{**engine, "max_num_seqs": s, "max_num_batched_tokens": max(engine["max_num_batched_tokens"], s)}
               for s in seqs]
    wl = {**workload, "num_requests": min(workload["num_requests"], 1000)}
    with st.spinner("simulating max batch values..."):
        res = sim_points(card, gpu, engines, [wl] * len(seqs), profile)
    # two panels, each on its own scale with its SLO: a second y axis would magnify a 0.5 ms change into a crossing
    fig = make_subplots(rows=1, cols=2, subplot_titles=("P99 TTFT vs max batch (ms)", "P99 TPOT vs max batch (ms)"))
    for col, (metric, key) in enumerate((("ttft", "ttft_s"), ("tpot", "tpot_s")), 1):
        ys = [None if r.saturated else getattr(r, metric).p99 * 1e3 for r in res]
        fig.add_scatter(x=seqs, y=ys, mode="lines+markers", name=f"P99 {metric.upper()}",
                        row=1, col=col, line_shape="linear")
        fig.add_hline(y=slo[key] * 1e3, line_dash="dash", line_color="red", row=1, col=col,
                      annotation_text="SLO", annotation_position="top right")
        sat = [s for s, r in zip(seqs, res) if r.saturated]
        if sat:
            fig.add_scatter(x=sat, y=[slo[key] * 1e3] * len(sat), mode="markers+text", text=["saturated"] * len(sat),
                            textposition="top center", marker_symbol="x", marker_color="red", showlegend=False,
                            row=1, col=col)
    fig.update_xaxes(title_text="max_num_seqs", type="log", tickvals=seqs, ticktext=[str(s) for s in seqs])
    fig.update_yaxes(type="linear", rangemode="tozero")
    fig.update_layout(height=340, showlegend=False, margin=dict(t=60))  # titles clear of the mode bar
    st.plotly_chart(fig, width="stretch")
    # the trade-off users face: the context their requests carry against the batch cap
    with st.spinner("simulating the context trade-off..."):
        cells = context_map(card, gpu, engine, workload, slo, profile)
    ctxs = sorted({c["context"] for c in cells})
    rows = sorted({c["max_num_seqs"] for c in cells})
    by = {(c["max_num_seqs"], c["context"]): c for c in cells}
    z, text = [], []
    for s in rows:
        zr, tr = [], []
        for x in ctxs:
            c = by.get((s, x))
            if c is None or not c["feasible"]:
                zr.append(None)
                tr.append("does not fit")
            elif c["saturated"] or c["p_ttft"] is None:
                zr.append(3.0)
                tr.append("saturated")
            else:
                zr.append(min(3.0, max(c["p_ttft"] / slo["ttft_s"], c["p_tpot"] / slo["tpot_s"])))
                kv = " KV-limited" if c["kv_concurrency"] is not None and c["kv_concurrency"] < s else ""
                tr.append(f"{c['p_ttft'] * 1e3:,.0f} / {c['p_tpot'] * 1e3:,.1f} ms<br>"
                          f"{c['capacity_tokens_per_s']:,.0f} tok/s{kv}")
        z.append(zr)
        text.append(tr)
    hm = go.Figure(go.Heatmap(z=z, x=[f"{x:,}" for x in ctxs], y=[str(s) for s in rows], text=text,
                              texttemplate="%{text}", zmin=0, zmax=3, colorbar=dict(title="P99 / SLO"),
                              colorscale=[[0, "#9fd9a8"], [1 / 3, "#f6e3a1"], [1, "#f4a3a3"]]))
    hm.update_layout(title="Request context x max_num_seqs: P99 TTFT / TPOT (ms) at 80% of peak, peak tok/s",
                     height=360,
                     xaxis_title="tokens per request (prompt + output)", yaxis_title="max_num_seqs",
                     xaxis=dict(type="category"), yaxis=dict(type="category"), margin=dict(t=60))
    st.plotly_chart(hm, width="stretch")
    # throughput vs P99 as load rises: up to 110% of the replica's capacity (the closed-loop rate `capacity
    # simulate` checks against), past the knee; the saturated points are drawn and marked, not dropped
    cap = (sim.get("capacity") or {}).get("capacity_req_per_s")
    rates = load_levels(cap, workload["arrivals"]["rate_per_s"])
    with st.spinner("simulating load levels..."):
        curve = sim_points(card, gpu, [engine] * len(rates),
                           [{**wl, "arrivals": {**workload["arrivals"], "rate_per_s": x}} for x in rates], profile)
    pts = [(x, c) for x, c in zip(rates, curve) if c.ttft.n]
    fig = go.Figure()
    fig.add_scatter(x=[c.tokens_per_s for _, c in pts], y=[c.ttft.p99 * 1e3 for _, c in pts], mode="lines+markers",
                    name="P99 TTFT", hovertext=[f"{x:.2f} req/s" + (f" ({x / cap:.0%} of capacity)" if cap else "")
                                                for x, _ in pts])
    sat = [(x, c) for x, c in pts if c.saturated]
    if sat:
        fig.add_scatter(x=[c.tokens_per_s for _, c in sat], y=[c.ttft.p99 * 1e3 for _, c in sat], mode="markers",
                        marker=dict(symbol="x", size=11, color="red"), name="saturated (P99 grows with the run)")
    fig.add_hline(y=slo["ttft_s"] * 1e3, line_dash="dash", line_color="red", annotation_text="SLO")
    top = f"{rates[-1]:.3g} req/s, {rates[-1] / cap:.0%} of the capacity" if cap else f"{rates[-1]:.3g} req/s"
    fig.update_layout(title=f"Throughput vs P99 TTFT as the load rises (one replica, up to {top})", height=340,
                      xaxis=dict(title="output tokens/s", type="linear"),
                      yaxis=dict(title="P99 TTFT (ms, log)", type="log"), margin=dict(t=50))
    st.plotly_chart(legend_below(fig), width="stretch")


def latency_view(sim: dict):
    s = sim["summary"]
    if sim["saturated"]:
        st.warning(sim["saturation"])
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("P99 TTFT (ms)", f"{s['ttft_s']['p99'] * 1e3:.1f}" if s["ttft_s"].get("n") else "-")
    c2.metric("P99 TPOT (ms)", f"{s['tpot_s']['p99'] * 1e3:.2f}" if s["tpot_s"].get("n") else "-")
    c3.metric("output tokens/s", f"{s['output_tokens_per_s']:,.0f}")
    cap = sim.get("capacity") or {}
    u = cap.get("offered_over_capacity")
    c4.metric("load / capacity", f"{u:.0%}" if u is not None else "-",
              help="the offered rate over the most this deployment serves with its queue never empty (a closed "
                   f"loop of {cap.get('closed_loop_users', 0):,} users, the planner's measure: "
                   f"{cap.get('capacity_req_per_s', 0):.3g} req/s); from 90% the percentiles settle slowly")
    fig = go.Figure()
    for key in ("ttft", "tpot", "e2e"):
        x = np.sort(np.array(sim[key], dtype=float))
        x = x[~np.isnan(x)] * 1e3
        fig.add_scatter(x=x, y=np.arange(1, len(x) + 1) / max(1, len(x)), name=key.upper(), mode="lines")
    fig.update_layout(height=320, xaxis=dict(title="ms", type="log"), yaxis=dict(title="CDF", type="linear"),
                      margin=dict(t=10))
    st.plotly_chart(legend_below(fig), width="stretch")
    rows = []
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queue_wait_s", "queue wait")):
        m = s[key]
        if m.get("n"):
            ci = s.get("p99_ci_s", {}).get(key[:-2])
            rows.append({"metric": label, **{k: round(m[k] * 1e3, 2) for k in ("mean", "p50", "p90", "p95", "p99")},
                         "P99 95% CI": f"{ci[0] * 1e3:.1f}-{ci[1] * 1e3:.1f}" if ci and ci[0] == ci[0] else ""})
    st.dataframe(rows, width="stretch")
    st.caption(f"{s['definitions']}; step costs: {sim['source']}")
    for n in sim["notes"]:  # the notes `capacity simulate` prints for the same run
        st.caption(f"note: {n}")


def timeline_view(sim: dict):
    ts = np.array(sim["timeseries"])
    if ts.size == 0:
        st.info("no engine events recorded")
        return
    fig = go.Figure()
    fig.add_scatter(x=ts[:, 0], y=ts[:, 1], name="queue (waiting)", mode="lines")
    fig.add_scatter(x=ts[:, 0], y=ts[:, 2], name="running batch", mode="lines")
    fig.add_scatter(x=ts[:, 0], y=ts[:, 3] / max(1, sim["num_blocks"]) * 100, name="KV used (%)", mode="lines",
                    yaxis="y2")
    # every axis numeric with its own ticks: Streamlit's plotly theme syncs an overlaying axis's ticks to the first
    # axis's grid (tickmode "sync"), which labelled KV % 5 / 25.9 / 46.9
    fig.update_layout(height=360, xaxis=dict(title="simulated time (s)", type="linear"),
                      yaxis=dict(title="requests", type="linear", rangemode="tozero"),
                      yaxis2=dict(title="KV used (%)", overlaying="y", side="right", range=[0, 100], type="linear",
                                  tickmode="linear", tick0=0, dtick=20, showgrid=False), margin=dict(t=40))
    st.plotly_chart(legend_below(fig), width="stretch")


AB_KNOBS = {  # engine setting -> the values the A/B tab offers for B
    "max_num_seqs": [8, 16, 32, 64, 128, 256, 512, 1024],
    "max_num_batched_tokens": [1024, 2048, 4096, 8192, 16384],
    "kv_cache_dtype": ["auto", "fp8"],
    "enable_chunked_prefill": [True, False],
    "gpu_memory_utilization": [0.7, 0.8, 0.85, 0.9, 0.95],
    "engine": ["vllm", "sglang", "trtllm"],
}
AB_DEFAULTS = {"max_num_seqs": 32}  # B's first offer: a smaller batch that still serves the default load (8 saturates)
VLLM_ONLY = ("gpu_memory_utilization", "block_size")
WHAT_IFS = ("kv_reservation", "step_overhead_ms", "output_cpu_us_per_token")  # the sidebar's what-ifs expander
PLACED = ("tensor_parallel_size", "kv_cache_dtype", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "engine",
          "gpu_memory_utilization", "block_size", "enable_chunked_prefill", "kv_estimate", *WHAT_IFS)  # sidebar settings the other engines size by their own rules


def _requests(sim: dict):
    from capacity.truth.compare import Requests

    ok = np.isfinite(np.array(sim["finish"], dtype=float))
    f = lambda k: np.array(sim[k], dtype=float)[ok]
    return Requests(f("sent"), f("first_token"), f("finish"), f("output_tokens"), ids=np.flatnonzero(ok))


def ab_view(card, gpu, engine, workload, profile, sim_a: dict):
    """A/B of one engine setting: B is the sidebar's configuration with one setting changed, simulated with the
    same seed (the same requests at the same times), compared as `capacity compare` does (paired bootstrap)."""
    from capacity.truth.compare import cdf_figure, compare

    st.write("Change one setting and see what it does to the same requests (same seed: paired comparison).")
    c1, c2 = st.columns(2)
    knob = c1.selectbox("setting to change (B)", list(AB_KNOBS), key="ab_knob")
    options = [v for v in AB_KNOBS[knob] if v != engine.get(knob)]
    default = AB_DEFAULTS.get(knob)
    value = c2.selectbox(f"B: {knob}", options, index=options.index(default) if default in options else 0,
                         key=f"ab_value_{knob}")
    eng_b = {**engine, knob: value}
    if knob == "engine" and not str(value).startswith("vllm"):  # B is sized by its own engine's rules
        eng_b = {k: v for k, v in eng_b.items() if k not in VLLM_ONLY}
    try:
        sim_b = simulate(card, gpu, eng_b, workload, 0, profile)
    except CapacityError as exc:
        st.error(f"B ({knob} {value}): {exc}")
        return
    a, b = _requests(sim_a), _requests(sim_b)
    if min(len(a.sent), len(b.sent)) < 10:
        st.info("too few finished requests to compare")
        return
    sat = saturated_label(sim_a["saturated"], sim_b["saturated"])
    if sat:  # a saturated run has no steady state: its P99s grow with the run, its TPOT is that of fewer requests
        st.warning(f"{sat} saturated: requests were still waiting when the run ended, so its latencies depend on "
                   "the run's length; the comparison shows these runs, not a steady state. "
                   + " ".join(f"{n}: {d['saturation']}" for n, d in (("A", sim_a), ("B", sim_b))
                              if d["saturated"] and d["saturation"]))
    st.dataframe(ab_rows(compare(a, b, resamples=1000), sim_a["saturated"], sim_b["saturated"]), width="stretch")
    st.plotly_chart(legend_below(cdf_figure(a, b, (f"A: {knob} {engine.get(knob)}", f"B: {knob} {value}"))),
                    width="stretch")
    st.caption("ms; throughput in output tokens/s; B vs A: a percentage from -50% to +100%, else a factor (x12: "
               "twelve times A); the same comparison from the CLI: simulate --save-run a.json / b.json, then "
               "capacity compare a b")


@st.cache_data(show_spinner=False)
def disagg_run(card: dict, gpu: str, engine: dict, workload: dict, profile: str | None, prefill: int, decode: int,
               decode_tp: int, link: str) -> dict:
    """One disaggregated layout and the aggregated one on as many GPUs (replicas of the sidebar's TP), the same
    seed, through the run pipeline (what `capacity simulate --disagg P:D --decode-tp N --link L` runs)."""
    from capacity.engine.config import EngineConfig
    from capacity.files import validate
    from capacity.model.card import ModelCard
    from capacity.model.gpus import get_gpu
    from capacity.pipeline import Deployment, Disagg, RunOptions, disagg_report, run
    from capacity.workload import WorkloadSpec

    mc, g, wl = ModelCard.model_validate(card), get_gpu(gpu), WorkloadSpec.model_validate(workload)
    cfg = validate(EngineConfig, engine, "engine")
    dep = Deployment(mc, g, cfg, profile=profile, replicas=prefill)
    dis = Disagg(Deployment(mc, g, cfg.model_copy(update={"tensor_parallel_size": decode_tp}), profile=profile,
                            replicas=decode), link)
    res = run(dep, wl, RunOptions(seed=0), disagg=dis)
    d = disagg_report(res, dep, dis)
    rows = [{"layout": f"P {prefill}xTP{cfg.tensor_parallel_size} + D {decode}xTP{decode_tp}", "GPUs": d["gpus"],
             "P99 TTFT (ms)": res.summary.ttft_s.p99, "P99 TPOT (ms)": res.summary.tpot_s.p99,
             "output tokens/s": res.summary.output_tokens_per_s, "saturated": res.sim.saturated}]
    tp = cfg.tensor_parallel_size
    if d["gpus"] % tp == 0:
        agg = run(Deployment(mc, g, cfg, profile=profile, replicas=d["gpus"] // tp), wl, RunOptions(seed=0))
        rows.append({"layout": f"{d['gpus'] // tp}xTP{tp} (aggregated)", "GPUs": d["gpus"],
                     "P99 TTFT (ms)": agg.summary.ttft_s.p99, "P99 TPOT (ms)": agg.summary.tpot_s.p99,
                     "output tokens/s": agg.summary.output_tokens_per_s, "saturated": agg.sim.saturated})
    for r in rows:
        for k in ("P99 TTFT (ms)", "P99 TPOT (ms)"):
            r[k] = None if r[k] is None else round(r[k] * 1e3, 1)
        r["output tokens/s"] = round(r["output tokens/s"], 1)
    return {"rows": rows, "report": {k: v for k, v in d.items() if k != "launch_hints"},
            "hints": d["launch_hints"]}


def disagg_view(card, gpu, engine, workload, profile):
    """Disaggregated prefill/decode: one layout of the sidebar's scenario next to the aggregated one on as many
    GPUs, and each pool's KV use."""
    from capacity.pipeline import LINKS

    st.write("A prefill pool and a decode pool (the prompt's KV read over a link, in vLLM's NIXL order), against "
             "the aggregated layout on as many GPUs; same requests (same seed).")
    c = st.columns(4)
    n_p = c[0].number_input("prefill replicas", 1, 16, 1, key="dis_p")
    n_d = c[1].number_input("decode replicas", 1, 16, 1, key="dis_d")
    tp_d = c[2].selectbox("decode TP", [1, 2, 4, 8], index=0, key="dis_tp")
    link = c[3].selectbox("KV link", list(LINKS), key="dis_link")
    if not st.toggle("simulate this layout", key="dis_on",
                     help="two more simulations (the layout and the aggregated one); cached by their inputs"):
        return
    try:
        with st.spinner("simulating both layouts..."):
            out = disagg_run(card, gpu, engine, workload, profile, int(n_p), int(n_d), int(tp_d), link)
    except CapacityError as exc:
        st.error(str(exc))
        return
    st.dataframe(out["rows"], width="stretch")
    d = out["report"]
    kv = d["kv"]

    def pool(role: str) -> str:
        k = kv[role]
        peak = k["peak_used"]
        return f"{role}: {k['blocks_per_replica']:,} blocks per replica" + (
            f", at most {peak:,} in use ({peak / max(1, k['blocks_per_replica']):.1%})" if peak is not None else "")
    ms = lambda x: "-" if x is None else f"{x * 1e3:.2f} ms"
    st.caption(f"KV {pool('prefill')} (prompts in prefill and those waiting to be read); {pool('decode')}. "
               f"{d['transfers']} KV reads over {d['link']}: mean {ms(d['transfer_s']['mean'])}, queued for the link "
               f"P99 {ms(d['link_wait_s']['p99'])}. The same from the CLI: capacity simulate ... --disagg {n_p}:{n_d} "
               f"--decode-tp {tp_d} --link {link}")
    with st.expander("launch hints (vLLM with the NIXL connector; adapt)"):
        st.code(out["hints"], language="bash")


def plan_and_export(card, gpu, engine, workload, slo, profile, price):
    st.write("The full plan searches the max sustainable rate, the frontier and the GPU count (about 10-30 s).")
    scenario = {"model": card, "gpu": gpu, "engine": {k: v for k, v in engine.items()
                                                      if k not in ("max_num_seqs", "max_model_len", "tensor_parallel_size")},
                "workload": {k: v for k, v in workload.items() if k != "num_requests"},
                "slo": {**slo, "percentile": 99}, "target_rate_per_s": workload["arrivals"]["rate_per_s"],
                "price_per_gpu_hour": price or None, "profile": profile,
                "search": {"seeds": 2, "requests": 600, "max_num_seqs": [32, 64, 128, 256, 512],
                           "max_model_len": [4096, 8192, 32768, 131072], "tp": [1, 2]}}
    if st.button("Run the plan", key="run_plan") or st.session_state.get("plan_done"):
        st.session_state["plan_done"] = True
        bar = st.empty()

        def progress(n: int, phase) -> None:  # the phase the planner is in (capacity.plan.progress) and its share
            bar.progress(min(0.99, phase.started_fraction), text=f"planning: {phase.name or 'starting'} "
                                                                   f"({n} simulations so far)")

        p = full_plan(scenario, card, progress)
        bar.empty()
        rec = p["recommended"] or {}
        c1, c2, c3 = st.columns(3)
        c1.metric("GPUs needed", p["gpus"])
        c2.metric("replicas x TP", f"{p['replicas']} x {p['tp']}")
        c3.metric("USD per 1M output tokens", f"{p['cost_per_million_tokens']:.3f}" if p["cost_per_million_tokens"] else "-")
        st.write(f"Recommended max_num_seqs={rec.get('max_num_seqs')}, max_model_len={rec.get('max_model_len')}, "
                 f"max_num_batched_tokens={p['budget'].get('max_num_batched_tokens')}; "
                 f"verification {'passed' if p['verification']['passed'] else 'FAILED'}")
        st.code(p["vllm_command"], language="bash")
        for t in p["tradeoffs"]:
            st.write("- " + t)
        for n in p["notes"]:  # the notes `capacity plan` prints (and the workbook lists) for the same plan
            st.caption("plan note: " + n)
        from capacity.io.export import write_review

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "capacity-review.xlsx"
            write_review(path, p)
            st.download_button("Download the XLSX review", path.read_bytes(), file_name="capacity-review.xlsx")
        st.download_button("Download the plan JSON", json.dumps(p, indent=1), file_name="capacity-plan.json")


# ---- autoscaling over a load curve ------------------------------------------------------------------------
MAX_CURVE_BYTES = 2_000_000  # a curve file: 100,000 points (MAX_CURVE_POINTS) of "t,rate" fit in about 2 MB
BUNDLED_CURVE = ROOT / "capacity/data/curves/diurnal.yaml"
AUTOSCALE_TARGETS = {"concurrency": (32.0, "requests in flight per replica"),
                     "queue": (4.0, "requests waiting per ready replica"),
                     "kv": (0.8, "share of the KV cache in use (<= 1)"),
                     "predictive": (32.0, "not used: the predictive policy divides the curve by the per-replica rate")}


@st.cache_data(show_spinner=False)
def load_rate_curve(source: str, text: str | None) -> dict:
    """A rate curve's fields: the bundled diurnal day (text None), or pasted/uploaded CSV or YAML/JSON text read by
    the parsers and bounds of a curve file (`capacity.curves.load_curve`): one error line names the bad line."""
    from capacity.curves import _curve_csv, _curve_yaml, load_curve

    if text is None:
        return load_curve(BUNDLED_CURVE).model_dump()
    if len(text) > MAX_CURVE_BYTES:
        raise CapacityError(f"{source}: {len(text):,} bytes is more than the {MAX_CURVE_BYTES:,} a curve may be")
    name = Path(source)
    if name.suffix.lower() == ".csv" or (name.suffix.lower() not in (".yaml", ".yml", ".json")
                                         and not re.search(r"^\s*(points\s*:|\{)", text, re.M)):
        return _curve_csv(name, text).model_dump()
    from capacity.files import parse_text

    data = parse_text(text, source, "json" if name.suffix.lower() == ".json" else "yaml")
    if not isinstance(data, dict):
        raise CapacityError(f"{source}: expected CSV lines (t,rate) or a YAML mapping with points: [[t, rate], ...]")
    return _curve_yaml(name, data).model_dump()


def fit_curve_to_run(curve: dict, minutes: float, peak: float) -> tuple[dict, float | None]:
    """The curve played faster or slower (one period, or the points' span, in `minutes`; 0: as given) at a peak of
    `peak` req/s (0: as given), and the run's length: one period (or the span)."""
    pts = [tuple(p) for p in curve["points"]]
    span = curve.get("period_s") or pts[-1][0]
    out = dict(curve)
    if minutes > 0 and span > 0:
        f = minutes * 60 / span
        out["points"] = [(t * f, r) for t, r in pts]
        out["period_s"] = curve["period_s"] * f if curve.get("period_s") else None
        span *= f
    if peak > 0:
        out["scale"] = peak / max(r for _, r in pts)
    return out, (span or None)


@st.cache_data(show_spinner=False)
def autoscale_run(card: dict, gpu: str, engine: dict, workload: dict, autoscale: dict, static: int | None,
                  window_s: float, slo_ttft_s: float | None, slo_tpot_s: float | None, price: float | None, seed: int,
                  profile: str | None) -> dict:
    """capacity.plan.autoscale.autoscale_report (what `capacity autoscale --json` prints) for these plain inputs."""
    from capacity.engine.config import EngineConfig
    from capacity.files import validate
    from capacity.model.card import ModelCard
    from capacity.model.gpus import get_gpu
    from capacity.plan.autoscale import autoscale_report
    from capacity.sim.autoscale import AutoscaleConfig
    from capacity.workload import WorkloadSpec

    spec = validate(WorkloadSpec, workload, "workload")
    asc = AutoscaleConfig(**autoscale, curve=spec.total_curve() if autoscale["policy"] == "predictive" else None)
    c, g, e = ModelCard.model_validate(card), get_gpu(gpu), validate(EngineConfig, engine, "engine")
    per_replica = None  # the perfect system's lower bound: the rate per replica given, or the planner's under the SLO
    if autoscale.get("per_replica_rate"):
        per_replica = (autoscale["per_replica_rate"], "given")
    elif slo_ttft_s or slo_tpot_s:
        from capacity.plan.autoscale_bound import max_rate_per_replica

        per_replica = max_rate_per_replica(c, g, e, spec, slo_ttft_s, slo_tpot_s)
    return autoscale_report(c, g, e, spec, asc, static, window_s=window_s, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s,
                            price=price, seed=seed, profile=profile, per_replica=per_replica)


def autoscale_figure(rep: dict, curve: dict) -> go.Figure:
    """The run over time: the arrival rate (shaded, left outer axis), ready and starting replicas (steps, left
    axis), P99 TTFT per window of the autoscaled and the static pool against the SLO (right axis)."""
    from capacity.curves import RateCurve

    a, reps = rep["autoscaled"], rep["autoscaled"]["replicas"]
    end = max(a["simulated_s"], reps["t_s"][-1], 1e-9)
    rc = RateCurve.model_validate(curve)
    t = np.linspace(0.0, end, 600)
    knots = np.array([x for x, _ in rc.points])
    if rc.period_s:
        knots = (knots[None, :] + rc.period_s * np.arange(int(end // rc.period_s) + 1)[:, None]).ravel()
    if knots.size < 20_000:
        t = np.unique(np.concatenate([t, knots[knots <= end]]))
    fig = go.Figure()
    fig.add_scatter(x=t / 60, y=rc.rate(t), name="arrival rate (req/s)", yaxis="y3", mode="lines", fill="tozeroy",
                    line=dict(color="rgba(120,120,120,0.6)", width=1, shape="hv" if rc.shape == "step" else "linear"),
                    fillcolor="rgba(160,160,160,0.15)")
    tr = np.array(reps["t_s"]) / 60
    fig.add_scatter(x=tr, y=reps["ready"], name="ready replicas", mode="lines",
                    line=dict(shape="hv", width=2.5, color="#1f77b4"))
    fig.add_scatter(x=tr, y=reps["starting"], name="starting replicas", mode="lines",
                    line=dict(shape="hv", dash="dot", color="#1f77b4"))
    w, sw = a["window"], rep["static"]["window"]
    mid = lambda starts: (np.array(starts, dtype=float) + rep["window_s"] / 2) / 60
    ttft = lambda vals: [None if v is None else v * 1e3 for v in vals]
    fig.add_scatter(x=mid(w["start_s"]), y=ttft(w["ttft_s"]), name="P99 TTFT per window (ms)", yaxis="y2",
                    mode="lines+markers", line=dict(color="#d62728"))
    fig.add_scatter(x=mid(sw["start_s"]), y=ttft(sw["ttft_s"]), name=f"static ({rep['static']['replicas']}): "
                    "P99 TTFT (ms)", yaxis="y2", mode="lines", line=dict(color="#d62728", dash="dot", width=1))
    miss = [i for i, ok in enumerate(w["met"]) if not ok]
    slo = rep["slo"].get("ttft_s")
    if miss:
        fig.add_scatter(x=mid([w["start_s"][i] for i in miss]),
                        y=[(w["ttft_s"][i] or slo or 0) * 1e3 for i in miss], name="window misses the SLO",
                        yaxis="y2", mode="markers", marker=dict(symbol="x", size=10, color="black"))
    if slo:
        fig.add_scatter(x=[0, end / 60], y=[slo * 1e3] * 2, name="SLO P99 TTFT", yaxis="y2", mode="lines",
                        line=dict(color="#d62728", dash="dash", width=1))
    fig.update_layout(
        height=460, margin=dict(t=30, l=50, r=10),
        xaxis=dict(title="simulated time (min)", domain=[0.1, 0.92], type="linear"),
        yaxis=dict(title="replicas", type="linear", rangemode="tozero", dtick=1 if reps["max"] <= 12 else None),
        # the overlaying axes: numeric, with their own ticks (tickmode auto), not synced to the replicas' grid
        # (Streamlit's theme syncs them: the P99 axis read 3 / 122.262 / 4 / 1)
        yaxis2=dict(title="P99 TTFT (ms)", overlaying="y", side="right", type="log", tickmode="auto",
                    showgrid=False),
        yaxis3=dict(title="req/s", overlaying="y", side="left", anchor="free", position=0.0, type="linear",
                    rangemode="tozero", tickmode="auto", showgrid=False))
    return legend_below(fig)


MAX_DAY_REPORT_BYTES = 16 << 20


def load_day_report_text(source: str, text: str) -> dict:
    """A pasted or uploaded `capacity fleet-day --json` report, bounded and checked (one error line)."""
    from capacity.files import parse_text
    from capacity.io.fleetday import check_day_report

    if len(text) > MAX_DAY_REPORT_BYTES:
        raise CapacityError(f"{source}: {len(text):,} bytes is more than the {MAX_DAY_REPORT_BYTES:,} a report may be")
    return check_day_report(parse_text(text, source, "json"), source)


def fleet_day_view() -> None:
    """A fleet of models over a day (`capacity fleet-day`): a day of several models takes minutes, so the
    dashboard shows a saved report rather than running one while a person waits."""
    from capacity.io.fleetday import day_table, totals_table

    with st.expander("A fleet of models over a day: load a `capacity fleet-day --json` report"):
        up = st.file_uploader("report (.json)", type=["json"], key="day_file")
        text = st.text_area("...or paste it", value="", height=80, key="day_text")
        if up is None and not text.strip():
            st.caption("`capacity fleet-day --fleet day.yaml --json > day.json` (docs/fleet.md) simulates static, "
                       "reactive and predictive scaling per model and the models sharing GPUs")
            return
        try:
            rep = (load_day_report_text(up.name, up.getvalue().decode("utf-8", errors="replace")) if up is not None
                   else load_day_report_text("pasted report", text))
        except CapacityError as exc:
            st.error(str(exc))
            return
        head, rows = totals_table(rep)
        rows = [r for r in rows if r[2] is not None]
        fig = go.Figure(go.Bar(x=[r[0] if r[0] != "shared" else f"shared ({r[1]} GPUs)" for r in rows],
                               y=[r[2] for r in rows], text=[f"{r[2]:,.1f}" for r in rows], textposition="outside"))
        fig.update_layout(title=f"GPU-hours per day, {len(rep['models'])} models on {rep['gpu']}",
                          yaxis_title="GPU-hours", height=340, margin=dict(t=50, b=30))
        st.plotly_chart(fig, width="stretch", key="day_chart")
        st.dataframe([dict(zip(head, r)) for r in rows], hide_index=True, width="stretch", key="day_totals")
        head, rows = day_table(rep)
        st.dataframe([dict(zip(head, r)) for r in rows], hide_index=True, width="stretch", key="day_models")


def autoscale_report_view() -> None:
    """A saved `capacity autoscale --json` report (a trace replay, `--trace`, takes minutes for a real trace): the
    same per-window plot and table as a run here."""
    from capacity.files import parse_text
    from capacity.io.fleet import check_report, summary_table

    with st.expander("A saved autoscale report (e.g. a trace replayed): load a `capacity autoscale --json` report"):
        up = st.file_uploader("report (.json)", type=["json"], key="as_report_file")
        text = st.text_area("...or paste it", value="", height=80, key="as_report_text")
        if up is None and not text.strip():
            st.caption("`capacity autoscale -m MODEL --trace examples/traces/azure_conv_2023_head.csv --policy sla "
                       "--slo-ttft-ms 2000 --json > trace.json` (docs/fleet.md)")
            return
        source, raw = (up.name, up.getvalue().decode("utf-8", errors="replace")) if up is not None else (
            "pasted report", text)
        try:
            if len(raw) > MAX_DAY_REPORT_BYTES:
                raise CapacityError(f"{source}: {len(raw):,} bytes is more than the {MAX_DAY_REPORT_BYTES:,} a "
                                    "report may be")
            rep = check_report(parse_text(raw, source, "json"), source)
        except CapacityError as exc:
            st.error(str(exc))
            return
        curve = rep.get("curve") or {"points": [[0.0, rep["curve_mean_rate_per_s"]]]}
        st.plotly_chart(autoscale_figure(rep, curve), width="stretch", key="as_report_chart")
        head, rows = summary_table(rep)
        st.dataframe([{h: (str(v) if v is not None else None) for h, v in zip(head, r)} for r in rows],
                     hide_index=True, width="stretch", key="as_report_table")


def autoscale_view(card, gpu, engine, workload, slo, profile, price):
    """Autoscaling over a load curve against static provisioning for its peak and a perfect system: `capacity autoscale` for the sidebar's
    model, GPU, engine and request lengths."""
    st.write("A replica pool that follows a load curve (the autoscaler starts replicas that are ready after the "
             "start-up delay and drains them after the cooldown) against a static pool sized for the peak, on the "
             "same requests. The curve is played fast so the run answers in seconds: the CLI's `capacity autoscale` "
             "runs the same for a real day.")
    c1, c2, c3 = st.columns(3)
    source = c1.radio("load curve", ["bundled diurnal day", "paste a curve", "upload a curve file"], key="as_source",
                      help="diurnal: capacity/data/curves/diurnal.yaml, 24 hourly points (night 2, noon 10 req/s); "
                      "a curve: CSV `t,rate` lines (or hour,rate_per_s...) or YAML `points: [[t, rate], ...]`")
    try:
        if source == "paste a curve":
            text = c1.text_area("curve (CSV or YAML)", value="t,rate\n0,2\n120,30\n240,2\n", height=120,
                                key="as_curve_text")
            curve = load_rate_curve("pasted curve", text)
        elif source == "upload a curve file":
            up = c1.file_uploader("curve file", type=["csv", "yaml", "yml", "json"], key="as_curve_file")
            if up is None:
                st.info("upload a curve file (.csv, .yaml or .json)")
                return
            curve = load_rate_curve(up.name, up.getvalue().decode("utf-8", errors="replace"))
        else:
            curve = load_rate_curve("diurnal", None)
    except CapacityError as exc:
        st.error(str(exc))
        return
    bundled = source == "bundled diurnal day"
    minutes = c1.number_input("play one period of the curve in (min; 0: as given)", 0.0, 24 * 60.0,
                              10.0 if bundled else 0.0, 1.0, key=f"as_minutes_{bundled}")
    peak = c1.number_input("peak arrival rate (req/s; 0: as given)", 0.0, 10_000.0, 20.0 if bundled else 0.0, 1.0,
                           key=f"as_peak_{bundled}")
    policy = c2.selectbox("policy", list(AUTOSCALE_TARGETS), key="as_policy")
    default, meaning = AUTOSCALE_TARGETS[policy]
    target = c2.number_input(f"target ({meaning})", 0.01, 100_000.0, default, key=f"as_target_{policy}")
    per_rate = (c2.number_input("per-replica rate (req/s under the SLO: the headline's max rate per replica)", 0.01,
                                10_000.0, 8.0, key="as_per_rate") if policy == "predictive" else None)
    lo = c2.number_input("min replicas", 1, 1024, 1, key="as_min")
    hi = c2.number_input("max replicas", 1, 1024, 8, key="as_max")
    static = c2.number_input("static replicas (0: the autoscaled peak)", 0, 1024, 0, key="as_static")
    startup = c3.number_input("start-up delay (s)", 0.0, 3600.0, 30.0, 5.0, key="as_startup")
    cooldown = c3.number_input("cooldown (s)", 0.0, 7200.0, 60.0, 5.0, key="as_cooldown")
    interval = c3.number_input("controller interval (s)", 1.0, 600.0, 5.0, 1.0, key="as_interval")
    window = c3.number_input("SLO window (s)", 1.0, 3600.0, 30.0, 5.0, key="as_window")
    ttft = c3.number_input("SLO P99 TTFT per window (ms)", 1.0, 600_000.0, slo["ttft_s"] * 1e3, 50.0, key="as_ttft")
    tpot = c3.number_input("SLO P99 TPOT per window (ms; 0: none)", 0.0, 10_000.0, slo["tpot_s"] * 1e3, 1.0,
                           key="as_tpot")
    cap = c3.select_slider("most requests simulated", [1000, 2000, 5000, 10_000, 20_000, 50_000], value=10_000,
                           key="as_requests", help="the run stops after one period of the curve or this many requests")
    played, duration = fit_curve_to_run(curve, minutes, peak)
    wl = {**{k: v for k, v in workload.items() if k != "arrivals"}, "num_requests": int(cap),
          "arrivals": {"kind": "curve", "curve": played, **({"duration_s": duration} if duration else {})}}
    asc = {"min_replicas": int(lo), "max_replicas": int(hi), "policy": policy, "target": float(target),
           "interval_s": float(interval), "startup_s": float(startup), "cooldown_s": float(cooldown),
           "per_replica_rate": per_rate}
    args = {"card": card, "gpu": gpu, "engine": engine, "workload": wl, "autoscale": asc,
            "static": int(static) or None, "window_s": float(window), "slo_ttft_s": ttft / 1e3,
            "slo_tpot_s": tpot / 1e3 or None, "price": price or None, "seed": 0, "profile": profile}
    scale = peak / max(r for _, r in curve["points"]) if peak > 0 else curve.get("scale", 1.0)
    st.caption(f"curve: {len(curve['points'])} points, peak {max(r for _, r in curve['points']) * scale:,.2f} req/s"
               + (f"; one run of {duration / 60:,.1f} min" if duration else ""))
    if not (st.button("Run the autoscaling simulation", key="run_autoscale") or st.session_state.get("autoscale_done")):
        return
    st.session_state["autoscale_done"] = True
    try:
        with st.spinner("simulating the autoscaled pool and the static one..."):
            rep = autoscale_run(**args)
    except CapacityError as exc:
        st.error(str(exc))
        return
    a, s = rep["autoscaled"], rep["static"]
    has_slo = bool(rep["slo"]["ttft_s"] or rep["slo"]["tpot_s"])
    m = st.columns(4)
    m[0].metric("GPU-hours, autoscaled", f"{a['gpu_hours']:.3f}")
    m[1].metric(f"GPU-hours, static ({s['replicas']})", f"{s['gpu_hours']:.3f}")
    m[2].metric("GPU-hours saved", f"{1 - a['gpu_hours'] / s['gpu_hours']:.0%}" if s["gpu_hours"] else "-")
    m[3].metric("SLO-miss minutes, autoscaled", f"{a['violation_minutes']:g}",
                help=f"of {a['windows'] * rep['window_s'] / 60:g} minutes; static: {s['violation_minutes']:g}")
    if a["saturated"] or s["saturated"]:
        st.warning("a pool saturated: requests were still waiting when the run ended (see the P99s)")
    b = rep.get("lower_bound")
    if b is not None:  # the perfect system: ceil(rate / per-replica rate) replicas at every instant, no start-up
        v = a["vs_bound"]
        st.caption(f"A perfect system (ceil(rate / {b['per_replica_rate_per_s']:.3g} req/s per replica), no start-up "
                   f"delay; {b['rate_source']}) needs {b['gpu_hours']:.3f} GPU-hours and misses no window: the "
                   f"autoscaled pool is {v['gpu_hours']:+.3f} GPU-hours"
                   + (f" ({v['pct']:+.0f}%)" if v["pct"] is not None else "")
                   + f" from it with {v['violation_minutes']:g} SLO-miss minutes; scale events "
                   f"{a['scale_events']['up']} up, {a['scale_events']['down']} down.")
    st.plotly_chart(autoscale_figure(rep, played), width="stretch", key="autoscale_chart")
    rows = [{"layout": name, "replicas": reps, "GPU-hours": d["gpu_hours"], "cost (USD)": d["cost_usd"],
             "SLO-miss minutes": d["violation_minutes"] if has_slo else None,
             "P99 TTFT (ms)": None if d["p99_ttft_s"] is None else d["p99_ttft_s"] * 1e3,
             "P99 TPOT (ms)": None if d["p99_tpot_s"] is None else d["p99_tpot_s"] * 1e3, "requests": d["requests"]}
            for name, d, reps in (("autoscaled", a, f"{a['replicas']['min']}-{a['replicas']['max']}"),
                                  ("static", s, str(s["replicas"])))]
    if b is not None:
        rows.append({"layout": "perfect system (lower bound)", "replicas": f"0-{b['replicas_max']}",
                     "GPU-hours": b["gpu_hours"], "cost (USD)": b["gpu_hours"] * price if price else None,
                     "SLO-miss minutes": 0.0, "P99 TTFT (ms)": None, "P99 TPOT (ms)": None, "requests": None})
    fmt = st.column_config.NumberColumn
    st.dataframe(rows, width="stretch", hide_index=True, key="autoscale_table",
                 column_config={"GPU-hours": fmt(format="%.3f"), "cost (USD)": fmt(format="%.2f"),
                                "SLO-miss minutes": fmt(format="%.1f"), "P99 TTFT (ms)": fmt(format="%.0f"),
                                "P99 TPOT (ms)": fmt(format="%.1f")})
    with st.expander("Inputs behind these numbers (capacity.plan.autoscale.autoscale_report's arguments)"):
        st.code(json.dumps({"autoscale": args}, indent=1), language="json")
    from capacity.io.export import write_review

    st.download_button("Download the autoscale report (JSON, as `capacity autoscale --json`)",
                       json.dumps(rep, indent=1), file_name="capacity-autoscale.json")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "capacity-autoscale.xlsx"
        write_review(path, autoscale=rep)
        st.download_button("Download the XLSX (Autoscale sheet)", path.read_bytes(),
                           file_name="capacity-autoscale.xlsx")


@st.cache_data(show_spinner=False)
def headline(card: dict, gpu: str, engine: dict, workload: dict, slo: dict, profile: str | None, price: float):
    """The answer for the sidebar as it stands: the max rate one replica sustains under the SLOs (a short
    bisection), the replicas and GPUs for the sidebar's rate at 80% of it, the cost, and the P99s a replica sees
    at its share of the load."""
    import math

    from capacity.engine.config import EngineConfig
    from capacity.model.card import ModelCard
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Planner, Scenario

    rate = workload["arrivals"]["rate_per_s"]
    sc = Scenario.model_validate({
        "model": card, "gpu": gpu, "profile": profile, "slo": {**slo, "percentile": 99}, "engine": engine,
        "workload": {k: v for k, v in workload.items() if k != "num_requests"}, "target_rate_per_s": rate,
        "search": {"seeds": 1, "requests": 300, "tolerance": 0.15}})
    planner = Planner(sc, ModelCard.model_validate(card), SerialExecutor(cache=True))
    cfg = EngineConfig.model_validate(engine)
    rs = planner.rate_search(cfg, cfg.tensor_parallel_size, cfg.max_num_seqs or 256)
    if rs.max_rate <= 0:
        return {"feasible": False, "why": f"even {rs.probes[0][0]:.3g} req/s per replica misses the SLO"}
    replicas = math.ceil(rate / (rs.max_rate * 0.8) - 1e-9)
    gpus = replicas * cfg.tensor_parallel_size
    out = workload["output_len"]
    tokens_h = rate * out.get("value", out.get("mean", 256)) * 3600
    return {"feasible": True, "gpus": gpus, "replicas": replicas, "tp": cfg.tensor_parallel_size,
            "max_rate": rs.max_rate, "cost": gpus * price / tokens_h * 1e6 if price and tokens_h else None}


def replica_workload(workload: dict, replicas: int) -> dict:
    """The sidebar's workload as one of `replicas` replicas sees it (its share of the arrival rate); for one
    replica the workload itself, so the header and the Latency tab read one simulation."""
    if replicas <= 1:
        return workload
    arr = workload["arrivals"]
    return {**workload, "arrivals": {**arr, "rate_per_s": arr["rate_per_s"] / replicas}}


def headline_view(h: dict, per: dict | None, gpu: str, slo: dict, workload: dict) -> None:
    """The answer first: GPUs, replicas x TP, cost, and the P99s one replica sees at its share of the load, from
    the same run the Latency tab shows when one replica serves the load (simulate(), seed 0)."""
    if not h["feasible"]:
        st.error(f"No replica of this configuration meets the SLO: {h['why']}")
        return
    c = st.columns(5)
    c[0].metric("GPUs needed", f"{h['gpus']:,}", help=f"{gpu}, replicas at 80% of their max sustainable rate")
    c[1].metric("replicas x TP", f"{h['replicas']} x {h['tp']}", help=f"{h['max_rate']:.2f} req/s per replica max")
    c[2].metric("USD per 1M output tokens", f"{h['cost']:,.3f}" if h["cost"] is not None else "-")
    rate = workload["arrivals"]["rate_per_s"] / h["replicas"]
    src = (f"one replica at {rate:.3g} req/s, {workload['num_requests']:,} requests, seed 0"
           + ("; the Latency tab's run" if h["replicas"] == 1 else ""))
    s = per["summary"] if per else {}
    for col, key, label, nd in ((c[3], "ttft", "P99 TTFT at that load (ms)", 0),
                                (c[4], "tpot", "P99 TPOT at that load (ms)", 1)):
        m, lim = s.get(f"{key}_s") or {}, slo[f"{key}_s"]
        v = m.get("p99") if m.get("n") else None
        col.metric(label, "saturated" if (per or {}).get("saturated") or v is None else f"{v * 1e3:,.{nd}f}",
                   delta=f"SLO {lim * 1e3:,.{nd}f}", delta_color="off", help=src)


TABS = ("Memory", "Trade-offs", "Latency", "Timeline", "A/B", "Disaggregated", "Autoscale", "Plan & export")
# Widgets of the tabs keep their values while their tab is hidden: Streamlit drops the state of a widget a run
# does not draw, and a lazy tab draws nothing, so at the top of each run the keys of the hidden tabs' widgets are
# set to their own values (the open tab's are left alone: setting a drawn widget's key logs a warning). File
# uploads cannot be set that way and are left out (buttons have no lasting value).
KEPT = {"ab_": "A/B", "dis_": "Disaggregated", "as_": "Autoscale", "day_": "Autoscale"}  # key prefix -> its tab
NOT_SETTABLE = ("as_curve_file", "day_file")


def keep_hidden_tab_widgets() -> None:
    open_tab = st.session_state.get("tab", TABS[0])
    for k in [k for k in st.session_state if isinstance(k, str) and k not in NOT_SETTABLE]:
        tab = next((t for prefix, t in KEPT.items() if k.startswith(prefix)), None)
        if tab is not None and tab != open_tab:
            st.session_state[k] = st.session_state[k]


def main():
    st.title("capacity: GPUs, latency and cost of an LLM deployment")
    keep_hidden_tab_widgets()
    try:
        card, gpu, engine, workload, slo, profile, price = sidebar()
        b, table = memory_budget(card, gpu, engine)
    except CapacityError as exc:
        st.error(str(exc))
        return
    with st.expander("Scenario behind these numbers (what the library receives)"):
        # the exact inputs of capacity.pipeline.run / capacity.engine.memory.budget: paste into a script or a
        # scenario file to get the same numbers from the CLI or the library
        st.code(json.dumps({"scenario": {"model": card, "gpu": gpu, "engine": engine, "workload": workload,
                                         "profile": profile, "seed": 0}}, indent=1), language="json")
    # the answer first: the header is computed before the tabs (drawing the Memory tab first delayed it by the
    # chart's and table's serialisation, and on a busy machine the browser showed both at once anyway)
    try:
        with st.spinner("finding the max rate per replica..."):
            h = headline(card, gpu, engine, workload, slo, profile, price)
            per = (simulate(card, gpu, engine, replica_workload(workload, h["replicas"]), 0, profile)
                   if h["feasible"] else None)
        headline_view(h, per, gpu, slo, workload)
    except CapacityError as exc:
        st.error(str(exc))
    # lazy tabs: only the open tab runs (switching tabs reruns the script), so the first paint waits for the
    # header and the Memory tab only, not for every tab's simulations
    tabs = st.tabs(list(TABS), key="tab", on_change="rerun")

    def base_run() -> dict:  # the sidebar's scenario, one replica, seed 0 (cached: one run for every tab)
        with st.spinner("simulating..."):
            return simulate(card, gpu, engine, workload, 0, profile)

    views = {"Memory": lambda: memory_view(b, table),
             "Trade-offs": lambda: tradeoff_view(card, gpu, engine, workload, slo, profile, base_run()),
             "Latency": lambda: latency_view(base_run()),
             "Timeline": lambda: timeline_view(base_run()),
             "A/B": lambda: ab_view(card, gpu, engine, workload, profile, base_run()),
             "Disaggregated": lambda: disagg_view(card, gpu, engine, workload, profile),
             "Autoscale": lambda: (fleet_day_view(), autoscale_report_view(), autoscale_view(card, gpu, engine, workload, slo, profile, price)),
             "Plan & export": lambda: plan_and_export(card, gpu, engine, workload, slo, profile, price)}
    for name, tab in zip(TABS, tabs):
        if tab.open:
            with tab:
                try:
                    views[name]()
                except CapacityError as exc:
                    st.error(str(exc))


main()
