"""Opening this process's dipu device as an emulated chip type of a cluster file (h2.core.emulation):
the host vendor profile is written from the chip's `emulation:` section and its memory, before the
device first opens, and the rank's DiComm waits set to sleep rather than spin. Used by the pipeline's
ranks and by the profiler's."""

from __future__ import annotations

import os

from h2.core.cluster import ChipType
from h2.core.emulation import host_vendor_settings, rank_wait_environment


def load_chip_vendor(vendor: str) -> None:
    """Make this process's dipu device open on the DIPU vendor `vendor` (a chip type's `vendor`), before
    the device first opens: DIPU_VENDOR for the processes it starts, the shim's choice for this one."""
    os.environ["DIPU_VENDOR"] = vendor
    import sys

    if "ditorch.dipu" in sys.modules:
        from ditorch.dipu.vendor import use_vendor

        use_vendor(vendor)


def open_emulated_chip(chip: ChipType, directory: str) -> str | None:
    """Make the dipu device `chip` (its vendor profile goes to `directory`); returns the profile's
    path, or None for a chip type without emulation (it runs as it is)."""
    if chip.emulation is None:
        return None
    return open_emulated_device(host_vendor_settings(chip), directory)


def open_emulated_device(settings: dict, directory: str) -> str:
    """Make the dipu device the chip of the host vendor profile `settings` (h2.core.emulation's
    host_vendor_settings; written to `directory`); returns the profile's path."""
    for name, value in rank_wait_environment().items():
        os.environ.setdefault(name, value)
    from ditorch.dipu.emulation import emulate_chip

    return emulate_chip(settings, directory)
