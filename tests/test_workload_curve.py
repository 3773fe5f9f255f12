"""Rate curves: closed-form integrals, thinning that draws the process it claims, fits that keep a trace's
volumes, curve files that load or fail with a line, and curve workloads through generate()."""
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import capacity
from capacity.curves import MAX_CURVE_POINTS, RateCurve, curve_arrivals, fit_curve, load_curve, save_curve
from capacity.errors import ConfigError
from capacity.files import validate
from capacity.workload import Arrivals, RequestClass, WorkloadSpec, generate, interarrival_gaps

CURVES = Path(capacity.__file__).parent / "data" / "curves"
STEP = [(0.0, 2.0), (10.0, 5.0), (30.0, 1.0)]
LINEAR = [(0.0, 0.0), (10.0, 4.0), (20.0, 4.0), (30.0, 1.0)]


# ---- closed forms, by hand ------------------------------------------------------------------------------

def test_step_integral_by_hand():
    c = RateCurve(points=STEP)
    assert c.integral(0, 10) == pytest.approx(20)
    assert c.integral(5, 35) == pytest.approx(2 * 5 + 5 * 20 + 1 * 5)  # the last rate holds after the last point
    assert c.integral(40, 50) == pytest.approx(10)
    assert c.integral(7, 7) == 0
    assert c.rate(np.array([-1, 0, 9.99, 10, 29, 30, 1e6])).tolist() == [0, 2, 2, 5, 5, 1, 1]
    assert (c.max_rate, c.mean_rate) == (5.0, pytest.approx(120 / 30))
    assert RateCurve(points=STEP, scale=3).integral(5, 35) == pytest.approx(3 * 115)


def test_step_integral_with_a_period():
    c = RateCurve(points=STEP, period_s=40)  # one period: 20 + 100 + 10 = 130
    assert c.integral(0, 40) == pytest.approx(130)
    assert c.integral(35, 95) == pytest.approx(5 + 130 + 20 + 25)
    assert c.integral(0, 4000) == pytest.approx(100 * 130)
    assert c.rate(np.array([35, 40, 45, 85])).tolist() == [1, 2, 2, 2]
    assert c.mean_rate == pytest.approx(130 / 40)


def test_linear_integral_trapezoids_by_hand():
    c = RateCurve(points=LINEAR, shape="linear")
    assert c.integral(0, 10) == pytest.approx(20)  # triangle 0 -> 4 over 10 s
    assert c.integral(20, 30) == pytest.approx(25)  # trapezoid 4 -> 1
    assert c.integral(5, 25) == pytest.approx(15 + 40 + 16.25)  # 2 -> 4, flat 4, 4 -> 2.5
    assert c.integral(30, 40) == pytest.approx(10)  # held at 1 after the last point
    assert c.rate(np.array([5, 15, 25, 100])).tolist() == pytest.approx([2, 4, 2.5, 1])
    assert c.mean_rate == pytest.approx(85 / 30)
    # periodic: the last point runs back to the first one's rate (0) at t = period_s
    p = RateCurve(points=LINEAR, shape="linear", period_s=40)
    assert p.integral(0, 40) == pytest.approx(90)
    assert p.integral(35, 45) == pytest.approx(1.25 + 5)
    assert p.integral(0, 80) == pytest.approx(180)
    assert p.rate(np.array([35, 45])).tolist() == pytest.approx([0.5, 2])
    assert p.cumulative(np.array([0, 40, 80])).tolist() == pytest.approx([0, 90, 180])


def test_integral_refuses_a_backwards_interval():
    with pytest.raises(ValueError, match="before t0"):
        RateCurve(points=STEP).integral(5, 1)


