"""Choosing the chip the vendor emulates in this process, before the device opens.

The host vendor reads its profile (DIPU_HOST_PROFILE: a built-in name or a YAML file) once, at the
first use of the device. `emulate_chip` writes a profile file from settings (the fields of
csrc/dipu/vendor/host/profiles/*.yaml) and points DIPU_HOST_PROFILE at it; once the vendor is open
the chip can no longer change, and asking for another one is an error. On the OpenCL vendor the same
settings become DIPU_OPENCL_MEMORY_CAPACITY and DIPU_OPENCL_RELATIVE_SPEED (its memory cap and the clock
of csrc/dipu/vendor/opencl/opencl_pacing.h); the profile file is still written, as the chip's record.
"""
from __future__ import annotations

import os

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError

PROFILE_VARIABLE = "DIPU_HOST_PROFILE"
OPENCL_VARIABLES = {"memory_capacity": "DIPU_OPENCL_MEMORY_CAPACITY", "relative_speed": "DIPU_OPENCL_RELATIVE_SPEED"}
OPENCL_LIBRARY = "libdipu_vendor_opencl.so"


def _profile_text(settings: dict) -> str:

    def value(item) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, (list, tuple)):
            return "[" + ", ".join(map(str, item)) + "]"
        return str(item)

    return "".join(f"{key}: {value(item)}\n" for key, item in settings.items())


def emulate_chip(settings: dict, directory: str) -> str:
    """Make this process's dipu device the chip `settings` describes (`name` names the file in
    `directory`); returns the profile's path. Ranks emulating the same chip may write the same file
    at once: each writes its own temporary file and renames it into place."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{settings['name']}.yaml")
    if os.path.basename(_C._vendor_path()) == OPENCL_LIBRARY:
        return _emulate_on_opencl(settings, path)
    text = _profile_text(settings)
    if _C._vendor_loaded():
        if os.environ.get(PROFILE_VARIABLE) == path:
            return path
        raise DipuError(f"the dipu device is already open as {os.environ.get(PROFILE_VARIABLE) or 'default'}; "
                        f"choose the emulated chip '{settings['name']}' before its first use")
    _write_atomically(path, text)
    os.environ[PROFILE_VARIABLE] = path
    return path


def _write_atomically(path: str, text: str) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def opencl_environment(settings: dict) -> dict[str, str]:
    """The OpenCL vendor's variables for the chip `settings` describes; a DipuError naming the setting it
    cannot emulate (a matmul precision, host-accessible memory: the host vendor's alone)."""
    if settings.get("round_output_ops"):
        raise DipuError(f"chip '{settings['name']}': the opencl vendor does not emulate a precision other than fp32 "
                        "(round_output_ops)")
    if settings.get("host_accessible"):
        raise DipuError(f"chip '{settings['name']}': the opencl vendor's device memory is never host-accessible")
    return {variable: str(settings[key]) for key, variable in OPENCL_VARIABLES.items() if key in settings}


def _emulate_on_opencl(settings: dict, path: str) -> str:
    environment = opencl_environment(settings)
    if _C._vendor_loaded():
        if all(os.environ.get(name) == value for name, value in environment.items()):
            return path
        raise DipuError(f"the dipu device is already open on the opencl vendor; choose the emulated chip "
                        f"'{settings['name']}' before its first use")
    _write_atomically(path, _profile_text(settings))
    os.environ.update(environment)
    return path
