"""Scalars from TensorBoard event files (`events.out.tfevents.*`), read without TensorFlow or protobuf.

An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC-32C of the length, the
payload, uint32 masked CRC-32C of the payload (all little-endian). Each payload is a serialized
`tensorflow.Event` protocol buffer; the fields read here are `step` (2) and `summary` (5), whose
`value` entries (1) carry a `tag` (1) and either a `simple_value` (2, float32: what
`SummaryWriter.add_scalar` writes) or a scalar `tensor` (8, a TensorProto: what TF2's
`tf.summary.scalar` writes). The length CRC of every record is checked; the payload CRC of every
record a scalar is taken from. A truncated last record (a writer still running) ends the file.
"""

from __future__ import annotations

import dataclasses
import struct

from h2.core.errors import UserError

_CRC32C_TABLE = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ 0x82F63B78 if _crc & 1 else _crc >> 1
    _CRC32C_TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def is_event_file(head: bytes) -> bool:
    """Whether these first bytes start a TFRecord (a valid length CRC)."""
    return len(head) >= 12 and struct.unpack("<I", head[8:12])[0] == masked_crc32c(head[:8])


# ---- protocol buffer wire format ------------------------------------------------------------------
class _Malformed(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed("varint too long")


def _fields(data: bytes):
    """(field number, wire type, value) of a message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise _Malformed(f"unsupported wire type {wire}")
        if pos > len(data):
            raise _Malformed("truncated field")
        yield number, wire, value


# TensorProto dtypes (tensorflow/core/framework/types.proto) and how a scalar of each is stored.
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_CONTENT_FORMATS = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}


def _tensor_scalar(data: bytes) -> float | None:
    dtype, values = None, []
    for number, wire, value in _fields(data):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and wire == 2 and dtype in _CONTENT_FORMATS:  # tensor_content, raw little-endian
            fmt = _CONTENT_FORMATS[dtype]
            if len(value) >= struct.calcsize(fmt):
                values.append(struct.unpack_from(fmt, value)[0])
        elif number == 5:  # float_val, packed (wire 2) or not (wire 5)
            values.extend(struct.unpack(f"<{len(value) // 4}f", value) if wire == 2 else struct.unpack("<f", value))
        elif number == 6:  # double_val
            values.extend(struct.unpack(f"<{len(value) // 8}d", value) if wire == 2 else struct.unpack("<d", value))
        elif number == 13 and wire == 0:  # half_val: the float16 bits in an int32
            values.append(struct.unpack("<e", struct.pack("<H", value & 0xFFFF))[0])
    return float(values[0]) if values else None


def _summary_scalars(data: bytes):
    for number, wire, value in _fields(data):
        if number != 1 or wire != 2:
            continue
        tag, scalar = None, None
        for field, field_wire, content in _fields(value):
            if field == 1 and field_wire == 2:
                tag = content.decode("utf-8", "replace")
            elif field == 2 and field_wire == 5:
                scalar = struct.unpack("<f", content)[0]
            elif field == 8 and field_wire == 2:
                scalar = _tensor_scalar(content)
        if tag is not None and scalar is not None:
            yield tag, scalar


@dataclasses.dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float
    event: int  # the record's index in its file, from 1, for messages


def read_scalars(path: str) -> list[Scalar]:
    """Every scalar in one event file, in file order."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None
    scalars, pos, index = [], 0, 0
    while pos + 12 <= len(data):
        header = data[pos:pos + 8]
        length = struct.unpack("<Q", header)[0]
        if struct.unpack("<I", data[pos + 8:pos + 12])[0] != masked_crc32c(header):
            raise UserError(f"{path}: corrupt event file (bad length checksum of record {index + 1} at byte {pos})")
        end = pos + 12 + length + 4
        if end > len(data):
            break  # a record still being written
        payload = data[pos + 12:pos + 12 + length]
        index += 1
        try:
            step, found = 0, []
            for number, wire, value in _fields(payload):
                if number == 2 and wire == 0:
                    step = value - (1 << 64) if value >= 1 << 63 else value
                elif number == 5 and wire == 2:
                    found.extend(_summary_scalars(value))
        except _Malformed as error:
            raise UserError(f"{path}: corrupt event file (record {index} at byte {pos}: {error})") from None
        if found:
            if struct.unpack("<I", data[end - 4:end])[0] != masked_crc32c(payload):
                raise UserError(f"{path}: corrupt event file (bad data checksum of record {index} at byte {pos})")
            scalars.extend(Scalar(tag, step, value, index) for tag, value in found)
        pos = end
    return scalars
