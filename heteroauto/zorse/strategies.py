"""A Zorse plan as a strategy file (h2.core.strategy) and back.

Plan to strategy: one stage per group, in pipeline order, with the chip type and rows of each rank
(`chips`, `rows`: a mixed-type group), tp 1, the group's layers and the plan's recompute; the
strategy's dp * micro_batch_size is the micro-batch's S sequences (dp = S, micro_batch_size = 1),
`schedule: gpipe` (the order it runs in), `ministages`, `optimizer_sharding: zero2` and `offload`.
Strategy to plan (to score any strategy of this shape with the same models and simulator): each rank
of chip type X takes the next GPU of type X in the cluster graph's node order, and a group's machines
are the nodes its ranks land on.
"""

from __future__ import annotations

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import PRESETS, ModelConfig
from h2.core.schedule import MINISTAGE_SCHEDULE
from h2.core.strategy import StageSpec, Strategy
from heteroauto.zorse.costs import GroupShape, Shapes, latency, rank_memory, transfer
from heteroauto.zorse.graph import Machine, link_across, machines_of, slowest_link
from heteroauto.zorse.planner import GroupPlan, ZorsePlan

OFFLOADED = ["activations", "parameters"]


def to_strategy(plan: ZorsePlan, model: ModelConfig) -> Strategy:
    stages = [
        StageSpec(chip=group.chips[0], tp=1, layers=group.layers, recompute=plan.recompute, chips=list(group.chips),
                  rows=list(group.rows)) for group in plan.groups
    ]
    strategy = Strategy(dp=plan.micro_batch_sequences, micro_batches=plan.micro_batches, micro_batch_size=1,
                        stages=stages, model=model.name if PRESETS.get(model.name) == model else model.to_dict(),
                        schedule=MINISTAGE_SCHEDULE, seq_len=plan.seq_len, ministages=plan.ministages,
                        optimizer_sharding="zero2", offload=list(OFFLOADED) if plan.offload else [])
    strategy.validate("zorse plan")
    return strategy


def is_zorse_strategy(strategy: Strategy) -> bool:
    """A strategy only the Zorse models price: mixed-type groups, ministages, ZeRO-2 or offload."""
    return (strategy.ministages > 1 or bool(strategy.offload) or strategy.optimizer_sharding == "zero2"
            or any(stage.chips for stage in strategy.stages))


def _place(strategy: Strategy, cluster: ClusterSpec, source: str) -> list[list[Machine]]:
    """Each stage's machines: ranks of a chip type take that type's GPUs in node order."""
    free: dict[str, list[Machine]] = {}
    for machine in machines_of(cluster):
        for chip in machine.chips:
            free.setdefault(chip, []).append(machine)
    groups = []
    for index, stage in enumerate(strategy.stages):
        if stage.tp != 1:
            raise UserError(f"{source}: field 'stages[{index}].tp': the Zorse models price tp 1 groups, got {stage.tp}")
        placed: list[Machine] = []
        for replica in range(strategy.stage_dp(index)):
            chip = stage.replica_chip(replica)
            cluster.chip(chip)
            if not free.get(chip):
                raise UserError(f"{source}: field 'stages[{index}]': places more chips of type '{chip}' than "
                                f"cluster {cluster.source} has")
            machine = free[chip].pop(0)
            if machine not in placed:
                placed.append(machine)
        groups.append(placed)
    return groups


def from_strategy(strategy: Strategy, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, rates: dict,
                  source: str = "strategy", overlap: bool = True, grad_clip: float = 1.0) -> ZorsePlan:
    """The plan a strategy describes, priced by the Zorse latency and memory models (for a run clipping
    gradients at grad_clip, 0: none)."""
    shapes = Shapes.of(model, training)
    groups = _place(strategy, cluster, source)
    if len({stage.recompute for stage in strategy.stages}) != 1:
        raise UserError(f"{source}: field 'stages': the Zorse models take recompute on every stage or on none")
    recompute = strategy.stages[0].recompute
    shaped = [
        GroupShape(tuple(rates[stage.replica_chip(r)] for r in range(strategy.stage_dp(i))),
                   tuple(strategy.stage_rows(i)), slowest_link(cluster, groups[i]), recompute)
        for i, stage in enumerate(strategy.stages)
    ]
    count = len(shaped)
    sequences = strategy.micro_batch_sequences
    hops = [
        transfer(shaped[g], shaped[(g + 1) % count],
                 link_across(cluster, groups[g], groups[(g + 1) % count]) if count > 1 else shaped[g].link, sequences,
                 shapes) for g in range(count)
    ]
    chunks = [tuple(strategy.chunk_sizes(index)) for index in range(count)]
    offload = bool(strategy.offload)
    memory = [
        tuple(
            rank_memory(group, r, chunks[g], strategy.micro_batches, offload, g == 0, g == count -
                        1, shapes, grad_clip=grad_clip, overlap=overlap) for r in range(group.size))
        for g, group in enumerate(shaped)
    ]
    predicted = latency(shaped, chunks, hops, strategy.micro_batches, offload, shapes, overlap)
    plan_groups = tuple(
        GroupPlan(tuple(groups[g]), tuple(rate.name
                                          for rate in group.rates), group.rows, chunks[g], group.link, memory[g])
        for g, group in enumerate(shaped))
    return ZorsePlan(groups=plan_groups, micro_batch_sequences=sequences, micro_batches=strategy.micro_batches,
                     ministages=strategy.ministages, offload=offload, recompute=recompute, latency=predicted,
                     transfers=tuple(hops), seq_len=training.seq_len, overlap=overlap)
