"""Zorse's latency and memory models for one plan: pipeline groups, rows per rank, ministages, offload.

A plan runs M pipeline micro-batches of S sequences. Group g (n_g ranks, any chip types) splits every
micro-batch into rows per rank (rows_r, summing to S) and holds k ministages (l_{g,c} layers each,
round-robin: virtual stage c * G + g), GPipe order: every micro-batch's forward through ministage c,
then the next ministage; backwards in reverse; each ministage's optimizer step right after its last
backward. Parameters are ZeRO-2 over the group: gradients reduce-scattered, optimizer state sharded;
with k = 1 the weights stay whole between steps (gathered once, in the forward); with k > 1 a
ministage is resharded after its forward and gathered again for its backward (the ministages held
whole are only the one computing and the next, prefetched). with activation checkpointing
(recompute, as the seed's runs) a layer keeps its input and backward recomputes the forward; without
it a layer keeps all its activations. The planner tries both.

Per layer of group g and one micro-batch: forward f_g = max_r rows_r * f_r, backward
b_g = max_r rows_r * (b_r [+ recompute_r]) (the slowest rank of the group sets the pace). Per layer and
step: all-gather AG_g and reduce-scatter RS_g of one layer over the group's slowest link (ring:
(n - 1) / n of the bytes, n - 1 latencies). Layer-wise prefetch overlaps gathers with compute, and
offload (activations and parameter shards to host memory over the host link) runs on its own stream,
so a ministage of l layers takes

    forward  = max(M * l * f_g, l * AG_g, offload traffic)
    backward = max(M * l * b_g, l * (AG_g [k > 1] + RS_g), reload traffic)
    step     = l * (Adam on the rank's 1/n shard at its memory bandwidth)

Latency (start-up + steady + drain), the largest over groups and over inter-group links:

    start-up_g = AG_0 (first layer, nothing to hide it) + sum_{g' < g} (l_{g',0} * f_{g'} + send_{g'})
    steady_g   = sum_c (forward + backward + step of ministage c), where a round after the first
                 (a backward round before the last) takes at least one micro-batch's trip around all
                 groups and hops (the round's first input comes back from the last group)
    drain_g    = sum_{g' < g} (l_{g',0} * b_{g'} + send_{g'})
    link g->g+1: start-up_g + crossings * M * occupancy + drain_g  (crossings = k; the wrap from the
                 last group back to the first: k - 1)

Memory of rank r (ZeRO-2 with ministages; bytes per element from the training spec):

    whole weights   (k = 1: all l_g layers; else the largest two consecutive ministages) * P * w;
                    HeteroPP's runtime (no overlap) without offload: all l_g layers (it keeps parameters
                    replicated; only offload takes them off the device)
    sharded weights rest of the group's layers * P * w / n   (0 with offload: on the host)
    gradients       Zorse's runtime (layer-wise reduce-scatter): one layer's unsharded gradient P * gr
                    + the shards of the ministage stepping (largest ministage * P * gr / n);
                    HeteroPP's runtime (reduced at the ministage's STEP): the unsharded gradients of the
                    ministage in its backward (l_c * P * gr). With global-norm clipping (grad_clip > 0,
                    the default 1.0) a ministage's step waits for the norm over every ministage, so the
                    reduced shards of every ministage stepped before are held until the last backward
                    (docs/zorse_runtime.md): Zorse's runtime l_g * P * gr / n + P * gr; HeteroPP's the
                    largest over ministages c of l_c * P * gr + (layers of the ministages after c) * P * gr / n
    optimizer       l_g * P * o / n
    activations     kept per layer (recompute: its input; else all its activations) for M * rows_r
                    sequences and l_g layers (with offload: two ministages' worth of one micro-batch),
                    with recompute one layer's full activations of rows_r sequences, and the send and
                    receive buffers of one micro-batch
    embedding/head  the first group the embedding, the last the final norm and head (whole weights,
                    gradients and optimizer state sharded)

Embedding and head compute are not in the latency (the Zorse paper's model counts decoder layers).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from h2.core.cluster import ChipType, TrainingSpec
from h2.core.links import Link
from h2.core.model_config import ModelConfig

HOST_LINK_GBPS = 16.0  # assumed host <-> device copy rate per GPU (PCIe 4.0 x16 in practice); not measured


@dataclass(frozen=True)
class ChipRates:
    """One chip type's per-sequence, per-layer costs at tp 1 and its memory."""
    name: str
    forward_s: float  # one sequence through one layer
    backward_s: float  # its backward
    recompute_s: float  # the recompute of its forward before the backward (activation checkpointing)
    capacity_bytes: float  # what the plan may use (chip capacity x memory fraction)
    memory_bandwidth_gbps: float


