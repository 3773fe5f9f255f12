"""The `sla` autoscaling policy: a throughput-based planner with a correction factor, modelled on NVIDIA Dynamo's
SLA planner (ai-dynamo/dynamo, `components/planner/src/dynamo/planner/utils/planner_core.py`, `Planner.
observe_metrics` and `Planner.make_adjustments`, read at commit b6f3161; its load predictors in
`components/planner/src/dynamo/planner/utils/load_predictor.py`).

What Dynamo's planner does every `adjustment_interval`:

1. observe, over the last interval, the average TTFT and ITL, the request count, the mean input and output
   lengths and the mean request duration (from Prometheus);
2. correction factors: TTFT observed / TTFT its pre-deployment profile expects at that input length
   (`p_correction_factor`, queueing shows up here), ITL observed / ITL the profile expects at the observed
   concurrency and context (`d_correction_factor`);
3. predict the next interval's request count (and lengths) from the history (constant, ARIMA or Prophet);
4. prefill replicas = ceil(predicted requests x ISL / interval x min(1, p_correction) / profiled prefill
   throughput per GPU / GPUs per engine); decode replicas: the ITL target divided by d_correction, the best
   profiled decode throughput per GPU that meets that corrected ITL, and ceil(predicted requests x OSL /
   interval / that throughput / GPUs per engine); at least `min_endpoint` each.

Here, for one aggregated pool (a replica does both phases), with a profile of one operating point (the rate R
one replica sustains under the SLO, from the planner's rate search, and the mean TTFT and TPOT a replica shows at
R, from a steady run: `capacity.plan.autoscale_bound.steady_point`):

- observed over the last interval: arrivals (the request count), the mean TTFT and mean TPOT of the requests that
  finished in it (TPOT is the per-request mean inter-token latency: what Dynamo's ITL average is);
- predictor: Dynamo's `constant` one (the next interval's requests = the last interval's). Dynamo's default is
  ARIMA (`components/planner/src/dynamo/planner/defaults.py`, `load_predictor = "arima"`, over the last 50
  intervals); `constant` is one of its options, the one its planner tests run (an ARIMA forecast is not modelled);
- p = mean TTFT / profiled TTFT, d = mean TPOT / profiled TPOT; kept from the previous interval when no request
  finished (Dynamo skips the adjustment when a metric is missing);
- the profile's throughput is taken as proportional to the latency budget (a one-point profile has no curve to
  invert: the simplification), so the throughput that meets the ITL target / d is R / d;
- desired = max(ceil(predicted rate x min(1, p) / R), ceil(predicted rate x d / R)): the prefill rule and the
  decode rule, the larger since the same replicas do both.

No cooldown in Dynamo's loop (it scales each interval); the pool's cooldown still applies here, as for every policy.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capacity.sim.entities import Seq
    from capacity.sim.simulator import Simulation


class SlaPlanner:
    """The observation side of the `sla` policy: the last interval's arrivals and finished requests."""

    def __init__(self, sim: Simulation, per_replica_rate: float, ttft_s: float, tpot_s: float) -> None:
        self.sim = sim
        self.rate, self.ttft_s, self.tpot_s = per_replica_rate, ttft_s, tpot_s
        self.seen = 0  # admitted requests already looked at
        self.sent = 0  # requests sent by the clients by the last look
        self.pending: list[Seq] = []  # admitted, not finished when last looked at
        self.t_last = 0.0
        self.p_correction = 1.0
        self.d_correction = 1.0

    def desired(self) -> int:
        seqs = self.sim.recorder.seqs
        now = self.sim.env.now
        self.pending.extend(seqs[self.seen:])
        self.seen = len(seqs)
        arrived, self.sent = self.sim.entered - self.sent, self.sim.entered
        done = [s for s in self.pending if math.isfinite(s.finish_s)]
        self.pending = [s for s in self.pending if not math.isfinite(s.finish_s)]
        if done and self.ttft_s > 0:
            self.p_correction = sum(s.first_token_s - s.req.arrival_s for s in done) / len(done) / self.ttft_s
        many = [s for s in done if s.req.output_tokens > 1]
        if many and self.tpot_s > 0:
            tpot = sum((s.finish_s - s.first_token_s) / (s.req.output_tokens - 1) for s in many) / len(many)
            self.d_correction = tpot / self.tpot_s
        span = now - self.t_last
        self.t_last = now
        predicted = arrived / span if span > 0 else 0.0  # Dynamo's constant predictor: the last interval again
        prefill = math.ceil(predicted * min(1.0, self.p_correction) / self.rate - 1e-9)
        decode = math.ceil(predicted * self.d_correction / self.rate - 1e-9)
        return max(prefill, decode)
