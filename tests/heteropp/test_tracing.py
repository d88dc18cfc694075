"""Trace spans: recompute is recorded when the backward re-runs a layer; the simulator's predicted
schedule becomes the same trace-event format, one track per stage."""

from __future__ import annotations

import json

import pytest
import torch

from h2.core.schedule import schedule_actions
from h2.core.trace import write_trace
from heteroauto.simulator import simulate, trace_events
from heteroauto.stage_terms import StageTerms
from heteropp.stage import RecomputedLayer
from heteropp.tracing import SpanRecorder


def test_a_recomputed_layer_records_a_recompute_span_during_backward_only():
    recorder = SpanRecorder(0, "stage 0", torch.device("cpu"))
    layer = RecomputedLayer(torch.nn.Linear(4, 4), recorder)
    output = layer(torch.randn(2, 4, requires_grad=True))
    assert recorder.events == []
    output.sum().backward()
    assert [e["cat"] for e in recorder.events] == ["recompute"]


def test_the_simulated_split_schedule_traces_input_and_weight_backward_on_every_stage():
    schedule = schedule_actions("1f1b-split-backward", 3, 4)
    result = simulate(schedule, [StageTerms(1.0, 2.0, 1.0, 0.5, send_occupancy_s=0.1)] * 3, keep_timeline=True)
    events = trace_events(result, ["a", "b", "c"], split_backward=True)
    for stage in range(3):
        kinds = {e["cat"] for e in events if e["ph"] == "X" and e["pid"] == stage}
        assert {"forward", "backward-input", "backward-weight", "optimizer"} <= kinds


def test_a_simulated_send_lies_on_its_own_lane_from_leaving_to_arriving():
    schedule = schedule_actions("1f1b", 2, 2)
    result = simulate(schedule, [StageTerms(1.0, 2.0, 0.0, 0.0, send_occupancy_s=0.25)] * 2, keep_timeline=True)
    sends = [e for e in trace_events(result, ["a", "b"], split_backward=False) if e.get("cat") == "send"]
    assert sends and all(e["tid"] == 1 and e["dur"] == pytest.approx(0.25e6) for e in sends)


def test_a_written_trace_is_chrome_trace_event_json(tmp_path):
    result = simulate(schedule_actions("1f1b", 2, 2), [StageTerms(1.0, 2.0, 0.0, 0.0)] * 2, keep_timeline=True)
    path = tmp_path / "t.json"
    write_trace(str(path), trace_events(result, ["a", "b"], split_backward=False))
    data = json.loads(path.read_text())
    assert all({"name", "ph", "pid", "tid"} <= set(e) for e in data["traceEvents"])


def test_heteroauto_simulate_writes_its_predicted_step_as_a_trace_with_one_track_per_stage(cli, tmp_path):
    path = tmp_path / "predicted.json"
    result = cli("h2.cli.heteroauto", "simulate", "--cluster", "configs/clusters/local-emulated.yaml", "--strategy",
                 "configs/strategies/local-tiny-pp2.yaml", "--trace", str(path))
    assert result.returncode == 0, result.stderr
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