@pytest.mark.parametrize("points,extra,msg", [
    ([(1, 2)], {}, r"points\[0\]: the first point must be at t=0"),
    ([(0, 2), (5, 1), (5, 3)], {}, r"points\[2\]: t=5 is not after the previous point's t=5"),
    ([(0, 2), (5, -1)], {}, r"points\[1\]: rate -1 is negative"),
    ([(0, 2), (5, float("nan"))], {}, r"points\[1\]: .*must be finite"),
    ([(0, 0), (5, 0)], {}, "every rate is 0"),
    ([], {}, "at least one point"),
    ([(0, 1), (10, 2)], {"period_s": 10}, "period_s 10 must be after the last point's t=10"),
    ([(0, 1)], {"scale": 1e300, "points": [(0, 1e300)]}, "not finite"),
    ([(0, 1)], {"shape": "cubic"}, "shape"),
])
def test_bad_curves_name_the_field(points, extra, msg):
    with pytest.raises(ConfigError, match=msg):
        validate(RateCurve, {"points": points, **extra}, "c.yaml")


def test_too_many_points_are_refused_before_validation():
    with pytest.raises(ConfigError, match="more than the 100,000 allowed"):
        validate(RateCurve, {"points": [[float(i), 1.0] for i in range(MAX_CURVE_POINTS + 1)]}, "c.yaml")


# ---- thinning draws the process it claims ----------------------------------------------------------------

def test_constant_curve_gives_poisson_gaps():
    t = curve_arrivals(RateCurve(points=[(0, 5.0)]), np.random.default_rng(3), 5000)
    assert t.size == 5000 and np.all(np.diff(t) > 0)
    assert stats.kstest(np.diff(t, prepend=0.0), stats.expon(scale=0.2).cdf).pvalue > 0.01


def test_time_rescaled_diurnal_arrivals_are_unit_poisson():
    """Time-rescaling theorem: through its own cumulative rate, an NHPP becomes a rate-1 Poisson process."""
    c = load_curve(CURVES / "diurnal.csv").model_copy(update={"scale": 0.05})
    t = curve_arrivals(c, np.random.default_rng(4), 8000)
    assert stats.kstest(np.diff(c.cumulative(t), prepend=0.0), "expon").pvalue > 0.01
    # the test has power: the same times rescaled by the mean rate (as if it were constant) fail it
    assert stats.kstest(np.diff(t * c.mean_rate, prepend=0.0), "expon").pvalue < 1e-6


def test_two_level_step_counts_match_the_integral_per_segment():
    c = RateCurve(points=[(0, 2.0), (50, 8.0)], period_s=100)
    t = curve_arrivals(c, np.random.default_rng(5), 1_000_000, duration_s=4000)
    assert 19_000 < t.size < 21_000 and t.max() <= 4000
    counts, _ = np.histogram(t, bins=np.arange(0, 4001, 50))
    mean = np.array([c.integral(a, a + 50) for a in range(0, 4000, 50)])
    assert set(mean.round(9)) == {100.0, 400.0}
    assert np.all(np.abs(counts - mean) < 4 * np.sqrt(mean))
    low, high = counts[0::2].sum(), counts[1::2].sum()
    assert abs(low - 4000) < 4 * np.sqrt(4000) and abs(high - 16000) < 4 * np.sqrt(16000)


def test_linear_ramp_passes_chi_square_per_bin():
    c = RateCurve(points=[(0, 0.0), (1000, 40.0)], shape="linear")
    t = curve_arrivals(c, np.random.default_rng(6), 1_000_000, duration_s=1000)
    edges = np.arange(0, 1001, 50.0)
    obs, _ = np.histogram(t, bins=edges)
    exp = np.diff(c.cumulative(edges))
    assert exp.sum() == pytest.approx(20_000)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert stats.chi2.sf(chi2, df=len(obs)) > 0.01  # known means, not fitted: df = bins
    flat = np.full_like(exp, exp.mean())  # and a flat rate of the same volume is rejected
    assert stats.chi2.sf(float(((obs - flat) ** 2 / flat).sum()), df=len(obs)) < 1e-6


def test_zero_tail_errors_instead_of_looping():
    c = RateCurve(points=[(0, 1.0), (10, 0.0)])
    with pytest.raises(ConfigError, match=r"rate is 0 from t=10 s on, and only \d+ of 1,000 requests"):
        curve_arrivals(c, np.random.default_rng(0), 1000)
    t = curve_arrivals(c, np.random.default_rng(0), 1000, duration_s=50)  # a duration stops at the end instead
    assert 0 < t.size < 40 and t.max() < 10


