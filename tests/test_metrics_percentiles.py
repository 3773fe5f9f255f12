"""`weighted_percentiles`: the inverted-CDF percentiles of a weighted sample, sorted once for all of them, the
same as `weighted_percentile` one at a time; values worked by hand."""
import math

import numpy as np

from capacity.sim.metrics import weighted_percentile, weighted_percentiles


def test_hand_worked_values():
    v = np.array([3.0, 1.0, 2.0, 4.0])
    # equal weights: sorted 1, 2, 3, 4, cumulative 1..4; P50 is the first with cum >= 2 (2.0), P90 >= 3.6 (4.0)
    assert weighted_percentiles(v, np.ones(4), (50, 90)) == [2.0, 4.0]
    # the 4.0 seen by 5 tokens: cumulative 1, 2, 3, 8 of the sorted values; P25 needs >= 2 (2.0), P50 >= 4 (4.0)
    w = np.array([1.0, 1.0, 1.0, 5.0])  # in the order of v: the 5 is 4.0's
    assert weighted_percentiles(v, w, (25, 50, 99)) == [2.0, 4.0, 4.0]
    assert all(math.isnan(x) for x in weighted_percentiles(np.array([]), np.array([]), (50, 99)))


def test_same_as_the_expanded_sample():
    """Whole-token weights: each value repeated as many times as its weight, numpy's inverted-CDF percentile."""
    rng = np.random.default_rng(7)
    v, w = rng.exponential(0.02, 5000), rng.integers(1, 8, 5000)
    qs = (50, 90, 95, 99, 99.9)
    expanded = [float(np.percentile(np.repeat(v, w), q, method="inverted_cdf")) for q in qs]
    assert weighted_percentiles(v, w.astype(float), qs) == expanded
    assert [weighted_percentile(v, w.astype(float), q) for q in qs] == expanded
