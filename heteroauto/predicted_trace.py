"""The simulator's predicted schedule written as a Chrome/Perfetto trace (h2.core.trace): one track per
stage of a HeteroAuto strategy, or per pipeline group of a Zorse plan, beside the runtime's measured one."""

from __future__ import annotations

from h2.core.schedule import schedule_named
from h2.core.trace import write_trace
from heteroauto.evaluation import StrategyReport
from heteroauto.simulator import SimulationResult, trace_events
from heteroauto.zorse.planner import ZorsePlan

PREDICTED = {"source": "predicted"}


def write_strategy_trace(path: str, simulation: SimulationResult, report: StrategyReport, schedule: str) -> None:
    """One track per stage of the strategy `report` scored, labelled with its chip, tp, dp and layers."""
    labels = [f"{s.chip} tp {s.tp} dp {s.dp}, {s.layers} layers" for s in report.stages]
    write_trace(path, trace_events(simulation, labels, schedule_named(schedule).splits_backward), PREDICTED)


def write_zorse_trace(path: str, replay: SimulationResult, plan: ZorsePlan) -> None:
    """One track per pipeline group of the Zorse `plan`."""
    labels = [
        f"{len(group.chips)} ranks ({', '.join(sorted(set(group.chips)))}), {group.layers} layers in "
        f"{plan.ministages} ministages" for group in plan.groups
    ]
    write_trace(path, trace_events(replay, labels, False), PREDICTED)
