"""Scoring one explicit strategy: memory per stage against capacity, each stage's terms under a cost
model (stage_terms), and the closed-form iteration time (cost.py); the simulator replays the same terms.

A stage with its own dp (fewer or more replicas than the strategy's dp) gives each replica
dp * micro_batch_size / dp_stage sequences per micro-batch; its profiled per-micro-batch times and
activation bytes are scaled by that ratio (first order: per-layer work is linear in the sequences)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.strategy import Strategy
from heteroauto.cost import pipeline_time_s
from heteroauto.memory import stage_memory_bytes
from heteroauto.profiles import LayerProfile, Profile
from heteroauto.stage_terms import StageTerms, check_cost_model, embedding_terms, head_terms, transfer_s


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
    terms: StageTerms

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes

    @property
    def compute_s(self) -> float:
        """Per micro-batch: forward, backward and recompute of the stage (with embedding or head)."""
        return self.terms.compute_s

    @property
    def update_s(self) -> float:
        return self.terms.update_s


@dataclass(frozen=True)
class StrategyReport:
    stages: list[StageReport]
    iteration_s: float
    tokens_per_iteration: int
    chips: int
    cost_model: str

    @property
    def tokens_per_chip_s(self) -> float:
        return self.tokens_per_iteration / self.iteration_s / self.chips

    @property
    def fits(self) -> bool:
        return all(stage.fits for stage in self.stages)

    @property
    def terms(self) -> list[StageTerms]:
        return [stage.terms for stage in self.stages]


def training_for(strategy: Strategy, training: TrainingSpec) -> TrainingSpec:
    """The training spec a strategy implies: its batch, micro-batch size and (if given) sequence length."""
    seq_len = strategy.seq_len or training.seq_len
    sequences = strategy.dp * strategy.micro_batches * strategy.micro_batch_size
    return dataclasses.replace(training, seq_len=seq_len, global_batch_sequences=sequences, global_batch_tokens=None,
                               micro_batch_size=strategy.micro_batch_size)


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
                               recompute_s=layer.recompute_s * ratio, activation_bytes=int(
                                   layer.activation_bytes * ratio), recompute_activation_bytes=int(
                                       layer.recompute_activation_bytes * ratio))


def strategy_terms(strategy: Strategy, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                   profiles: dict[str, Profile], cost_model: str, source: str = "strategy") -> list[StageTerms]:
    """Each stage's terms under `cost_model`; in the split-backward variant W takes half the weight work.
    Under "full", a stage's ends (embedding, head) as stage_terms.EndTerms prices them (the profile's
    measured time where it has one)."""
    check_cost_model(cost_model)
    last = len(strategy.stages) - 1
    terms = []
    for index, stage in enumerate(strategy.stages):
        dp = strategy.stage_dp(index)
        layer = stage_layer_profile(strategy, profiles, index)
        update = profiles[stage.chip].update_s(dp, stage.tp)
        if layer is None or update is None:
            raise UserError(f"{source}: field 'stages[{index}]': no profile of chip '{stage.chip}' at tp={stage.tp}, "
                            f"dp={dp}")
        forward = stage.layers * layer.forward_s
        backward = stage.layers * (layer.backward_s + (layer.recompute_s if stage.recompute else 0.0))
        weight_grad = stage.layers * layer.backward_s / 2
        update_s = stage.layers * update
        occupancy = latency = 0.0
        if cost_model == "full":
            chip, profile = cluster.chip(stage.chip), profiles[stage.chip]
            micro_batch_size = strategy.stage_micro_batch_size(index)
            ends = []
            if index == 0:
                ends.append(
                    embedding_terms(model, training, chip, profile, tp=stage.tp, dp=dp,
                                    micro_batch_size=micro_batch_size))
            if index == last:
                ends.append(head_terms(model, training, chip, profile, layer, dp=dp, micro_batch_size=micro_batch_size))
            for end in ends:
                forward, backward = forward + end.forward_s, backward + end.backward_s
                update_s += end.update_s
            if index < last:
                peer = strategy.stages[index + 1]
                occupancy, latency = transfer_s(cluster, model, training, strategy.micro_batch_sequences, chip,
                                                stage.tp * dp, cluster.chip(peer.chip),
                                                peer.tp * strategy.stage_dp(index + 1))
        terms.append(
            StageTerms(forward_s=forward, backward_s=backward, weight_grad_s=weight_grad, update_s=update_s,
                       send_occupancy_s=occupancy, send_latency_s=latency))
    return terms


def evaluate_strategy(strategy: Strategy, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                      profiles: dict[str,
                                     Profile], source: str = "strategy", cost_model: str = "full") -> StrategyReport:
    check_chips(strategy, cluster, source)
    terms = strategy_terms(strategy, cluster, model, training, profiles, cost_model, source)
    num_stages = len(strategy.stages)
    reports = []
    for index, (stage, stage_terms) in enumerate(zip(strategy.stages, terms)):
        chip = cluster.chip(stage.chip)
        dp = strategy.stage_dp(index)
        stage_training = dataclasses.replace(training, micro_batch_size=strategy.stage_micro_batch_size(index))
        memory = stage_memory_bytes(model, stage_training, stage_layer_profile(strategy, profiles, index), dp=dp,
                                    recompute=stage.recompute, position=index, num_stages=num_stages,
                                    micro_batches=strategy.micro_batches, layers=stage.layers)
        reports.append(
            StageReport(index=index, chip=stage.chip, tp=stage.tp, dp=dp, layers=stage.layers,
                        recompute=stage.recompute, memory_bytes=memory, capacity_bytes=chip.capacity_bytes,
                        terms=stage_terms))
    iteration = pipeline_time_s(terms, strategy.micro_batches, training.alpha)
    return StrategyReport(stages=reports, iteration_s=iteration, tokens_per_iteration=training.tokens,
                          chips=strategy.world_size, cost_model=cost_model)
