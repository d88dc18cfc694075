"""The data flow over ZeroMQ: a shard's layer server, and a cluster's push and pull of its layers.

Shard side (`LayerServer`): one ROUTER socket; an I/O thread receives messages (zero-copy frames),
checks their headers and hands each to the thread of its layer through a bounded queue (the memory
pool: at most `pool_frames` received frames wait per layer, after which the I/O thread stops reading
and ZeroMQ's high-water marks push back on the senders). A layer's thread (the consumer) copies a
pushed layer into its staging buffer and answers; a pull is answered from the layer's flat float32
vector, sent without a copy. Replies return through an in-process socket to the I/O thread. The
socket's MAXMSGSIZE is the largest layer, so an oversized message is dropped by ZeroMQ before it is
buffered, and the server keeps serving everyone else.

Cluster side (`push_layers`, `pull_layers`): a producer thread serialises layers (flattens them into
float32 vectors) in the master's order while one sender thread per shard sends the ones ready and
waits for each acknowledgement; pulled layers are received by one thread per shard and copied into
the model (deserialised) by a consumer thread while the next ones arrive.

Every connection is CurveZMQ (libzmq's CURVE, pyzmq's `zmq.auth`): the server holds its key pair and
admits only the client public keys it was given (`CurveServer.clients`, each named by its participant),
through a ZAP authenticator of its own ZeroMQ context; every message it receives carries the sender's
name (the ZAP User-Id), which `on_push` gets. A client names the server's public key, so it talks only to
the shard that holds the matching secret. A peer without an admitted key gets no answer at all: its
handshake fails before any frame reaches the server.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable

import torch
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from h2.core.errors import UserError
from h2.ps import wire
from h2.ps.layout import WIRE_DTYPE, Layer, flatten


class DataFlowError(RuntimeError):
    """A push or pull failed (a peer refused it, or did not answer in time)."""


class Refused(Exception):
    """Raised by a layer server's handlers: answered as an ERROR frame with this one line."""


ZAP_DOMAIN = "h2ps"
CURVE_OVERHEAD = 64  # bytes CURVE adds to a message part (command name, nonce, MAC, flags), with room to spare


def _message_limit(max_payload: int) -> int:
    """ZeroMQ's MAXMSGSIZE for messages whose largest part is a `max_payload`-byte payload: it counts the
    encrypted part, so CURVE's overhead is added."""
    return max_payload + wire.HEADER.size + CURVE_OVERHEAD


def _context() -> zmq.Context:
    return zmq.Context.instance()


@dataclass(frozen=True)
class CurveServer:
    """A layer server's CURVE key pair (Z85) and the clients it admits: public key (Z85) -> name."""
    public: bytes
    secret: bytes
    clients: dict[bytes, str]


@dataclass(frozen=True)
class CurveClient:
    """A client's CURVE key pair (Z85)."""
    public: bytes
    secret: bytes


class _Admitted:
    """The ZAP authenticator's callback: only the listed client keys."""

    def __init__(self, clients: dict[bytes, str]):
        self.clients = clients

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.clients


