"""heteroauto._dp, the planner's dynamic programmes in C++, against the numpy programmes they replaced (kept as
the reference): layer_dp.most_layers / sum_tables / rebuild for one stage order, orders_dp.AllOrders.*_reference
for every order at once. Values equal to 1e-12 relative; under a cap the least sum exact when below it and at
or above it otherwise; the plan and the stage order traced the same."""

import math
import os
import random

import numpy as np
import pytest

from autohelpers import CLUSTERS, random_problem
from h2.core.cluster import load_cluster
from h2.core.model_config import preset
from heteroauto import _dp, layer_dp
from heteroauto.memory import stage_caps_table, stage_caps_table_reference
from heteroauto.orders_dp import AllOrders
from heteroauto.profiles import profiles_for
from heteroauto.search import Planner, _orders, batch_dp_values, groupings

LEVELS = ("exact", "order", "last", "item")


def reference_most(problem, bound: float) -> float:
    if isinstance(problem, AllOrders):
        return problem.most_layers_reference(bound)
    return layer_dp.most_layers(problem, bound)


def reference_sum(problem, bound: float) -> float:
    if isinstance(problem, AllOrders):
        return problem.least_sum_reference(bound)
    return layer_dp.sum_tables(problem, bound).best()[0]


def assert_equal_sums(native: float, reference: float) -> None:
    assert native == reference or native == pytest.approx(reference, rel=1e-12, abs=0.0)


def check(problem, bounds) -> int:
    """Every question the search asks of the problem, at each bound, against the numpy reference; the count of
    bounds under which the layers fit."""
    fitting = 0
    for bound in bounds:
        assert problem.most_layers(bound) == reference_most(problem, bound)
        assert problem.feasible(bound) == (reference_most(problem, bound) >= problem.layers)
        least = reference_sum(problem, bound)
        assert_equal_sums(problem.least_sum(bound), least)
        if not math.isfinite(least):
            continue
        fitting += 1
        above = least * (1 + 1e-9) + 1e-12
        assert_equal_sums(problem.least_sum(bound, above), least)
        if least > 0:
            below = least * (1 - 1e-6)
            assert problem.least_sum(bound, below) >= below
        if isinstance(problem, AllOrders):
            assert problem.best_order(bound, above) == problem.best_order_reference(bound, above)
        else:
            assert problem.plan(bound, above) == layer_dp.rebuild(problem, layer_dp.sum_tables(problem, bound, above))
    return fitting


def spread(values: np.ndarray, count: int) -> list[float]:
    """`count` values spread evenly over the sorted candidates, both ends included."""
    picked = np.unique(np.linspace(0, len(values) - 1, min(count, len(values))).round().astype(int))
    return [float(values[i]) for i in picked]


def least_fitting(problem, values: np.ndarray) -> int:
    """Index of the least value under which the layers fit (len(values): none), by bisection (fitting only grows
    with the bound); checked against the reference at the index and the one below by check."""
    low, high = 0, len(values)
    while low < high:
        middle = (low + high) // 2
        if problem.feasible(float(values[middle])):
            high = middle
        else:
            low = middle + 1
    return low


def items_of(cluster, model, training, group_size):
    planner = Planner(cluster, model, training, profiles_for(cluster, model, training))
    for dp in batch_dp_values(cluster, training):
        for grouping in groupings(cluster, group_size):
            item = planner.item(dp, grouping)
            if item is not None:
                yield planner, item


def problems_of(planner, item, orders):
    yield planner.all_orders(item)
    for level in LEVELS:
        yield planner.ordered(item, orders[0], level)[0]
    yield planner.ordered(item, orders[-1])[0]


@pytest.mark.parametrize("seed", range(8))
def test_native_programmes_equal_numpy_on_the_bound_candidates_of_small_random_problems(seed):
    """Every candidate where a problem has at most 24 (most), else 24 spread over them."""
    cluster, model, training = random_problem(random.Random(3000 + seed), max_types=3)
    orders = _orders(cluster)
    for group_size in (None, 2):
        for planner, item in items_of(cluster, model, training, group_size):
            for problem in problems_of(planner, item, orders):
                check(problem, spread(problem.bound_values(), 24) + [math.inf])


@pytest.mark.parametrize("name", ["exp-a-1", "exp-b-1", "exp-c-1"])
def test_native_programmes_equal_numpy_on_the_paper_experiments(name):
    """Every item of the experiment, every kind of problem the search builds; the bounds: the least candidate
    under which the layers fit, the one below, four spread from it to the largest, and none (every candidate of every
    problem would take hours in numpy)."""
    cluster = load_cluster(os.path.join(CLUSTERS, f"{name}.yaml"))
    model = preset("h2-100b")
    orders = _orders(cluster)
    fitting = 0
    for planner, item in items_of(cluster, model, cluster.training, None):
        for problem in problems_of(planner, item, orders):
            values = problem.bound_values()
            start = least_fitting(problem, values)
            near = [float(v) for v in values[max(0, start - 1):start + 1]]
            fitting += check(problem, near + spread(values[start:], 4) + [math.inf])
    assert fitting >= 10


def test_candidates_equal_numpy_including_repeated_and_non_positive_weights():
    rng = np.random.default_rng(0)
    for _ in range(300):
        pairs = rng.normal(size=(int(rng.integers(0, 40)), 2)) * rng.choice([1e-3, 1.0, 1e3])
        pairs[rng.random(len(pairs)) < 0.2, 0] = 0.0
        if len(pairs) > 3:
            pairs[1] = pairs[0]
        layers = int(rng.integers(1, 130))
        assert np.array_equal(_dp.candidates(pairs, layers), layer_dp.candidates_of_pairs_reference(pairs, layers))


def test_stage_caps_equal_numpy_on_every_option_of_the_paper_experiments(monkeypatch):
    calls = []

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return stage_caps_table(*args, **kwargs)

    monkeypatch.setattr("heteroauto.search.stage_caps_table", recording)
    for name in ("exp-a-1", "exp-b-1", "exp-c-1"):
        cluster = load_cluster(os.path.join(CLUSTERS, f"{name}.yaml"))
        model = preset("h2-100b")
        for _ in items_of(cluster, model, cluster.training, None):
            pass
    assert len(calls) > 20  # per chip and dp
    for args, kwargs in calls:
        assert np.array_equal(stage_caps_table(*args, **kwargs), stage_caps_table_reference(*args, **kwargs))


def test_stage_caps_rounding_at_the_edges():
    fixed = np.array([0.0, 10.0, 100.0, 101.0, 5.0])
    per_layer = np.array([0.0, 1.0, 3.0, 1e-300, 90.0, 1e30])
    for capacity in (0.0, 100.0, 1e3):
        native = _dp.stage_caps(fixed, per_layer, capacity, 7.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            layers = np.floor((capacity - fixed[:, None]) / per_layer[None, :])
        layers = np.clip(np.nan_to_num(layers, nan=7, posinf=7, neginf=0), 0, 7)
        for _ in range(3):
            total = fixed[:, None] + layers * per_layer[None, :]
            layers = np.where((layers > 0) & (total > capacity), layers - 1, layers)
            layers = np.where((layers < 7) & (fixed[:, None] + (layers + 1) * per_layer[None, :] <= capacity),
                              layers + 1, layers)
        expected = np.where(fixed[:, None] + per_layer[None, :] > capacity, 0.0, layers)
        assert np.array_equal(native, expected)
