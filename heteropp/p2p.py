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

A cross-site link that the data-parallel replicas share (JEEVES's global send list, heteroauto.jeeves)
is one queue, not one per (sender, destination) pair: with `shared` (per direction, a `SharedLink`)
this rank's messages in that direction take the link in the send list's order. Message i leaves
when message i - 1 (another replica's, perhaps) has left: its sender publishes its arrival on the
job's store (within the site, as the paper's signal to the next replica), and message i arrives at
max(arrival of i - 1, posted + latency) + bytes / bandwidth (posted a transfer's time earlier where
the kernel shapes the bandwidth between the nodes). A thread per shared direction waits for the
turns, so the schedule still never waits for a send.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

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

    def release_at(self, send: _PacedSend, due: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (due, next(self._order), send))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heteropp-link-pacer", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, send = heapq.heappop(self._due)
            send.release()


@dataclass
class SharedLink:
    """One direction of a cross-site boundary that every replica's messages share: its link, the global
    send list [(replica, micro_batch)] in link order, this rank's replica, the store the senders signal
    through and the key naming this queue on it (one per boundary, direction and TP lane)."""
    link: Link
    order: Sequence[tuple[int, int]]
    replica: int
    store: object  # torch.distributed Store
    key: str
    kernel_shaped: bool = False  # the kernel shapes the bandwidth to the peer: post a transfer's time early
    position: dict[tuple[int, int], int] = field(init=False)

    def __post_init__(self):
        self.position = {message: index for index, message in enumerate(self.order)}


class _SharedQueue:
    """This rank's messages on one SharedLink: a thread takes them in send-list order, waits for the
    previous message's arrival on the store, publishes its own and hands the send to the pacer."""

    def __init__(self, shared: SharedLink, pacer: LinkPacer):
        self.shared, self._pacer = shared, pacer
        self._mine = [index for index, (replica, _) in enumerate(shared.order) if replica == shared.replica]
        self._waiting: dict[int, tuple[float, int, _PacedSend]] = {}
        self._changed = threading.Condition()
        self._step = 0
        self._next = 0  # position in self._mine of the next message to pace
        threading.Thread(target=self._run, name="heteropp-shared-link", daemon=True).start()

    def post(self, post: Callable[[], dist.Work], micro_batch: int, nbytes: int) -> _PacedSend:
        send = _PacedSend(post)
        index = self.shared.position[(self.shared.replica, micro_batch)]
        with self._changed:
            self._waiting[index] = (time.time(), nbytes, send)
            self._changed.notify()
        return send

    def _key(self, step: int, index: int) -> str:
        return f"{self.shared.key}/{step}/{index}"

    def _run(self) -> None:
        store, link = self.shared.store, self.shared.link
        while True:
            with self._changed:
                index = self._mine[self._next]
                while index not in self._waiting:
                    self._changed.wait()
                posted, nbytes, send = self._waiting.pop(index)
                step = self._step
                self._next += 1
                if self._next == len(self._mine):
                    self._next, self._step = 0, self._step + 1
            previous = -math.inf
            if index > 0:
                previous = float(store.get(self._key(step, index - 1)).decode())
                store.delete_key(self._key(step, index - 1))
            arrival = max(previous, posted + link.latency_s) + nbytes / link.bytes_per_s
            store.set(self._key(step, index), repr(arrival))
            if index == len(self.shared.order) - 1:
                store.delete_key(self._key(step, index))  # nobody waits for the last one
            transfer = nbytes / link.bytes_per_s if self.shared.kernel_shaped else 0.0
            self._pacer.release_at(send, arrival - transfer - time.time() + time.monotonic())


class P2P:

    def __init__(self, stage_through_host: bool = False, link_to: Callable[[int], Link] | None = None,
                 shared: dict[int, SharedLink] | None = None):
        """`link_to(peer)`: the emulated link to global rank `peer`, which paces the sends (h2.core.links
        PeerLinks.to); None: unpaced. `shared`: per direction (FORWARD, BACKWARD), the cross-site link this
        rank's sends that way share with the other replicas' (module doc); needs `link_to`."""
        self.stage_through_host = stage_through_host
        self.bytes_sent = 0
        self._pacer = LinkPacer(link_to) if link_to is not None else None
        self._shared = {direction: _SharedQueue(link, self._pacer)
                        for direction, link in (shared or {}).items()} if self._pacer is not None else {}
        self._pending_sends: list[tuple[dist.Work | _PacedSend, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst: int, group, tag: int) -> None:
        tensor = (tensor.cpu() if self.stage_through_host else tensor).contiguous()
        post = lambda: dist.isend(tensor, dst=dst, group=group, tag=tag)  # noqa: E731
        nbytes = tensor.numel() * tensor.element_size()
        direction, micro_batch = tag % 2, tag // 2 // CHUNK_TAGS
        if direction in self._shared:
            work = self._shared[direction].post(post, micro_batch, nbytes)
        elif self._pacer is not None:
            work = self._pacer.post(post, dst, nbytes)
        else:
            work = post()
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
