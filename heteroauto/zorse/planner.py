"""Phase 2: from each phase-1 partition, the best plan under the latency and memory models (costs).

For every partition of the machines into k groups (k from the number of machines down to 1):
- order the groups: first the one whose slowest internal link is fastest (its first gather has
  nothing to hide behind), then each time the group best linked to the last one placed;
- for every micro-batch size S (a divisor of the global batch in sequences, at least one row per
  rank of the largest group): split S over each group's ranks in proportion to speed
  (costs.rows_per_rank);
- the layers go to the groups in proportion to group speed (each layer to the group that would
  finish it first: the seed's rule); only when no plan of any partition fits that way, a second pass,
  for each ministage count and offload choice, moves one layer at a time from a group whose fullest
  rank exceeds its memory to the group with the most room, as long as that empties the fuller of the
  two (_relieve_memory); so memory pressure first adds ministages or offload, as the seed's planner
  does, and moves layers only where those cannot make the speed split fit;
- for recompute on and off, every count k of ministages per group up to the smallest group's layers
  (each group's layers cut into k ministages as evenly as possible, the larger ones first: the seed's
  "evenly sized ministages"; h2.core.strategy.even_chunks, the strategy format's rule), and offload off/on:
  keep the plan if every rank fits the memory model, and the fastest by the latency model.
When nothing fits, the error names the constraint the nearest candidate broke.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.links import Link
from h2.core.model_config import ModelConfig
from h2.core.numbers import divisors
from h2.core.strategy import even_chunks
from heteroauto.profiles import Profile
from heteroauto.zorse.costs import (
    ChipRates,
    GroupShape,
    Latency,
    RankMemory,
    Shapes,
    Transfer,
    chip_rates,
    latency,
    proportional_counts,
    rank_memory,
    rows_per_rank,
    transfer,
)
from heteroauto.zorse.graph import Machine, bandwidth_graph, link_across, machines_of, slowest_link
from heteroauto.zorse.partition import Partition, split_partitions

GB = 1e9
OFFLOAD_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class GroupPlan:
    machines: tuple[Machine, ...]
    chips: tuple[str, ...]  # each rank's chip type
    rows: tuple[int, ...]  # each rank's sequences of one micro-batch
    ministage_layers: tuple[int, ...]  # layers of each ministage, in pipeline order
    link: Link  # the slowest link inside the group
    memory: tuple[RankMemory, ...]  # each rank's, by the memory model

    @property
    def layers(self) -> int:
        return sum(self.ministage_layers)

    @property
    def label(self) -> str:
        return "+".join(machine.label for machine in self.machines)

    @property
    def regions(self) -> set[str]:
        return {machine.region for machine in self.machines}


@dataclass(frozen=True)
class ZorsePlan:
    groups: tuple[GroupPlan, ...]  # pipeline order
    micro_batch_sequences: int  # S: sequences of one pipeline micro-batch (all ranks of a group)
    micro_batches: int  # M
    ministages: int  # per group
    offload: bool
    recompute: bool
    latency: Latency
    transfers: tuple[Transfer, ...]  # group g to group (g + 1) % G
    seq_len: int
    overlap: bool = True  # communication and offload overlap compute (Zorse); False: HeteroPP's

    @property
    def max_memory_fraction(self) -> float:
        return max(memory.fraction for group in self.groups for memory in group.memory)


@dataclass(frozen=True)
class PlanSearch:
    best: ZorsePlan
    partitions: list[Partition]
    evaluated: int
    search_s: float


def rates_from_profiles(cluster: ClusterSpec, profiles: dict[str, Profile],
                        memory_fraction: float = 1.0) -> dict[str, ChipRates]:
    """Per-sequence, per-layer rates at tp 1 of each chip type (Zorse uses no tensor parallelism); each
    chip may use memory_fraction of its usable memory."""
    if not 0 < memory_fraction <= 1:
        raise UserError(f"--memory-fraction: must be in (0, 1], got {memory_fraction}")
    rates = {}
    for chip in cluster.chips:
        layer = profiles[chip.name].layer(1)
        if layer is None:
            raise UserError(f"profile of chip '{chip.name}': no tp 1 entry (the Zorse planner plans without TP)")
        sequences = profiles[chip.name].micro_batch_size
        rates[chip.name] = chip_rates(chip, layer.forward_s / sequences, layer.backward_s / sequences,
                                      layer.recompute_s / sequences, memory_fraction)
    return rates


def group_order(cluster: ClusterSpec, groups: list[list[Machine]]) -> list[list[Machine]]:
    """Fastest inside first, then each time the group best linked to the last one placed."""
    inside = [slowest_link(cluster, group) for group in groups]
    first = min(range(len(groups)), key=lambda i: (-inside[i].bandwidth_gbps, inside[i].latency_us, i))
    order, left = [first], set(range(len(groups))) - {first}
    while left:
        last = groups[order[-1]]
        between = {i: link_across(cluster, last, groups[i]) for i in left}
        nearest = min(left, key=lambda i: (-between[i].bandwidth_gbps, between[i].latency_us, i))
        order.append(nearest)
        left.remove(nearest)
    return [groups[i] for i in order]


@dataclass
class _Nearest:
    """The candidate that came closest to fitting, for the error when none fits."""
    fraction: float = float("inf")
    text: str = ""


def _fullest(memory: tuple[RankMemory, ...]) -> float:
    return max(rank.fraction for rank in memory)


def _relieve_memory(layers_of: list[int], memory: list, k: int, group_memory) -> tuple[list[int], list]:
    """While a group's fullest rank exceeds its memory, move one layer from it to the group with the
    most room (each keeps at least k layers), as long as the fullest rank of the two gets emptier."""
    layers_of, memory = list(layers_of), list(memory)
    for _ in range(sum(layers_of)):
        fullest = max(range(len(memory)), key=lambda g: _fullest(memory[g]))
        if _fullest(memory[fullest]) <= 1 or layers_of[fullest] <= k:
            break
        roomiest = min(range(len(memory)), key=lambda g: _fullest(memory[g]))
        if roomiest == fullest:
            break
        gave, took = group_memory(fullest, layers_of[fullest] - 1), group_memory(roomiest, layers_of[roomiest] + 1)
        if max(_fullest(gave), _fullest(took)) >= _fullest(memory[fullest]):
            break
        layers_of[fullest] -= 1
        layers_of[roomiest] += 1
        memory[fullest], memory[roomiest] = gave, took
    return layers_of, memory


def plan(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, rates: dict[str, ChipRates], *,
         ministages: int | None = None, offload: str = "auto", micro_batch_sequences: int | None = None,
         overlap: bool = True, max_groups: int | None = None, min_groups: int = 1, lone_group_ministages: bool = False,
         grad_clip: float = 1.0) -> PlanSearch:
    """The fastest plan that fits (module doc) among partitions of min_groups to max_groups groups;
    `rates` from rates_from_profiles (which sets the memory each chip may use). lone_group_ministages
    False (the default): a plan of one group has one ministage unless `ministages` says otherwise (the
    Zorse authors' planner: ministages interleave a pipeline of several groups; one group of all
    machines with ministages is ZeRO-3 with layer-wise accumulation, the seed's Cephalo baseline). grad_clip: the
    run's global-norm clip (h2 train --grad-clip, 0: none), which decides the gradients a rank holds."""
    started = time.perf_counter()
    if offload not in OFFLOAD_CHOICES:
        raise UserError(f"--offload: unknown choice '{offload}' (known: {', '.join(OFFLOAD_CHOICES)})")
    shapes = Shapes.of(model, training)
    machines = machines_of(cluster)
    partitions = split_partitions(bandwidth_graph(cluster, machines), f"{cluster.source}: bandwidth graph")
    sequences = training.sequences
    sizes = divisors(sequences) if micro_batch_sequences is None else [micro_batch_sequences]
    if micro_batch_sequences is not None and sequences % micro_batch_sequences:
        raise UserError(f"--micro-batch-sequences: {micro_batch_sequences} does not divide the global batch of "
                        f"{sequences} sequences")
    offloads = {"auto": (False, True), "on": (True, ), "off": (False, )}[offload]
    best: ZorsePlan | None = None
    nearest = _Nearest()
    evaluated = 0
    for relieve in (False, True):  # the seed's split by speed first; layers moved for memory only if none fits
        for partition in reversed(partitions[:len(machines)]):
            groups = group_order(cluster, [[machines[i] for i in group] for group in partition.groups])
            if (len(groups) > model.num_layers or len(groups) < min_groups
                    or (max_groups is not None and len(groups) > max_groups)):
                continue
            chips = [[chip for machine in group for chip in machine.chips] for group in groups]
            links = [slowest_link(cluster, group) for group in groups]
            between = [
                link_across(cluster, groups[g], groups[(g + 1) % len(groups)]) if len(groups) > 1 else links[0]
                for g in range(len(groups))
            ]
            for size, recompute in itertools.product(sizes, (True, False)):
                if size < max(len(c) for c in chips):
                    continue
                shaped = [
                    GroupShape(tuple(rates[c] for c in group_chips), rows_per_rank([rates[c] for c in group_chips],
                                                                                   size), link, recompute)
                    for group_chips, link in zip(chips, links)
                ]
                hops = [
                    transfer(shaped[g], shaped[(g + 1) % len(shaped)], between[g], size, shapes)
                    for g in range(len(shaped))
                ]
                group_layers = proportional_counts([g.forward_s + g.backward_s for g in shaped], model.num_layers)
                counts = range(1, min(group_layers) + 1) if ministages is None else [ministages]
                if ministages is None and len(shaped) == 1 and not lone_group_ministages:
                    counts = [1]
                for k in counts:
                    if k > min(group_layers):
                        continue
                    for off in offloads:
                        evaluated += 1

                        def group_memory(g: int, layers: int) -> tuple[RankMemory, ...]:
                            return tuple(
                                rank_memory(shaped[g], r, even_chunks(layers, k), sequences //
                                            size, off, g == 0, g == len(shaped) -
                                            1, shapes, grad_clip=grad_clip, overlap=overlap)
                                for r in range(shaped[g].size))

                        layers_of = list(group_layers)
                        memory = [group_memory(g, layers) for g, layers in enumerate(layers_of)]
                        if relieve:
                            layers_of, memory = _relieve_memory(layers_of, memory, k, group_memory)
                        chunks = [even_chunks(layers, k) for layers in layers_of]
                        worst_g, worst_r = max(((g, r) for g in range(len(shaped)) for r in range(shaped[g].size)),
                                               key=lambda gr: memory[gr[0]][gr[1]].fraction)
                        worst = memory[worst_g][worst_r]
                        if worst.fraction > 1:
                            if worst.fraction < nearest.fraction:
                                nearest = _Nearest(
                                    worst.fraction,
                                    (f"{len(shaped)} groups, {k} ministages, {size} sequences per micro-batch, "
                                     f"offload {'on' if off else 'off'}, recompute {'on' if recompute else 'off'}: "
                                     f"rank {worst_r} ({chips[worst_g][worst_r]}) of "
                                     f"group {worst_g} needs {worst.device_bytes / GB:.3g} GB, its memory allows "
                                     f"{worst.capacity_bytes / GB:.3g} GB"))
                            continue
                        predicted = latency(shaped, chunks, hops, sequences // size, off, shapes, overlap)
                        if best is None or predicted.iteration_s < best.latency.iteration_s * (1 - 1e-9):
                            best = ZorsePlan(
                                groups=tuple(
                                    GroupPlan(tuple(groups[g]), tuple(chips[g]), shaped[g].rows, chunks[g], links[g],
                                              memory[g]) for g in range(len(shaped))), micro_batch_sequences=size,
                                micro_batches=sequences // size, ministages=k, offload=off, recompute=recompute,
                                latency=predicted, transfers=tuple(hops), seq_len=training.seq_len, overlap=overlap)
        if best is not None:
            break
    if best is None:
        if not nearest.text:
            raise UserError(f"{cluster.source}: no plan to evaluate: the model's {model.num_layers} layers and "
                            f"{sequences} sequences per step leave no group count, micro-batch size and "
                            f"ministage count to try")
        raise UserError(f"{cluster.source}: no plan fits the memory model; nearest: {nearest.text}")
    return PlanSearch(best, partitions, evaluated, time.perf_counter() - started)
