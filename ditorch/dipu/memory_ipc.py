"""The vendor's optional memory-sharing entry points (csrc/dipu/vendor/dipu_vendor_ipc.h), as the
addresses another layer's C code calls: DiComm moves dipu tensors between processes through them
without host staging. Also the host vendor's count of copies by kind, which proves a path made none.
"""
from __future__ import annotations

import ctypes
import os

from ditorch.dipu import _C

# DiComm's device memory ABI name -> the vendor function implementing it.
_ABI_FUNCTIONS = {
    "export": "dipuIpcGetMemHandle",
    "open": "dipuIpcOpenMemHandle",
    "close": "dipuIpcCloseMemHandle",
    "copy": "dipuMemcpy",
    "last_error": "dipuGetLastErrorMessage",
}


def _vendor_library() -> ctypes.CDLL:
    """The vendor library the shim uses (the dynamic loader hands back one handle per path). Looking
    its functions up does not open the device: torch.dipu.is_initialized() stays False, as
    torch.cuda's does after init_process_group, so DeviceMesh still places a rank on its LOCAL_RANK."""
    path = _C._vendor_path()
    if not path:
        _C._device_count()  # no vendor chosen yet: the shim's default choice opens it
        path = _C._vendor_path()
    return ctypes.CDLL(path)


def memory_functions() -> dict[str, int] | None:
    """Addresses of the functions that share dipu memory, or None when the vendor has none (or
    cannot be loaded: then nothing reaches dipu memory directly)."""
    try:
        library = _vendor_library()
    except (RuntimeError, OSError):
        return None
    addresses = {}
    for name, symbol in _ABI_FUNCTIONS.items():
        try:
            addresses[name] = ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
        except AttributeError:
            return None
    return addresses


def vendor_identity() -> str | None:
    """The vendor library this process's dipu device runs on (its file name: libdipu_vendor_opencl.so), or
    None when none can be loaded."""
    try:
        library = _vendor_library()
    except (RuntimeError, OSError):
        return None
    return os.path.basename(library._name)


def copy_counts() -> dict[str, int]:
    """The host vendor's dipuMemcpy calls so far in this process, by kind (other vendors: empty)."""
    library = _vendor_library()
    counts = getattr(library, "dipuHostCopyCounts", None)
    if counts is None:
        return {}
    values = [ctypes.c_uint64() for _ in range(3)]
    counts(*(ctypes.byref(v) for v in values))
    return dict(zip(("host_to_device", "device_to_host", "device_to_device"), (v.value for v in values)))
