"""The default search's plans pinned: a faster search must find the very plans (and iteration times) it
found before (Exp-A/B/C of the H2 paper), and still equal the exhaustive oracle on small problems."""

import math
import os
import random

import numpy as np
import pytest

from autohelpers import CLUSTERS, random_problem
from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.model_config import preset
from heteroauto.oracle import oracle_search
from heteroauto.profiles import profiles_for
from heteroauto.search import Planner, _orders, _Search, batch_dp_values, groupings, search

# experiment: (iteration s, dp, groups in pipeline order, tp, recompute, stage layers) of the default search
PINNED = {
    "exp-a-1": (34.22975554601521, 32, ("A", "C", "B"), (4, 8, 8), (False, False, False), ((20, 20), (15, ), (41, ))),
    "exp-b-1": (19.962510383303517, 8, ("B#0", "B#1", "A#0", "A#1", "C#0", "C#1", "D#0", "D#1"),
                (8, 8, 8, 8, 8, 8, 4, 8), (False, ) * 8, ((6, 6), (6, 6), (5, 5), (5, 5), (2, 2), (2, 2), (5, 6, 6, 6),
                                                          (11, 10))),
    "exp-c-1": (28.5190275687362, 16, ("A#0", "A#1", "A#2", "B#0", "B#1", "B#2", "B#3", "B#4", "B#5", "B#6", "B#7"),
                (8, 8, 8, 4, 4, 4, 4, 4, 4, 8, 8), (False, ) * 11, ((7, ), (7, ), (7, ), (4, 5), (5, 5), (5, 5), (5, 5),
                                                                    (5, 5), (5, 5), (8, ), (8, ))),
    "exp-b-2": (66.68373933025703, 16, ("C#0", "C#1", "A#0", "A#1", "B#0", "B#1", "D#0", "D#1"),
                (4, 8, 2, 2, 4, 4, 2, 4), (False, False, False, False, False, False, True, False),
                ((2, 2), (3, ), (3, 3, 3, 3), (3, 3, 3, 3), (6, 6), (6, 6), (5, 5, 5, 5), (10, 11))),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_default_search_finds_the_pinned_plan(name):
    cluster = load_cluster(os.path.join(CLUSTERS, f"{name}.yaml"))
    model = preset("h2-100b")
    result = search(cluster, model, cluster.training, profiles_for(cluster, model, cluster.training))
    iteration_s, dp, groups, tps, recompute, stage_layers = PINNED[name]
    plan = result.best
    assert result.optimal
    assert (plan.dp, tuple(g.label for g in plan.groups), plan.tps, plan.recompute,
            plan.stage_layers) == (dp, groups, tps, recompute, stage_layers)
    assert plan.objective_s == pytest.approx(iteration_s, rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("group_size", [None, 2])
def test_search_equals_the_oracle_on_fixed_small_problems(seed, group_size):
    cluster, model, training = random_problem(random.Random(1000 + seed), max_types=3)
    profiles = profiles_for(cluster, model, training)
    try:
        oracle = oracle_search(cluster, model, training, profiles, group_size=group_size)
    except UserError as error:
        if "too large" in str(error):
            pytest.skip("past the oracle's limit")
        with pytest.raises(UserError):
            search(cluster, model, training, profiles, group_size=group_size)
        return
    found = search(cluster, model, training, profiles, group_size=group_size)
    assert found.best.objective_s == pytest.approx(oracle.objective_s, rel=1e-9)


def test_quick_bound_is_never_above_the_relaxed_bound():
    """The items run in the order of their relaxed bounds only if a quick bound never exceeds one."""
    checked = 0
    for seed in range(12):
        cluster, model, training = random_problem(random.Random(2000 + seed), max_types=3)
        planner = Planner(cluster, model, training, profiles_for(cluster, model, training))
        run = _Search(planner, 1, 0.0, None, None)
        for dp in batch_dp_values(cluster, training):
            for grouping in groupings(cluster, 2):
                item = planner.item(dp, grouping)
                if item is None:
                    continue
                least, quick = planner.quick_bound(item)
                run.bound_item(item, _orders(cluster))
                assert quick <= item.lower_bound_s
                assert all(least <= start for _, _, _, start, _ in item.pending)
                checked += math.isfinite(item.lower_bound_s)
    assert checked >= 10


def test_items_the_quick_bound_rules_out_are_not_bounded_further(monkeypatch):
    """Exp-B-1: the items whose quick bound cannot beat the best plan found by then (dp 1, 2, 64, 128, 256)
    never reach the relaxed bound; the plan is the pinned one."""
    cluster = load_cluster(os.path.join(CLUSTERS, "exp-b-1.yaml"))
    model = preset("h2-100b")
    bounded = []
    original = _Search.bound_item

    def bound_item(self, item, orders):
        bounded.append(item.dp)
        original(self, item, orders)

    monkeypatch.setattr(_Search, "bound_item", bound_item)
    result = search(cluster, model, cluster.training, profiles_for(cluster, model, cluster.training))
    assert result.best.objective_s == pytest.approx(PINNED["exp-b-1"][0], rel=1e-12)
    assert result.optimal and result.lower_bound_s == result.best.objective_s
    assert set(bounded) == {4, 8, 16, 32}


class _Threshold:
    """A problem whose layers fit from one bound on: counts the feasibility questions asked."""

    def __init__(self, least: float):
        self.least, self.asked = least, 0

    def feasible(self, bound: float) -> bool:
        self.asked += 1
        return bound >= self.least


def test_least_bound_is_the_least_fitting_candidate_and_gallops_past_the_near_part():
    run = _Search(None, 1, 0.0, None, None)
    for count in (1, 2, 3, 17, 100, 1000, 10252):
        candidates = np.arange(count, dtype=float)
        for answer in sorted({0, min(1, count - 1), count // 3, count - 1, min(count - 1, 112)}):
            assert run.least_bound(_Threshold(answer), candidates) == answer
        assert run.least_bound(_Threshold(count), candidates) is None
    # Exp-B-1's relaxed item: the least M at index 112 of 10252 candidates (past the near part, index 101)
    problem = _Threshold(112)
    assert run.least_bound(problem, np.arange(10252, dtype=float)) == 112
    assert problem.asked <= 11  # bisecting all that is past the near part asks 16
