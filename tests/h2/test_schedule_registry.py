"""The schedule registry (h2.core.schedule): one set of names accepted by every entry (Python options, a
job file, the command line, a strategy file), one-line refusals of any other name, the schedule a Zorse
plan runs named in its strategy, and resolve_schedule's rules."""

from __future__ import annotations

import dataclasses
import os
import typing

import pytest

from h2.core import flags
from h2.core.errors import UserError
from h2.core.schedule import SCHEDULES, gpipe_ministages, one_f_one_b
from h2.core.strategy import StageSpec, Strategy, load_strategy
from h2.core.training import PipelineOptions

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PP2 = os.path.join(REPO_ROOT, "configs", "strategies", "local-tiny-pp2.yaml")
UNKNOWN = "zero-bubble-v"


def two_stages(**fields) -> Strategy:
    strategy = Strategy(dp=1, micro_batches=4, micro_batch_size=1, model="tiny",
                        stages=[StageSpec(chip="A", tp=1, layers=2),
                                StageSpec(chip="A", tp=1, layers=2)])
    return dataclasses.replace(strategy, **fields)


# ---- every entry accepts the same names ------------------------------------------------------------
def accepted_by_python_options(name: str) -> bool:
    try:
        PipelineOptions(schedule=name)
    except UserError:
        return False
    return True


def accepted_by_a_job_file(name: str, tmp_path) -> bool:
    job = tmp_path / "job.yaml"
    job.write_text(f"schedule: {name}\n")
    try:
        flags.job_values(job, [PipelineOptions])
    except UserError:
        return False
    return True


def accepted_by_the_command_line(name: str) -> bool:
    from h2.cli.main import build_parser
    try:
        build_parser().parse_args(["train", "--schedule", name])
    except (UserError, SystemExit):
        return False
    return True


def accepted_by_a_strategy_file(name: str, tmp_path) -> bool:
    path = tmp_path / "strategy.yaml"
    path.write_text(open(PP2).read().replace("schedule: 1f1b", f"schedule: {name}"))
    try:
        load_strategy(path)
    except UserError:
        return False
    return True


def names_spelled_anywhere() -> set[str]:
    """Every schedule name the code spells as a choice: the registry's and each annotation's."""
    annotations = [typing.get_type_hints(PipelineOptions)["schedule"], typing.get_type_hints(Strategy)["schedule"]]
    literals = {arg for annotation in annotations for arg in _literal_args(annotation)}
    return set(SCHEDULES) | literals


def _literal_args(annotation) -> tuple:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return tuple(arg for option in typing.get_args(annotation) for arg in _literal_args(option))


def test_every_schedule_name_accepted_anywhere_is_accepted_by_every_entry(tmp_path, capsys):
    names = names_spelled_anywhere()
    assert {"1f1b", "1f1b-split-backward", "jeeves", "gpipe"} <= names
    for name in sorted(names):
        accepted = {
            "python options": accepted_by_python_options(name), "job file": accepted_by_a_job_file(name, tmp_path),
            "command line": accepted_by_the_command_line(name), "strategy file": accepted_by_a_strategy_file(
                name, tmp_path)
        }
        assert all(accepted.values()), f"schedule '{name}': {accepted}"


def test_an_unknown_schedule_in_python_options_is_one_line():
    with pytest.raises(UserError) as error:
        PipelineOptions(schedule=UNKNOWN)
    assert str(error.value) == f"--schedule must be one of {', '.join(SCHEDULES)}, got '{UNKNOWN}'"


