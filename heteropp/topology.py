"""Where every global rank sits: its pipeline stage, data-parallel replica and tensor-parallel index,
the groups inside each stage, and which ranks of adjacent stages exchange which activation elements.

Pure Python (no torch): the same arithmetic serves process-group creation, the executor, tests and
the simulator. Input is a strategy (`dp`, `stages` of `{chip, tp, dp, layers, recompute}`).

Rank layout: stage s owns the consecutive global ranks [base_s, base_s + tp_s * dp_s). Inside it,
replica d owns [base_s + d * tp_s, base_s + (d + 1) * tp_s) as its tensor-parallel group (TP
neighbours are adjacent ranks, as Megatron places them inside one server); the data-parallel group
of TP index t is {base_s + d * tp_s + t : d in [0, dp_s)}.

Batch layout: every stage runs the same micro-batches. A micro-batch is R sequences (R = the
strategy's dp * micro_batch_size); replica d of stage s holds sequences [d * R / dp_s, (d + 1) * R / dp_s),
or, where the stage lists uneven `rows` (a Zorse group), [rows_0 + ... + rows_{d-1}, ... + rows_d).
Resharding plans address the micro-batch's activation flattened to R * row_numel elements (the
sequences are its leading dimension, so a replica's rows are one contiguous element range).

Plans between stage s (TP size a, dp_s replicas) and stage s + 1 (TP size b, dp_{s+1} replicas):
  sliced (send/recv + all-gather): each sender replica's range is cut in a contiguous blocks, one per
      sender TP rank; each receiver replica's range in b blocks, one per receiver TP rank; every
      non-empty intersection of a sender block and a receiver block is one message. Exactly one copy
      of the activation crosses the boundary, every receiver gets its own block, and the receivers
      then all-gather their blocks inside their TP group.
  full: every receiver rank gets its replica's whole range, from the sender replicas that hold it
      (TP index: the receiver's modulo a). b copies cross.
Between two ranks there is at most one message per micro-batch and direction in either mode.
Gradients flow back the same way with the roles swapped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankPlace:
    rank: int
    stage: int
    dp_index: int
    tp_index: int


@dataclass(frozen=True)
class Transfer:
    """Elements [start, stop) of a micro-batch's flattened activation go from global rank `src` to `dst`."""
    src: int
    dst: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class StageInfo:
    index: int
    chip: str
    tp: int
    layers: range  # global decoder-layer indices of this stage
    recompute: bool
    first_rank: int
    dp: int
    micro_batch_size: int  # sequences of one micro-batch per replica
    device: str | None = None  # torch device type, None: the run's default
    row_counts: tuple[int, ...] = ()  # sequences of a micro-batch per replica; empty: micro_batch_size each
    replica_chips: tuple[str, ...] = ()  # chip type per replica of a mixed-type group; empty: `chip`

    def replica_chip(self, dp_index: int) -> str:
        return self.replica_chips[dp_index] if self.replica_chips else self.chip

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.tp * self.dp)

    def rank_of(self, dp_index: int, tp_index: int) -> int:
        return self.first_rank + dp_index * self.tp + tp_index

    def tp_group(self, dp_index: int) -> list[int]:
        return [self.rank_of(dp_index, t) for t in range(self.tp)]

    def dp_group(self, tp_index: int) -> list[int]:
        return [self.rank_of(d, tp_index) for d in range(self.dp)]

    def rows(self, dp_index: int) -> range:
        """Sequences of a micro-batch that replica `dp_index` holds."""
        if self.row_counts:
            start = sum(self.row_counts[:dp_index])
            return range(start, start + self.row_counts[dp_index])
        return range(dp_index * self.micro_batch_size, (dp_index + 1) * self.micro_batch_size)

    def replica_elements(self, dp_index: int, row_numel: int) -> tuple[int, int]:
        rows = self.rows(dp_index)
        return rows.start * row_numel, rows.stop * row_numel


