"""Where every global rank sits: its pipeline stage, data-parallel replica and tensor-parallel index,
the groups inside each stage, and which ranks of adjacent stages exchange which activation slices.

Pure Python (no torch): the same arithmetic serves process-group creation, the executor, tests and
the simulator. Input is a strategy (`dp`, `stages` of `{chip, tp, layers, recompute}`).

Rank layout: stage s owns the consecutive global ranks [base_s, base_s + tp_s * dp). Inside it,
replica d owns [base_s + d * tp_s, base_s + (d + 1) * tp_s) as its tensor-parallel group (TP
neighbours are adjacent ranks, as Megatron places them inside one server); the data-parallel group
of TP index t is {base_s + d * tp_s + t : d in [0, dp)}.

Resharding between stage s (TP size a) and s + 1 (TP size b), within one replica: the activation is
replicated over the sender's TP group and must end replicated over the receiver's. It is cut into
n = lcm(a, b) equal slices; slice k goes from sender TP index k // (n / a) to receiver TP index
k // (n / b): every sender sends a contiguous block of n / a slices, every receiver gets a contiguous
block of n / b, and exactly one copy of the tensor crosses the stage boundary; the receivers then
all-gather their blocks, which lands every slice in place. Gradients flow back the same way with
the roles swapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RankPlace:
    rank: int
    stage: int
    dp_index: int
    tp_index: int


@dataclass(frozen=True)
class SliceTransfer:
    """Slice `slice_index` of `num_slices` goes from global rank `src` to global rank `dst`."""
    src: int
    dst: int
    slice_index: int
    num_slices: int


@dataclass(frozen=True)
class StageInfo:
    index: int
    chip: str
    tp: int
    layers: range           # global decoder-layer indices of this stage
    recompute: bool
    first_rank: int
    dp: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.tp * self.dp)

    def rank_of(self, dp_index: int, tp_index: int) -> int:
        return self.first_rank + dp_index * self.tp + tp_index

    def tp_group(self, dp_index: int) -> list[int]:
        return [self.rank_of(dp_index, t) for t in range(self.tp)]

    def dp_group(self, tp_index: int) -> list[int]:
        return [self.rank_of(d, tp_index) for d in range(self.dp)]


class Topology:
    def __init__(self, stages: list[StageInfo], dp: int):
        self.stages = stages
        self.dp = dp
        self.world_size = sum(stage.tp * dp for stage in stages)

    @classmethod
    def from_strategy(cls, strategy) -> "Topology":
        stages, first_rank, first_layer = [], 0, 0
        for index, spec in enumerate(strategy.stages):
            stages.append(StageInfo(index=index, chip=spec.chip, tp=spec.tp,
                                    layers=range(first_layer, first_layer + spec.layers),
                                    recompute=bool(spec.recompute), first_rank=first_rank, dp=strategy.dp))
            first_rank += spec.tp * strategy.dp
            first_layer += spec.layers
        return cls(stages, strategy.dp)

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
        return [stage.tp_group(d) for stage in self.stages for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [stage.dp_group(t) for stage in self.stages for t in range(stage.tp)]

    def boundary_ranks(self, stage: int) -> list[int]:
        """Ranks of stages `stage` and `stage + 1`: those that talk across this boundary."""
        return list(self.stages[stage].ranks) + list(self.stages[stage + 1].ranks)

    # ---- resharding plans -----------------------------------------------------------------
    def sliced_transfers(self, src_stage: int, dst_stage: int, dp_index: int) -> list[SliceTransfer]:
        """Send/recv + all-gather: one copy crosses, cut in lcm(a, b) slices (see module doc)."""
        src, dst = self.stages[src_stage], self.stages[dst_stage]
        n = math.lcm(src.tp, dst.tp)
        per_sender, per_receiver = n // src.tp, n // dst.tp
        return [SliceTransfer(src.rank_of(dp_index, k // per_sender), dst.rank_of(dp_index, k // per_receiver), k, n)
                for k in range(n)]

    def full_transfers(self, src_stage: int, dst_stage: int, dp_index: int) -> list[SliceTransfer]:
        """Full-tensor mode: every receiver gets the whole tensor from sender (its TP index mod a)."""
        src, dst = self.stages[src_stage], self.stages[dst_stage]
        return [SliceTransfer(src.rank_of(dp_index, j % src.tp), dst.rank_of(dp_index, j), 0, 1)
                for j in range(dst.tp)]

    def describe(self, device_note: str = "emulated on cpu") -> str:
        """One line per stage; `device_note` says where the chip really runs."""
        lines = []
        for stage in self.stages:
            recompute = "recompute" if stage.recompute else "no recompute"
            lines.append(f"stage {stage.index}: chip {stage.chip} ({device_note}), tp {stage.tp} x dp {stage.dp}, "
                         f"layers {stage.layers.start}..{stage.layers.stop - 1}, {recompute}, "
                         f"ranks {stage.ranks.start}..{stage.ranks.stop - 1}")
        return "\n".join(lines)