def test_an_unknown_schedule_in_a_job_file_is_one_line_naming_file_and_key(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(f"schedule: {UNKNOWN}\n")
    with pytest.raises(UserError) as error:
        flags.job_values(job, [PipelineOptions])
    assert str(error.value).startswith(f"{job}: key 'schedule': must be one of ")
    assert "\n" not in str(error.value)


def test_an_unknown_schedule_on_the_command_line_is_one_line_with_exit_2(cli, tmp_path):
    result = cli("h2", "train", "--strategy", PP2, "--schedule", UNKNOWN, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and f"invalid choice: '{UNKNOWN}'" in result.stderr


def test_an_unknown_schedule_in_a_strategy_file_is_one_line_naming_file_and_field(tmp_path):
    path = tmp_path / "strategy.yaml"
    path.write_text(open(PP2).read().replace("schedule: 1f1b", f"schedule: {UNKNOWN}"))
    with pytest.raises(UserError) as error:
        load_strategy(path)
    assert str(error.value).startswith(f"{path}: field 'schedule': must be one of ")
    assert "\n" not in str(error.value)


def test_an_unknown_schedule_in_a_strategy_built_in_python_is_refused_by_its_validation():
    with pytest.raises(UserError, match=rf"^s.yaml: field 'schedule': unknown schedule '{UNKNOWN}' \(known: "):
        two_stages(schedule=UNKNOWN).validate("s.yaml")


# ---- a Zorse plan names the schedule it runs --------------------------------------------------------
def test_a_zorse_plan_names_the_schedule_it_runs():
    from h2.core.cluster import load_cluster
    from h2.core.model_config import resolve_model
    from heteroauto.profiles import profiles_for
    from heteroauto.zorse.planner import plan, rates_from_profiles
    from heteroauto.zorse.scoring import plan_schedule
    from heteroauto.zorse.strategies import to_strategy

    cluster = load_cluster(os.path.join(REPO_ROOT, "configs", "clusters", "zorse-a.yaml"))
    model = resolve_model(os.path.join(REPO_ROOT, "configs", "models", "llama-7b.yaml"))
    training = dataclasses.replace(cluster.training, micro_batch_size=1)
    rates = rates_from_profiles(cluster, profiles_for(cluster, model, training, []))
    # one ministage, no offload: only the strategy's schedule says it runs in GPipe order
    best = plan(cluster, model, training, rates, max_groups=1, ministages=1, offload="off").best
    strategy = to_strategy(best, model)
    assert (strategy.ministages, strategy.offload) == (1, [])
    assert strategy.schedule == "gpipe"
    from h2.core.stage_orders import run_schedule
    assert run_schedule(strategy) == plan_schedule(best)  # what the ranks run is what the planner simulated


# ---- resolve_schedule's rules ------------------------------------------------------------------------
def test_the_strategys_schedule_runs_unless_an_override_names_another():
    from h2.core.schedule import resolve_schedule
    assert resolve_schedule(two_stages(schedule="1f1b-split-backward")).name == "1f1b-split-backward"
    assert resolve_schedule(two_stages(schedule="1f1b-split-backward"), "jeeves").name == "jeeves"


@pytest.mark.parametrize("zorse", [{"ministages": 2}, {"offload": ["activations"]}], ids=["ministages", "offload"])
def test_a_strategy_with_ministages_or_offload_runs_gpipe_on_the_ministage_executor(zorse):
    from h2.core.schedule import resolve_schedule
    for override in (None, "gpipe"):
        resolved = resolve_schedule(two_stages(**zorse), override)
        assert resolved.name == "gpipe" and resolved.ministage_executor


def test_an_override_other_than_gpipe_on_ministages_is_one_line():
    from h2.core.schedule import resolve_schedule
    with pytest.raises(UserError) as error:
        resolve_schedule(two_stages(ministages=2), "1f1b")
    assert str(error.value) == ("--schedule 1f1b does not apply to a strategy with ministages or offload "
                                "(they run in GPipe order)")


def test_only_gpipe_runs_on_the_ministage_executor_and_only_jeeves_needs_orders():
    from h2.core.schedule import REGISTRY
    assert [name for name, entry in REGISTRY.items() if entry.ministage_executor] == ["gpipe"]
    assert [name for name, entry in REGISTRY.items() if entry.needs_orders] == ["jeeves"]


def test_a_strategy_with_ministages_runs_gpipe_over_its_chunks():
    from h2.core.stage_orders import run_schedule
    assert run_schedule(two_stages(ministages=2)) == gpipe_ministages(2, 4, 2)
    assert run_schedule(two_stages(schedule="gpipe")) == gpipe_ministages(2, 4, 1)


def test_a_strategys_orders_run_only_under_its_own_schedule():
    from h2.core.stage_orders import needs_generated_orders, run_schedule
    forwards_first = ["F0 F1 F2 F3 B0 B1 B2 B3"] * 2
    jeeves = two_stages(schedule="jeeves", orders=forwards_first)
    assert [str(a) for a in run_schedule(jeeves)[1] if a.kind in ("F", "B")] == forwards_first[1].split()
    assert run_schedule(jeeves, "1f1b") == one_f_one_b(2, 4)
    assert not needs_generated_orders(jeeves)
    assert needs_generated_orders(two_stages(), "jeeves") and not needs_generated_orders(two_stages())


def test_the_planners_bubble_coefficient_names_its_schedule_and_back():
    from h2.core.schedule import REGISTRY, schedule_for_alpha
    assert schedule_for_alpha(0.0) == "1f1b-split-backward" and schedule_for_alpha(1.0) == "1f1b"
    assert {name: entry.alpha for name, entry in REGISTRY.items()} == {
        "1f1b": 1.0, "1f1b-split-backward": 0.0, "jeeves": 1.0, "gpipe": 1.0
    }


def test_schedule_actions_is_the_one_builder_by_name():
    import h2.core.schedule as schedule
    assert not hasattr(schedule, "stage_actions")
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule.schedule_actions(UNKNOWN, 2, 4)
