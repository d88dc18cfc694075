"""The pseudo-gradient penalty's arithmetic against values worked out by hand."""

import math

import pytest

from h2.ps import penalty

# Two shards, clusters a and b. Shard 0: |Δa|² = 9, |Δb|² = 16, <Δa, Δb> = 4; shard 1: 1, 9, 2.
GRAMS = [{"a": {"a": 9.0, "b": 4.0}, "b": {"a": 4.0, "b": 16.0}},
         {"a": {"a": 1.0, "b": 2.0}, "b": {"a": 2.0, "b": 9.0}}]
TOKENS = {"a": 1000, "b": 3000}
SETTINGS = dict(alpha=0.02, beta=3.0, clip_norm=1.0, warmup_scores=4)


def settled() -> penalty.PenaltyState:
    return penalty.PenaltyState(mean=5.0, deviation=2.0, norms_seen=10, scores_seen=10, max_score=1.5)


def test_a_clusters_norm_is_the_sum_of_its_per_shard_l2_norms():
    assert penalty.cluster_norms(GRAMS, ["a", "b"]) == {"a": 3.0 + 1.0, "b": 4.0 + 3.0}


def test_scores_are_z_scores_against_the_statistics_before_the_round():
    verdict = penalty.judge(settled(), GRAMS, TOKENS, **SETTINGS)
    assert verdict.scores == {"a": pytest.approx((4 - 5) / 2, abs=1e-12), "b": pytest.approx((7 - 5) / 2, abs=1e-12)}


def test_accepted_norms_update_mean_and_deviation_in_cluster_order():
    state = settled()
    penalty.judge(state, GRAMS, TOKENS, **SETTINGS)
    # a: mean 0.02*4 + 0.98*5 = 4.98, deviation² = 0.98*4 + 0.02*(4 - 4.98)² = 3.939208
    # b: mean 0.02*7 + 0.98*4.98 = 5.0204, deviation² = 0.98*3.939208 + 0.02*(7 - 5.0204)² = 3.9388001632
    assert state.mean == pytest.approx(5.0204, abs=1e-7)
    assert state.deviation == pytest.approx(math.sqrt(3.9388001632), abs=1e-7)
    assert (state.norms_seen, state.scores_seen, state.max_score) == (12, 12, 1.5)


def test_accepted_clusters_are_averaged_by_the_tokens_they_consumed():
    assert penalty.judge(settled(), GRAMS, TOKENS, **SETTINGS).weights == {"a": 0.25, "b": 0.75}


def test_the_average_is_clipped_to_norm_one_from_the_shards_gram_matrices():
    verdict = penalty.judge(settled(), GRAMS, TOKENS, **SETTINGS)
    # |0.25 Δa + 0.75 Δb|²: shard 0 0.0625*9 + 0.5625*16 + 2*0.1875*4 = 11.0625, shard 1 5.875
    assert verdict.update_norm == pytest.approx(math.sqrt(16.9375), abs=1e-7)
    assert verdict.clip == pytest.approx(1 / math.sqrt(16.9375), abs=1e-7)


def test_a_score_above_beta_times_the_largest_accepted_score_is_rejected_and_the_others_proceed():
    grams = [{"a": {"a": 49.0, "c": 0.0}, "c": {"a": 0.0, "c": 700.0**2}}]
    state = settled()
    verdict = penalty.judge(state, grams, {"a": 1000, "c": 1000}, **SETTINGS)
    assert (verdict.accepted, list(verdict.rejected)) == (["a"], ["c"])
    assert verdict.weights == {"a": 1.0}
    assert "score" in verdict.rejected["c"]


def test_a_nan_pseudo_gradient_is_rejected_and_leaves_the_statistics_alone():
    grams = [{"a": {"a": 49.0, "n": math.nan}, "n": {"a": math.nan, "n": math.nan}}]
    state = settled()
    verdict = penalty.judge(state, grams, {"a": 1000, "n": 1000}, **SETTINGS)
    assert verdict.rejected == {"n": "norm is nan"} and verdict.accepted == ["a"]
    assert state.norms_seen == 11 and math.isfinite(verdict.update_norm)


def test_the_threshold_is_at_least_beta_sigmas_while_the_record_is_small():
    state = penalty.PenaltyState(mean=5.0, deviation=1.0, norms_seen=10, scores_seen=10, max_score=0.2)
    assert penalty.threshold(state, beta=3.0, warmup_scores=4) == 3.0


def test_nothing_finite_is_rejected_before_warmup_scores_are_on_record():
    state = penalty.PenaltyState(mean=5.0, deviation=1.0, norms_seen=3, scores_seen=3, max_score=0.5)
    grams = [{"c": {"c": 500.0**2}}]
    assert penalty.judge(state, grams, {"c": 10}, **SETTINGS).accepted == ["c"]


def test_the_first_norm_ever_sets_the_mean_and_has_no_score():
    state = penalty.PenaltyState()
    verdict = penalty.judge(state, [{"a": {"a": 16.0}}], {"a": 1}, **SETTINGS)
    assert verdict.scores == {"a": None} and (state.mean, state.deviation, state.scores_seen) == (4.0, 0.0, 0)


def test_without_the_penalty_outliers_and_nan_are_averaged_in_unclipped():
    grams = [{"a": {"a": 49.0, "n": math.nan}, "n": {"a": math.nan, "n": math.nan}}]
    verdict = penalty.judge(settled(), grams, {"a": 1000, "n": 1000}, **SETTINGS, penalize=False)
    assert verdict.accepted == ["a", "n"] and verdict.clip == 1.0
