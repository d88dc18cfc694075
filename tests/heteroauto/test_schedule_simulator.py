import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h2.core.schedule import Action, format_schedule, one_f_one_b, one_f_one_b_split_backward
from heteroauto.cost import iteration_time_s, pipeline_closed_form_s, pipeline_time_s
from heteroauto.simulator import simulate
from heteroauto.stage_terms import StageTerms


def test_schedule_planner_and_cli_do_not_import_torch():
    import subprocess
    code = ("import sys, h2.core, h2.core.schedule, h2.core.cluster, h2.core.strategy, h2.core.training, "
            "h2.core.devices, h2.cli.heteroauto, heteroauto.search, heteroauto.simulator; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_1f1b_warms_up_p_minus_s_minus_1_forwards():
    text = format_schedule(one_f_one_b(3, 4))
    assert text.splitlines() == [
        "stage 0: F0 F1 F2 B0 F3 B1 B2 B3", "stage 1: F0 F1 B0 F2 B1 F3 B2 B3", "stage 2: F0 B0 F1 B1 F2 B2 F3 B3"
    ]


@pytest.mark.parametrize("make", [one_f_one_b, one_f_one_b_split_backward])
@pytest.mark.parametrize("stages,micro_batches", [(1, 1), (2, 5), (4, 3), (5, 8)])
def test_every_micro_batch_runs_once_per_stage_and_every_send_has_a_receive(make, stages, micro_batches):
    schedule = make(stages, micro_batches)
    for s, actions in enumerate(schedule):
        kinds = ["F", "B", "W"] if make is one_f_one_b_split_backward else ["F", "B"]
        for kind in kinds:
            assert sorted(a.micro_batch for a in actions if a.kind == kind) == list(range(micro_batches))
        assert all(a.stage == s for a in actions)
    sends = {(a.kind[-1], a.stage + (1 if a.kind == "SEND_F" else -1), a.micro_batch) for actions in schedule
             for a in actions if a.kind.startswith("SEND")}
    receives = {(a.kind[-1], a.stage, a.micro_batch) for actions in schedule for a in actions
                if a.kind.startswith("RECV")}
    assert sends == receives


def test_split_backward_runs_weight_gradients_after_their_backward():
    for actions in one_f_one_b_split_backward(4, 6):
        order = [(a.kind, a.micro_batch) for a in actions]
        for m in range(6):
            assert order.index(("B", m)) < order.index(("W", m))


def test_unknown_action_kind_is_refused():
    with pytest.raises(ValueError):
        Action("X", 0, 0)


def _costs(forward, backward, send=None):
    send = send or [0.0] * len(forward)
    return [
        StageTerms(forward_s=f, backward_s=b, weight_grad_s=0.0, update_s=0.0, send_occupancy_s=x)
        for f, b, x in zip(forward, backward, send)
    ]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.floats(0.5, 3.0), st.floats(0.1, 2.0))
def test_uniform_stages_match_the_closed_form(stages, micro_batches, ratio, forward):
    result = simulate(one_f_one_b(stages, micro_batches), _costs([forward] * stages, [ratio * forward] * stages))
    closed = pipeline_closed_form_s([forward * (1 + ratio)] * stages, micro_batches)
    assert result.iteration_s == pytest.approx(closed, rel=1e-12)


def random_pipeline(seed: int):
    """(rng, stages 1-6, micro-batches 1-12, forward seconds per stage in 0.1-2) drawn from `seed`."""
    rng = random.Random(seed)
    stages, micro_batches = rng.randint(1, 6), rng.randint(1, 12)
    return rng, stages, micro_batches, [rng.uniform(0.1, 2) for _ in range(stages)]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**9))
