import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from heteropp.auto.layer_dp import INF, _window_min


def brute_window_min(values, lows, highs):
    rows, width = values.shape
    out = np.full((rows, width), INF)
    for r in range(rows):
        for y in range(width):
            inside = [values[r, x] for x in range(y - highs[r], y - lows[r] + 1) if 0 <= x < width]
            out[r, y] = min(inside, default=INF)
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 6), st.integers(1, 24))
def test_window_min_equals_the_minimum_of_each_window_including_empty_and_clipped_windows(seed, rows, width):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 9, (rows, width)).astype(float)
    values[rng.random((rows, width)) < 0.3] = INF
    lows = rng.integers(0, width + 3, rows)
    highs = lows + rng.integers(-2, width + 3, rows)
    assert np.array_equal(_window_min(values, lows, highs), brute_window_min(values, lows, highs))
