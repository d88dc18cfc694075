"""Scoring one explicit strategy: memory per stage against capacity, the cost model's iteration time,
and the inputs the simulator needs (per-stage costs, stage-to-stage transfer times).

A stage with its own dp (fewer or more replicas than the strategy's dp) gives each replica
dp * micro_batch_size / dp_stage sequences per micro-batch; its profiled per-micro-batch times and
activation bytes are scaled by that ratio (first order: per-layer work is linear in the sequences)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from h2.core.errors import UserError
from h2.core.links import rank_locations, stage_link
from h2.core.model_config import ModelConfig
from heteropp.auto.cost import iteration_time_s
from heteropp.auto.memory import stage_memory_bytes
from heteropp.auto.profiles import LayerProfile, Profile
from heteropp.auto.simulator import StageCost
from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.strategy import Strategy


@dataclass(frozen=True)
class StageReport:
    index: int
    chip: str
    tp: int
    dp: int
    layers: int
    recompute: bool
    memory_bytes: float
    capacity_bytes: float
    compute_s: float   # per micro-batch: layers * (t_fwd + t_bwd + r * t_recomp), plus the measured stage ends
    update_s: float

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes


@dataclass(frozen=True)
class StrategyReport:
    stages: list[StageReport]
    iteration_s: float
    tokens_per_iteration: int
    chips: int

    @property
    def tokens_per_chip_s(self) -> float:
        return self.tokens_per_iteration / self.iteration_s / self.chips

    @property
    def fits(self) -> bool:
        return all(stage.fits for stage in self.stages)


def training_for(strategy: Strategy, training: TrainingSpec) -> TrainingSpec:
    """The training spec a strategy implies: its batch, micro-batch size and (if given) sequence length."""
    seq_len = strategy.seq_len or training.seq_len
    sequences = strategy.dp * strategy.micro_batches * strategy.micro_batch_size
    return TrainingSpec(seq_len=seq_len, global_batch_sequences=sequences, micro_batch_size=strategy.micro_batch_size,
                        alpha=training.alpha, zero1=training.zero1, weight_bytes=training.weight_bytes,
                        gradient_bytes=training.gradient_bytes, optimizer_bytes=training.optimizer_bytes,
                        activation_bytes_per_element=training.activation_bytes_per_element)


def check_chips(strategy: Strategy, cluster: ClusterSpec, source: str) -> None:
    known = {c.name: c for c in cluster.chips}
    for index, stage in enumerate(strategy.stages):
        if stage.chip not in known:
            raise UserError(f"{source}: field 'stages[{index}].chip': unknown chip type '{stage.chip}' (cluster "
                            f"{cluster.source} has: {', '.join(known)})")
    for chip, used in strategy.chips_per_type().items():
        available = known[chip].count
        if used > available:
            raise UserError(f"{source}: field 'stages': uses {used} chips of type '{chip}', cluster "
                            f"{cluster.source} has {available}")


def stage_layer_profile(strategy: Strategy, profiles: dict[str, Profile], index: int) -> LayerProfile | None:
    """Stage `index`'s per-layer profile for the sequences one of its replicas holds per micro-batch."""
    stage = strategy.stages[index]
    layer = profiles[stage.chip].layer(stage.tp)
    ratio = strategy.stage_micro_batch_size(index) / strategy.micro_batch_size
    if layer is None or ratio == 1:
        return layer
    return dataclasses.replace(layer, forward_s=layer.forward_s * ratio, backward_s=layer.backward_s * ratio,
                               recompute_s=layer.recompute_s * ratio,
                               activation_bytes=int(layer.activation_bytes * ratio),
                               recompute_activation_bytes=int(layer.recompute_activation_bytes * ratio))