def test_a_rare_spike_is_refused_up_front():
    c = RateCurve(points=[(0, 0.001), (86399, 1e6)], period_s=86400)
    with pytest.raises(ConfigError, match="candidate times at its peak 1e\\+06/s"):
        curve_arrivals(c, np.random.default_rng(0), 10_000)


# ---- fits keep a trace's volumes ---------------------------------------------------------------------------

def test_fit_curve_reproduces_per_bin_counts_exactly(tmp_path):
    day = load_curve(CURVES / "diurnal.yaml").model_copy(update={"scale": 0.05})
    t = curve_arrivals(day, np.random.default_rng(7), 1_000_000, duration_s=86_399)
    for period in (86400.0, None):
        fit = fit_curve(t, 900, period_s=period)
        edges = np.arange(0, 86401, 900.0)
        counts, _ = np.histogram(t, bins=edges)
        vol = np.diff(fit.cumulative(edges))
        assert np.abs(vol - counts).max() < 1e-6 and np.array_equal(np.rint(vol), counts)
        assert fit.integral(0, 10 * 86400) == pytest.approx(t.size * (10 if period else 1))  # no period: 0 after
        for name in ("fit.csv", "fit.yaml"):
            save_curve(fit, tmp_path / name)
            assert load_curve(tmp_path / name) == fit


def test_fit_curve_partial_last_bin_and_linear_midpoints():
    t = np.array([1.0, 2.0, 95.0, 99.0])
    fit = fit_curve(t, 30, period_s=100)  # bins [0,30) [30,60) [60,90) [90,100)
    assert [r for _, r in fit.points] == pytest.approx([2 / 30, 0, 0, 2 / 10])
    assert fit.integral(90, 100) == pytest.approx(2)
    # linear: points at the bins' middles; a bin whose neighbours' counts are in a line keeps its volume
    times = np.concatenate([k * 10 + np.linspace(0.5, 9.5, k + 1) for k in range(8)])
    lin = fit_curve(times, 10, shape="linear")
    assert [lin.integral(10 * k, 10 * k + 10) for k in range(1, 7)] == pytest.approx(list(range(2, 8)))


@pytest.mark.parametrize("times,bin_s,msg", [([], 10, "no arrival times"), ([1.0, -2.0], 10, ">= 0"),
                                             ([1.0], 0, "bin_s"), (np.arange(0, 1e6, 1e3), 1e-3, "use wider bins")])
def test_fit_curve_bad_input(times, bin_s, msg):
    with pytest.raises(ConfigError, match=msg):
        fit_curve(np.asarray(times, dtype=float), bin_s)


# ---- curve files -------------------------------------------------------------------------------------------

def test_bundled_diurnal_curves_are_the_same_day():
    csv_c, yaml_c = load_curve(CURVES / "diurnal.csv"), load_curve(CURVES / "diurnal.yaml")
    assert csv_c == yaml_c
    assert (csv_c.shape, csv_c.period_s, len(csv_c.points)) == ("linear", 86400, 24)
    night, noon = csv_c.rate(3.5 * 3600), csv_c.rate(12 * 3600)
    assert noon == pytest.approx(5 * night) and csv_c.max_rate == noon


def test_csv_and_yaml_units_convert(tmp_path):
    (tmp_path / "h.csv").write_text("hour,rate_per_hour\n0,7200\n1,3600\n")
    assert load_curve(tmp_path / "h.csv").points == [(0.0, 2.0), (3600.0, 1.0)]
    (tmp_path / "m.csv").write_text("# a comment\nminute,rate_per_minute\n\n0,60\n2,120\n# shape: linear\n")
    m = load_curve(tmp_path / "m.csv")
    assert (m.points, m.shape) == ([(0.0, 1.0), (120.0, 2.0)], "linear")
    (tmp_path / "s.csv").write_text("t,rate\n0,1.5\n")
    assert load_curve(tmp_path / "s.csv").points == [(0.0, 1.5)]
    (tmp_path / "c.yaml").write_text("unit: per_hour\ntime_unit: min\nperiod_s: 7200\npoints: [[0, 3600], [30, 1800]]\n")
    y = load_curve(tmp_path / "c.yaml")
    assert (y.points, y.period_s, y.shape) == ([(0.0, 1.0), (1800.0, 0.5)], 7200.0, "step")