def test_slowest_stage_last_matches_the_closed_form_and_proportional_costs_never_exceed_it(seed):
    rng, stages, micro_batches, forward = random_pipeline(seed)
    ratio = rng.uniform(1.0, 3.0)
    proportional = simulate(one_f_one_b(stages, micro_batches), _costs(forward, [ratio * f for f in forward]))
    closed = pipeline_closed_form_s([(1 + ratio) * f for f in forward], micro_batches)
    assert proportional.iteration_s <= closed * (1 + 1e-12)  # backward = ratio * forward on every stage
    backward = [rng.uniform(0.1, 4) for _ in range(stages)]
    totals = [f + b for f, b in zip(forward, backward)]
    slowest = totals.index(max(totals))
    for values in (forward, backward):
        values[slowest], values[-1] = values[-1], values[slowest]
    result = simulate(one_f_one_b(stages, micro_batches), _costs(forward, backward))
    closed = pipeline_closed_form_s([f + b for f, b in zip(forward, backward)], micro_batches)
    assert result.iteration_s == pytest.approx(closed, rel=1e-12)
    assert iteration_time_s([f + b for f, b in zip(forward, backward)], [0.0] * stages, micro_batches, 1.0) == \
        pytest.approx(result.iteration_s, rel=1e-12)


def test_busy_plus_bubble_plus_update_is_the_iteration_on_every_stage():
    costs = [
        StageTerms(1.0, 2.0, 0.0, update_s=0.5),
        StageTerms(0.5, 1.0, 0.0, update_s=0.1),
        StageTerms(2.0, 4.0, 0.0, update_s=0.0)
    ]
    result = simulate(one_f_one_b(3, 5), costs)
    for busy, bubble, cost in zip(result.busy_s, result.bubble_s, costs):
        assert busy + bubble + cost.update_s == pytest.approx(result.iteration_s)
    assert result.busy_s == [15.0, 7.5, 30.0]


def test_transfers_lie_on_the_path_of_a_single_micro_batch():
    costs = _costs([1.0, 1.5], [2.0, 2.5], send=[0.25, 0.0])
    result = simulate(one_f_one_b(2, 1), costs)
    assert result.iteration_s == pytest.approx(1.0 + 0.25 + 1.5 + 2.5 + 0.25 + 2.0)
    assert result.transfers == 2


def test_transfers_never_shorten_the_iteration():
    costs = _costs([1.0, 0.5, 2.0], [2.0, 1.0, 4.0], send=[0.1, 0.1, 0.0])
    free = simulate(one_f_one_b(3, 6), costs, transfers=False).iteration_s
    assert simulate(one_f_one_b(3, 6), costs).iteration_s > free


def test_messages_queue_behind_a_link_s_occupancy_but_not_its_latency():
    # stage 0 forwards two micro-batches back to back (1 s each); each send holds the link for 3 s
    occupied = [StageTerms(1.0, 1.0, 0.0, 0.0, send_occupancy_s=3.0), StageTerms(1.0, 1.0, 0.0, 0.0)]
    delayed = [StageTerms(1.0, 1.0, 0.0, 0.0, send_latency_s=3.0), StageTerms(1.0, 1.0, 0.0, 0.0)]
    queued = simulate(one_f_one_b(2, 2), occupied, keep_timeline=True).timeline[1]
    pipelined = simulate(one_f_one_b(2, 2), delayed, keep_timeline=True).timeline[1]
    assert [start for name, start, _ in queued if name.startswith("F")] == [4.0, 7.0]  # second waits for the link
    assert [start for name, start, _ in pipelined if name.startswith("F")] == [4.0, 6.0]  # latencies overlap


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**9))
def test_cost_model_with_transfers_bounds_the_1f1b_replay_when_backward_is_proportional(seed):
    rng, stages, micro_batches, forward = random_pipeline(seed)
    ratio = rng.uniform(1.0, 3.0)
    send = [rng.uniform(0.0, 0.5) for _ in range(stages - 1)] + [0.0]
    costs = _costs(forward, [ratio * f for f in forward], send)
    replay = simulate(one_f_one_b(stages, micro_batches), costs).iteration_s
    assert replay <= pipeline_time_s(costs, micro_batches, 1.0) * (1 + 1e-12)


