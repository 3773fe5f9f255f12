"""`capacity autoscale`'s inputs and its extra outputs: the load (a workload's curve, or a replayed trace and the
curve of its arrivals), the controllers of each policy (with the per-replica rate and the SLA planner's profile
that some need, computed once), the lower bound's line, and the start-up sweep's tables."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from capacity.curves import fit_curve
from capacity.engine.startup import estimate_startup
from capacity.errors import CapacityError
from capacity.files import dumps, read_mapping, strict_json, validate
from capacity.plan.autoscale_bound import max_rate_per_replica, steady_point
from capacity.plan.autoscale_sweep import parse_sweep, startup_sweep
from capacity.sim.autoscale import POLICIES, AutoscaleConfig
from capacity.traces import convert, parse_window, rows
from capacity.workload import WorkloadSpec

MAX_TRACE_LENGTHS = 10_000  # trace lengths kept for the steady runs' empirical distributions (every k-th row)


def minutes(x: float) -> str:
    """SLO-miss minutes: whole when whole (windows of whole minutes), else to a tenth (windows of seconds)."""
    return f"{x:.0f}" if x == int(x) else f"{x:.1f}"


class AutoscaleInputs:
    def __init__(self, card, gpu, engine, slo_ttft_s: float | None, slo_tpot_s: float | None,
                 per_replica_rate: float | None, window_s: float, seed: int, router: str,
                 settings: dict[str, Any]) -> None:
        self.card, self.gpu, self.engine = card, gpu, engine
        self.slo_ttft_s, self.slo_tpot_s, self.given_rate = slo_ttft_s, slo_tpot_s, per_replica_rate
        self.window_s, self.seed, self.router, self.settings = window_s, seed, router, settings
        self._rate: tuple[float, str] | None = None
        self._profile: dict[str, float] | None = None
        self.spec: Any = None
        self.curve: Any = None

    @contextlib.contextmanager
    def load(self, workload: str | None, trace: str | None, fmt: str | None, time_scale: float,
             window: str | None) -> Iterator[None]:
        """The workload and its curve; a trace is converted into a temporary file that lives until the block ends."""
        import tempfile
        from pathlib import Path

        if (workload is None) == (trace is None):
            raise CapacityError("give one of --workload (a load curve) or --trace (a trace to replay)")
        if trace is None:
            if fmt or time_scale != 1.0 or window:
                raise CapacityError("--trace-format, --time-scale and --window apply to --trace")
            self.spec = validate(WorkloadSpec, read_mapping(workload), workload)  # type: ignore[arg-type]
            if self.spec.arrivals.kind != "curve":
                raise CapacityError(f"--workload: arrivals.kind is {self.spec.arrivals.kind}; autoscaling follows a "
                                    "curve (arrivals: {kind: curve, curve_file: ...}) or a trace (--trace)")
            self.curve = self.spec.total_curve()
            yield
            return

        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise CapacityError(f"--window-s: must be a finite number > 0 (got {self.window_s})")
        with tempfile.TemporaryDirectory(prefix="capacity-trace-") as d:
            tmp = Path(d) / "trace.jsonl"
            counts = convert(trace, tmp, fmt, time_scale=time_scale, window=parse_window(window))
            if counts.kept == 0:
                raise CapacityError(f"--trace {trace}: no request in it (after the window and dropping 0-token rows)")
            got = list(rows(tmp, "capacity"))
            every = max(1, len(got) // MAX_TRACE_LENGTHS)
            self.curve = fit_curve([r.t for r in got], self.window_s, "step")
            self.spec = validate(WorkloadSpec, {
                "arrivals": {"kind": "trace"}, "trace": str(tmp), "num_requests": len(got),
                "input_len": {"kind": "empirical", "values": [r.input_tokens for r in got[::every]]},
                "output_len": {"kind": "empirical", "values": [r.output_tokens for r in got[::every]]}}, "--trace")
            yield

    def per_replica(self) -> tuple[float, str]:
        """The rate one replica sustains under the SLO: --per-replica-rate, or the planner's search (once)."""
        if self._rate is None:
            if self.given_rate is not None:
                if not (math.isfinite(self.given_rate) and self.given_rate > 0):
                    raise CapacityError(f"--per-replica-rate: must be a number > 0 (got {self.given_rate:g})")
                self._rate = (self.given_rate, "given")
            else:

                self._rate = max_rate_per_replica(self.card, self.gpu, self.engine, self.spec, self.slo_ttft_s,
                                                  self.slo_tpot_s)
        return self._rate

    def profile(self) -> dict[str, float]:
        """The SLA planner's profile: one replica at the per-replica rate (steady_point), once."""
        if self._profile is None:

            self._profile = steady_point(self.card, self.gpu, self.engine, self.spec, self.per_replica()[0], self.seed)
        return self._profile

    def controller(self, policy: str):
        if policy not in POLICIES:
            raise CapacityError(f"--policy {policy!r}: use {', '.join(POLICIES)}")
        extra: dict[str, Any] = {}
        if policy in ("predictive", "sla"):
            if self.given_rate is None and self.slo_ttft_s is None and self.slo_tpot_s is None:
                raise CapacityError(f"--policy {policy}: needs --per-replica-rate or an SLO (--slo-ttft-ms, "
                                    "--slo-tpot-ms) for the planner's per-replica rate")
            extra["per_replica_rate"] = self.per_replica()[0]
        if policy == "predictive":
            extra["curve"] = self.curve
        if policy == "sla":
            p = self.profile()
            extra["profile_ttft_s"], extra["profile_tpot_s"] = p["ttft_mean_s"], p["tpot_mean_s"]
        return AutoscaleConfig(policy=policy, **self.settings, **extra)  # type: ignore[arg-type]


