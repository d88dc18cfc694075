"""Memory-aware stage division (heteroauto/division.py), against the JEEVES paper's Figure 4(e)
and an exhaustive search."""

import itertools

import pytest

from h2.core.errors import UserError
from heteroauto.division import division_for_wish, fastest_division_within
from heteroauto.jeeves import PipelineCosts, jeeves_schedule
from heteroauto.simulator import shared_links_of, simulate_replicas
from heteroauto.stage_terms import StageTerms

# Figure 4's toy (as in test_jeeves_schedule): 96 layers, 24 a stage, forward 1 and backward 2 per stage.
FIGURE4 = PipelineCosts(forward_s=(1.0, ) * 4, backward_s=(2.0, ) * 4, occupancy_s=(2.0, 0.0, 0.0),
                        latency_s=(1.0, 0.0, 0.0), shared=(True, False, False))


def _peak_layer_units(schedule, layers):
    """Replay `schedule` with stage times proportional to `layers`; the peak activations in layer units."""
    terms = [StageTerms(l / 24, 2 * l / 24, 0.0, 0.0) for l in layers]
    result = simulate_replicas(schedule.actions, terms, shared_links=shared_links_of(FIGURE4, schedule))
    return max(l * held for l, held in zip(layers, result.peak_in_flight))


def test_figure4_even_division_peaks_at_120_layer_units():
    schedule = jeeves_schedule(FIGURE4, 12, 5)
    assert _peak_layer_units(schedule, (24, 24, 24, 24)) == 120


def test_figure4_memory_aware_division_of_the_same_schedule_peaks_at_most_104_layer_units():
    schedule = jeeves_schedule(FIGURE4, 12, 5)
    division = fastest_division_within(96, schedule.peak_in_flight, 104)
    assert _peak_layer_units(schedule, division.layers) <= 104


def test_figure4_memory_aware_division_costs_the_slowest_stage_two_layers_as_in_the_paper():
    schedule = jeeves_schedule(FIGURE4, 12, 5)
    assert fastest_division_within(96, schedule.peak_in_flight, 104).slowest_stage_s == 26


def test_fastest_division_within_a_limit_matches_an_exhaustive_search():
    in_flight, layer_s, limit = (4, 3, 2, 1), (1.0, 2.0, 1.0, 3.0), 30
    best = min(
        max(l * t for l, t in zip(layers, layer_s)) for layers in itertools.product(range(1, 20), repeat=4)
        if sum(layers) == 20 and all(l * k <= limit for l, k in zip(layers, in_flight)))
    assert fastest_division_within(20, in_flight, limit, layer_s).slowest_stage_s == best


def test_no_division_fits_a_limit_below_one_layer_per_stage():
    assert fastest_division_within(8, (4, 1), 3) is None


def test_more_stages_than_layers_is_a_one_line_error():
    with pytest.raises(UserError, match="3 layers cannot fill 4 stages"):
        fastest_division_within(3, (1, 1, 1, 1), 10)


def test_division_for_wish_gives_the_stage_that_wishes_more_fewer_layers():
    assert division_for_wish(12, (4, 1), 12, 9) == (3, 9)


def test_division_for_wish_matches_an_exhaustive_search():
    wish, limit, cap = (6, 4, 2, 1), 24, 9

    def share(layers):
        return min(min(1.0, (limit // l) / w) for l, w in zip(layers, wish))

    best = max(share(layers) for layers in itertools.product(range(1, cap + 1), repeat=4) if sum(layers) == 20)
    assert share(division_for_wish(20, wish, limit, cap)) == best