def test_split_backward_leaves_less_bubble_than_1f1b():
    costs = [StageTerms(1.0, 2.0, weight_grad_s=1.0, update_s=0.0) for _ in range(4)]
    plain = simulate(one_f_one_b(4, 8), costs).iteration_s
    split = simulate(one_f_one_b_split_backward(4, 8), costs).iteration_s
    assert (plain, split) == (33.0, 30.0)  # 1F1B bubble (P-1)(F+B+W) = 9 becomes 6


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (8, 16), (3, 12)])
def test_split_backward_beats_1f1b_on_uniform_stages(stages, micro_batches):
    costs = [StageTerms(1.0, 2.0, weight_grad_s=1.0, update_s=0.0) for _ in range(stages)]
    plain = simulate(one_f_one_b(stages, micro_batches), costs).iteration_s
    split = simulate(one_f_one_b_split_backward(stages, micro_batches), costs).iteration_s
    assert split < plain


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**9))
def test_split_backward_costs_at_most_3_percent_on_uneven_stages(seed):
    # its weight-gradient passes cannot be interrupted, so on uneven stages a drained W can delay a
    # gradient that has just arrived: 2.3 % worst case over 20,000 random pipelines (docs/heteroauto.md)
    _, stages, micro_batches, forward = random_pipeline(seed)
    costs = [StageTerms(f, 2 * f, weight_grad_s=f, update_s=0.0) for f in forward]
    plain = simulate(one_f_one_b(stages, micro_batches), costs).iteration_s
    split = simulate(one_f_one_b_split_backward(stages, micro_batches), costs).iteration_s
    assert split <= plain * 1.03


def test_a_schedule_that_waits_for_a_message_never_sent_is_reported():
    schedule = [[Action("F", 0, 0)], [Action("RECV_F", 1, 0), Action("F", 1, 0)]]
    with pytest.raises(ValueError, match="deadlocks"):
        simulate(schedule, _costs([1.0, 1.0], [1.0, 1.0]))


TWO_TYPES = (
    "chips:\n"
    "  - {name: A, count: 8, memory_gb: 1, peak_tflops: 100, chips_per_node: 8, tp_max: 8, intra_node_gbps: 100, "
    "inter_node_gbps: 10}\n"
    "  - {name: B, count: 8, memory_gb: 1, peak_tflops: 100, chips_per_node: 8, tp_max: 8, intra_node_gbps: 100, "
    "inter_node_gbps: 10}\n")


@pytest.mark.parametrize("links, bandwidth_gbps, latency_us", [
    pytest.param("", 10, 10, id="without_links_the_chips_inter_node_fields"),
    pytest.param("links:\n  inter_type: {bandwidth_gbps: 0.5, latency_us: 300}\n", 0.5, 300,
                 id="the_clusters_inter_type_link"),
])
def test_the_simulators_transfer_between_chip_types_crosses_the_inter_type_link(write, links, bandwidth_gbps,
                                                                                latency_us):
    from h2.core.cluster import TrainingSpec, load_cluster
    from h2.core.model_config import preset
    from h2.core.strategy import strategy_from_mapping
    from heteroauto.evaluation import strategy_terms, training_for
    from heteroauto.profiles import profiles_for
    cluster = load_cluster(write("c.yaml", TWO_TYPES + links))
    strategy = strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 64, "model": "tiny",
            "stages": [{"chip": "A", "tp": 2, "layers": 2}, {"chip": "B", "tp": 1, "layers": 2}]
        }, "s.yaml")
    model = preset("tiny")
    training = training_for(strategy, TrainingSpec(seq_len=64, global_batch_sequences=8, micro_batch_size=2))
    activation_bytes = 2 * 64 * model.hidden_size * training.activation_bytes_per_element
    expected = activation_bytes / (bandwidth_gbps * 1e9) + latency_us * 1e-6  # one lane: B has tp 1
    terms = strategy_terms(strategy, cluster, model, training, profiles_for(cluster, model, training), "full")
    assert terms[0].send_s == pytest.approx(expected)
