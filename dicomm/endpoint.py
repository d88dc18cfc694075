"""Endpoint: this process's DiComm connections to every other rank of a job."""
from __future__ import annotations

import collections
from typing import Any, Callable, Mapping

from dicomm import _dicomm_core as _core
from h2.core.links import Link

CommError = _core.CommError
FrameError = _core.FrameError
Handle = _core.Handle

TUNING_OPTIONS = ("tcp_chunk_bytes", "tcp_socket_buffer_bytes", "tcp_congestion", "shm_ring_bytes", "shm_eager_bytes",
                  "tcp_notsent_lowat_bytes", "shm_split_bytes", "shm_cross_memory_attach", "max_message_bytes",
                  "bind_address", "advertise_address", "spin_wait_us", "hello_timeout_s", "unexpected_bytes_per_peer")


def check_options(options: _core.Options) -> None:
    """Refuse, before the engine starts, options the engine would take but cannot work with: the C++
    checks (`Options.validate`), then a message size limit below one byte (DICOMM_MAX_MESSAGE_BYTES=0
    made every receiver refuse every message). ValueError, one line naming the setting."""
    options.validate()
    if options.max_message_bytes < 1:
        raise ValueError(f"DICOMM_MAX_MESSAGE_BYTES (max_message_bytes) must be at least 1, got "
                         f"{options.max_message_bytes}: every peer would refuse every message")


def environment_options() -> _core.Options:
    """DiComm's options from the DICOMM_* environment, checked (`check_options`): a value the engine
    cannot parse or use is a one-line ValueError naming the variable."""
    options = _core.Options.from_environment()
    check_options(options)
    return options