class LayerServer:
    """Serves pushes and pulls of `layers` (names indexed by their position in the model's layer list).

    `on_push(ticket, layer_name, payload, sender)` stores a pushed layer from client `sender` (raise
    Refused to refuse it); `on_pull(layer_name, version)` returns (version, flat float32 tensor) of a
    layer. Only the clients `curve` admits are served."""

    def __init__(self, host: str, port: int, layers: dict[int, Layer], *, on_push: Callable[[int, str, memoryview, str],
                                                                                            None],
                 on_pull: Callable[[str, int], tuple[int, torch.Tensor]], curve: CurveServer, pool_frames: int = 4):
        self.layers, self.on_push, self.on_pull = layers, on_push, on_pull
        self.max_payload = max([layer.nbytes for layer in layers.values()] + [wire.MAX_ERROR_BYTES])
        self.context = context = zmq.Context()
        self.authenticator = ThreadAuthenticator(context)
        self.authenticator.start()
        self.authenticator.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_Admitted(curve.clients))
        self.authenticator.curve_user_id = lambda key: curve.clients[z85.encode(key)]
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, _message_limit(self.max_payload))
        self.router.curve_server = True
        self.router.curve_secretkey, self.router.curve_publickey = curve.secret, curve.public
        self.router.zap_domain = ZAP_DOMAIN.encode()
        try:
            if port:
                self.router.bind(f"tcp://{host}:{port}")
                self.port = port
            else:
                self.port = self.router.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as error:
            self.router.close()
            self.authenticator.stop()
            context.term()
            raise UserError(f"shard data flow: cannot listen on {host}:{port} ({error})") from None
        self._replies_address = f"inproc://h2ps-replies-{id(self)}"
        self.replies = context.socket(zmq.PULL)
        self.replies.bind(self._replies_address)
        self.queues = {index: queue.Queue(maxsize=pool_frames) for index in layers}
        self.refused = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._io_loop, name="ps-data-io", daemon=True)]
        self._threads += [
            threading.Thread(target=self._layer_loop, args=(index, ), name=f"ps-layer-{layers[index].name}",
                             daemon=True) for index in layers
        ]
        for thread in self._threads:
            thread.start()

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.replies, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(100))
            if self.replies in ready:
                while True:
                    try:
                        self.router.send_multipart(self.replies.recv_multipart(zmq.NOBLOCK, copy=False), copy=False)
                    except zmq.Again:
                        break
            if self.router in ready:
                while True:
                    try:
                        message = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._dispatch(message)
        self.router.close(0)
        self.replies.close(0)

    def _dispatch(self, message: list) -> None:
        identity, frames = message[0], message[1:]
        try:
            header, payload = wire.parse([frame.buffer for frame in frames], max_payload=self.max_payload)
            if header.kind not in (wire.PUSH, wire.PULL):
                raise wire.FrameError(f"a shard takes push and pull frames, got {wire.KINDS[header.kind]}")
            if header.layer not in self.layers:
                raise wire.FrameError(f"layer {header.layer} is not held by this shard")
        except wire.FrameError as error:
            self.refused += 1
            self.router.send_multipart([identity, *wire.error_frames(str(error))])
            return
        sender = frames[0].get("User-Id")
        self.queues[header.layer].put((identity, header, payload, frames, sender))  # blocks when the pool is full

    def _layer_loop(self, index: int) -> None:
        socket = self.context.socket(zmq.PUSH)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self._replies_address)
        layer = self.layers[index]
        while not self._stop.is_set():
            try:
                identity, header, payload, _frames, sender = self.queues[index].get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                if header.kind == wire.PUSH:
                    if header.nbytes != layer.nbytes:
                        raise Refused(f"layer {layer.name} holds {layer.nbytes} bytes, "
                                      f"the push carries {header.nbytes}")
                    self.on_push(header.ticket, layer.name, payload, sender)
                    reply = [wire.Header(wire.OK, index, header.ticket, 0, 0).pack(), b""]
                else:
                    version, vector = self.on_pull(layer.name, header.version)
                    reply = [wire.Header(wire.DATA, index, 0, version, layer.nbytes).pack(), vector.numpy()]
            except Refused as error:
                self.refused += 1
                reply = wire.error_frames(str(error))
            socket.send_multipart([identity, *reply], copy=False)
        socket.close(0)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self.authenticator.stop()
        self.context.destroy(linger=0)


# ---- cluster side -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    index: int  # the layer's position in the model's layer list (its id on the wire)
    layer: Layer
    address: str  # tcp://host:port of the shard that holds it
    server_key: bytes  # the shard's CURVE public key (Z85)


