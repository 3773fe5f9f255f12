"""capacity.sim.intervals against scipy.stats, bit for bit: the bootstrap percentile interval of the P99 (all at
once and in batches, small and large samples, ties) and the TTFT trend's slope and one-sided p-value."""
import numpy as np
import pytest
from scipy import stats

from capacity.sim.intervals import percentile_ci, slope_greater
from capacity.sim.metrics import p99_ci


def _p99(a, axis):
    return np.percentile(a, 99, axis=axis)


@pytest.mark.parametrize("n, resamples, batch, confidence", [
    (100, 400, None, 0.95), (137, 400, 7, 0.95), (1000, 400, None, 0.9), (2500, 399, 64, 0.95), (300, 50, None, 0.5)])
@pytest.mark.parametrize("kind", ["lognormal", "ties"])
def test_bootstrap_interval_is_scipys(n, resamples, batch, confidence, kind):
    data = np.random.default_rng(n)
    x = data.lognormal(0, 1, n) if kind == "lognormal" else data.integers(0, 5, n).astype(float)
    ours = percentile_ci(x, _p99, np.random.default_rng(3), resamples, confidence, batch)
    res = stats.bootstrap((x,), _p99, vectorized=True, batch=batch, n_resamples=resamples,
                          confidence_level=confidence, method="percentile", random_state=np.random.default_rng(3))
    theirs = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    assert ours == theirs
    assert ours[0] <= np.percentile(x, 99) + 1e-12 or kind == "ties"


def test_p99_ci_leaves_the_generator_where_scipy_does():
    """The run's generator goes on to the next metric's interval: the same draws consumed as by scipy."""
    x = np.random.default_rng(0).exponential(1.0, 500)
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    p99_ci(x, a)
    stats.bootstrap((x,), _p99, vectorized=True, n_resamples=400, method="percentile", random_state=b)
    assert a.integers(0, 1 << 62) == b.integers(0, 1 << 62)


@pytest.mark.parametrize("seed", range(30))
def test_trend_is_scipys_linregress(seed):
    rng = np.random.default_rng(seed)
    n = 20 if seed % 3 else int(rng.integers(3, 40))
    x = np.sort(rng.uniform(0, 100, n))
    y = rng.normal(0.2, 0.05, n) + (seed % 4 - 1.5) * 1e-3 * x
    lr = stats.linregress(x, y, alternative="greater")
    assert slope_greater(x, y) == (float(lr.slope), float(lr.pvalue))


def test_trend_of_a_perfect_line():
    x = np.arange(20.0)
    for y in (2.0 * x + 1.0, -0.5 * x):
        lr = stats.linregress(x, y, alternative="greater")
        assert slope_greater(x, y) == (float(lr.slope), float(lr.pvalue))
