"""Turning a device name from the command line into a torch.device, with a clear error."""

from __future__ import annotations

import importlib

import torch

from h2.errors import UserError

# Device types that a Python package provides on import (the package registers the backend).
_DEVICE_PROVIDERS = {"dipu": "ditorch.dipu"}


def resolve_device(name: str) -> torch.device:
    device_type = name.split(":", 1)[0]
    provider = _DEVICE_PROVIDERS.get(device_type)
    if provider:
        try:
            importlib.import_module(provider)
        except ImportError as error:
            raise UserError(f"device '{name}': its provider {provider} is not available ({error})") from None
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device '{name}' (try cpu, cuda, cuda:1, dipu)") from None
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        available = getattr(module, "is_available", lambda: False)()
        if not available:
            raise UserError(f"device '{name}' is not available on this machine")
        count = module.device_count() if hasattr(module, "device_count") else 1
        if device.index is not None and device.index >= count:
            raise UserError(f"device '{name}': only {count} {device.type} device(s) present")
    return device
