import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from heteroauto.sharding import absorber_bound, lower_bound, objective, shard_layers


def brute_force(total, pps, compute, update, caps, b, alpha):
    weights = [(b - alpha) * t + u for t, u in zip(compute, update)]
    best = None
    ranges = [range(p, p * k + 1) for p, k in zip(pps, caps)]
    for layers in itertools.product(*ranges):
        if sum(layers) == total:
            value = objective(layers, pps, compute, weights, alpha)
            best = value if best is None else min(best, value)
    return best


problems = st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.integers(1, 14), st.lists(st.integers(1, 3), min_size=n, max_size=n),
    st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n), st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n),
    st.lists(st.integers(1, 8), min_size=n, max_size=n), st.integers(1, 12), st.sampled_from([0.0, 0.5, 1.0])))


@settings(max_examples=300, deadline=None)
@given(problems)
def test_layer_sharding_is_optimal_over_all_layer_vectors(problem):
    total, pps, compute, update, caps, b, alpha = problem
    exact = brute_force(total, pps, compute, update, caps, b, alpha)
    solved = shard_layers(total, pps, compute, update, caps, b, alpha)
    if exact is None:
        assert solved is None
        return
    value, layers = solved
    assert sum(layers) == total
    assert all(p <= l <= p * k for l, p, k in zip(layers, pps, caps))
    assert abs(value - exact) <= 1e-9 * exact
    assert lower_bound(total, pps, compute, update, caps, b, alpha) <= value * (1 + 1e-9)
    weights = [(b - alpha) * t + u for t, u in zip(compute, update)]
    absorbers = [(p, p / w if w > 0 else float("inf"), p * k, t, w) for p, k, t, w in zip(pps, caps, compute, weights)]
    assert absorber_bound(total, absorbers, alpha) <= value * (1 + 1e-9)


def test_faster_groups_get_more_layers():
    value, layers = shard_layers(12, [1, 1], [1.0, 2.0], [0.0, 0.0], [12, 12], 16, 1.0)
    assert layers == [8, 4]


def test_memory_caps_move_layers_to_slower_groups():
    value, layers = shard_layers(12, [1, 1], [1.0, 2.0], [0.0, 0.0], [5, 12], 16, 1.0)
    assert layers == [5, 7]


def test_too_little_memory_is_infeasible():
    assert shard_layers(12, [1, 1], [1.0, 2.0], [0.0, 0.0], [5, 6], 16, 1.0) is None
