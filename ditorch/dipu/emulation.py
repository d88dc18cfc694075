"""Choosing the chip the host vendor emulates in this process, before the device opens.

The host vendor reads its profile (DIPU_HOST_PROFILE: a built-in name or a YAML file) once, at the
first use of the device. `emulate_chip` writes a profile file from settings (the fields of
csrc/dipu/vendor/host/profiles/*.yaml) and points DIPU_HOST_PROFILE at it; once the vendor is open
the chip can no longer change, and asking for another one is an error.
"""
from __future__ import annotations

import os

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError

PROFILE_VARIABLE = "DIPU_HOST_PROFILE"


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
    text = _profile_text(settings)
    if _C._vendor_loaded():
        if os.environ.get(PROFILE_VARIABLE) == path:
            return path
        raise DipuError(f"the dipu device is already open as {os.environ.get(PROFILE_VARIABLE) or 'default'}; "
                        f"choose the emulated chip '{settings['name']}' before its first use")
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    os.environ[PROFILE_VARIABLE] = path
    return path
