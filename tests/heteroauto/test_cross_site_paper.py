"""JEEVES's paper setup (configs/xdc/gpt3-175b.yaml: GPT-3 175B, 64 replicas x 8 stages x TP8 across two
sites) simulated by `heteroauto cross-site`, and its one-line errors."""

import json
import os

import pytest
import yaml

from h2.cli.heteroauto import main

SCENARIO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "xdc", "gpt3-175b.yaml")


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def paper_runs():
    from heteroauto.cross_site import compare, load_scenario
    scenario = load_scenario(SCENARIO)
    return {latency: compare(scenario.with_link(latency_ms=latency)) for latency in (1, 20)}


@pytest.mark.parametrize("latency", [1, 20])
def test_jeeves_is_never_slower_than_1f1b(paper_runs, latency):
    report = paper_runs[latency]
    assert report.jeeves.iteration_s <= report.one_f_one_b.iteration_s


def test_jeeves_saves_at_least_15_percent_at_20_ms(paper_runs):
    report = paper_runs[20]
    assert report.jeeves.iteration_s <= 0.85 * report.one_f_one_b.iteration_s


@pytest.mark.parametrize("latency", [1, 20])
def test_the_global_send_list_beats_replicas_splitting_the_link(paper_runs, latency):
    report = paper_runs[latency]
    assert report.jeeves.iteration_s < report.uncoordinated.iteration_s


@pytest.mark.parametrize("latency", [1, 20])
def test_jeeves_stays_within_1_25x_of_one_site(paper_runs, latency):
    report = paper_runs[latency]
    assert report.jeeves.iteration_s <= 1.25 * report.one_site.iteration_s


@pytest.mark.parametrize("latency", [1, 20])
def test_no_schedule_beats_the_critical_path_bound(paper_runs, latency):
    report = paper_runs[latency]
    for run_ in (report.jeeves, report.uncoordinated, report.one_f_one_b, report.one_site):
        assert run_.iteration_s >= run_.bounds.bound_s * (1 - 1e-9)


@pytest.mark.parametrize("latency", [1, 20])
def test_jeeves_keeps_every_stage_within_its_activation_budget(paper_runs, latency):
    report = paper_runs[latency]
    assert all(held <= k for held, k in zip(report.jeeves.peak_in_flight, report.jeeves.limits))


def test_a_tight_budget_moves_layers_off_the_stages_that_hold_more(capsys):
    code, out, _ = run(capsys, "cross-site", "--scenario", SCENARIO, "--latency-ms", "20", "--limit", "8", "--json")
    layers = json.loads(out)["jeeves"]["layers"]
    assert code == 0 and layers[0] < layers[-1]


def _scenario_with(tmp_path, edit):
    with open(SCENARIO) as f:
        data = yaml.safe_load(f)
    edit(data)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["--latency-ms", "-1"], "--latency-ms must be a number >= 0, got -1"),
    (["--bandwidth-gbps", "-5"], "--bandwidth-gbps must be a number >= 0, got -5"),
    (["--limit", "0"], "--limit: the in-flight limit K must be >= 1 (one micro-batch), got 0"),
])
def test_bad_flags_are_one_line_and_exit_2(capsys, argv, message):
    code, _, err = run(capsys, "cross-site", "--scenario", SCENARIO, *argv)
    assert (code, err.strip()) == (2, f"heteroauto: error: {message}")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["links"]["inter_site"].update(latency_us=-3), "links.inter_site.latency_us must be a number >= 0"),
    (lambda d: d["links"]["inter_site"].update(bandwidth_gbps=-1),
     "links.inter_site.bandwidth_gbps must be a number > 0"),
    (lambda d: d["sites"][1].update(stages=[4, 5, 6, 9]), "sites: every stage 0..7 must sit in exactly one site"),
    (lambda d: d["chip"].update(activation_budget_gb=1.0), "is below one micro-batch of a 12-layer stage"),
])
def test_bad_scenario_fields_are_one_line_naming_file_and_field_and_exit_2(capsys, tmp_path, edit, message):
    path = _scenario_with(tmp_path, edit)
    code, _, err = run(capsys, "cross-site", "--scenario", path)
    assert code == 2 and message in err and err.count("\n") == 1 and path in err


def test_the_comparison_also_holds_jeeves_to_the_memory_1f1b_uses(paper_runs):
    report = paper_runs[20]
    held = max(report.one_f_one_b.peak_in_flight)  # 1F1B's first stage: as many micro-batches as stages
    assert held == 8 and max(report.jeeves.peak_in_flight) > held  # the scenario's budget lets JEEVES hold more
    equal = report.jeeves_equal_memory
    assert equal.peak_layer_units <= held * 12  # what 1F1B holds on a 12-layer stage, in layers x micro-batches
    assert report.saving > report.equal_memory_saving > 0.15
    assert report.to_dict()["jeeves_saves_at_equal_memory"] == report.equal_memory_saving