def stage_end_s(strategy: Strategy, profiles: dict[str, Profile], index: int) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch that stage `index` computes besides its layers: the
    embedding on the first stage, the final norm, head and loss on the last, where its chip's profile
    measured them (a synthesised profile has none: the paper's model counts layers only)."""
    stage = strategy.stages[index]
    end = profiles[stage.chip].stage_end(stage.tp)
    if end is None:
        return 0.0, 0.0
    forward = backward = 0.0
    if index == 0:
        forward, backward = forward + end.embedding_forward_s, backward + end.embedding_backward_s
    if index == len(strategy.stages) - 1:
        forward, backward = forward + end.head_forward_s, backward + end.head_backward_s
    ratio = strategy.stage_micro_batch_size(index) / strategy.micro_batch_size
    return forward * ratio, backward * ratio


def evaluate_strategy(strategy: Strategy, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                      profiles: dict[str, Profile], source: str = "strategy") -> StrategyReport:
    check_chips(strategy, cluster, source)
    num_stages = len(strategy.stages)
    reports = []
    for index, stage in enumerate(strategy.stages):
        chip = cluster.chip(stage.chip)
        dp = strategy.stage_dp(index)
        layer = stage_layer_profile(strategy, profiles, index)
        update = profiles[stage.chip].update_s(dp, stage.tp)
        if layer is None or update is None:
            raise UserError(f"{source}: field 'stages[{index}]': no profile of chip '{stage.chip}' at tp={stage.tp}, "
                            f"dp={dp}")
        stage_training = dataclasses.replace(training, micro_batch_size=strategy.stage_micro_batch_size(index))
        memory = stage_memory_bytes(model, stage_training, layer, dp=dp, recompute=stage.recompute, position=index,
                                    num_stages=num_stages, micro_batches=strategy.micro_batches, layers=stage.layers)
        reports.append(StageReport(index=index, chip=stage.chip, tp=stage.tp, dp=dp, layers=stage.layers,
                                   recompute=stage.recompute, memory_bytes=memory, capacity_bytes=chip.capacity_bytes,
                                   compute_s=stage.layers * layer.compute_s(stage.recompute)
                                   + sum(stage_end_s(strategy, profiles, index)),
                                   update_s=stage.layers * update))
    iteration = iteration_time_s([r.compute_s for r in reports], [r.update_s for r in reports],
                                 strategy.micro_batches, training.alpha)
    return StrategyReport(stages=reports, iteration_s=iteration, tokens_per_iteration=training.tokens,
                          chips=strategy.world_size)


def stage_costs(strategy: Strategy, profiles: dict[str, Profile], report: StrategyReport) -> list[StageCost]:
    """Per-stage costs for the simulator; in the split variant W takes half of the gradient work."""
    costs = []
    for index, (stage, row) in enumerate(zip(strategy.stages, report.stages)):
        layer = stage_layer_profile(strategy, profiles, index)
        end_forward, end_backward = stage_end_s(strategy, profiles, index)
        forward = stage.layers * layer.forward_s + end_forward
        backward = stage.layers * (layer.backward_s + (layer.recompute_s if stage.recompute else 0.0)) + end_backward
        costs.append(StageCost(forward_s=forward, backward_s=backward,
                               weight_grad_s=stage.layers * layer.backward_s / 2, update_s=row.update_s))
    return costs


def transfer_model(strategy: Strategy, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec):
    """Activation (or gradient) of one micro-batch between neighbouring stages: one copy of all its
    sequences crosses (send/recv + all-gather resharding), spread over the chips of the smaller side
    (tp * dp of them, each with its own link), at the slowest link class between the two stages' ranks
    (h2.core.links: the cluster's `links:` section, else the chips' own fields), plus its latency."""
    nbytes = (strategy.micro_batch_sequences * training.seq_len * model.hidden_size
              * training.activation_bytes_per_element)
    locations = rank_locations(strategy, cluster)
    links = {}

    def transfer_s(src: int, dst: int, kind: str, micro_batch: int) -> float:
        a, b = strategy.stages[src], strategy.stages[dst]
        lanes = min(a.tp * strategy.stage_dp(src), b.tp * strategy.stage_dp(dst))
        if (src, dst) not in links:
            links[src, dst] = stage_link(strategy, cluster, locations, src, dst)
        return links[src, dst].seconds(nbytes / lanes)

    return transfer_s
