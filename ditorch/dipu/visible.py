"""Which of the vendor's devices a process sees: DIPU_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES when
ditorch maps CUDA onto dipu (a CUDA-written launcher sets it per worker). The value lists vendor device
indices, separated by commas, each at most once; "" hides every device. Visible device i of the
process is vendor device indices[i]. A malformed value is one line naming the variable.

The map itself lives in the shim (ditorch.dipu._C._set_visible_devices, before the vendor opens); a
shim built without it cannot hide devices, and a restriction it cannot apply is refused in one line
rather than ignored.
"""

from __future__ import annotations

import os

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError

DIPU_VARIABLE = "DIPU_VISIBLE_DEVICES"
CUDA_VARIABLE = "CUDA_VISIBLE_DEVICES"


def parse(name: str, value: str) -> tuple[int, ...]:
    """The device indices `value` lists; DipuError naming `name` when it is not such a list."""
    entries = [entry.strip() for entry in value.split(",")] if value.strip() else []
    for entry in entries:
        if not entry.isdigit():
            raise DipuError(f"{name}={value!r}: expected device indices separated by commas (such as 0,1), "
                            f"got {entry!r}")
    indices = tuple(int(entry) for entry in entries)
    repeated = sorted({index for index in indices if indices.count(index) > 1})
    if repeated:
        raise DipuError(f"{name}={value!r}: device {repeated[0]} is listed more than once")
    return indices


def requested(cuda_mapped: bool) -> tuple[str, tuple[int, ...]] | None:
    """(variable, indices) of the visibility asked for, or None when every device is visible."""
    for name in (DIPU_VARIABLE, CUDA_VARIABLE) if cuda_mapped else (DIPU_VARIABLE, ):
        value = os.environ.get(name)
        if value is not None:
            return name, parse(name, value)
    return None


def apply(cuda_mapped: bool) -> None:
    """Hand the requested visibility to the shim before the vendor opens."""
    request = requested(cuda_mapped)
    if request is None:
        return
    name, indices = request
    setter = getattr(_C, "_set_visible_devices", None)
    if setter is None:
        raise DipuError(f"{name}={os.environ[name]!r}: this dipu shim cannot hide devices (it has no "
                        f"_set_visible_devices); unset {name} to see every device")
    try:
        setter(list(indices))
    except RuntimeError as error:
        raise DipuError(f"{name}={os.environ[name]!r}: {str(error).splitlines()[0]}") from None
