import dataclasses
import os
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h2.core.errors import UserError
from h2.core.model_config import preset
from heteropp.auto.evaluation import evaluate_strategy
from heteropp.auto.oracle import oracle_search
from heteropp.auto.profiles import profiles_for
from heteropp.auto.search import search
from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec, load_cluster

from autohelpers import CLUSTERS, random_problem, small_model


def _solve_both(seed, group_size=None):
    cluster, model, training = random_problem(random.Random(seed))
    profiles = profiles_for(cluster, model, training)
    try:
        oracle = oracle_search(cluster, model, training, profiles, group_size=group_size)
    except UserError:
        oracle = None
    try:
        found = search(cluster, model, training, profiles, group_size=group_size)
    except UserError:
        found = None
    return cluster, model, training, profiles, oracle, found


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10 ** 9))
def test_single_stage_search_finds_the_oracle_optimum(seed):
    cluster, model, training, profiles, oracle, found = _solve_both(seed)
    assert (oracle is None) == (found is None)
    if oracle is not None:
        assert found.best.objective_s == pytest.approx(oracle.best.objective_s, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10 ** 9))
def test_searched_strategy_is_valid_and_scores_as_predicted(seed):
    cluster, model, training, profiles, oracle, found = _solve_both(seed)
    if found is None:
        return
    strategy = found.best.to_strategy(model, training)
    strategy.validate()
    assert strategy.chips_per_type() == {c.name: c.count for c in cluster.chips}
    report = evaluate_strategy(strategy, cluster, model, training, profiles)
    assert report.fits
    assert report.iteration_s == pytest.approx(found.best.objective_s, rel=1e-9)


def searched(seed: int, max_types: int = 3):
    """A random problem, its profiles, and its single-stage and two-stage (groups of 2) search
    results; None where no strategy fits the problem."""
    cluster, model, training = random_problem(random.Random(seed), max_types=max_types)
    profiles = profiles_for(cluster, model, training)
    try:
        single = search(cluster, model, training, profiles, group_size=None)
    except UserError:
        return None
    return (cluster, model, training, profiles), single, search(cluster, model, training, profiles, group_size=2)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10 ** 9))
def test_second_stage_pruning_keeps_the_optimum_of_its_space(seed):
    found = searched(seed, max_types=2)
    if found is None:
        return
    (cluster, model, training, profiles), first, two = found
    try:
        space = oracle_search(cluster, model, training, profiles, group_size=2, dp=first.best.dp,
                              monotone_tp=True).best.objective_s
    except UserError:
        space = float("inf")
    assert two.best.objective_s == pytest.approx(min(first.best.objective_s, space), rel=1e-9)


def test_refining_at_every_dp_recovers_a_grouped_optimum_at_another_dp():
    cluster, model, training = random_problem(random.Random(1035), max_types=2)  # found by the gap benchmark
    profiles = profiles_for(cluster, model, training)
    grouped = oracle_search(cluster, model, training, profiles, group_size=2).best
    paper_style = search(cluster, model, training, profiles, group_size=2)
    every_dp = search(cluster, model, training, profiles, group_size=2, refine_all_dp=True)
    assert paper_style.best.objective_s > grouped.objective_s * 1.1  # stage 1's dp was the wrong one
    assert every_dp.best.objective_s == pytest.approx(grouped.objective_s, rel=1e-9)


def test_two_stage_search_never_loses_to_its_first_stage():
    for seed in range(40):
        found = searched(seed)
        if found is not None:
            _, single, two = found
            assert two.best.objective_s <= single.best.objective_s * (1 + 1e-12)


def test_top_k_lists_distinct_configurations_best_first():
    cluster = load_cluster(os.path.join(CLUSTERS, "exp-a-1.yaml"))
    model = preset("h2-100b")
    result = search(cluster, model, cluster.training, profiles_for(cluster, model, cluster.training), top_k=4,
                    group_size=None)
    values = [c.objective_s for c in result.top]
    assert len(values) == 4 and values == sorted(values)


def test_exp_c1_strategy_is_valid_and_found_fast():
    cluster = load_cluster(os.path.join(CLUSTERS, "exp-c-1.yaml"))
    model = preset("h2-100b")
    profiles = profiles_for(cluster, model, cluster.training)
    started = time.perf_counter()
    result = search(cluster, model, cluster.training, profiles)
    assert time.perf_counter() - started < 2.0
    strategy = result.best.to_strategy(model, cluster.training)
    assert sum(s.layers for s in strategy.stages) == 96
    assert strategy.chips_per_type() == {"A": 384, "B": 1024}
    report = evaluate_strategy(strategy, cluster, model, cluster.training, profiles)
    assert report.fits
    chips_in_order = [s.chip for s in strategy.stages]
    assert chips_in_order == sorted(chips_in_order)  # A (96 GB) before B (64 GB)


def _chip(name, count, memory_gb=80.0, tp_max=8):
    return ChipType(name=name, count=count, memory_gb=memory_gb, chips_per_node=8, tp_max=tp_max,
                    intra_node_gbps=100, inter_node_gbps=10, peak_tflops=300)


def test_data_parallel_size_divides_every_chip_type_and_the_batch():
    cluster = ClusterSpec(name="odd", chips=(_chip("A", 6, tp_max=2), _chip("B", 4)), source="odd.yaml")
    training = TrainingSpec(seq_len=2048, global_batch_sequences=8)
    model = small_model(8)
    for candidate in search(cluster, model, training, profiles_for(cluster, model, training), top_k=20,
                            group_size=None).top:
        assert 8 % candidate.dp == 0
        assert all(g.count == tp * pp * candidate.dp for g, tp, pp in zip(candidate.groups, candidate.tps, candidate.pps))


def test_chip_count_that_no_profiled_tp_times_dp_divides_is_refused():
    cluster = ClusterSpec(name="odd", chips=(_chip("A", 7, tp_max=2),), source="odd.yaml")
    training = TrainingSpec(seq_len=256, global_batch_sequences=8)
    model = small_model(8)
    profiles = profiles_for(cluster, model, training)
    only_tp2 = dataclasses.replace(profiles["A"], layers=[profiles["A"].layer(2)])
    with pytest.raises(UserError, match="no feasible strategy: profile of chip 'A' lacks tp=1"):
        search(cluster, model, training, {"A": only_tp2})


def test_model_that_fits_nowhere_names_the_tightest_memory_constraint():
    cluster = ClusterSpec(name="tiny-mem", chips=(_chip("A", 8, memory_gb=2.0),), source="tiny-mem.yaml")
    training = TrainingSpec(seq_len=2048, global_batch_sequences=8)
    model = preset("h2-100b")
    with pytest.raises(UserError, match=r"no feasible strategy: memory: .*(needs .* GB per chip|holds at most)"):
        search(cluster, model, training, profiles_for(cluster, model, training))


def test_pipeline_deeper_than_the_model_is_reported():
    model = small_model(2)
    cluster = ClusterSpec(name="deep", chips=(_chip("A", 8, tp_max=1),), source="deep.yaml")
    training = TrainingSpec(seq_len=256, global_batch_sequences=1)
    with pytest.raises(UserError, match="more pipeline stages than the model's 2 layers"):
        search(cluster, model, training, profiles_for(cluster, model, training))
