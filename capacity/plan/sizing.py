"""What the planner (capacity.plan.planner) and its frontier (capacity.plan.frontier) both use to size a service:
replicas for a target rate, and the mean over seeds. Its own module so that neither imports the other for it."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capacity.plan.scenario import Scenario


def replicas_for(sc: Scenario, max_rate: float) -> int:
    """Replicas to serve the target with each at `headroom` x its max sustainable rate."""
    return max(1, math.ceil(sc.target_rate_per_s / (max_rate * sc.headroom) - 1e-9))  # a trickle still needs one


def mean(xs: list[float]) -> float:
    """The plain mean over seeds (no numpy: a handful of floats)."""
    return sum(xs) / len(xs)
