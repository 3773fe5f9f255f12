"""Pure helpers of the dashboard (`app.py`): how an A/B change reads, which load levels the throughput curve
simulates, where a figure's legend goes, and the store that shares finished plans between browser sessions.

Plain data in, plain data out, no Streamlit: the dashboard formats with these and they are tested without a
browser (tests/test_dashboard_views.py). plotly figures are passed in, never imported here.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

# Between these factors of B over A a change reads as a percentage (-50% .. +100%); beyond them as a factor
# ("x12", "x0.08"): "+176,738%" says less than "x1,768" and hides that the two runs are not comparable.
PERCENT_BAND = (0.5, 2.0)

# The throughput curve's load levels, as fractions of the replica's capacity (the closed-loop rate it serves
# with its queue never empty): dense near 1, where the P99 bends, and one past it to show the knee.
LOAD_FRACTIONS = (0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1)
FALLBACK_RATE_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # of the sidebar's rate, when no capacity is known

# A horizontal legend under the plot area (the x axis title keeps its place above it): plotly's mode bar sits
# at the top right, where a legend at its default place covers it.
LEGEND_BELOW = {"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0,
                "xanchor": "left"}
LEGEND_ROOM_PX = 40  # bottom margin added for a one-row legend below the x axis title


def factor_text(factor: float) -> str:
    """B / A as a factor: "x12", "x1.8", "x0.31"; "" for an undefined one."""
    if not math.isfinite(factor):
        return ""
    if factor >= 100:
        return f"x{factor:,.0f}"
    if factor >= 1:
        return f"x{factor:.1f}"
    return f"x{factor:.2g}"


def _is_percent(change: float) -> bool:
    return PERCENT_BAND[0] <= 1 + change <= PERCENT_BAND[1]


def change_text(change: float) -> str:
    """A change B / A - 1: "+12.3%" within PERCENT_BAND, else a factor ("x12")."""
    if not math.isfinite(change):
        return ""
    return f"{change:+.1%}" if _is_percent(change) else factor_text(1 + change)


def interval_text(low: float, high: float) -> str:
    """An interval of B / A - 1, both ends in one form: percentages when both lie within PERCENT_BAND."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    if _is_percent(low) and _is_percent(high):
        return f"[{low:+.1%}, {high:+.1%}]"
    return f"[{factor_text(1 + low)}, {factor_text(1 + high)}]"


def saturated_label(saturated_a: bool, saturated_b: bool) -> str:
    """Which run saturated (requests still waiting when it ended): "", "A", "B" or "A and B"."""
    return " and ".join(n for n, s in (("A", saturated_a), ("B", saturated_b)) if s)


def ab_rows(changes: Iterable[Any], saturated_a: bool, saturated_b: bool) -> list[dict]:
    """The A/B table: one row per `capacity.truth.compare.Change`. A run that saturated has no steady state (its
    latencies grow with the run's length, and a short batch cap 'improves' TPOT by serving fewer requests), so
    its verdicts say so rather than reading 'better'."""
    sat = saturated_label(saturated_a, saturated_b)
    return [{"metric": c.metric, "A": round(c.a, 2), "B": round(c.b, 2), "B vs A": change_text(c.change),
             "95% interval": interval_text(c.low, c.high),
             "verdict": f"{c.verdict} ({sat} saturated)" if sat else c.verdict} for c in changes]


def load_levels(capacity_req_per_s: float | None, rate_per_s: float) -> list[float]:
    """Arrival rates for the throughput-vs-latency curve: up to 110% of the replica's capacity, past the knee;
    without a capacity, multiples of the sidebar's rate."""
    if capacity_req_per_s and capacity_req_per_s > 0 and math.isfinite(capacity_req_per_s):
        return [capacity_req_per_s * f for f in LOAD_FRACTIONS]
    return [rate_per_s * f for f in FALLBACK_RATE_FACTORS]


def legend_below(fig: Any, bottom_px: int = 50) -> Any:
    """Move a plotly figure's legend under the plot (LEGEND_BELOW), with room for it; returns the figure."""
    fig.update_layout(legend=LEGEND_BELOW, margin={"b": bottom_px + LEGEND_ROOM_PX})
    return fig


class SharedStore:
    """A small thread-safe least-recently-used store of finished results, shared by every browser session of one
    dashboard process. It holds plain data only: a cached function that drew Streamlit elements would replay
    them into blocks of another run (Streamlit's CacheReplayClosureError), so the computation runs uncached,
    with its own progress bar, and only its result is kept here."""

    def __init__(self, max_entries: int = 32) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(*parts: Any) -> str:
        """A key for plain-data inputs (JSON with sorted keys, hashed): equal inputs, equal keys."""
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> Any | None:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