class Endpoint:
    """Connects rank ``rank`` of ``world_size`` to all others through ``store``.

    ``store`` is any object with ``set(key, value)`` and a blocking ``get(key)`` (a
    torch.distributed Store, or :class:`dicomm.FileStore`). Arguments left as None fall back to
    the DICOMM_* environment variables, then to built-in defaults:

    - ``transport``: "auto" (same host -> shm, RDMA on both -> ibverbs, else tcp), "tcp", "shm"
      or "ibverbs"; ``peer_transport`` overrides it per peer rank.
    - ``token``: the job token every peer must present; None lets rank 0 draw one and share
      it through the store.
    - ``timeout``: seconds after which a pending request fails (dead or silent peer).
    - ``connect_timeout``: seconds allowed for setup (store look-ups and connections).
    - ``prefix``: store key prefix, so several endpoints can share one store.
    - ``device_memory``: the device memory functions of the buffers passed with ``device=True``
      (``h2.core.devices.device_memory("dipu")``). With them on both sides of a same-host
      connection, device buffers move device-direct (one vendor copy, no host staging); elsewhere
      they are staged through host memory with the vendor's copies. ``device_direct=False`` (or
      DICOMM_DEVICE_DIRECT=0) always stages: the CPU-mediated baseline.
    - ``link``: an emulated link (``h2.core.links.Link``: bandwidth, one-way latency) that paces
      what this rank sends to every peer; ``peer_links`` overrides it per peer rank. Each message
      is handed to the transport when it would arrive over that link (docs/dicomm.md, "Link
      emulation"); DICOMM_LINK_GBPS and DICOMM_LINK_LATENCY_US set ``link`` from the environment.
    - ``**tuning``: any of TUNING_OPTIONS (see docs/dicomm.md for each one's environment variable).

    Buffers are bytes-like objects (bytes, bytearray, numpy arrays, memoryviews; receive
    buffers must be writable) or ``(address, nbytes)`` tuples for memory the caller keeps alive.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        *,
        transport: str | None = None,
        peer_transport: Mapping[int, str] | None = None,
        token: str | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        prefix: str | None = None,
        device_memory: Mapping[str, int] | None = None,
        device_direct: bool | None = None,
        link: Link | None = None,
        peer_links: Mapping[int, Link] | None = None,
        **tuning: int,
    ):
        options = _core.Options.from_environment()
        if transport is not None:
            options.transport = transport
        if peer_transport is not None:
            options.peer_transport = {int(k): v for k, v in peer_transport.items()}
        if token is not None:
            options.token = token
        if timeout is not None:
            options.timeout_s = float(timeout)
        if connect_timeout is not None:
            options.connect_timeout_s = float(connect_timeout)
        if prefix is not None:
            options.store_prefix = prefix
        if device_memory is not None:
            options.set_device_memory(dict(device_memory))
        if device_direct is not None:
            options.device_direct = bool(device_direct)
        if link is not None:
            options.link = link_shape(link)
        if peer_links is not None:
            options.peer_links = {int(peer): link_shape(peer_link) for peer, peer_link in peer_links.items()}
        for name, value in tuning.items():
            if name not in TUNING_OPTIONS:
                raise TypeError(f"Endpoint() got an unknown option '{name}'")
            setattr(options, name, value)
        check_options(options)
        self._engine = _core.Engine(store, rank, world_size, options)
        self._inflight: collections.deque = collections.deque()
        self._prune_at = 1024

    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def world_size(self) -> int:
        return self._engine.world_size

    @property
    def notes(self) -> list[str]:
        """One line per noteworthy setup event (fallbacks, refused connections)."""
        return self._engine.notes()

    def transport(self, peer: int) -> str:
        """The transport carrying traffic to ``peer``: "tcp", "shm" or "ibverbs"."""
        return self._engine.transport(peer)

    def device_direct(self, peer: int) -> bool:
        """Whether ``device=True`` buffers to and from ``peer`` move device-direct (no host staging)."""
        return self._engine.device_direct(peer)

    def link(self, peer: int) -> Link | None:
        """The emulated link that paces sends to ``peer``; None when they are not paced."""
        return link_from_shape(self._engine.link(peer))

    def _track(self, handle: Handle) -> Handle:
        # Keeps each buffer alive until its request finishes, even if the caller drops the handle.
        self._inflight.append(handle)
        while self._inflight and self._inflight[0].done:
            self._inflight.popleft()
        if len(self._inflight) > self._prune_at:  # a long-pending request at the front
            self._inflight = collections.deque(h for h in self._inflight if not h.done)
            self._prune_at = max(1024, 2 * len(self._inflight))
        return handle

    def set_copy_hooks(self, to_host: Callable[[int, int, int], None], from_host: Callable[[int, int, int],
                                                                                           None]) -> None:
        """How device memory is read and written: each hook is called as ``hook(dst_address,
        src_address, nbytes)``. Requests with ``device=True`` that do not move device-direct are then
        staged through host memory with these hooks."""
        self._engine.set_copy_hooks(to_host, from_host)

    def isend(self, buffer: Any, dst: int, tag: int = 0, *, device: bool = False) -> Handle:
        return self._track(self._engine.isend(buffer, dst, tag, device))

    def irecv(self, buffer: Any, src: int, tag: int = 0, *, device: bool = False) -> Handle:
        return self._track(self._engine.irecv(buffer, src, tag, device))

    def send(self, buffer: Any, dst: int, tag: int = 0, *, device: bool = False) -> int:
        return self.isend(buffer, dst, tag, device=device).wait()

    def recv(self, buffer: Any, src: int, tag: int = 0, *, device: bool = False) -> int:
        """Receives into ``buffer``; returns the message size in bytes."""
        return self.irecv(buffer, src, tag, device=device).wait()

    def close(self) -> None:
        """Fails pending requests ("endpoint closed") and releases sockets, rings and threads."""
        self._engine.close()
        self._inflight.clear()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def link_shape(link: Link) -> "_core.LinkShape":
    """The C++ core's form of a link (bytes per second, seconds)."""
    return _core.LinkShape(link.bytes_per_s, link.latency_s)


def link_from_shape(shape: "_core.LinkShape") -> Link | None:
    if not shape.shaped:
        return None
    # Back in the units it was given in, without the last bits of unit conversion.
    return Link(float(f"{shape.bandwidth_bytes_per_s / 1e9:.12g}"), float(f"{shape.latency_s * 1e6:.12g}"))


def probe_ibverbs() -> dict:
    """What this build and host offer for RDMA: compiled, available, device, message (one line)."""
    return _core.probe_ibverbs()


def live_requests() -> int:
    """Requests alive in this process; flat over time when nothing leaks."""
    return _core.live_requests()
