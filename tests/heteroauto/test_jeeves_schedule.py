"""The JEEVES schedule generator (heteroauto/jeeves.py): the schedule's invariants over random pipelines,
the paper's Figure 4 toy example, and its one-line errors."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h2.core.errors import UserError
from heteroauto.jeeves import PipelineCosts, jeeves_schedule

# Figure 4's toy: 4 stages, forward 1 and backward 2 per stage, the cross-site link between stages 0
# and 1 busy 2 per micro-batch with latency 1, each stage holding at most 5 micro-batches.
FIGURE4 = PipelineCosts(forward_s=(1.0, ) * 4, backward_s=(2.0, ) * 4, occupancy_s=(2.0, 0.0, 0.0),
                        latency_s=(1.0, 0.0, 0.0), shared=(True, False, False))

costs = st.floats(min_value=0.01, max_value=5.0)


@st.composite
def pipelines(draw):
    stages = draw(st.integers(1, 5))
    boundaries = stages - 1
    pipeline = PipelineCosts(
        forward_s=tuple(draw(st.lists(costs, min_size=stages, max_size=stages))), backward_s=tuple(
            draw(st.lists(costs, min_size=stages, max_size=stages))), occupancy_s=tuple(
                draw(st.lists(st.floats(0.0, 5.0), min_size=boundaries, max_size=boundaries))), latency_s=tuple(
                    draw(st.lists(st.floats(0.0, 40.0), min_size=boundaries, max_size=boundaries))), shared=tuple(
                        draw(st.lists(st.booleans(), min_size=boundaries, max_size=boundaries))))
    limits = draw(st.lists(st.integers(1, 6), min_size=stages, max_size=stages))
    return pipeline, draw(st.integers(1, 9)), limits, draw(st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_no_stage_ever_holds_more_micro_batches_than_its_limit(case):
    pipeline, micro_batches, limits, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limits, replicas=replicas)
    for stage_lists in generated.actions:
        for stage, actions in enumerate(stage_lists):
            held = peak = 0
            for action in actions:
                held += {"F": 1, "B": -1}.get(action.kind, 0)
                peak = max(peak, held)
            assert peak <= limits[stage]


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_every_forward_and_backward_runs_exactly_once_per_stage(case):
    pipeline, micro_batches, limits, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limits, replicas=replicas)
    expected = Counter({(kind, m): 1 for kind in "FB" for m in range(micro_batches)})
    for stage_lists in generated.actions:
        for actions in stage_lists:
            assert Counter((a.kind, a.micro_batch) for a in actions if a.kind in "FB") == expected


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_every_send_has_the_matching_receive_on_the_neighbour(case):
    pipeline, micro_batches, limits, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limits, replicas=replicas)
    for stage_lists in generated.actions:
        sends = Counter((a.kind[-1], a.stage + (1 if a.kind == "SEND_F" else -1), a.micro_batch)
                        for actions in stage_lists for a in actions if a.kind.startswith("SEND"))
        receives = Counter((a.kind[-1], a.stage, a.micro_batch) for actions in stage_lists for a in actions
                           if a.kind.startswith("RECV"))
        assert sends == receives


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_a_backward_starts_only_after_its_forward_on_the_same_stage(case):
    pipeline, micro_batches, limits, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limits, replicas=replicas)
    for (replica, stage, kind, m), start in generated.start_s.items():
        if kind == "B":
            assert start >= generated.start_s[(replica, stage, "F", m)] + pipeline.forward_s[stage]


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_each_shared_link_lists_every_replicas_micro_batches_once(case):
    pipeline, micro_batches, limits, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limits, replicas=replicas)
    shared = [b for b, is_shared in enumerate(pipeline.shared) if is_shared]
    assert sorted(generated.send_lists) == sorted((b, d) for b in shared for d in "FB")
    for messages in generated.send_lists.values():
        assert sorted((m.replica, m.micro_batch) for m in messages) == \
            [(r, m) for r in range(replicas) for m in range(micro_batches)]


def _compute_order(actions):
    return [str(a) for a in actions if a.kind in ("F", "B")]


def test_figure4_third_stage_runs_the_first_backward_before_the_third_forward():
    order = _compute_order(jeeves_schedule(FIGURE4, 12, 5).stage_actions(2))
    assert order.index("B0") < order.index("F2") < order.index("F3")


def test_figure4_the_first_backward_wins_a_tie_with_a_ready_forward():
    generated = jeeves_schedule(FIGURE4, 12, 5)
    assert generated.ready_s[(0, 2, "F", 2)] == generated.start_s[(0, 2, "B", 0)]


def test_figure4_the_first_stage_holds_five_micro_batches_and_the_second_four():
    assert jeeves_schedule(FIGURE4, 12, 5).peak_in_flight == [5, 4, 2, 1]


def test_a_tighter_limit_delays_the_first_stage():
    assert jeeves_schedule(FIGURE4, 12, 4).makespan_s > jeeves_schedule(FIGURE4, 12, 5).makespan_s


def test_two_replicas_alternate_on_the_shared_link():
    generated = jeeves_schedule(FIGURE4, 3, 5, replicas=2)
    assert [m.replica for m in generated.send_lists[(0, "F")]] == [0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize("limits, message", [
    (0, "in-flight limit k of stage 0 must be an integer >= 1"),
    ([5, 5, 0, 5], "in-flight limit k of stage 2 must be an integer >= 1"),
    ([5, 5], "need one per stage (4), got 2"),
])
def test_a_limit_below_one_micro_batch_is_a_one_line_error(limits, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jeeves_schedule(FIGURE4, 4, limits)


def test_a_negative_latency_is_a_one_line_error_naming_the_boundary():
    bad = PipelineCosts((1.0, 1.0), (2.0, 2.0), (1.0, ), (-0.5, ), (True, ))
    with pytest.raises(UserError, match=r"latency_s\[0\] must be a finite number >= 0, got -0.5"):
        jeeves_schedule(bad, 4, 2)
