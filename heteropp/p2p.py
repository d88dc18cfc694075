"""All stage-to-stage traffic: non-blocking sends and receives on a boundary's process group, with
a count of the bytes this rank sends across stages.

Sends never block the schedule: they are posted and kept until `wait_sends` at the end of the step.
Receives are posted when the schedule reaches them and waited for only when their tensor is used,
so the transfer overlaps whatever compute the schedule places in between. Every message carries a
tag naming micro-batch and direction, so the pairs match whatever order the wire delivers.

With `stage_through_host` (a cross-stage backend that cannot read the stages' device memory, such
as gloo for dipu tensors) sends copy to host first and receives land in host buffers that are
copied into place when waited for.

With `link_to` (the emulated link to each peer, h2.core.links.PeerLinks.to) every send is paced: a
`LinkPacer` thread posts it when it would arrive over its link (max(previous arrival, now +
latency) + bytes / bandwidth), so a pipeline on gloo sees its slow links; the schedule still never
waits for a send. The DiComm backend paces in its own shaping layer instead (no `link_to` here then).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

from h2.core.links import ArrivalClock, Link

FORWARD, BACKWARD = 0, 1

CHUNK_TAGS = 1024  # the most ministages a strategy may have (h2.core.strategy)


def message_tag(micro_batch: int, direction: int, chunk: int = 0) -> int:
    """Two ranks exchange at most one message per micro-batch, direction and ministage (`chunk`: the
    local chunk of the stage that produced the activation; heteropp.topology, heteropp.ministages)."""
    return (micro_batch * CHUNK_TAGS + chunk) * 2 + direction


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


class _PacedSend:
    """A send the pacer posts later; `wait()` waits for the posting, then for the send."""

    def __init__(self, post: Callable[[], dist.Work]):
        self._post = post
        self._posted = threading.Event()
        self._work: dist.Work | None = None
        self._error: BaseException | None = None

    def release(self) -> None:
        try:
            self._work = self._post()
        except BaseException as error:  # handed to the waiting thread
            self._error = error
        self._posted.set()

    def wait(self) -> bool:
        self._posted.wait()
        if self._error is not None:
            raise self._error
        return self._work.wait()


class LinkPacer:
    """One thread that posts each send at its arrival time over the link to its destination."""

    def __init__(self, link_to: Callable[[int], Link]):
        self._link_to = link_to
        self._clocks: dict[int, ArrivalClock] = {}
        self._due: list[tuple[float, int, _PacedSend]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def post(self, post: Callable[[], dist.Work], dst: int, nbytes: int) -> _PacedSend:
        send = _PacedSend(post)
        with self._changed:
            clock = self._clocks.get(dst)
            if clock is None:
                clock = self._clocks[dst] = ArrivalClock(self._link_to(dst))
            heapq.heappush(self._due, (clock.arrival(time.monotonic(), nbytes), next(self._order), send))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heteropp-link-pacer", daemon=True)
                self._thread.start()
            self._changed.notify()
        return send

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, send = heapq.heappop(self._due)
            send.release()


class P2P:

    def __init__(self, stage_through_host: bool = False, link_to: Callable[[int], Link] | None = None):
        """`link_to(peer)`: the emulated link to global rank `peer`, which paces the sends (h2.core.links
        PeerLinks.to); None: unpaced."""
        self.stage_through_host = stage_through_host
        self.bytes_sent = 0
        self._pacer = LinkPacer(link_to) if link_to is not None else None
        self._pending_sends: list[tuple[dist.Work | _PacedSend, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst: int, group, tag: int) -> None:
        tensor = (tensor.cpu() if self.stage_through_host else tensor).contiguous()
        post = lambda: dist.isend(tensor, dst=dst, group=group, tag=tag)  # noqa: E731
        nbytes = tensor.numel() * tensor.element_size()
        work = self._pacer.post(post, dst, nbytes) if self._pacer is not None else post()
        self._pending_sends.append((work, tensor))
        self.bytes_sent += nbytes

    def recv(self, buffer: torch.Tensor, src: int, group, tag: int):
        """Post a receive into `buffer`; returns something with `wait()`."""
        if self.stage_through_host and buffer.device.type != "cpu":
            return _StagedRecv(buffer, src, group, tag)
        return dist.irecv(buffer, src=src, group=group, tag=tag)

    def wait_sends(self) -> None:
        for work, _ in self._pending_sends:
            work.wait()
        self._pending_sends.clear()