class SocketPool:
    """Connected DEALER sockets kept between transfers, one per (shard address and key, reply size limit,
    client key): a transfer takes one out and puts it back when it went well; a socket whose transfer failed
    may still receive a stale reply, so it is closed instead."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle: dict[tuple, list[zmq.Socket]] = {}

    def take(self, route: Route, max_payload: int, curve: CurveClient) -> zmq.Socket:
        with self.lock:
            idle = self.idle.get(_pool_key(route, max_payload, curve))
            if idle:
                return idle.pop()
        socket = _context().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, _message_limit(max_payload))
        socket.curve_serverkey = route.server_key
        socket.curve_publickey, socket.curve_secretkey = curve.public, curve.secret
        socket.connect(route.address)
        return socket

    def give_back(self, route: Route, max_payload: int, curve: CurveClient, socket: zmq.Socket, healthy: bool) -> None:
        if not healthy:
            socket.close(0)
            return
        with self.lock:
            self.idle.setdefault(_pool_key(route, max_payload, curve), []).append(socket)


def _pool_key(route: Route, max_payload: int, curve: CurveClient) -> tuple:
    return route.address, route.server_key, max_payload, curve.public


SOCKETS = SocketPool()


def _reply(socket: zmq.Socket, route: Route, timeout_s: float, max_payload: int):
    if not socket.poll(int(timeout_s * 1000)):
        raise DataFlowError(f"shard {route.address} did not answer for layer {route.layer.name} in {timeout_s:g} s")
    frames = socket.recv_multipart(copy=False)
    try:
        header, payload = wire.parse([frame.buffer for frame in frames], max_payload=max_payload)
    except wire.FrameError as error:
        raise DataFlowError(f"shard {route.address}, layer {route.layer.name}: {error}") from None
    if header.kind == wire.ERROR:
        raise DataFlowError(f"shard {route.address} refused layer {route.layer.name}: "
                            f"{bytes(payload).decode('utf-8', 'replace')}")
    return header, payload


def _by_address(routes: list[Route]) -> dict[str, list[Route]]:
    grouped: dict[str, list[Route]] = {}
    for route in routes:
        grouped.setdefault(route.address, []).append(route)
    return grouped


def _run_workers(workers: list[threading.Thread], errors: list[BaseException]) -> None:
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def push_layers(routes: list[Route], ticket: int, tensors: dict[str, torch.Tensor], *, curve: CurveClient,
                timeout_s: float = 30.0, pool_slots: int = 2,
                transform: Callable[[Layer, torch.Tensor], torch.Tensor] | None = None) -> int:
    """Push every routed layer of `tensors` (full-model names) under `ticket`; the bytes sent.

    A producer serialises layers in `routes` order into at most `pool_slots` waiting vectors per
    shard; one sender per shard sends them as they come. `transform` may rewrite a serialised layer
    (fault injection)."""
    grouped = _by_address(routes)
    pools = {address: queue.Queue(maxsize=pool_slots) for address in grouped}
    errors: list[BaseException] = []
    max_payload = max(route.layer.nbytes for route in routes)
    abort = threading.Event()

    def produce() -> None:
        for route in routes:
            if abort.is_set():
                break
            vector = flatten(route.layer, tensors)
            if transform is not None:
                vector = transform(route.layer, vector)
            pools[route.address].put((route, vector))
        for pool in pools.values():
            pool.put(None)

    def send(address: str) -> None:
        shard = grouped[address][0]
        socket = SOCKETS.take(shard, max_payload, curve)
        healthy = False
        try:
            while (item := pools[address].get()) is not None:
                if abort.is_set():
                    continue
                route, vector = item
                header = wire.Header(wire.PUSH, route.index, ticket, 0, route.layer.nbytes)
                socket.send_multipart([header.pack(), vector.numpy()], copy=False)
                _reply(socket, route, timeout_s, max_payload)
            healthy = not abort.is_set()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors.append(error)
            abort.set()
            while pools[address].get() is not None:
                pass
        finally:
            SOCKETS.give_back(shard, max_payload, curve, socket, healthy)

    workers = [threading.Thread(target=produce, name="ps-serialise")]
    workers += [threading.Thread(target=send, args=(address, ), name="ps-push") for address in grouped]
    _run_workers(workers, errors)
    return sum(route.layer.nbytes for route in routes)


def pull_layers(routes: list[Route], version: int, write: Callable[[Layer, torch.Tensor], None], *, curve: CurveClient,
                timeout_s: float = 30.0) -> int:
    """Pull every routed layer at global `version`; `write(layer, vector)` deserialises each into the
    model on a consumer thread while the next layers arrive. The bytes received."""
    grouped = _by_address(routes)
    received: queue.Queue = queue.Queue()
    errors: list[BaseException] = []
    max_payload = max(route.layer.nbytes for route in routes)

    def receive(address: str) -> None:
        shard = grouped[address][0]
        socket = SOCKETS.take(shard, max_payload, curve)
        healthy = False
        try:
            for route in grouped[address]:
                socket.send_multipart([wire.Header(wire.PULL, route.index, 0, version, 0).pack(), b""])
                header, payload = _reply(socket, route, timeout_s, max_payload)
                if header.kind != wire.DATA or header.nbytes != route.layer.nbytes or header.version != version:
                    raise DataFlowError(f"shard {address} answered layer {route.layer.name} with "
                                        f"{wire.KINDS[header.kind]} of {header.nbytes} bytes at version "
                                        f"{header.version}, expected {route.layer.nbytes} bytes at {version}")
                received.put((route.layer, torch.frombuffer(bytearray(payload), dtype=WIRE_DTYPE)))
            healthy = True
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors.append(error)
        finally:
            SOCKETS.give_back(shard, max_payload, curve, socket, healthy)
            received.put(None)

    def consume() -> None:
        remaining = len(grouped)
        while remaining:
            item = received.get()
            if item is None:
                remaining -= 1
                continue
            if not errors:
                write(*item)

    workers = [threading.Thread(target=receive, args=(address, ), name="ps-pull") for address in grouped]
    workers.append(threading.Thread(target=consume, name="ps-deserialise"))
    _run_workers(workers, errors)
    return sum(route.layer.nbytes for route in routes)
