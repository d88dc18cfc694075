import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from heteroauto.layer_dp import INF, _window_min, _window_min_sorted, _window_min_stacked
from heteroauto.orders_dp import _least_fill


def brute_window_min(values, lows, highs):
    rows, width = values.shape
    out = np.full((rows, width), INF)
    for r in range(rows):
        for y in range(width):
            inside = [values[r, x] for x in range(y - highs[r], y - lows[r] + 1) if 0 <= x < width]
            out[r, y] = min(inside, default=INF)
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 24))
def test_window_min_equals_the_minimum_of_each_window_including_empty_and_clipped_windows(seed, rows, width):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 9, (rows, width)).astype(float)
    values[rng.random((rows, width)) < 0.3] = INF
    lows = rng.integers(0, width + 3, rows)
    highs = lows + rng.integers(-2, width + 3, rows)
    expected = brute_window_min(values, lows, highs)
    assert np.array_equal(_window_min(values, lows, highs), expected)
    clipped = np.minimum(highs, width - 1)
    assert np.array_equal(_window_min_sorted(values, lows, clipped), expected)
    if clipped.max() >= 0:
        assert np.array_equal(_window_min_stacked(values, lows, clipped), expected)


def brute_least_fill(count, rates, rooms):
    splits = itertools.product(*[range(1, room + 1) for room in rooms])
    return min((sum(r * n for r, n in zip(rates, split)) for split in splits if sum(split) == count), default=INF)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 4)), max_size=4), st.integers(0, 12))
def test_least_fill_is_the_cheapest_split_with_one_to_room_layers_per_group(groups, count):
    rates = np.array([float(rate) for rate, _ in groups])
    rooms = np.array([float(room) for _, room in groups])
    least = _least_fill(np.array([float(count)]), rates, rooms)[0]
    assert least == brute_least_fill(count, [rate for rate, _ in groups], [room for _, room in groups])