@dataclass(frozen=True)
class Shapes:
    """The model and training numbers the models read."""
    layer_params: int
    embedding_params: int
    head_params: int  # final norm and LM head
    weight_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    checkpoint_bytes: int  # one layer's input, one sequence
    layer_activation_bytes: int  # one layer's full activations, one sequence
    boundary_bytes: int  # what crosses a stage boundary, one sequence
    num_layers: int

    @staticmethod
    def of(model: ModelConfig, training: TrainingSpec) -> "Shapes":
        element = training.activation_bytes_per_element
        return Shapes(
            layer_params=model.layer_params(), embedding_params=model.embedding_params(),
            head_params=model.head_params() + model.final_norm_params(), weight_bytes=training.weight_bytes,
            gradient_bytes=training.gradient_bytes,
            optimizer_bytes=training.optimizer_bytes, checkpoint_bytes=model.layer_recompute_activation_bytes(
                1, training.seq_len, bytes_per_element=element), layer_activation_bytes=model.layer_activation_bytes(
                    1, training.seq_len, bytes_per_element=element),
            boundary_bytes=training.seq_len * model.hidden_size * element, num_layers=model.num_layers)


@dataclass(frozen=True)
class GroupShape:
    """A group's ranks (their chip rates and rows per micro-batch) and the link its collectives use."""
    rates: tuple[ChipRates, ...]
    rows: tuple[int, ...]
    link: Link
    recompute: bool = True

    @property
    def size(self) -> int:
        return len(self.rates)

    @property
    def forward_s(self) -> float:
        return max(rows * rate.forward_s for rows, rate in zip(self.rows, self.rates))

    @property
    def backward_s(self) -> float:
        return max(rows * (rate.backward_s + (rate.recompute_s if self.recompute else 0.0))
                   for rows, rate in zip(self.rows, self.rates))


def proportional_counts(per_unit_s: list[float], total: int) -> tuple[int, ...]:
    """`total` units over workers taking per_unit_s each, at least one each, the slowest worker's
    time as small as it can be: each unit to the worker that would finish it first (counts in
    proportion to speed, rounded the min-max way)."""
    counts = [1] * len(per_unit_s)
    heap = [(2 * t, i) for i, t in enumerate(per_unit_s)]
    heapq.heapify(heap)
    for _ in range(total - len(per_unit_s)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) * per_unit_s[i], i))
    return tuple(counts)


def rows_per_rank(rates: list[ChipRates], sequences: int) -> tuple[int, ...]:
    """One micro-batch of `sequences` over the ranks in proportion to speed (at least one row each)."""
    return proportional_counts([rate.forward_s + rate.backward_s + rate.recompute_s for rate in rates], sequences)