def blocks(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) cut in `parts` blocks of ceil(length / parts) elements (the last ones may be short
    or empty): the layout an all-gather of equal, padded blocks reassembles in place."""
    size = block_size(stop - start, parts)
    return [(min(start + k * size, stop), min(start + (k + 1) * size, stop)) for k in range(parts)]


def block_size(length: int, parts: int) -> int:
    return -(-length // parts)


class Topology:

    def __init__(self, stages: list[StageInfo], micro_batch_sequences: int):
        self.stages = stages
        self.micro_batch_sequences = micro_batch_sequences
        self.world_size = sum(stage.tp * stage.dp for stage in stages)

    @classmethod
    def from_strategy(cls, strategy) -> "Topology":
        stages, first_rank, first_layer = [], 0, 0
        for index, spec in enumerate(strategy.stages):
            dp = strategy.stage_dp(index)
            stages.append(
                StageInfo(index=index, chip=spec.chip, tp=spec.tp, layers=range(first_layer, first_layer + spec.layers),
                          recompute=bool(spec.recompute), first_rank=first_rank, dp=dp,
                          micro_batch_size=strategy.stage_micro_batch_size(index), device=spec.device, row_counts=tuple(
                              spec.rows or ()), replica_chips=tuple(spec.chips or ())))
            first_rank += spec.tp * dp
            first_layer += spec.layers
        return cls(stages, strategy.micro_batch_sequences)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def place(self, rank: int) -> RankPlace:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        for stage in self.stages:
            if rank in stage.ranks:
                offset = rank - stage.first_rank
                return RankPlace(rank, stage.index, offset // stage.tp, offset % stage.tp)
        raise AssertionError("unreachable: ranks cover the world")

    def tp_groups(self) -> list[list[int]]:
        return [stage.tp_group(d) for stage in self.stages for d in range(stage.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [stage.dp_group(t) for stage in self.stages for t in range(stage.tp)]

    def boundary_ranks(self, stage: int) -> list[int]:
        """Ranks of stages `stage` and `stage + 1`: those that talk across this boundary."""
        return list(self.stages[stage].ranks) + list(self.stages[stage + 1].ranks)

    # ---- resharding plans -----------------------------------------------------------------
    def sliced_transfers(self, src_stage: int, dst_stage: int, row_numel: int) -> list[Transfer]:
        """Send/recv + all-gather: one copy crosses (see module doc)."""
        src, dst = self.stages[src_stage], self.stages[dst_stage]
        transfers = []
        for i in range(src.dp):
            for t, (a0, a1) in enumerate(blocks(*src.replica_elements(i, row_numel), src.tp)):
                for j in range(dst.dp):
                    for u, (b0, b1) in enumerate(blocks(*dst.replica_elements(j, row_numel), dst.tp)):
                        lo, hi = max(a0, b0), min(a1, b1)
                        if lo < hi:
                            transfers.append(Transfer(src.rank_of(i, t), dst.rank_of(j, u), lo, hi))
        return transfers

    def full_transfers(self, src_stage: int, dst_stage: int, row_numel: int) -> list[Transfer]:
        """Full-tensor mode: every receiver rank gets its replica's whole range (see module doc)."""
        src, dst = self.stages[src_stage], self.stages[dst_stage]
        transfers = []
        for j in range(dst.dp):
            b0, b1 = dst.replica_elements(j, row_numel)
            for u in range(dst.tp):
                for i in range(src.dp):
                    a0, a1 = src.replica_elements(i, row_numel)
                    lo, hi = max(a0, b0), min(a1, b1)
                    if lo < hi:
                        transfers.append(Transfer(src.rank_of(i, u % src.tp), dst.rank_of(j, u), lo, hi))
        return transfers

    def device_type(self, stage: int, default: str = "cpu") -> str:
        """The device type stage `stage` runs on: its own, else `default` (a device name's type part)."""
        return (self.stages[stage].device or default).split(":", 1)[0]

    def describe(self, default_device: str = "cpu", chip_labels: dict[str, str] | None = None) -> str:
        """One line per stage, saying where its chip really runs (`chip_labels`: how to name a chip
        type that a cluster file describes, e.g. as emulated)."""
        lines = []
        for stage in self.stages:
            recompute = "recompute" if stage.recompute else "no recompute"
            sequences = "sequence" if stage.micro_batch_size == 1 else "sequences"
            device = self.device_type(stage.index, default_device)
            names = list(dict.fromkeys(stage.replica_chips or (stage.chip, )))
            if chip_labels and all(name in chip_labels for name in names):
                chip = " + ".join(chip_labels[name] for name in names) + f" on {device}"
            else:
                chip = f"{' + '.join(names)} ({'emulated on cpu' if device == 'cpu' else f'on {device}'})"
            lines.append(f"stage {stage.index}: chip {chip}, tp {stage.tp} x dp {stage.dp}, "
                         f"layers {stage.layers.start}..{stage.layers.stop - 1}, {recompute}, "
                         f"ranks {stage.ranks.start}..{stage.ranks.stop - 1}, " +
                         (f"rows {'/'.join(map(str, stage.row_counts))} of each micro-batch per replica" if stage.
                          row_counts else f"{stage.micro_batch_size} {sequences} per micro-batch per replica"))
        return "\n".join(lines)
