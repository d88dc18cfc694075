"""All stage-to-stage traffic: non-blocking sends and receives on a boundary's process group, with
a count of the bytes this rank sends across stages.

Sends never block the schedule: they are posted and kept until `wait_sends` at the end of the step.
Receives are posted when the schedule reaches them and waited for only when their tensor is used,
so the transfer overlaps whatever compute the schedule places in between. Every message carries a
tag naming micro-batch and direction, so the pairs match whatever order the wire delivers.

With `stage_through_host` (a cross-stage backend that cannot read the stages' device memory, such
as gloo for dipu tensors) sends copy to host first and receives land in host buffers that are
copied into place when waited for.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

FORWARD, BACKWARD = 0, 1


def message_tag(micro_batch: int, direction: int) -> int:
    """Two ranks exchange at most one message per micro-batch and direction (heteropp.topology)."""
    return micro_batch * 2 + direction


class _StagedRecv:
    """A receive into a host buffer, copied into the device tensor `target` when waited for."""

    def __init__(self, target: torch.Tensor, src: int, group, tag: int):
        self._target = target
        self._host = torch.empty(target.shape, dtype=target.dtype)
        self._work = dist.irecv(self._host, src=src, group=group, tag=tag)

    def wait(self) -> bool:
        self._work.wait()
        self._target.copy_(self._host)
        return True


class P2P:
    def __init__(self, stage_through_host: bool = False):
        self.stage_through_host = stage_through_host
        self.bytes_sent = 0
        self.messages_sent = 0
        self._pending_sends: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst: int, group, tag: int) -> None:
        tensor = (tensor.cpu() if self.stage_through_host else tensor).contiguous()
        work = dist.isend(tensor, dst=dst, group=group, tag=tag)
        self._pending_sends.append((work, tensor))
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.messages_sent += 1

    def recv(self, buffer: torch.Tensor, src: int, group, tag: int):
        """Post a receive into `buffer`; returns something with `wait()`."""
        if self.stage_through_host and buffer.device.type != "cpu":
            return _StagedRecv(buffer, src, group, tag)
        return dist.irecv(buffer, src=src, group=group, tag=tag)

    def wait_sends(self) -> None:
        for work, _ in self._pending_sends:
            work.wait()
        self._pending_sends.clear()
