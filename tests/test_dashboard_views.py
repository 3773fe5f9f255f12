"""The dashboard's pure view helpers (capacity.io.dashboard), without Streamlit or a browser: how an A/B change
reads, the load levels of the throughput curve, the legend's place, the store that shares finished plans."""
import math
import threading
from types import SimpleNamespace

import pytest

from capacity.io.dashboard import (
    LEGEND_BELOW,
    SharedStore,
    ab_rows,
    change_text,
    factor_text,
    interval_text,
    legend_below,
    load_levels,
    saturated_label,
)


def test_small_changes_read_as_percentages_large_ones_as_factors():
    assert change_text(0.123) == "+12.3%" and change_text(-0.5) == "-50.0%" and change_text(1.0) == "+100.0%"
    # the "+176,738%": B's P99 TTFT 1,768 times A's
    assert change_text(1767.38) == "x1,768"
    assert change_text(10.5) == "x11.5" and change_text(-0.92) == "x0.08" and change_text(-0.9958) == "x0.0042"
    assert change_text(math.nan) == "" and factor_text(math.inf) == ""


def test_an_interval_uses_one_form_for_both_ends():
    assert interval_text(-0.05, 0.02) == "[-5.0%, +2.0%]"
    assert interval_text(0.5, 3.0) == "[x1.5, x4.0]"  # one end beyond the band: both as factors
    assert interval_text(math.nan, 0.1) == ""


def change(metric, a, b, low, high, verdict):
    return SimpleNamespace(metric=metric, a=a, b=b, change=b / a - 1, low=low, high=high, verdict=verdict)


def test_ab_rows_flag_a_saturated_run():
    cs = [change("p99_ttft", 74.0, 130_000.0, 1500.0, 1900.0, "worse"),
          change("mean_tpot", 12.0, 9.0, -0.3, -0.2, "better")]
    rows = ab_rows(cs, saturated_a=False, saturated_b=True)
    assert [r["verdict"] for r in rows] == ["worse (B saturated)", "better (B saturated)"]
    assert rows[0]["B vs A"] == "x1,757" and rows[1]["B vs A"] == "-25.0%"
    assert rows[0]["A"] == 74.0 and rows[0]["B"] == 130_000.0
    assert [r["verdict"] for r in ab_rows(cs, False, False)] == ["worse", "better"]
    assert saturated_label(True, True) == "A and B" and saturated_label(False, False) == ""


def test_load_levels_reach_past_the_capacity():
    rates = load_levels(10.0, 8.0)
    assert max(rates) == pytest.approx(11.0) and rates == sorted(rates) and min(rates) == pytest.approx(2.0)
    assert sum(r > 8.0 for r in rates) >= 3  # dense near the knee
    assert load_levels(None, 8.0) == [2.0, 4.0, 6.0, 8.0, 12.0, 16.0]
    assert load_levels(0.0, 4.0)[-1] == 8.0


def test_legend_goes_below_the_plot():
    go = pytest.importorskip("plotly.graph_objects")
    fig = legend_below(go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="a")))
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.yanchor == LEGEND_BELOW["yanchor"]
    assert fig.layout.legend.y == 0 and fig.layout.legend.yref == "container" and fig.layout.margin.b >= 80


def test_store_keeps_the_most_recent_entries():
    store = SharedStore(max_entries=2)
    k = [store.key({"rate": r}, "card") for r in (1, 2, 3)]
    assert store.key({"b": 1, "a": 2}) == store.key({"a": 2, "b": 1}) and len(set(k)) == 3
    store.put(k[0], "one")
    store.put(k[1], "two")
    assert store.get(k[0]) == "one"  # now the most recent: the next put drops k[1]
    store.put(k[2], "three")
    assert store.get(k[1]) is None and store.get(k[0]) == "one" and store.get(k[2]) == "three" and len(store) == 2
    with pytest.raises(ValueError):
        SharedStore(0)


def test_store_is_safe_across_threads():
    store = SharedStore(max_entries=32)

    def work(i):
        for j in range(200):
            store.put(store.key(i, j), j)
            store.get(store.key(i, j // 2))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 32
