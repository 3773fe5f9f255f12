"""capacity.sim.exact_stats against scipy.stats itself: the same numbers bit for bit and the generator left in
the same state, on data shaped like a plan's (TTFT batch means, P99 bootstraps of a few hundred to a few thousand
latencies) and on awkward cases (ties, a perfect line, a constant sample, batches)."""
import numpy as np
import pytest
from scipy import stats

from capacity.sim.exact_stats import linregress_greater, percentile_bootstrap


def p99(a, axis):
    return np.percentile(a, 99, axis=axis)


@pytest.mark.parametrize("seed", range(40))
def test_linregress_matches_scipy(seed):
    g = np.random.default_rng(seed)
    n = int(g.integers(3, 40))
    x = np.sort(g.uniform(0, 600, n))
    y = 0.2 + g.normal(0, 0.05, n) + (x * g.uniform(-1e-3, 1e-3) if seed % 3 else 0.0)
    ref = stats.linregress(x, y, alternative="greater")
    assert linregress_greater(x, y) == (float(ref.slope), float(ref.pvalue))


@pytest.mark.parametrize("y", [[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0], [1.0, 1.0, 1.0, 2.0], [0.5, 0.5]])
def test_linregress_edges_match_scipy(y):
    x = np.arange(len(y), dtype=float)
    ref = stats.linregress(x, np.array(y), alternative="greater")
    assert linregress_greater(x, np.array(y)) == (float(ref.slope), float(ref.pvalue))


def test_linregress_p_value_by_hand():
    # y = (-0.1, 1.1, 1.9, 3.1) over x = 0..3: Sxx = 5, Sxy = 5.2, Syy = 5.44, so slope 1.04, r^2 = 27.04 / 27.2,
    # t^2 = 2 r^2 / (1 - r^2) = 338 on 2 degrees of freedom, whose one-sided p is 1/2 - t / (2 sqrt(2 + t^2))
    slope, p = linregress_greater(np.arange(4.0), np.array([-0.1, 1.1, 1.9, 3.1]))
    assert slope == pytest.approx(1.04)
    assert p == pytest.approx(0.5 - np.sqrt(338) / (2 * np.sqrt(340)), rel=1e-9)


@pytest.mark.parametrize("n,batch", [(100, None), (257, None), (1000, None), (3000, None), (500, 7), (400, 400)])
def test_bootstrap_matches_scipy(n, batch):
    for seed in range(5):
        x = np.random.default_rng(100 + seed).lognormal(-2, 1, n)
        r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
        ref = stats.bootstrap((x,), p99, vectorized=True, batch=batch, n_resamples=400, confidence_level=0.95,
                              method="percentile", random_state=r1)
        got = percentile_bootstrap(x, p99, r2, 0.95, 400, batch)
        assert got == (float(ref.confidence_interval.low), float(ref.confidence_interval.high))
        assert r1.random() == r2.random()  # the generator left where scipy leaves it: later draws unchanged


def test_bootstrap_ties_and_constant_sample():
    for x in (np.repeat([0.1, 0.2, 0.3], 50), np.full(120, 0.25)):
        r1, r2 = np.random.default_rng(3), np.random.default_rng(3)
        with np.errstate(all="ignore"):
            ref = stats.bootstrap((x,), p99, vectorized=True, n_resamples=400, confidence_level=0.9,
                                  method="percentile", random_state=r1)
        assert percentile_bootstrap(x, p99, r2, 0.9, 400) == (float(ref.confidence_interval.low),
                                                             float(ref.confidence_interval.high))
