"""Moving an activation (forward) or its gradient (backward) between adjacent stages whose TP sizes
may differ, in one of two modes:

  "sliced" (send/recv + all-gather, the paper's SR&AG): the tensor, replicated over the sender's TP
      group, is flattened and cut in n = lcm(a, b) slices; each slice crosses once, sender
      k // (n / a) to receiver k // (n / b); the receivers all-gather their contiguous blocks inside
      their TP group. One copy crosses the boundary.
  "full": each of the b receivers gets the whole tensor from one sender. b copies cross.

The plan (who sends which slice to whom) comes from the Topology; this module only moves tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from heteropp.p2p import BACKWARD, FORWARD, P2P, message_tag
from heteropp.topology import SliceTransfer, Topology

MODES = ("sliced", "full")


class PendingTensor:
    """Receives posted for one tensor; `wait()` completes them, reassembles and returns the tensor."""

    def __init__(self, works, assemble):
        self._works, self._assemble, self._value = works, assemble, None

    def wait(self) -> torch.Tensor:
        if self._value is None:
            for work in self._works:
                work.wait()
            self._value = self._assemble()
        return self._value


class Resharder:
    def __init__(self, topology: Topology, rank: int, groups, p2p: P2P, mode: str = "sliced"):
        if mode not in MODES:
            raise ValueError(f"resharding mode must be one of {MODES}, got {mode!r}")
        self.topology, self.rank, self.groups, self.p2p, self.mode = topology, rank, groups, p2p, mode
        self.place = topology.place(rank)

    def _plan(self, src_stage: int, dst_stage: int) -> list[SliceTransfer]:
        plan = self.topology.sliced_transfers if self.mode == "sliced" else self.topology.full_transfers
        return plan(src_stage, dst_stage, self.place.dp_index)

    def _boundary_group(self, other_stage: int):
        return self.groups.next_boundary if other_stage > self.place.stage else self.groups.prev_boundary

    def send(self, tensor: torch.Tensor, to_stage: int, micro_batch: int) -> None:
        """Post this rank's part of `tensor` for stage `to_stage` (the next stage: forward; previous: backward)."""
        direction = FORWARD if to_stage > self.place.stage else BACKWARD
        group = self._boundary_group(to_stage)
        transfers = [t for t in self._plan(self.place.stage, to_stage) if t.src == self.rank]
        slices = _flat_slices(tensor.detach(), transfers[0].num_slices) if transfers else []
        for transfer in transfers:
            self.p2p.send(slices[transfer.slice_index], transfer.dst, group,
                          message_tag(micro_batch, direction, transfer.slice_index))

    def post_recv(self, shape: tuple[int, ...], dtype: torch.dtype, from_stage: int, micro_batch: int) -> PendingTensor:
        """Post the receives of this rank's slices of a tensor of `shape` coming from stage `from_stage`.

        Slices are received straight into their place in one flat buffer; in sliced mode the
        receivers' all-gather then fills in the other receivers' blocks.
        """
        direction = FORWARD if from_stage < self.place.stage else BACKWARD
        group = self._boundary_group(from_stage)
        transfers = [t for t in self._plan(from_stage, self.place.stage) if t.dst == self.rank]
        num_slices = transfers[0].num_slices
        numel = _numel(shape)
        slice_len = -(-numel // num_slices)
        flat = torch.empty(slice_len * num_slices, dtype=dtype)
        works = [self.p2p.recv(flat[t.slice_index * slice_len:(t.slice_index + 1) * slice_len], t.src, group,
                               message_tag(micro_batch, direction, t.slice_index))
                 for t in transfers]
        gather = self.mode == "sliced" and len(transfers) < num_slices

        def assemble() -> torch.Tensor:
            if gather:
                first = transfers[0].slice_index * slice_len
                mine = flat[first:first + len(transfers) * slice_len].clone()
                dist.all_gather_single(flat, mine, group=self.groups.tp)
            return flat[:numel].view(shape)

        return PendingTensor(works, assemble)


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _flat_slices(tensor: torch.Tensor, num_slices: int) -> list[torch.Tensor]:
    flat = tensor.reshape(-1)
    slice_len = -(-flat.numel() // num_slices)
    padding = slice_len * num_slices - flat.numel()
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding)])
    return list(flat.split(slice_len))
