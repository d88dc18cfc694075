"""The control flow: small JSON requests over gRPC, without generated code, every call signed.

Each role registers plain functions `handler(request: dict, caller: str) -> dict` under method names
of one service (`serve`); `Control(address, signer).call("Method", field=value)` calls them. gRPC's
generic handlers carry the bytes; the JSON inside is this module's own (de)serialisation, so no protoc
step is needed. Every call is signed by its caller and checked by the server's `Guard` before its bytes
are parsed (h2.ps.auth): an unsigned, forged or replayed call answers UNAUTHENTICATED and reaches no
handler; `caller` is the authenticated participant. Every reply is signed too, and a reply whose
signature does not match is refused by the client. A handler that raises `Rejected` answers
INVALID_ARGUMENT with its one-line message (`Forbidden`: PERMISSION_DENIED, a caller speaking for
someone else) and the server goes on serving; a request larger than MAX_CONTROL_BYTES is refused by
gRPC before it is read, and one that is not a JSON object is refused by name.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import grpc

from h2.core.errors import UserError
from h2.ps.auth import REPLY_MAC, Guard, NotAuthenticated, Signer, reply_signature

SERVICE = "h2.ps.Control"
MAX_CONTROL_BYTES = 4 << 20
_OPTIONS = [("grpc.max_receive_message_length", MAX_CONTROL_BYTES), ("grpc.max_send_message_length", MAX_CONTROL_BYTES)]


class Rejected(Exception):
    """The peer refused the request (bad input, unknown cluster, stale ticket); one line."""


class Forbidden(Rejected):
    """An authenticated caller asked for what only another participant may do (speak for another cluster)."""


class Unreachable(Exception):
    """The peer did not answer (down, restarting, or too slow)."""


def _wrap(method: str, handler: Callable[[dict, str], dict], guard: Guard):

    def handle(raw: bytes, context) -> bytes:
        try:
            caller, key, request_mac = guard.check(method, context.invocation_metadata(), raw)
        except NotAuthenticated as error:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))
        try:
            request = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request: not UTF-8 JSON")
        if not isinstance(request, dict):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request: expected a JSON object")
        try:
            reply = handler(request, caller)
        except Forbidden as error:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error).splitlines()[0])
        except Rejected as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error).splitlines()[0] if str(error) else "rejected")
        except (KeyError, TypeError, ValueError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {type(error).__name__} {error}")
        body = json.dumps(reply or {}).encode("utf-8")
        context.set_trailing_metadata(((REPLY_MAC, reply_signature(key, request_mac, body)), ))
        return body

    return handle


def serve(handlers: dict[str, Callable[[dict, str], dict]], host: str, port: int, *, what: str, guard: Guard,
          max_workers: int = 32) -> tuple[grpc.Server, int]:
    """Start a gRPC server for `handlers` on host:port (0: any free port), admitting the callers `guard`
    admits; (server, bound port).

    A port already in use is a one-line UserError naming `what` (SO_REUSEPORT is off, so a second
    server cannot silently share the port)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=what),
                         options=[*_OPTIONS, ("grpc.so_reuseport", 0)])
    methods = {name: grpc.unary_unary_rpc_method_handler(_wrap(name, fn, guard)) for name, fn in handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods), ))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise UserError(f"{what}: cannot listen on {host}:{port} (port in use or address unavailable)")
    server.start()
    return server, bound


class Control:
    """A client of one control endpoint, signing its calls with `signer`."""

    def __init__(self, address: str, signer: Signer, timeout_s: float = 10.0):
        self.address, self.signer, self.timeout_s = address, signer, timeout_s
        self.channel = grpc.insecure_channel(address, options=_OPTIONS)
        self._methods: dict[str, Callable] = {}

    def call(self, method: str, timeout_s: float | None = None, **request) -> dict:
        stub = self._methods.get(method)
        if stub is None:
            stub = self._methods[method] = self.channel.unary_unary(f"/{SERVICE}/{method}")
        body = json.dumps(request).encode("utf-8")
        metadata, request_mac = self.signer.sign(method, body)
        try:
            raw, call = stub.with_call(body, timeout=timeout_s or self.timeout_s, metadata=metadata)
        except grpc.RpcError as error:
            code = error.code()
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.PERMISSION_DENIED):
                raise Rejected(f"{self.address} {method}: {error.details()}") from None
            raise Unreachable(f"{self.address} {method}: {code.name.lower()}") from None
        reply_mac = dict(call.trailing_metadata() or ()).get(REPLY_MAC)
        if not self.signer.reply_is_authentic(request_mac, raw, reply_mac):
            raise Rejected(f"{self.address} {method}: the reply is not signed by the run's credentials "
                           f"(a different run, or a forged reply)")
        return json.loads(raw.decode("utf-8"))

    def call_until(self, method: str, give_up_s: float, retry_s: float = 0.2, **request) -> dict:
        """`call`, retried while the peer is unreachable, for at most `give_up_s` seconds."""
        deadline = time.monotonic() + give_up_s
        while True:
            try:
                return self.call(method, **request)
            except Unreachable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(retry_s)

    def close(self) -> None:
        self.channel.close()


def wait_until_stopped(stopped: threading.Event) -> None:
    """Block a server process's main thread until SIGTERM, Ctrl-C or `stopped` is set."""
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    stopped.set()
