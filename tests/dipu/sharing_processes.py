"""Two processes sharing dipu memory through the vendor's handles: an owner that allocates, exports
and frees on command, and an importer that opens a handle and copies through it. Each runs in its
own interpreter (a vendor's profile is read once per process)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

ALLOCATION_BYTES = 64 << 10
EXPORTED_OFFSET = 4096
EXPORTED_BYTES = 8192

_PRELUDE = """
import ctypes, json, os, sys
import ditorch.dipu
from ditorch.dipu import memory_ipc
lib = memory_ipc._vendor_library()
lib.dipuGetLastErrorMessage.restype = ctypes.c_char_p
def error(status):
    return None if status == 0 else lib.dipuGetLastErrorMessage().decode()
"""

_OWNER = _PRELUDE + f"""
base = ctypes.c_void_p()
assert lib.dipuMalloc(ctypes.byref(base), ctypes.c_size_t({ALLOCATION_BYTES})) == 0
pattern = bytes(i % 251 for i in range({ALLOCATION_BYTES}))
assert lib.dipuMemcpy(base, pattern, ctypes.c_size_t({ALLOCATION_BYTES}), 0) == 0
handle = (ctypes.c_uint8 * 64)()
assert lib.dipuIpcGetMemHandle(handle, ctypes.c_void_p(base.value + {EXPORTED_OFFSET}),
                               ctypes.c_size_t({EXPORTED_BYTES})) == 0
print(json.dumps({{"pid": os.getpid(), "handle": bytes(handle).hex()}}), flush=True)
for command in sys.stdin:
    command = command.strip()
    if command == "free":
        assert lib.dipuFree(base) == 0
        print(json.dumps({{"freed": True}}), flush=True)
    elif command == "dump":
        host = ctypes.create_string_buffer({ALLOCATION_BYTES})
        assert lib.dipuMemcpy(host, base, ctypes.c_size_t({ALLOCATION_BYTES}), 1) == 0
        print(json.dumps({{"bytes": host.raw.hex()}}), flush=True)
"""

_IMPORTER = _PRELUDE + """
request = json.loads(sys.argv[1])
handle = (ctypes.c_uint8 * 64).from_buffer_copy(bytes.fromhex(request["handle"]))
pointer, size = ctypes.c_void_p(), ctypes.c_size_t()
result = {"open_error": error(lib.dipuIpcOpenMemHandle(ctypes.byref(pointer), ctypes.byref(size), handle,
                                                      ctypes.c_int64(request["owner"])))}
if result["open_error"] is None:
    result["size"] = size.value
    host = ctypes.create_string_buffer(size.value)
    result["read_error"] = error(lib.dipuMemcpy(host, pointer, size, 1))
    result["read"] = host.raw.hex()
    fill = bytes([request.get("fill", 0xAB)]) * (size.value + request.get("overrun", 0))
    result["write_error"] = error(lib.dipuMemcpy(pointer, fill, ctypes.c_size_t(len(fill)), 0))
    result["close_error"] = error(lib.dipuIpcCloseMemHandle(pointer))
print(json.dumps(result), flush=True)
"""


def _environment(profile: str) -> dict:
    return {**os.environ, "DIPU_HOST_PROFILE": profile}


class Owner:
    """A process holding one allocation of ALLOCATION_BYTES (bytes i % 251) and a handle to
    [EXPORTED_OFFSET, EXPORTED_OFFSET + EXPORTED_BYTES) of it."""

    def __init__(self, profile: str = "discrete"):
        self.process = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=_environment(profile))
        started = self._answer()
        self.pid = started["pid"]
        self.handle = bytes.fromhex(started["handle"])

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"owner process failed: {self.process.stderr.read()}")
        return json.loads(line)

    def _ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def free(self) -> None:
        self._ask("free")

    def memory(self) -> bytes:
        return bytes.fromhex(self._ask("dump")["bytes"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def open_in_another_process(handle: bytes, owner: int, profile: str = "discrete", **options) -> dict:
    """Opens `handle` (expecting it from process `owner`) in a fresh process, reads the range, writes
    `fill` over it (plus `overrun` bytes more) and closes it; returns what each step said."""
    request = json.dumps({"handle": handle.hex(), "owner": owner, **options})
    done = subprocess.run([sys.executable, "-c", _IMPORTER, request], capture_output=True, text=True, timeout=300,
                          env=_environment(profile))
    if done.returncode != 0:
        raise RuntimeError(f"importer process failed: {done.stderr}")
    return json.loads(done.stdout)


def handle_fields(handle: bytes) -> dict:
    """The host vendor's handle layout (csrc/dipu/vendor/host/device_memory.h, IpcHandle)."""
    names = ("magic", "version", "owner_pid", "arena_fd", "slot", "arena_nonce", "generation", "offset", "size")
    return dict(zip(names, struct.unpack_from("<IIqiIQQQQ", handle)))


def forge(handle: bytes, **fields) -> bytes:
    values = {**handle_fields(handle), **fields}
    packed = struct.pack("<IIqiIQQQQ", *values.values())
    return packed + handle[len(packed):]
