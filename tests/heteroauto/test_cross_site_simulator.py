"""The simulator across sites (heteroauto/simulator.py): replicas sharing a cross-site link, the
global send list, peak in-flight micro-batches and the critical-path lower bounds."""

from hypothesis import given, settings
from hypothesis import strategies as st

from h2.core.schedule import one_f_one_b
from heteroauto.jeeves import Message, PipelineCosts, jeeves_schedule
from heteroauto.simulator import SharedLink, critical_path_bounds, shared_links_of, simulate_replicas
from heteroauto.stage_terms import StageTerms

costs = st.floats(min_value=0.05, max_value=4.0)


@st.composite
def cross_site_pipelines(draw):
    stages = draw(st.integers(2, 4))
    forward = draw(st.lists(costs, min_size=stages, max_size=stages))
    backward = draw(st.lists(costs, min_size=stages, max_size=stages))
    boundary = draw(st.integers(0, stages - 2))
    occupancy, latency = draw(st.floats(0.0, 3.0)), draw(st.floats(0.0, 20.0))
    pipeline = PipelineCosts(tuple(forward), tuple(backward),
                             tuple(occupancy if b == boundary else 0.0 for b in range(stages - 1)),
                             tuple(latency if b == boundary else 0.0 for b in range(stages - 1)),
                             tuple(b == boundary for b in range(stages - 1)))
    return pipeline, draw(st.integers(1, 8)), draw(st.integers(1, 6)), draw(st.integers(1, 3))


def _terms(pipeline: PipelineCosts) -> list[StageTerms]:
    return [StageTerms(f, b, 0.0, 0.0) for f, b in zip(pipeline.forward_s, pipeline.backward_s)]


@settings(max_examples=60, deadline=None)
@given(cross_site_pipelines())
def test_replaying_a_jeeves_schedule_with_its_send_lists_reproduces_its_timeline(case):
    pipeline, micro_batches, limit, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limit, replicas=replicas)
    replay = simulate_replicas(generated.actions, _terms(pipeline), shared_links=shared_links_of(pipeline, generated))
    assert abs(replay.iteration_s - generated.makespan_s) <= 1e-9 * max(1.0, generated.makespan_s)


@settings(max_examples=60, deadline=None)
@given(cross_site_pipelines())
def test_no_schedule_beats_the_critical_path_bound(case):
    pipeline, micro_batches, limit, replicas = case
    generated = jeeves_schedule(pipeline, micro_batches, limit, replicas=replicas)
    terms = _terms(pipeline)
    bound = critical_path_bounds(terms, micro_batches, replicas=replicas,
                                 shared_links=shared_links_of(pipeline)).bound_s
    jeeves = simulate_replicas(generated.actions, terms, shared_links=shared_links_of(pipeline, generated))
    baseline = simulate_replicas([one_f_one_b(pipeline.num_stages, micro_batches)] * replicas, terms,
                                 shared_links=shared_links_of(pipeline))
    assert min(jeeves.iteration_s, baseline.iteration_s) >= bound * (1 - 1e-9)


def test_replicas_splitting_a_link_wait_longer_than_one_after_another():
    pipeline = PipelineCosts((1.0, 1.0), (2.0, 2.0), (1.0, ), (0.0, ), (True, ))
    schedules = [one_f_one_b(2, 1)] * 4
    one_by_one = {"F": [Message(r, 0) for r in range(4)], "B": [Message(r, 0) for r in range(4)]}
    split = simulate_replicas(schedules, _terms(pipeline), shared_links={0: SharedLink(1.0, 0.0)})
    serial = simulate_replicas(schedules, _terms(pipeline), shared_links={0: SharedLink(1.0, 0.0, one_by_one)})
    assert (split.finish_s[0], serial.finish_s[0]) == (14.0, 8.0)


def test_the_send_list_order_decides_which_replica_goes_first():
    pipeline = PipelineCosts((1.0, 1.0), (2.0, 2.0), (1.0, ), (0.0, ), (True, ))
    last_first = {"F": [Message(1, 0), Message(0, 0)], "B": [Message(1, 0), Message(0, 0)]}
    result = simulate_replicas([one_f_one_b(2, 1)] * 2, _terms(pipeline),
                               shared_links={0: SharedLink(1.0, 0.0, last_first)})
    assert result.finish_s[0] == 9.0  # replica 0 waits for replica 1 both ways (8.0 going first)


def test_latency_delays_the_arrival_but_does_not_occupy_the_link():
    terms = [StageTerms(1.0, 2.0, 0.0, 0.0, send_occupancy_s=0.0, send_latency_s=10.0), StageTerms(1.0, 2.0, 0.0, 0.0)]
    result = simulate_replicas([one_f_one_b(2, 2)], terms, keep_timeline=True)
    sends = [(start, end) for name, start, end in result.timeline[0] if name.startswith("SEND_F")]
    assert sends == [(1.0, 11.0), (2.0, 12.0)]


def test_peak_in_flight_counts_the_micro_batches_a_stage_holds():
    terms = [StageTerms(1.0, 2.0, 0.0, 0.0)] * 4
    assert simulate_replicas([one_f_one_b(4, 8)], terms).peak_in_flight == [4, 3, 2, 1]
