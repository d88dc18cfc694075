"""JEEVES's stage division by the paper's objective (heteroauto.jeeves_division): the HiGHS MILP finds
the optimum that trying every division finds, on random small pipelines across two sites."""

from __future__ import annotations

import json
import math
import os
import random

import pytest
import yaml

from h2.cli.heteroauto import main
from h2.core.errors import UserError
from heteroauto.cross_site import division_problem, jeeves_run, load_scenario
from heteroauto.jeeves_division import DivisionProblem, estimate, exhaustive, solve


def _random_problem(rng: random.Random) -> DivisionProblem:
    stages = rng.randint(2, 4)
    layers = rng.randint(stages, 10)
    cut = rng.randint(0, stages - 2)
    shared = tuple(b == cut for b in range(stages - 1))
    micro_batches = rng.randint(2, 8)
    return DivisionProblem(num_layers=layers, num_stages=stages, layer_forward_s=rng.uniform(0.5, 2.0),
                           backward_factor=rng.choice([1.0, 2.0, 3.0]), occupancy_s=tuple(
                               rng.uniform(0.0, 2.0) if s else rng.uniform(0.0, 0.2) for s in shared), latency_s=tuple(
                                   rng.uniform(0.0, 20.0) if s else 0.01
                                   for s in shared), shared=shared, micro_batches=micro_batches, replicas=rng.randint(
                                       1, 3), budget_layer_units=rng.uniform(math.ceil(layers / stages),
                                                                             layers * micro_batches / 2))


@pytest.mark.parametrize("seed", range(25))
def test_the_milp_finds_the_best_division_of_every_small_instance(seed):
    problem = _random_problem(random.Random(seed))
    solved, best = solve(problem), exhaustive(problem)
    assert solved.iteration_s == pytest.approx(best.iteration_s, rel=1e-7, abs=1e-9)
    assert estimate(problem, solved.layers) == solved


def test_memory_binding_moves_layers_off_the_stages_that_hold_most():
    # three stages, the first holds the most: a tight budget makes its memory delay the larger term
    problem = DivisionProblem(num_layers=12, num_stages=3, layer_forward_s=1.0, backward_factor=2.0,
                              occupancy_s=(0.1, 0.1), latency_s=(30.0, 0.01), shared=(True, False), micro_batches=8,
                              replicas=1, budget_layer_units=12)
    solved = solve(problem)
    assert solved == exhaustive(problem)
    uniform = estimate(problem, (4, 4, 4))
    assert uniform.memory_delay_s > 0 and solved.iteration_s < uniform.iteration_s
    assert solved.layers[0] < 4


def test_a_budget_below_one_layer_is_one_line():
    problem = DivisionProblem(num_layers=4, num_stages=2, layer_forward_s=1.0, backward_factor=2.0, occupancy_s=(0.1, ),
                              latency_s=(1.0, ), shared=(True, ), micro_batches=4, replicas=1, budget_layer_units=0.5)
    with pytest.raises(UserError, match="below one micro-batch"):
        solve(problem)


def test_the_gpt3_scenario_is_a_division_problem():
    scenario = load_scenario("configs/xdc/gpt3-175b.yaml").with_link(latency_ms=20).with_limit(8)
    problem = division_problem(scenario)
    assert problem.shared == (False, False, False, True, False, False, False)
    assert problem.held(12) == 8 and problem.replicas == 64


def test_cross_site_runs_jeeves_on_the_solver_division_when_asked(capsys, tmp_path):
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "xdc", "gpt3-175b.yaml")) as f:
        data = yaml.safe_load(f)
    data["model"]["layers"] = 16
    data["pipeline"].update(stages=4, replicas=2, micro_batches=8)
    data["sites"] = [{"name": "dc1", "stages": [0, 1]}, {"name": "dc2", "stages": [2, 3]}]
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main([
        "cross-site", "--scenario",
        str(path), "--latency-ms", "20", "--limit", "3", "--solver-division", "--json"
    ])
    solver = json.loads(capsys.readouterr().out)["jeeves_solver_division"]
    scenario = load_scenario(str(path)).with_link(latency_ms=20).with_limit(3)
    assert code == 0 and tuple(solver["layers"]) == solve(division_problem(scenario)).layers
    assert solver["iteration_s"] == pytest.approx(jeeves_run(scenario, tuple(solver["layers"])).iteration_s)
