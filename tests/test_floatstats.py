"""``floatstats`` equals numpy bit for bit (the summary was computed with numpy; its values must not move)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.floatstats import float64_sum, mean, percentiles

# Times and token counts as a run produces them: non-negative, from microseconds to days, often repeated.
times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
signed = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
# Lengths through every branch: < 8 (plain loop), <= 128 (8 accumulators and a tail), longer (split in halves).
lists = st.one_of(st.lists(times, min_size=1, max_size=12), st.lists(times, min_size=100, max_size=140),
                  st.lists(signed, min_size=1, max_size=600))


@settings(max_examples=300, deadline=None)
@given(lists)
def test_sum_and_mean_equal_numpy(values):
    array = np.asarray(values, dtype=float)
    assert float64_sum(values) == float(array.sum())
    assert mean(values) == float(array.mean())


@settings(max_examples=300, deadline=None)
@given(lists, st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=4))
def test_percentiles_equal_numpy(values, qs):
    assert percentiles(values, qs) == [float(v) for v in np.percentile(np.asarray(values, dtype=float), qs)]


def test_summary_quantiles_on_repeated_values():
    values = [0.25, 3.0, 3.0, 7.5, 0.1 + 0.2]
    assert percentiles(values, [50, 90, 99]) == [float(v) for v in np.percentile(values, [50, 90, 99])]


def test_long_list_uses_pairwise_not_sequential_summation():
    """A list where the order of additions shows: numpy's pairwise sum differs from ``sum`` here, and ours follows numpy."""
    values = [0.1 * (i % 7) + 1e-3 * i for i in range(5000)]
    assert float64_sum(values) == float(np.asarray(values).sum())
    assert float64_sum(values) != sum(values)
