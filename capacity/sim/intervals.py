"""The two statistics a run's summary takes from scipy.stats, computed here with numpy and scipy.special:
importing scipy.stats costs each process about half a second of CPU more than scipy.special (measured with
scipy 1.17 on the 2-core bench machine), and a plan's pool workers each paid it for these two calls.

Both follow scipy 1.17.1's code step for step, so they give the same numbers bit for bit
(tests/test_intervals.py checks them against scipy.stats on many inputs):
- `percentile_ci`: `scipy.stats.bootstrap(..., method="percentile", vectorized=True)` of a one-sample statistic
  (`_resampling.py`: `bootstrap`, `_bootstrap_resample`): resamples drawn as `rng.integers(0, n, (batch, n))`,
  batch after batch, and the interval's ends as `scipy.stats.quantile(..., method="linear")` takes them
  (`_quantile.py`: `_quantile_hf`, Hyndman and Fan's type 7 written as (1 - g) y[j] + g y[j + 1]).
- `slope_greater`: `scipy.stats.linregress(x, y, alternative="greater")`'s slope and p-value (`_stats_py.py`:
  `linregress`, `_SimpleStudentT.sf` = `scipy.special.stdtr(df, -t)`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def _quantile_linear(theta: np.ndarray, p: np.ndarray) -> np.ndarray:
    """scipy.stats.quantile(theta, p, method="linear") of a 1-D array without NaN."""
    y = np.sort(theta)
    n = np.asarray(float(y.shape[-1]))
    jg = p * n + (1 - p)
    jp1 = jg // 1
    j = jp1 - 1
    g = jg % 1
    g[j < 0] = 0
    j = np.clip(j, 0.0, n - 1)
    jp1 = np.clip(jp1, 0.0, n - 1)
    return (1 - g) * y[j.astype(np.int64)] + g * y[jp1.astype(np.int64)]


def percentile_ci(x: np.ndarray, statistic: Callable[..., np.ndarray], rng: np.random.Generator, resamples: int,
                  confidence: float, batch: int | None = None) -> tuple[float, float]:
    """The bootstrap percentile interval of `statistic(sample, axis=-1)` over `resamples` resamples of the 1-D
    `x` (at least 2 values, no NaN), drawn from `rng` `batch` resamples at a time (None: all at once)."""
    n = x.shape[-1]
    step = batch or resamples or 1
    parts = []
    for k in range(0, resamples, step):
        i = rng.integers(0, n, (min(step, resamples - k), n), dtype="int64", endpoint=False)
        parts.append(statistic(x[..., i], axis=-1))
    theta = np.concatenate(parts, axis=-1)
    alpha = np.asarray((1 - confidence) / 2, dtype=theta.dtype)
    lo, hi = _quantile_linear(theta, np.stack((alpha, 1 - alpha), axis=-1))
    return float(lo), float(hi)


def slope_greater(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, one-sided p-value that the slope is > 0) of the least-squares line through (x, y) (more than two
    points, x not all equal)."""
    from scipy.special import stdtr

    tiny = 1.0e-20
    n = len(x)
    ssxm, ssxym, _, ssym = np.cov(x, y, bias=True).flat  # (scipy passes bias=1)
    r: Any
    if ssxm == 0.0 or ssym == 0.0:
        r = np.asarray(np.nan if ssxym == 0 else 0.0)[()]
    else:
        r = ssxym / np.sqrt(ssxm * ssym)
        if r > 1.0:
            r = 1.0
        elif r < -1.0:
            r = -1.0
    slope = ssxym / ssxm
    df = n - 2
    t = r * np.sqrt(df / ((1.0 - r + tiny) * (1.0 + r + tiny)))
    prob = np.asarray(stdtr(df, -t))
    return float(slope), float(prob[()] if prob.ndim == 0 else prob)
