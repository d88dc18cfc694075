"""The Zorse paper's three baselines (seed 003, section 6) as planners priced by the Zorse cost and memory
models (costs) and scored by the shared simulator (heteroauto.simulator), like the Zorse planner.

Each is a function cluster + model + training (+ the chips' rates) -> a BaselinePlan or an OutOfMemory
naming the nearest candidate's fullest rank. Within its rules each takes the fastest candidate: every
candidate is priced by a closed-form pipeline estimate, the best few are replayed by the simulator and
the fastest replay wins.

- TorchTitan-Het ("3D parallelism in TorchTitan adapted for heterogeneous clusters by partitioning the
  model unevenly to balance compute across PP stages ... DP (ZeRO-2), PP, and TP"): P pipeline stages of
  equal GPU count (the GPUs taken fastest type first, in node order, so a stage mixes types only where a
  type's count is not a multiple of the stage size), each micro-batch split evenly over a stage's GPUs
  (TorchTitan's DP gives every rank the same batch), layers in proportion to each stage's speed, ZeRO-2
  inside a stage, 1F1B, gradient accumulation over M micro-batches with the ZeRO-2 gather and
  reduce-scatter per micro-batch (the paper: "gradient accumulation ... adds communication overhead for
  ZeRO-2 from extra parameter gathering"). No ministages, no offload. Not modelled: TP (the Zorse cost
  model prices tp 1 groups).
- HexiScale ("PP + ZeRO-2 DP, adjusting PP and DP degrees to manage memory usage"; asymmetric stages,
  uneven batch sizes inside a DP group): stages from the same machine-graph partitions as Zorse's
  phase 1, each group optionally cut into f equal consecutive stages (f = 1, 2, 4, 8: the PP degree
  raised for memory), rows per GPU in proportion to speed, layers in proportion to speed and then moved
  for memory (planner._relieve_memory), ZeRO-2 with gradients accumulated and reduced once per step,
  1F1B. No ministages, no offload. Not modelled: TP.
- Cephalo ("distributes compute workload and training state unevenly with FSDP"; ZeRO-3 across all
  GPUs, gradient accumulation with the computation reordered so parameters are not regathered per
  micro-batch, no pipeline): one group of every GPU, rows in proportion to speed, every layer its own
  ministage (gathered before its forward and again before its backward, resharded after): the Zorse
  planner restricted to one group and num_layers ministages. Layer-wise accumulation keeps every
  micro-batch's layer inputs until the backward; at 1M tokens per step they exceed the GPUs' memory
  from 33B on cluster A (an H100 rank would hold 91 GB of 33B checkpoints), where the paper trains
  Cephalo up to 65B, so the planner may put them in host memory (offload, assumed: the seed does not
  say how Cephalo holds them). Not modelled: Cephalo's uneven sharding of the training state (the
  memory model shards it evenly).

1F1B stage s of P holds min(M, P - s) micro-batches' activations (the memory model's `micro_batches`).
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.numbers import divisors
from h2.core.schedule import schedule_actions
from heteroauto.simulator import simulate
from heteroauto.stage_terms import StageTerms
from heteroauto.zorse.costs import (
    ChipRates,
    GroupShape,
    Latency,
    RankMemory,
    Shapes,
    ministage_times,
    proportional_counts,
    rank_memory,
    rows_per_rank,
    transfer,
)
from heteroauto.zorse.graph import Machine, bandwidth_graph, link_across, machines_of, slowest_link
from heteroauto.zorse.partition import split_partitions
from heteroauto.zorse.planner import GroupPlan, ZorsePlan, _relieve_memory, group_order, plan
from heteroauto.zorse.scoring import simulate_plan

SIMULATED_CANDIDATES = 4  # the best by the closed-form estimate that the simulator replays
HEXISCALE_SPLITS = (1, 2, 4, 8)


@dataclass(frozen=True)
class BaselinePlan:
    system: str
    # stages as groups (one ministage each, except Cephalo's), rows, layers, memory; its `latency` is the
    # Zorse latency model's only for Cephalo (the pipelines are priced by 1F1B estimate and simulator)
    plan: ZorsePlan
    schedule: str  # "1f1b" or "gpipe" (Cephalo's ministages)
    collectives_per_micro_batch: bool  # the ZeRO-2 gather and reduce-scatter every micro-batch
    simulated_s: float

    @property
    def stages(self) -> int:
        return len(self.plan.groups) * self.plan.ministages

    def describe(self) -> str:
        stages = " | ".join(f"{len(g.chips)}x[{','.join(sorted(set(g.chips)))}] L{g.layers}" for g in self.plan.groups)
        flags = (f"offload {'on' if self.plan.offload else 'off'}, recompute {'on' if self.plan.recompute else 'off'}, "
                 f"memory {self.plan.max_memory_fraction:.2f}")
        return (f"{len(self.plan.groups)} stages ({stages}), S {self.plan.micro_batch_sequences} x M "
                f"{self.plan.micro_batches}, {self.plan.ministages} ministages, {flags}")


@dataclass(frozen=True)
class OutOfMemory:
    system: str
    reason: str

    def describe(self) -> str:
        return f"OOM: {self.reason}"


Rank = tuple[Machine, str]


@dataclass
class _Search:
    """Candidates that fit (estimate, tie-break, plan) and the nearest one that did not."""
    system: str
    fits: list = dataclasses.field(default_factory=list)
    nearest_fraction: float = float("inf")
    nearest: str = ""
    counter: int = 0

    def offer(self, estimate: float, candidate: ZorsePlan) -> None:
        self.counter += 1
        heapq.heappush(self.fits, (-estimate, self.counter, candidate))
        if len(self.fits) > SIMULATED_CANDIDATES:
            heapq.heappop(self.fits)

    def refuse(self, memory: list[tuple[RankMemory, ...]], stages: list[list[Rank]], text: str) -> None:
        g, r = max(((g, r) for g in range(len(memory))
                    for r in range(len(memory[g]))), key=lambda gr: memory[gr[0]][gr[1]].fraction)
        worst = memory[g][r]
        if worst.fraction < self.nearest_fraction:
            self.nearest_fraction = worst.fraction
            self.nearest = (f"{text}: rank {r} ({stages[g][r][1]}) of stage {g} needs {worst.device_bytes / 1e9:.3g} "
                            f"GB, its memory allows {worst.capacity_bytes / 1e9:.3g} GB")


def stage_terms(plan: ZorsePlan, rates: dict[str, ChipRates], shapes: Shapes,
                per_micro_batch: bool) -> list[StageTerms]:
    """One StageTerms per stage of a one-ministage plan; with per_micro_batch the ZeRO-2 gather and
    reduce-scatter are paid by every micro-batch, else once per step (spread over the micro-batches)."""
    terms = []
    for g, group in enumerate(plan.groups):
        shaped = GroupShape(tuple(rates[chip] for chip in group.chips), group.rows, group.link, plan.recompute)
        counted = 1 if per_micro_batch else plan.micro_batches
        times = ministage_times(shaped, group.layers, 1, counted, False, shapes)
        hop = plan.transfers[g]
        last = g == len(plan.groups) - 1
        terms.append(
            StageTerms(forward_s=times.forward_s / counted, backward_s=times.backward_s / counted, weight_grad_s=0.0,
                       update_s=times.step_s, send_occupancy_s=0.0 if last else hop.occupancy_s,
                       send_latency_s=0.0 if last else hop.latency_s))
    return terms


def one_f_one_b_estimate(terms: list[StageTerms], micro_batches: int) -> float:
    """Closed-form 1F1B step: one micro-batch's trip through every stage and back, then M - 1 more at
    the pace of the slowest stage or link, then the slowest update."""
    trip = sum(t.compute_s + 2 * (t.send_occupancy_s + t.send_latency_s) for t in terms)
    pace = max(max(t.compute_s for t in terms), max(2 * t.send_occupancy_s for t in terms))
    return trip + (micro_batches - 1) * pace + max(t.update_s for t in terms)


def simulate_one_f_one_b(plan: ZorsePlan, terms: list[StageTerms]) -> float:
    return simulate(schedule_actions("1f1b", len(plan.groups), plan.micro_batches), terms).iteration_s


def _stage_memory(shaped: GroupShape, layers: int, micro_batches: int, stage: int, count: int, shapes: Shapes,
                  grad_clip: float) -> tuple[RankMemory, ...]:
    """Every rank of 1F1B stage `stage` of `count` (min(M, count - stage) micro-batches in flight)."""
    return tuple(
        rank_memory(shaped, r, (layers, ), min(micro_batches, count - stage), False, stage == 0, stage == count -
                    1, shapes, grad_clip=grad_clip) for r in range(shaped.size))


def _shape(cluster: ClusterSpec, stage: list[Rank], rows: tuple[int, ...], recompute: bool,
           rates: dict[str, ChipRates]) -> GroupShape:
    machines = list(dict.fromkeys(machine for machine, _ in stage))
    return GroupShape(tuple(rates[chip] for _, chip in stage), rows, slowest_link(cluster, machines), recompute)


def _build(cluster: ClusterSpec, stages: list[list[Rank]], rows: list[tuple[int, ...]], layers: list[int],
           sequences: int, micro_batches: int, recompute: bool, rates: dict[str, ChipRates], shapes: Shapes,
           grad_clip: float) -> tuple[ZorsePlan, list[tuple[RankMemory, ...]]]:
    """A one-ministage plan of these stages and its memory (1F1B in-flight activations)."""
    count = len(stages)
    machines = [list(dict.fromkeys(machine for machine, _ in stage)) for stage in stages]
    shaped = [_shape(cluster, stage, rows[g], recompute, rates) for g, stage in enumerate(stages)]
    links = [group.link for group in shaped]
    hops = [
        transfer(shaped[g], shaped[(g + 1) % count],
                 link_across(cluster, machines[g], machines[(g + 1) % count]) if count > 1 else links[g], sequences,
                 shapes) for g in range(count)
    ]
    memory = [_stage_memory(shaped[g], layers[g], micro_batches, g, count, shapes, grad_clip) for g in range(count)]
    groups = tuple(
        GroupPlan(tuple(machines[g]), tuple(chip for _, chip in stages[g]), rows[g], (layers[g], ), links[g], memory[g])
        for g in range(count))
    built = ZorsePlan(groups=groups, micro_batch_sequences=sequences, micro_batches=micro_batches,
                      ministages=1, offload=False, recompute=recompute, latency=Latency(
                          0.0, 0.0, 0.0, 0.0, "not estimated"), transfers=tuple(hops), seq_len=0, overlap=True)
    return built, memory


def _fastest(search: _Search, rates: dict[str, ChipRates], shapes: Shapes, per_micro_batch: bool,
             seq_len: int) -> BaselinePlan | OutOfMemory:
    if not search.fits:
        return OutOfMemory(search.system, search.nearest or "no candidate to evaluate")
    best = None
    for _, _, candidate in search.fits:
        candidate = dataclasses.replace(candidate, seq_len=seq_len)
        simulated = simulate_one_f_one_b(candidate, stage_terms(candidate, rates, shapes, per_micro_batch))
        if best is None or simulated < best.simulated_s:
            best = BaselinePlan(search.system, candidate, "1f1b", per_micro_batch, simulated)
    return best


def _layers_by_speed(stages: list[list[Rank]], rows: list[tuple[int, ...]], recompute: bool,
                     rates: dict[str, ChipRates], num_layers: int) -> list[int]:
    """Layers in proportion to each stage's speed (its slowest rank's rows x per-sequence time)."""
    per_layer = [
        max(n * (rates[c].forward_s + rates[c].backward_s + (rates[c].recompute_s if recompute else 0.0))
            for n, (_, c) in zip(rows[g], stage)) for g, stage in enumerate(stages)
    ]
    return list(proportional_counts(per_layer, num_layers))


def _gpus_fastest_first(cluster: ClusterSpec, rates: dict[str, ChipRates]) -> list[Rank]:
    ranks = [(machine, chip) for machine in machines_of(cluster) for chip in machine.chips]
    speed = {name: rate.forward_s + rate.backward_s for name, rate in rates.items()}
    return sorted(ranks, key=lambda rank: speed[rank[1]])  # stable: node order within a type


def _try(search: _Search, cluster: ClusterSpec, stages: list[list[Rank]], rows: list[tuple[int, ...]],
         layers: list[int], sequences: int, micro_batches: int, recompute: bool, rates: dict[str, ChipRates],
         shapes: Shapes, grad_clip: float, per_micro_batch: bool, text: str) -> None:
    built, memory = _build(cluster, stages, rows, layers, sequences, micro_batches, recompute, rates, shapes, grad_clip)
    if max(rank.fraction for group in memory for rank in group) > 1:
        search.refuse(memory, stages, text)
        return
    terms = stage_terms(built, rates, shapes, per_micro_batch)
    search.offer(one_f_one_b_estimate(terms, micro_batches), built)


def torchtitan_het(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, rates: dict[str, ChipRates], *,
                   grad_clip: float = 1.0) -> BaselinePlan | OutOfMemory:
    """TorchTitan-Het (module doc): uniform stages of equal GPU count, even rows, ZeRO-2 per micro-batch."""
    shapes = Shapes.of(model, training)
    gpus = _gpus_fastest_first(cluster, rates)
    search = _Search("TorchTitan-Het")
    total = training.sequences
    for count in divisors(len(gpus)):
        if count > model.num_layers:
            continue
        size = len(gpus) // count
        stages = [gpus[s * size:(s + 1) * size] for s in range(count)]
        for sequences in divisors(total):
            if sequences % size:
                continue
            rows = [tuple([sequences // size] * size)] * count
            for recompute in (True, False):
                layers = _layers_by_speed(stages, rows, recompute, rates, model.num_layers)
                _try(
                    search, cluster, stages, rows, layers, sequences, total // sequences, recompute, rates, shapes,
                    grad_clip, True, f"{count} stages of {size} GPUs, {sequences} sequences per micro-batch, "
                    f"recompute {'on' if recompute else 'off'}")
    return _fastest(search, rates, shapes, True, training.seq_len)


def hexiscale(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, rates: dict[str, ChipRates], *,
              grad_clip: float = 1.0) -> BaselinePlan | OutOfMemory:
    """HexiScale (module doc): asymmetric stages, rows and layers by speed, layers moved for memory."""
    shapes = Shapes.of(model, training)
    machines = machines_of(cluster)
    partitions = split_partitions(bandwidth_graph(cluster, machines), f"{cluster.source}: bandwidth graph")
    speed = {name: rate.forward_s + rate.backward_s for name, rate in rates.items()}
    search = _Search("HexiScale")
    total = training.sequences
    seen = set()
    for partition in partitions[:len(machines)]:
        groups = group_order(cluster, [[machines[i] for i in group] for group in partition.groups])
        ranked = [sorted(((m, c) for m in group for c in m.chips), key=lambda rank: speed[rank[1]]) for group in groups]
        for split in HEXISCALE_SPLITS:
            if any(len(group) % split for group in ranked):
                continue
            stages = [
                group[i * len(group) // split:(i + 1) * len(group) // split] for group in ranked for i in range(split)
            ]
            key = tuple(tuple((m.index, c) for m, c in stage) for stage in stages)
            if len(stages) > model.num_layers or key in seen:
                continue
            seen.add(key)
            widest = max(len(stage) for stage in stages)
            for sequences in divisors(total):
                if sequences < widest:
                    continue
                micro_batches = total // sequences
                for recompute in (True, False):
                    rows = [rows_per_rank([rates[c] for _, c in stage], sequences) for stage in stages]
                    layers = _layers_by_speed(stages, rows, recompute, rates, model.num_layers)
                    layers = _memory_moved(cluster, stages, rows, layers, sequences, micro_batches, recompute, rates,
                                           shapes, grad_clip)
                    _try(
                        search, cluster, stages, rows, layers, sequences, micro_batches, recompute, rates, shapes,
                        grad_clip, False, f"{len(stages)} stages, {sequences} sequences per micro-batch, "
                        f"recompute {'on' if recompute else 'off'}")
    return _fastest(search, rates, shapes, False, training.seq_len)


def _memory_moved(cluster: ClusterSpec, stages: list[list[Rank]], rows: list[tuple[int, ...]], layers: list[int],
                  sequences: int, micro_batches: int, recompute: bool, rates: dict[str, ChipRates], shapes: Shapes,
                  grad_clip: float) -> list[int]:
    """Layers moved from over-full stages to the roomiest while that helps (the planner's rule)."""

    shaped = [_shape(cluster, stage, rows[g], recompute, rates) for g, stage in enumerate(stages)]

    def stage_memory(g: int, count: int) -> tuple[RankMemory, ...]:
        return _stage_memory(shaped[g], count, micro_batches, g, len(stages), shapes, grad_clip)

    memory = [stage_memory(g, count) for g, count in enumerate(layers)]
    moved, _ = _relieve_memory(layers, memory, 1, stage_memory)
    return moved


def cephalo(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, rates: dict[str, ChipRates], *,
            grad_clip: float = 1.0) -> BaselinePlan | OutOfMemory:
    """Cephalo (module doc): one ZeRO-3 group of every GPU, a ministage per layer, no pipeline."""
    try:
        found = plan(cluster, model, training, rates, ministages=model.num_layers, offload="auto", max_groups=1,
                     lone_group_ministages=True, grad_clip=grad_clip)
    except UserError as error:
        return OutOfMemory("Cephalo", str(error).split("nearest: ", 1)[-1])
    best = found.best
    simulated = simulate_plan(best, rates, model, training).iteration_s
    return BaselinePlan("Cephalo", best, "gpipe", False, simulated)


BASELINES = {"TorchTitan-Het": torchtitan_het, "HexiScale": hexiscale, "Cephalo": cephalo}