def ring_s(nbytes: float, ranks: int, link: Link) -> float:
    """All-gather or reduce-scatter of `nbytes` (the whole tensor) over a ring of `ranks`."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / link.bytes_per_s + (ranks - 1) * link.latency_s


@dataclass(frozen=True)
class Ministage:
    """Times of one ministage of one group for one step."""
    forward_s: float
    backward_s: float
    step_s: float


def ministage_times(group: GroupShape, layers: int, ministages: int, micro_batches: int, offload: bool, shapes: Shapes,
                    overlap: bool = True) -> Ministage:
    """With overlap (Zorse's runtime) the module's formulas; without, HeteroPP's runtime (issue 20a) on
    DiComm: weights stay whole; at a ministage's STEP each owner's share of its gradients is reduced
    to the owner (every replica sends its part straight to it: one share's time per owner) and each
    owner's update is broadcast along a binomial tree (ceil(log2 n) rounds of one share); offload
    copies wait for the compute; every term adds up."""
    n = group.size
    layer_weights = shapes.layer_params * shapes.weight_bytes
    gather = ring_s(layer_weights, n, group.link)
    scatter = ring_s(shapes.layer_params * shapes.gradient_bytes, n, group.link)
    host = HOST_LINK_GBPS * 1e9
    kept = shapes.checkpoint_bytes if group.recompute else shapes.layer_activation_bytes
    checkpoints = max(group.rows) * kept / host  # per layer and micro-batch
    shard = layer_weights / n / host if ministages > 1 else 0.0
    forward = max(micro_batches * layers * group.forward_s, layers * gather,
                  layers * (micro_batches * checkpoints + shard) if offload else 0.0)
    backward = max(micro_batches * layers * group.backward_s, layers * ((gather if ministages > 1 else 0.0) + scatter),
                   layers * (micro_batches * checkpoints + shard) if offload else 0.0)
    touched = shapes.gradient_bytes + 2 * shapes.optimizer_bytes + shapes.weight_bytes
    step = layers * max(shapes.layer_params / n * touched / (rate.memory_bandwidth_gbps * 1e9) for rate in group.rates)
    if not overlap:
        copies = layers * (micro_batches * checkpoints + (layer_weights / host if ministages > 1 else 0.0))
        rounds = math.ceil(math.log2(n)) if n > 1 else 0
        reduce_to_owners = layers * shapes.layer_params * shapes.gradient_bytes / group.link.bytes_per_s
        broadcast_updates = layers * layer_weights / group.link.bytes_per_s
        collectives = (reduce_to_owners + rounds * broadcast_updates +
                       (1 + rounds) * n * group.link.latency_s if n > 1 else 0.0)
        return Ministage(micro_batches * layers * group.forward_s + (copies if offload else 0.0),
                         micro_batches * layers * group.backward_s + (copies if offload else 0.0), step + collectives)
    return Ministage(forward, backward, step)


@dataclass(frozen=True)
class Transfer:
    occupancy_s: float
    latency_s: float


def transfer(sender: GroupShape, receiver: GroupShape, link: Link, sequences: int, shapes: Shapes) -> Transfer:
    """One micro-batch's activations (or gradients) from one group to the next: spread over the
    smaller side's ranks, each pair on `link` (as HeteroAuto's cost model spreads a stage boundary)."""
    pairs = min(sender.size, receiver.size)
    return Transfer(sequences * shapes.boundary_bytes / pairs / link.bytes_per_s, link.latency_s)


@dataclass(frozen=True)
class Latency:
    iteration_s: float
    startup_s: float  # of the group or link that sets the iteration
    steady_s: float
    drain_s: float
    bottleneck: str  # "group i" or "link i->j"


def latency(groups: list[GroupShape], ministage_layers: list[tuple[int, ...]], transfers: list[Transfer],
            micro_batches: int, offload: bool, shapes: Shapes, overlap: bool = True) -> Latency:
    """The module's latency model. transfers[g]: group g to group (g + 1) % G (the last is the wrap)."""
    count = len(groups)
    ministages = len(ministage_layers[0])
    first_gather = (ring_s(shapes.layer_params *
                           shapes.weight_bytes, groups[0].size, groups[0].link) if overlap else 0.0)
    startup, drain = [first_gather], [0.0]
    for g in range(1, count):
        previous, hop = groups[g - 1], transfers[g - 1]
        hop_s = hop.occupancy_s + hop.latency_s
        startup.append(startup[-1] + ministage_layers[g - 1][0] * previous.forward_s + hop_s)
        drain.append(drain[-1] + ministage_layers[g - 1][0] * previous.backward_s + hop_s)
    hops = [hop.occupancy_s + hop.latency_s for hop in transfers] if count > 1 else [0.0]
    cycle_forward = sum(layers[0] * group.forward_s for layers, group in zip(ministage_layers, groups)) + sum(hops)
    cycle_backward = sum(layers[0] * group.backward_s for layers, group in zip(ministage_layers, groups)) + sum(hops)
    best = None
    for g, group in enumerate(groups):
        steady = 0.0
        for c, layers in enumerate(ministage_layers[g]):
            times = ministage_times(group, layers, ministages, micro_batches, offload, shapes, overlap)
            forward = max(times.forward_s, cycle_forward if c > 0 else 0.0)
            backward = max(times.backward_s, cycle_backward if c < ministages - 1 else 0.0)
            steady += forward + backward + times.step_s
        candidate = (startup[g] + steady + drain[g], startup[g], steady, drain[g], f"group {g}")
        best = candidate if best is None or candidate[0] > best[0] else best
    for g in range(count if ministages > 1 else count - 1):
        crossings = ministages if g < count - 1 else ministages - 1
        busy = crossings * micro_batches * transfers[g].occupancy_s
        candidate = (startup[g] + busy + drain[g], startup[g], busy, drain[g], f"link {g}->{(g + 1) % count}")
        best = candidate if candidate[0] > best[0] else best
    return Latency(*best)


@dataclass(frozen=True)
class RankMemory:
    device_bytes: float
    host_bytes: float
    capacity_bytes: float

    @property
    def fraction(self) -> float:
        return self.device_bytes / self.capacity_bytes


def gradient_layers(ministage_layers: tuple[int, ...], ranks: int, grad_clip: float, overlap: bool) -> float:
    """The most layers' worth of gradients a rank holds at once (the module doc's gradients term; a
    shard counts 1/ranks of a layer)."""
    clipped = grad_clip > 0
    if overlap:
        shards = sum(ministage_layers) if clipped else max(ministage_layers)
        return 1 + shards / ranks
    return max(layers + (sum(ministage_layers[c + 1:]) / ranks if clipped else 0.0)
               for c, layers in enumerate(ministage_layers))


def rank_memory(group: GroupShape, rank: int, ministage_layers: tuple[int, ...], micro_batches: int, offload: bool,
                first: bool, last: bool, shapes: Shapes, *, grad_clip: float = 1.0, overlap: bool = True) -> RankMemory:
    """The module's memory model for one rank of a group, for a run clipping gradients by their global
    norm at grad_clip (0: no clipping) on Zorse's runtime (overlap) or HeteroPP's."""
    n, rows = group.size, group.rows[rank]
    total = sum(ministage_layers)
    if len(ministage_layers) == 1 or (not overlap and not offload):
        whole = total
    else:
        whole = max(a + b for a, b in zip(ministage_layers, ministage_layers[1:]))
    p = shapes.layer_params
    sharded_weights = (total - whole) * p * shapes.weight_bytes / n
    extra = (shapes.embedding_params if first else 0) + (shapes.head_params if last else 0)
    device = (whole * p * shapes.weight_bytes + (0.0 if offload else sharded_weights) +
              gradient_layers(ministage_layers, n, grad_clip, overlap) * p * shapes.gradient_bytes +
              total * p * shapes.optimizer_bytes / n + extra * (shapes.weight_bytes +
                                                                (shapes.gradient_bytes + shapes.optimizer_bytes) / n))
    kept = shapes.checkpoint_bytes if group.recompute else shapes.layer_activation_bytes
    checkpoints = micro_batches * rows * total * kept
    resident_checkpoints = 2 * rows * max(ministage_layers) * kept if offload else checkpoints
    working = rows * shapes.layer_activation_bytes if group.recompute else 0
    device += resident_checkpoints + working + 2 * rows * shapes.boundary_bytes
    host = (sharded_weights + checkpoints) if offload else 0.0
    return RankMemory(device, host, group.rates[rank].capacity_bytes)


def chip_rates(chip: ChipType, forward_s: float, backward_s: float, recompute_s: float,
               memory_fraction: float) -> ChipRates:
    return ChipRates(chip.name, forward_s, backward_s, recompute_s, chip.capacity_bytes * memory_fraction,
                     chip.memory_bandwidth_gbps)
