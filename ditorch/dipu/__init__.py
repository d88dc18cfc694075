"""DIPU: the "dipu" PyTorch device (PrivateUse1) backed by a vendor runtime loaded at run time.

Importing this package registers the device: torch.device("dipu"), the torch.dipu module,
Tensor.dipu() / Tensor.is_dipu and Module.dipu(). The vendor library is chosen by DIPU_VENDOR (a
vendor name such as "host", or a path to a shared library) or by use_vendor(), and is opened at
the first use of the device. Operators run through the vendor's DIOPI kernels when it has them and
through the CPU otherwise (see fallback_counts()). Imports only h2.core beside torch; never
dicomm, heteropp or the rest of h2.
"""
import os

import torch

from ditorch.dipu import _C, conv_fallback, memory_ipc
from ditorch.dipu import at_exit as _at_exit
from ditorch.dipu import device as _device_module
from ditorch.dipu import fallback as _fallback
from ditorch.dipu import sharing as _sharing
from ditorch.dipu import visible as _visible
from ditorch.dipu.errors import DipuError, VendorNotFound
from ditorch.dipu.fallback import (
    fallback_counts,
    fallback_logging,
    force_fallback,
    forced_fallback,
    reset_fallback_counts,
    set_fallback_logging,
)
from ditorch.dipu.table import TableEntry, diopi_table
from ditorch.dipu.vendor import available_vendors, resolve_vendor, use_vendor, vendor_name
from h2.core import devices, environment

BACKEND_NAME = "dipu"

__all__ = [
    "BACKEND_NAME",
    "DipuError",
    "TableEntry",
    "available_vendors",
    "diopi_table",
    "fallback_counts",
    "fallback_logging",
    "force_fallback",
    "forced_fallback",
    "reset_fallback_counts",
    "resolve_vendor",
    "set_fallback_logging",
    "use_vendor",
    "vendor_name",
]


def _register_backend() -> None:
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", BACKEND_NAME):
        raise DipuError(f"PrivateUse1 is already registered as '{current}'; dipu cannot take it")
    if current != BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
        # Collective backends registered before the rename know only "cpu": they extend
        # themselves to dipu when told.
        devices.device_type_registered(BACKEND_NAME)
    if not hasattr(torch, BACKEND_NAME):
        torch._register_device_module(BACKEND_NAME, _device_module)
    if not hasattr(torch.Tensor, BACKEND_NAME):
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_packed_sequence=True,
                                                             for_storage=True)


if not _C._vendor_loaded():
    try:
        use_vendor(os.environ.get("DIPU_VENDOR") or "host")
    except VendorNotFound as error:
        raise (VendorNotFound(f"DIPU_VENDOR: {error}") if os.environ.get("DIPU_VENDOR") else error) from None
    _visible.apply(cuda_mapped=False)
environment.switch("DIPU_LOG_FALLBACK")  # read by the C++ fallback; 0 or 1
_fallback.check_operators(_fallback.operator_list(os.environ.get("DIPU_FORCE_FALLBACK_OPS", "")),
                          "DIPU_FORCE_FALLBACK_OPS")
_register_backend()
conv_fallback.register(_C._vendor_path())
devices.serve_device_memory(BACKEND_NAME, memory_ipc.memory_functions)
devices.serve_device_vendor(BACKEND_NAME, memory_ipc.vendor_identity)
_at_exit.register()
_sharing.refuse_device_tensors_in_pickles()
