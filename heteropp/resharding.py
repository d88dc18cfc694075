"""Moving an activation (forward) or its gradient (backward) between adjacent stages whose TP sizes and
data-parallel sizes may differ, in one of two modes:

  "sliced" (send/recv + all-gather, the paper's SR&AG): each sender rank sends its block of its
      replica's sequences to the receivers whose blocks overlap it; the receivers all-gather their
      blocks inside their TP group (pairwise send/recv of the blocks). One copy crosses the boundary.
  "full": every receiver rank gets its replica's whole tensor from the sender replicas holding it.
      tp_receiver copies cross.

The plan (who sends which elements to whom) comes from the Topology; this module only moves tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from h2.core.training import RESHARDING_MODES as MODES
from heteropp.p2p import BACKWARD, FORWARD, P2P, message_tag
from heteropp.topology import Topology, Transfer, block_size


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
        self.stage = topology.stages[self.place.stage]
        self._plans: dict[tuple[int, int, int], list[Transfer]] = {}

    def _plan(self, src_stage: int, dst_stage: int, row_numel: int) -> list[Transfer]:
        key = (src_stage, dst_stage, row_numel)
        if key not in self._plans:
            plan = self.topology.sliced_transfers if self.mode == "sliced" else self.topology.full_transfers
            self._plans[key] = plan(src_stage, dst_stage, row_numel)
        return self._plans[key]

    def _boundary_group(self, other_stage: int):
        """The group this stage shares with `other_stage`: the next or previous boundary's, or, between
        the last stage and stage 0 (the ministages' wrap-around), the wrap group."""
        if other_stage == self.place.stage + 1:
            return self.groups.next_boundary
        if other_stage == self.place.stage - 1:
            return self.groups.prev_boundary
        return self.groups.wrap

    def _check_rows(self, shape: tuple[int, ...]) -> int:
        held = len(self.stage.rows(self.place.dp_index))
        if shape[0] != held:
            raise ValueError(f"stage {self.place.stage} holds {held} sequences per "
                             f"micro-batch, got a tensor of shape {tuple(shape)}")
        return _numel(shape[1:])

    def send(self, tensor: torch.Tensor, to_stage: int, micro_batch: int, *, direction: int | None = None,
             chunk: int = 0) -> None:
        """Post this rank's part of `tensor` for stage `to_stage` (the next stage: forward; previous:
        backward, unless `direction` says otherwise: the wrap-around between the last stage and stage 0;
        `chunk`: the ministage the message belongs to, heteropp.p2p.message_tag)."""
        if direction is None:
            direction = FORWARD if to_stage > self.place.stage else BACKWARD
        row_numel = self._check_rows(tuple(tensor.shape))
        first, _ = self.stage.replica_elements(self.place.dp_index, row_numel)
        flat = tensor.detach().reshape(-1)
        group = self._boundary_group(to_stage)
        for transfer in self._plan(self.place.stage, to_stage, row_numel):
            if transfer.src == self.rank:
                self.p2p.send(flat[transfer.start - first:transfer.stop - first], transfer.dst, group,
                              message_tag(micro_batch, direction, chunk))

    def post_recv(self, shape: tuple[int, ...], dtype: torch.dtype, from_stage: int, micro_batch: int,
                  device: torch.device | str = "cpu", *, direction: int | None = None, chunk: int = 0) -> PendingTensor:
        """Post the receives of this rank's part of a tensor of `shape` coming from stage `from_stage`
        (`direction`, `chunk`: as for `send`).

        Parts are received straight into their place in one flat buffer (padded to whole TP blocks);
        in sliced mode the TP group's all-gather then fills in the other ranks' blocks.
        """
        if direction is None:
            direction = FORWARD if from_stage < self.place.stage else BACKWARD
        row_numel = self._check_rows(tuple(shape))
        first, last = self.stage.replica_elements(self.place.dp_index, row_numel)
        numel = last - first
        tp, tp_index = self.stage.tp, self.place.tp_index
        gather = self.mode == "sliced" and tp > 1
        block = block_size(numel, tp) if gather else numel
        flat = torch.empty(block * tp if gather else numel, dtype=dtype, device=device)
        group = self._boundary_group(from_stage)
        works = [
            self.p2p.recv(flat[t.start - first:t.stop - first], t.src, group, message_tag(
                micro_batch, direction, chunk)) for t in self._plan(from_stage, self.place.stage, row_numel)
            if t.dst == self.rank
        ]

        def assemble() -> torch.Tensor:
            if gather:
                _exchange_blocks(flat, block, self.groups.tp_ranks, tp_index, self.groups.tp,
                                 message_tag(micro_batch, direction, chunk))
            return flat[:numel].view(shape)

        return PendingTensor(works, assemble)


def _exchange_blocks(flat: torch.Tensor, block: int, tp_ranks: list[int], tp_index: int, group, tag: int) -> None:
    """The receivers' all-gather: every TP rank sends its block of `flat` to each other one and receives
    theirs into place. Pairwise send/recv rather than all_gather_into_tensor, which on gloo stages
    through extra buffers (1.6-3.7x slower here for 0.5-32 MiB blocks between two processes)."""
    mine = flat[tp_index * block:(tp_index + 1) * block]
    works = []
    for peer_index, peer in enumerate(tp_ranks):
        if peer_index != tp_index:
            works.append(dist.irecv(flat[peer_index * block:(peer_index + 1) * block], src=peer, group=group, tag=tag))
            works.append(dist.isend(mine, dst=peer, group=group, tag=tag))
    for work in works:
        work.wait()


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
