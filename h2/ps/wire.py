"""The data flow's frames: a fixed 32-byte header and, for parameters, the layer's bytes.

    header = magic "H2PS" | protocol u8 | kind u8 | layer u16 | ticket u64 | version u64 | nbytes u64

A push carries a layer of a cluster's model under the ticket the master issued for that push; a
pull asks for a layer at the global model's current version; the shard answers OK, DATA (the
layer at `version`) or ERROR (a one-line reason as UTF-8). Every field is checked against what the
receiver expects before the payload is touched; the transport itself refuses messages larger than
the largest layer (ZeroMQ's MAXMSGSIZE), so a peer's length field never sizes an allocation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"H2PS"
PROTOCOL = 1
HEADER = struct.Struct("<4sBBHQQQ")
PUSH, PULL, OK, DATA, ERROR = 1, 2, 3, 4, 5
KINDS = {PUSH: "push", PULL: "pull", OK: "ok", DATA: "data", ERROR: "error"}
MAX_ERROR_BYTES = 512


class FrameError(ValueError):
    """A malformed frame; the message is one line naming what is wrong."""


@dataclass(frozen=True)
class Header:
    kind: int
    layer: int
    ticket: int
    version: int
    nbytes: int

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, PROTOCOL, self.kind, self.layer, self.ticket, self.version, self.nbytes)


def parse(frames: list, *, max_payload: int) -> tuple[Header, memoryview]:
    """The header and payload of a received message, checked: two parts, the magic, the protocol, a
    known kind, a declared length within `max_payload` and equal to the payload's."""
    if len(frames) != 2:
        raise FrameError(f"expected 2 message parts (header, payload), got {len(frames)}")
    raw_header, payload = memoryview(frames[0]), memoryview(frames[1])
    if len(raw_header) != HEADER.size:
        raise FrameError(f"header is {len(raw_header)} bytes, expected {HEADER.size}")
    magic, protocol, kind, layer, ticket, version, nbytes = HEADER.unpack(raw_header)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r} (not an H2 parameter-server frame)")
    if protocol != PROTOCOL:
        raise FrameError(f"protocol {protocol}, this server speaks {PROTOCOL}")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if nbytes > max_payload:
        raise FrameError(f"frame declares {nbytes} payload bytes, more than the {max_payload} allowed")
    if len(payload) != nbytes:
        raise FrameError(f"truncated or padded frame: header declares {nbytes} payload bytes, "
                         f"{len(payload)} arrived")
    return Header(kind, layer, ticket, version, nbytes), payload


def error_frames(message: str) -> list[bytes]:
    text = message.splitlines()[0].encode("utf-8")[:MAX_ERROR_BYTES] if message else b"error"
    return [Header(ERROR, 0, 0, 0, len(text)).pack(), text]
