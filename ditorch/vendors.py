"""Vendor adapters: which accelerator this node has, and how its PyTorch integration is named.

Detection order (first available wins): cuda, npu (Ascend, torch_npu), mlu (Cambricon, torch_mlu),
musa (Moore Threads, torch_musa), xpu (Intel, built into torch), dipu (H2's own device shim).
`DITORCH_VENDOR=<name>` or `ditorch.use(name)` overrides detection.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from h2.core.errors import UserError


@dataclass
class Probe:
    available: bool
    reason: str
    device_count: int = 0


@dataclass(frozen=True)
class VendorAdapter:
    name: str  # the adapter's name: cuda, npu, mlu, musa, xpu, dipu
    label: str  # who makes it
    device_type: str  # torch device type the vendor's tensors live on
    package: str | None  # the Python package that brings the device (None: built into torch)
    collective_backend: str  # torch.distributed backend for collectives on this device
    probe_fn: Callable[["VendorAdapter"], Probe] = field(compare=False)

    def probe(self) -> Probe:
        try:
            return self.probe_fn(self)
        except UserError:  # the user's settings are wrong (a variable out of range): say so, don't skip the vendor
            raise
        except Exception as error:  # a broken vendor install must not break detection
            return Probe(False, f"probe failed: {type(error).__name__}: {error}")

    def device_module(self):
        """The torch.<device_type> module (torch.cuda, torch.npu, torch.dipu, ...)."""
        return getattr(torch, self.device_type)


def _probe_builtin(adapter: VendorAdapter) -> Probe:
    module = getattr(torch, adapter.device_type, None)
    if module is None or not hasattr(module, "is_available"):
        return Probe(False, f"this torch build has no torch.{adapter.device_type}")
    if not module.is_available():
        return Probe(False, f"torch.{adapter.device_type}.is_available() is False (no device or driver)")
    return Probe(True, "available", module.device_count())


def _probe_plugin(adapter: VendorAdapter) -> Probe:
    if importlib.util.find_spec(adapter.package) is None:
        return Probe(False, f"package {adapter.package} is not installed")
    importlib.import_module(adapter.package)
    return _probe_builtin(adapter)


def _probe_cuda(adapter: VendorAdapter) -> Probe:
    from ditorch import cuda_surface  # the real answer even after the CUDA surface was remapped
    if not cuda_surface.native_cuda_is_available():
        reason = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA device or driver"
        return Probe(False, reason)
    return Probe(True, "available", cuda_surface.native_cuda_device_count())


def _probe_dipu(adapter: VendorAdapter) -> Probe:
    try:
        dipu = importlib.import_module("ditorch.dipu")
    except ImportError as error:
        return Probe(False, f"the dipu extension is not built ({error})")
    except RuntimeError as error:
        missing_by_default = getattr(error, "vendor_missing", False) and not os.environ.get("DIPU_VENDOR")
        if isinstance(error, UserError) and not missing_by_default:
            raise  # a DIPU_* setting is wrong (DIPU_VENDOR naming no vendor, an unknown operator): say so
        return Probe(False, str(error).splitlines()[0])
    if dipu._C._vendor_loaded():
        return _probe_builtin(adapter)
    # The vendor library opens at the device's first use, so that settings made before then
    # (DIPU_HOST_PROFILE, ditorch.dipu.use_vendor) still apply; its library being there is enough here.
    return Probe(True, "available (the vendor opens at first use)")


ADAPTERS: dict[str, VendorAdapter] = {
    a.name: a for a in (
        VendorAdapter("cuda", "NVIDIA CUDA (native)", "cuda", None, "nccl", _probe_cuda),
        VendorAdapter("npu", "Huawei Ascend", "npu", "torch_npu", "hccl", _probe_plugin),
        VendorAdapter("mlu", "Cambricon", "mlu", "torch_mlu", "cncl", _probe_plugin),
        VendorAdapter("musa", "Moore Threads", "musa", "torch_musa", "mccl", _probe_plugin),
        VendorAdapter("xpu", "Intel GPU", "xpu", None, "xccl", _probe_builtin),
        VendorAdapter("dipu", "DIPU (H2 device shim)", "dipu", None, "dipu-gloo", _probe_dipu),
    )
}

DETECTION_ORDER = tuple(ADAPTERS)


def get_adapter(name: str) -> VendorAdapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown ditorch vendor '{name}' (known: {', '.join(ADAPTERS)})") from None


def detect(order: tuple[str, ...] = DETECTION_ORDER) -> tuple[VendorAdapter | None, dict[str, Probe]]:
    """Probe adapters in order; returns the first available one and every probe's result."""
    probes: dict[str, Probe] = {}
    chosen = None
    for name in order:
        probes[name] = ADAPTERS[name].probe()
        if probes[name].available:
            chosen = ADAPTERS[name]
            break
    for name in order:  # later adapters are reported as not tried, so `ditorch info` shows all
        probes.setdefault(name, Probe(False, f"not probed: {chosen.name} was found first" if chosen else "not probed"))
    return chosen, probes
