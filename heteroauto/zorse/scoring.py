"""A Zorse plan as the shared simulator's input (heteroauto.simulator): the interleaved GPipe action
lists (h2.core.schedule.gpipe_ministages, one list per group) and one StageTerms per ministage.

Ministage c of group g is stage c * G + g. Per micro-batch it takes its share of the ministage's step
time from the latency model (costs.ministage_times: compute, or the gathers and offload traffic where
they are slower, divided by M); its update is the ministage's optimizer step; its send is the group's
transfer to the next group (costs.transfer).
"""

from __future__ import annotations

from h2.core.cluster import TrainingSpec
from h2.core.model_config import ModelConfig
from h2.core.schedule import Action, gpipe_ministages
from heteroauto.simulator import SimulationResult, simulate
from heteroauto.stage_terms import StageTerms
from heteroauto.zorse.costs import GroupShape, Shapes, ministage_times
from heteroauto.zorse.planner import ZorsePlan


def plan_schedule(plan: ZorsePlan) -> list[list[Action]]:
    return gpipe_ministages(len(plan.groups), plan.micro_batches, plan.ministages)


def plan_terms(plan: ZorsePlan, rates: dict, shapes: Shapes) -> list[StageTerms]:
    count = len(plan.groups)
    terms: list[StageTerms | None] = [None] * (count * plan.ministages)
    for g, group in enumerate(plan.groups):
        shaped = GroupShape(tuple(rates[chip] for chip in group.chips), group.rows, group.link, plan.recompute)
        hop = plan.transfers[g]
        for c, layers in enumerate(group.ministage_layers):
            stage = c * count + g
            times = ministage_times(shaped, layers, plan.ministages, plan.micro_batches, plan.offload, shapes,
                                    plan.overlap)
            last = stage == len(terms) - 1
            terms[stage] = StageTerms(forward_s=times.forward_s / plan.micro_batches, backward_s=times.backward_s /
                                      plan.micro_batches, weight_grad_s=0.0, update_s=times.step_s, send_occupancy_s=0.0
                                      if last else hop.occupancy_s, send_latency_s=0.0 if last else hop.latency_s)
    return terms


def simulate_plan(plan: ZorsePlan, rates: dict, model: ModelConfig, training: TrainingSpec,
                  keep_timeline: bool = False) -> SimulationResult:
    return simulate(plan_schedule(plan), plan_terms(plan, rates, Shapes.of(model, training)),
                    keep_timeline=keep_timeline)
