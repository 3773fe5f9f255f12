"""One page per load test: latency over time, the engine's own batch and KV series, and host/GPU utilisation, with
the simulator's prediction for the same requests overlaid where there is one (`capacity validate --plot`).

Rows, sharing the time axis (seconds since the run started):
1. TTFT and E2E of each request at its send time (ms, log scale); predicted TTFT as open markers;
2. the engine's running and waiting requests from its /metrics, and the simulator's running batch and queue;
3. KV-cache use (%) from /metrics and the simulator's;
4. host CPU and each GPU's SM utilisation (%), from `capacity.truth.utilisation`.
A row with nothing to show says so in its title instead of being left blank.
"""
from __future__ import annotations

import numpy as np


def _series(scrapes: list[dict], needle: str) -> tuple[np.ndarray, np.ndarray]:
    t = [s["t"] for s in scrapes if any(needle in k for k in s if k != "t")]
    v = [sum(val for k, val in s.items() if k != "t" and needle in k) for s in scrapes
         if any(needle in k for k in s if k != "t")]
    return np.array(t, dtype=float), np.array(v, dtype=float)


def run_figure(run: dict, sim=None, num_blocks: int | None = None):
    """The page for a run dict (`capacity loadtest --out`); `sim`: a SimResult of the same requests (replayed)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [r for r in run["requests"] if r.get("status") == "ok"]
    scrapes = run.get("metrics") or []
    util = (run.get("utilisation") or {}).get("samples") or []
    titles = ["latency per request (ms)", "requests running / waiting", "KV cache used (%)", "utilisation (%)"]
    if not scrapes:
        titles[1] += ": the server has no /metrics" if sim is None else ": simulated only"
        titles[2] += ": the server has no /metrics" if sim is None else ": simulated only"
    if not util:
        titles[3] += ": not sampled"
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.06)
    sent = np.array([r["sent_s"] for r in ok], dtype=float)
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in ok], dtype=float) * 1e3
    e2e = np.array([r["finish_s"] - r["sent_s"] for r in ok], dtype=float) * 1e3
    fig.add_trace(go.Scatter(x=sent, y=ttft, mode="markers", name="TTFT", marker={"size": 4}), row=1, col=1)
    fig.add_trace(go.Scatter(x=sent, y=e2e, mode="markers", name="E2E", marker={"size": 4}), row=1, col=1)
    if sim is not None:
        r = sim.records
        done = r.finished
        fig.add_trace(go.Scatter(x=r.arrival[done], y=(r.first_token - r.arrival)[done] * 1e3, mode="markers",
                                 name="TTFT predicted", marker={"size": 5, "symbol": "circle-open"}), row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    for needle, name in (("num_requests_running", "running"), ("num_requests_waiting", "waiting")):
        t, v = _series(scrapes, needle)
        if len(t):
            fig.add_trace(go.Scatter(x=t, y=v, mode="lines", name=f"{name} (engine)"), row=2, col=1)
    t, v = _series(scrapes, "cache_usage")
    if len(t):
        fig.add_trace(go.Scatter(x=t, y=v * (100 if v.max(initial=0) <= 1 else 1), mode="lines",
                                 name="KV used (engine)"), row=3, col=1)
    if sim is not None and len(sim.timeseries):
        ts = np.asarray(sim.timeseries)  # columns: t, waiting, running, KV blocks used
        fig.add_trace(go.Scatter(x=ts[:, 0], y=ts[:, 2], mode="lines", line={"dash": "dot"},
                                 name="running (simulated)"), row=2, col=1)
        fig.add_trace(go.Scatter(x=ts[:, 0], y=ts[:, 1], mode="lines", line={"dash": "dot"},
                                 name="waiting (simulated)"), row=2, col=1)
        if num_blocks:
            fig.add_trace(go.Scatter(x=ts[:, 0], y=ts[:, 3] / num_blocks * 100, mode="lines", line={"dash": "dot"},
                                     name="KV used (simulated)"), row=3, col=1)
    if util:
        ut = np.array([s["t"] for s in util], dtype=float)
        cols = sorted({k for s in util for k in s if k == "host_cpu_pct" or k.endswith("_util_pct")})
        for c in cols:
            fig.add_trace(go.Scatter(x=ut, y=[s.get(c, np.nan) for s in util], mode="lines",
                                     name=c.replace("_pct", " %").replace("_", " ")), row=4, col=1)
    fig.update_xaxes(title_text="seconds since the run started", row=4, col=1)
    fig.update_layout(height=900, width=1000, margin={"l": 60, "r": 20, "t": 40, "b": 40})
    return fig
