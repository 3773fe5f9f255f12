"""Two of scipy.stats' functions, the arithmetic of scipy 1.17 operation for operation, without importing
scipy.stats: that import costs about a second of CPU in every process that runs a simulation (a plan's pool
workers each pay it), while these need only numpy and `scipy.special.stdtr` (a third of that).

- `linregress_greater(x, y)`: `scipy.stats.linregress(x, y, alternative="greater")`'s slope and p-value
  (scipy/stats/_stats_py.py, `linregress` and `_SimpleStudentT.sf`: stdtr(df, -t));
- `percentile_bootstrap(x, statistic, ...)`: `scipy.stats.bootstrap((x,), statistic, vectorized=True,
  method="percentile", ...)`'s interval for one 1-D sample (scipy/stats/_resampling.py, `bootstrap` and
  `_bootstrap_resample`: rng.integers(0, n, (batch, n)) per batch; the interval is `scipy.stats.quantile`'s
  default "linear" method, scipy/stats/_quantile.py `_quantile_hf`).

Both are pinned against scipy itself, bit for bit, in tests/test_exact_stats.py: a scipy release that changes
either shows there first.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

TINY = 1.0e-20  # scipy's linregress: keeps t finite at |r| = 1


def linregress_greater(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, one-sided p-value that the slope is > 0), as scipy.stats.linregress(x, y, alternative="greater")."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = len(x)
    if n < 2 or np.amax(x) == np.amin(x):
        raise ValueError("linregress needs two or more points with distinct x")
    ssxm, ssxym, _, ssym = np.cov(x, y, bias=True).flat  # scipy passes bias=1: the same (ddof 0)
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
    if n == 2:
        return float(slope), 1.0 if y[0] == y[1] else 0.0
    from scipy.special import stdtr

    df = n - 2
    t = r * np.sqrt(df / ((1.0 - r + TINY) * (1.0 + r + TINY)))
    return float(slope), float(np.asarray(stdtr(df, -t))[()])


def percentile_bootstrap(x: np.ndarray, statistic: Callable[..., np.ndarray], rng: np.random.Generator,
                         confidence: float, resamples: int, batch: int | None = None) -> tuple[float, float]:
    """The two-sided percentile bootstrap interval of `statistic` (vectorized, `axis=-1`) over the 1-D sample `x`,
    drawing from `rng` exactly as scipy.stats.bootstrap does, so `rng` ends in the same state."""
    x = np.asarray(x)
    n = x.shape[-1]
    step = batch or resamples or 1
    parts = []
    for k in range(0, resamples, step):
        i = rng.integers(0, n, size=(min(step, resamples - k), n), dtype="int64", endpoint=False)
        parts.append(statistic(x[..., i], axis=-1))
    theta = np.concatenate(parts, axis=-1)
    alpha = np.asarray((1 - confidence) / 2, dtype=theta.dtype)
    p = np.stack((alpha, 1 - alpha), axis=-1)
    # scipy.stats.quantile(theta, p, axis=-1), method "linear" (Hyndman & Fan 7): m = 1 - p
    y = np.sort(theta, axis=-1)
    m_ = np.asarray(y.shape[-1], dtype=y.dtype)
    jg = p * m_ + (1 - p)
    jp1 = jg // 1
    j = jp1 - 1
    g = jg % 1
    g = np.where(j < 0, 0.0, g)
    j = np.clip(j, 0.0, m_ - 1)
    jp1 = np.clip(jp1, 0.0, m_ - 1)
    ci = (1 - g) * y[j.astype(np.int64)] + g * y[jp1.astype(np.int64)]
    return float(ci[0]), float(ci[1])