@pytest.mark.parametrize("name,text,msg", [
    ("a.csv", "t,rate\n0,1\n5,2\n5,3\n", r"line 4: t=5 is not after the previous point's t=5"),
    ("a.csv", "t,rate\n0,1\n5,-2\n", r"line 3: rate -2 is negative"),
    ("a.csv", "t,rate\n0,1\n5,nan\n", r"line 3: t=5, rate=nan: times and rates must be finite"),
    ("a.csv", "t,rate\n0,1\n5,lots\n", r"line 3: '5,lots' is not two numbers"),
    ("a.csv", "hour,rate\n0,1\n2,\n", r"line 3: '2,' is not two numbers"),  # an hour without its rate
    ("a.csv", "t,rate\n0,1,2\n", r"line 2: expected 2 values"),
    ("a.csv", "", "no header"),
    ("a.csv", "t,rate\n", "no points after the header"),
    ("a.csv", "when,rate\n0,1\n", r"line 1: header 'when,rate' is not a time and a rate column"),
    ("a.csv", "# period_s: soon\nt,rate\n0,1\n", r"line 1: period_s 'soon' is not a number"),
    ("a.csv", "# shape: cubic\nt,rate\n0,1\n", "shape"),
    ("a.yaml", "", "expected a mapping"),
    ("a.yaml", "points: [[0, 1], [5, '2']]\n", r"points\[1\]: expected \[t, rate\] numbers, got \[5, '2'\]"),
    ("a.yaml", "points: [[0, 1], [-1, 2]]\n", r"points\[1\]: t=-1 is not after"),
    ("a.yaml", "points: [[0, 1]]\nunit: per_day\n", "unit 'per_day' is not one of"),
    ("a.yaml", "points: [[0, 1]]\nperod_s: 5\n", "perod_s: unknown field"),
    ("a.txt", "t,rate\n0,1\n", "expected a .csv, .yaml or .json file"),
])
def test_bad_curve_files_name_the_file_line_and_value(tmp_path, name, text, msg):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg) as e:
        load_curve(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_too_many_csv_points_and_folders_and_missing_files(tmp_path):
    p = tmp_path / "big.csv"
    p.write_text("t,rate\n" + "".join(f"{i},1\n" for i in range(MAX_CURVE_POINTS + 1)))
    with pytest.raises(ConfigError, match=f"line {MAX_CURVE_POINTS + 2}: more than the 100,000 points"):
        load_curve(p)
    with pytest.raises(ConfigError, match="is a folder"):
        load_curve(tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        load_curve(tmp_path / "nope.csv")


# ---- curve workloads through generate() --------------------------------------------------------------------

def _spec(n=2000, **arr):
    curve = RateCurve(points=[(0, 2.0), (60, 8.0)], period_s=120)
    return WorkloadSpec(arrivals=Arrivals(kind="curve", curve=curve, **arr), num_requests=n,
                        classes=[RequestClass(name="chat", weight=3), RequestClass(name="batch", weight=1, priority=5)])


def test_generate_curve_is_seeded_sorted_and_counted():
    a, b = generate(_spec(), np.random.default_rng(11)), generate(_spec(), np.random.default_rng(11))
    assert a == b and a != generate(_spec(), np.random.default_rng(12))
    t = np.array([r.arrival_s for r in a])
    assert len(a) == 2000 and [r.id for r in a] == list(range(2000)) and np.all(np.diff(t) >= 0)
    assert t[-1] == pytest.approx(2000 / 5.0, rel=0.1)  # mean rate 5/s
    assert np.mean([r.cls == 1 for r in a]) == pytest.approx(0.25, abs=0.03)


def test_generate_curve_stops_at_duration():
    reqs = generate(_spec(n=1_000_000, duration_s=600), np.random.default_rng(13))
    t = np.array([r.arrival_s for r in reqs])
    assert t.max() <= 600 and abs(len(reqs) - 3000) < 4 * np.sqrt(3000)
    with pytest.raises(ConfigError, match="no request arrived in the first 0.001 s"):
        generate(_spec(duration_s=0.001), np.random.default_rng(13))


def test_generate_curve_from_a_file_and_from_yaml_fields():
    spec = validate(WorkloadSpec, {"arrivals": {"kind": "curve", "curve_file": str(CURVES / "diurnal.csv")},
                                   "num_requests": 500}, "w.yaml")
    t = [r.arrival_s for r in generate(spec, np.random.default_rng(1))]
    assert len(t) == 500 and t[-1] == pytest.approx(500 / 3.0, rel=0.3)  # midnight: about 2.4-3 req/s
    inline = validate(WorkloadSpec, {"arrivals": {"kind": "curve", "curve": {
        "points": [[0, 1], [3600, 2.5]], "shape": "linear", "period_s": 7200}}}, "w.yaml")
    assert inline.arrivals.curve is not None and inline.arrivals.curve.points[1] == (3600.0, 2.5)
    missing = WorkloadSpec(arrivals=Arrivals(kind="curve", curve_file="/nonexistent/day.csv"))
    with pytest.raises(ConfigError, match="day.csv': curve file not found"):
        generate(missing, np.random.default_rng(0))


@pytest.mark.parametrize("arr,msg", [
    ({"kind": "curve"}, "need one of curve"),
    ({"kind": "curve", "curve_file": "a.csv", "curve": {"points": [[0, 1]]}}, "need one of curve"),
    ({"kind": "curve", "curve_file": "a.csv", "rate_per_s": 3}, "rate_per_s 3: curve arrivals take their rate"),
    ({"kind": "poisson", "rate_per_s": 3, "duration_s": 60}, "duration_s: only curve arrivals"),
    ({"kind": "poisson", "rate_per_s": 3, "curve_file": "a.csv"}, "curve_file: only curve arrivals"),
    ({"kind": "curve", "curve": {"points": [[0, 1], [0, 2]]}}, r"arrivals.curve: points\[1\]: t=0 is not after"),
    ({"kind": "curve", "curve": {"points": [[0, True]]}}, r"arrivals.curve.points.0.1"),
])
def test_bad_curve_arrivals_name_the_field(arr, msg):
    with pytest.raises(ConfigError, match=msg):
        validate(WorkloadSpec, {"arrivals": arr}, "w.yaml")


def test_curve_arrivals_have_no_stationary_gaps():
    with pytest.raises(ConfigError, match="curve_arrivals"):
        interarrival_gaps(_spec().arrivals, np.random.default_rng(0), 5)


def test_a_plan_refuses_a_curve_in_one_line(tmp_path):
    """The planner sizes one steady rate: a curve in a plan scenario is refused, not replaced by a rate."""
    from tests.conftest import run_cli

    sc = tmp_path / "sc.yaml"
    sc.write_text("model: llama-3.1-8b\nworkload:\n  arrivals: {kind: curve, curve: {points: [[0, 1], [60, 3]]}}\n")
    r = run_cli("plan", "-m", str(sc))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "arrivals.kind curve" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_simulate_runs_a_curve_workload_and_reports_its_mean_rate(tmp_path):
    """`simulate --workload` with a curve: requests arrive along it, the offered rate is the curve's mean."""
    import json

    from tests.conftest import run_cli

    wl = tmp_path / "wl.yaml"
    wl.write_text("arrivals: {kind: curve, curve: {points: [[0, 1], [100, 3]], period_s: 200}}\n"
                  "input_len: {kind: fixed, value: 128}\noutput_len: {kind: fixed, value: 16}\nnum_requests: 400\n")
    r = run_cli("simulate", "--model", "llama-3.1-8b", "--workload", str(wl), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["offered_rate_per_s"] == pytest.approx(2.0)  # (1 x 100 + 3 x 100) / 200, by hand
    assert not out["saturated"]


# ---- a curve per request class ----------------------------------------------------------------------------------

def test_sum_of_curves_by_hand():
    """Linear, period 100: A = (0, 2), (50, 4); B = (0, 1), (20, 3). At the union points 0, 20, 50: A is 2, 2.8,
    4 and B is 1, 3, 3 - (30/80) x 2 = 2.25 (B falls from 3 at t=20 back to 1 at t=100)."""
    from capacity.curves import sum_curves

    a = RateCurve(points=[(0, 2.0), (50, 4.0)], shape="linear", period_s=100)
    b = RateCurve(points=[(0, 1.0), (20, 3.0)], shape="linear", period_s=100)
    s = sum_curves([a, b])
    assert s.points == [(0.0, 3.0), (20.0, pytest.approx(5.8)), (50.0, pytest.approx(6.25))]
    t = np.linspace(0, 300, 601)
    np.testing.assert_allclose(s.rate(t), a.rate(t) + b.rate(t), atol=1e-12)
    assert s.integral(0, 100) == pytest.approx(a.integral(0, 100) + b.integral(0, 100))
    with pytest.raises(ConfigError, match="one shape and one period_s"):
        sum_curves([a, RateCurve(points=[(0, 1.0)], shape="step", period_s=100)])


def test_classes_on_curves_of_their_own():
    """Chat follows the workload's day curve (busy in the first half), batch a night curve of its own (busy in
    the second half): each class's counts per half match its own curve's integral (Poisson, 4 sd), the
    priorities stay with their classes, and the total rate is the sum."""
    day = RateCurve(points=[(0, 8.0), (500, 1.0)], period_s=1000)
    night = RateCurve(points=[(0, 0.5), (500, 6.0)], period_s=1000)
    spec = WorkloadSpec(arrivals=Arrivals(kind="curve", curve=day, duration_s=3000), num_requests=100_000,
                        classes=[RequestClass(name="chat", priority=0),
                                 RequestClass(name="batch", priority=1, curve=night)])
    reqs = generate(spec, np.random.default_rng(4))
    t = np.array([r.arrival_s for r in reqs])
    cls = np.array([r.cls for r in reqs])
    assert np.all(np.diff(t) >= 0) and [r.id for r in reqs] == list(range(len(reqs)))
    assert all(r.priority == r.cls for r in reqs)
    first = (t % 1000) < 500
    for c, curve in ((0, day), (1, night)):
        for half, (t0, t1) in ((first, (0, 500)), (~first, (500, 1000))):
            want = 3 * curve.integral(t0, t1)
            assert abs(np.sum((cls == c) & half) - want) < 4 * np.sqrt(want), (c, t0)
    assert spec.total_curve().points == [(0.0, 8.5), (500.0, 7.0)]


@pytest.mark.parametrize("kw, msg", [
    (dict(arrivals=Arrivals(kind="poisson", rate_per_s=1.0),
          classes=[RequestClass(name="a"), RequestClass(name="b", curve=RateCurve(points=[(0, 1.0)]))]),
     "a class curve needs curve arrivals"),
    (dict(arrivals=Arrivals(kind="curve", curve=RateCurve(points=[(0, 1.0)])),
          classes=[RequestClass(name="b", curve=RateCurve(points=[(0, 1.0)]))]),
     "every class has a curve of its own"),
])
def test_bad_class_curves_name_the_field(kw, msg):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=msg):
        WorkloadSpec(**kw)
    spec = WorkloadSpec(arrivals=Arrivals(kind="curve", curve=RateCurve(points=[(0, 1.0)], period_s=10)),
                        classes=[RequestClass(name="a"), RequestClass(name="b", curve=RateCurve(points=[(0, 1.0)]))])
    with pytest.raises(ConfigError, match="one shape and one period_s"):
        generate(spec, np.random.default_rng(0))
