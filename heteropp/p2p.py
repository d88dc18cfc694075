"""All stage-to-stage traffic: non-blocking sends and receives on a boundary's process group, with
a count of the bytes this rank sends across stages.

Sends never block the schedule: they are posted and kept until `wait_sends` at the end of the step.
Receives are posted when the schedule reaches them and waited for only when their tensor is used,
so the transfer overlaps whatever compute the schedule places in between. Every message carries a
tag naming micro-batch and direction, so the pairs match whatever order the wire delivers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

FORWARD, BACKWARD = 0, 1


def message_tag(micro_batch: int, direction: int) -> int:
    """Two ranks exchange at most one message per micro-batch and direction (heteropp.topology)."""
    return micro_batch * 2 + direction


class P2P:
    def __init__(self):
        self.bytes_sent = 0
        self.messages_sent = 0
        self._pending_sends: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst: int, group, tag: int) -> None:
        tensor = tensor.contiguous()
        work = dist.isend(tensor, dst=dst, group=group, tag=tag)
        self._pending_sends.append((work, tensor))
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.messages_sent += 1

    def recv(self, buffer: torch.Tensor, src: int, group, tag: int) -> dist.Work:
        return dist.irecv(buffer, src=src, group=group, tag=tag)

    def wait_sends(self) -> None:
        for work, _ in self._pending_sends:
            work.wait()
        self._pending_sends.clear()
