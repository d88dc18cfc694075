"""Device names and the one answer to "which collective backend serves this device type".

Device types other than torch's own come from plugins declared as Python entry points (in
pyproject.toml), so that no layer imports another sideways to find them:
- group `h2.device_types`: name = device type, value = the module whose import registers it with
  torch (dipu -> ditorch.dipu);
- group `h2.collective_backends`: value = a module whose import registers a torch.distributed backend
  and announces, through `serve_device`, the device types it serves (dicomm serves dipu).
A device package may announce the C functions that reach its memory without host staging
(`serve_device_memory`; DiComm asks `device_memory`) and the vendor behind it (`serve_device_vendor`:
DiComm maps memory directly only between processes of one vendor). A package may also announce a fallback at run
time (`serve_device(..., fallback=True)`: ditorch's host-staged gloo). `on_device_type_registered`
lets a backend extend itself to a device type that appears after it was loaded, and
`device_type_registered` is what a device package calls then.

Torch is imported only inside the functions that need it: the planner uses this package torch-free.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Callable

from h2.core.errors import UserError

NATIVE_COLLECTIVE_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
DEVICE_TYPE_GROUP = "h2.device_types"
COLLECTIVE_BACKEND_GROUP = "h2.collective_backends"

_served: dict[str, str] = {}  # device type -> preferred backend
_fallbacks: dict[str, str] = {}  # device type -> backend used when nothing better is served
_device_memory: dict[str, Callable[[], "dict[str, int] | None"]] = {}  # device type -> its functions
_device_vendor: dict[str, Callable[[], "str | None"]] = {}  # device type -> who implements it here
_device_type_listeners: list[Callable[[str], None]] = []
_loaded_backend_plugins = False


def _entry_points(group: str) -> list:
    return list(metadata.entry_points(group=group))


def device_type_providers() -> dict[str, str]:
    """Device type -> the module that provides it (from the installed entry points)."""
    return {entry.name: entry.value for entry in _entry_points(DEVICE_TYPE_GROUP)}


def resolve_device(name: str, where: str = "--device"):
    """A device name from a user ("cpu", "cuda:1", "dipu") as a torch.device that exists here; errors
    name `where` it came from (a flag, or a file and field)."""
    import torch

    device_type = name.split(":", 1)[0]
    provider = device_type_providers().get(device_type)
    if provider:
        try:
            importlib.import_module(provider)
        except ImportError as error:
            raise UserError(f"{where} {name}: its provider {provider} is not available ({error})") from None
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"{where} {name}: unknown device '{name}' (try cpu, cuda, cuda:1, dipu)") from None
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        available = getattr(module, "is_available", lambda: False)()
        if not available:
            raise UserError(f"{where} {name}: device '{name}' is not available on this machine")
        count = module.device_count() if hasattr(module, "device_count") else 1
        if device.index is not None and device.index >= count:
            raise UserError(f"{where} {name}: only {count} {device.type} device(s) present")
    return device


def serve_device(device_type: str, backend: str, *, fallback: bool = False) -> None:
    """Announce that torch.distributed backend `backend` serves collectives on `device_type`."""
    (_fallbacks if fallback else _served)[device_type] = backend


def _load_backend_plugins() -> None:
    global _loaded_backend_plugins
    if _loaded_backend_plugins:
        return
    _loaded_backend_plugins = True
    for entry in _entry_points(COLLECTIVE_BACKEND_GROUP):
        try:
            entry.load()
        except ImportError:  # a backend that is not built here serves nothing
            continue


def collective_backend(device_type: str) -> str | None:
    """The torch.distributed backend for collectives on `device_type`, or None when none serves it."""
    if device_type in NATIVE_COLLECTIVE_BACKENDS:
        return NATIVE_COLLECTIVE_BACKENDS[device_type]
    if device_type not in _served:
        _load_backend_plugins()
    return _served.get(device_type) or _fallbacks.get(device_type)


def serve_device_memory(device_type: str, functions: Callable[[], "dict[str, int] | None"]) -> None:
    """Announce how another layer reaches `device_type` memory without host staging: `functions()`
    returns the addresses of the C functions of DiComm's device memory ABI (`export`, `open`, `close`,
    `copy`, `last_error`; docs/dicomm.md), or None when this device's vendor cannot share memory."""
    _device_memory[device_type] = functions


def device_memory(device_type: str) -> "dict[str, int] | None":
    """The device memory functions announced for `device_type`, or None (then: stage through the host)."""
    functions = _device_memory.get(device_type)
    return functions() if functions else None


def serve_device_vendor(device_type: str, vendor: Callable[[], "str | None"]) -> None:
    """Announce who implements `device_type` in this process: `vendor()` names its vendor library (None when
    none can be loaded). Device memory is shared directly only between processes of one vendor (DiComm)."""
    _device_vendor[device_type] = vendor


def device_vendor(device_type: str) -> "str | None":
    """The vendor announced for `device_type` in this process, or None."""
    vendor = _device_vendor.get(device_type)
    return vendor() if vendor else None


def on_device_type_registered(listener: Callable[[str], None]) -> None:
    """Call `listener(device_type)` whenever a device package registers a new device type."""
    _device_type_listeners.append(listener)


def device_type_registered(device_type: str) -> None:
    """Called by a device package once torch knows `device_type` (e.g. after renaming PrivateUse1)."""
    for listener in list(_device_type_listeners):
        listener(device_type)