def print_bound(con, out: dict) -> None:
    """The lower bound's line under the autoscale table, and the scale events."""
    b = out.get("lower_bound")
    a = out["autoscaled"]
    ev = a.get("scale_events")
    if ev is not None:
        con.print(f"scale events: {ev['up']} up, {ev['down']} down")
    if b is None:
        return

    def dist(v: dict) -> str:
        pct = f" ({v['pct']:+.0f}%)" if v["pct"] is not None else ""
        return f"{v['gpu_hours']:+.2f} GPU-hours{pct}, {minutes(v['violation_minutes'])} SLO-miss min"

    con.print(f"a perfect system (ceil(rate / {b['per_replica_rate_per_s']:.3g} req/s per replica), no start-up "
              f"delay; rate: {b['rate_source']}): {b['gpu_hours']:.2f} GPU-hours, up to {b['replicas_max']} "
              f"replicas, 0 SLO-miss min; autoscaled {dist(a['vs_bound'])}; static "
              f"{dist(out['static']['vs_bound'])}")


def print_sweep(inp: AutoscaleInputs, spec: str, policies: str, storage_gbps: float, workers: int | None,
                json_out: bool) -> None:
    """`--startup-sweep`: the start-up estimate, then each policy's GPU-hours and SLO-miss minutes per start-up,
    and where its SLO breaks."""

    startups = parse_sweep(spec)
    if workers is not None and not 1 <= workers <= 256:
        raise CapacityError(f"--workers: 1 to 256 (got {workers})")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise CapacityError(f"--policies {policies!r}: a comma-separated list of distinct policies")
    est = estimate_startup(inp.card, inp.gpu, inp.engine, storage_gbps)
    ctrls = [inp.controller(p) for p in names]
    sw = startup_sweep(inp.card, inp.gpu, inp.engine, inp.spec, ctrls, startups, window_s=inp.window_s,
                       slo_ttft_s=inp.slo_ttft_s, slo_tpot_s=inp.slo_tpot_s, router=inp.router, seed=inp.seed,
                       workers=workers)
    out = strict_json({"model": inp.card.name, "gpu": inp.gpu.name, "tp": inp.engine.tensor_parallel_size,
                       "slo": {"ttft_s": inp.slo_ttft_s, "tpot_s": inp.slo_tpot_s}, "window_s": inp.window_s,
                       "startup_estimate": est, **sw, "units": "seconds, GPU-hours"})
    if json_out:
        import typer

        typer.echo(dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = est["terms"]
    lo, hi = est["total_s"]
    con.print(f"start-up estimate ({est['engine']}): {lo:.0f}-{hi:.0f} s = init {t['init_s'][0]:.0f}-"
              f"{t['init_s'][1]:.0f} + weights {est['weights_bytes_per_rank'] / 1e9:.1f} GB at "
              f"{est['storage_gbps']:g} GB/s {t['load_s'][0]:.0f}-{t['load_s'][1]:.0f} + profiling "
              f"{t['profile_s'][0]:.0f}-{t['profile_s'][1]:.0f} + torch.compile {t['compile_s'][0]:.0f}-"
              f"{t['compile_s'][1]:.0f} + CUDA graphs ({est['capture_sizes']} sizes) {t['capture_s'][0]:.0f}-"
              f"{t['capture_s'][1]:.0f} s ({est['assumes']})")
    tab = Table(title="GPU-hours / SLO-miss minutes per start-up delay", title_justify="left")
    tab.add_column("start-up s", justify="right")
    for p in names:
        tab.add_column(p, justify="right")
    for i, s in enumerate(startups):
        tab.add_row(f"{s:g}", *(f"{sw['runs'][p][i]['gpu_hours']:.2f} / {minutes(sw['runs'][p][i]['violation_minutes'])}"
                                for p in names))
    con.print(tab)
    for p in names:
        c = sw["cliff"][p]
        if c["breaks_at_s"] is None:
            con.print(f"{p}: the SLO holds at every start-up swept (to {startups[-1]:g} s)")
        elif c["holds_to_s"] is None:
            con.print(f"{p}: the SLO is missed already at {startups[0]:g} s")
        else:
            con.print(f"{p}: the SLO holds to {c['holds_to_s']:g} s and breaks at {c['breaks_at_s']:g} s"
                      f"{' (inside the estimate)' if lo <= c['breaks_at_s'] <= hi else ''}")
