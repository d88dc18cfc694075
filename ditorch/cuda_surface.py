"""The `torch.cuda` namespace pointed at another vendor's device module.

Each public name a CUDA script uses is replaced by the vendor module's function of the same name,
or by a generic equivalent built on `torch.accelerator`, or by a function that raises a one-line
error naming what is not supported. The originals are kept so the mapping can be undone and so
detection can still ask the real CUDA runtime.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch._utils
import torch.cuda.nccl

from ditorch.device_args import DeviceTranslator
from ditorch.multi_device import MultiDeviceCopies
from ditorch.patches import Patches

_ORIGINAL_IS_AVAILABLE = torch.cuda.is_available
_ORIGINAL_DEVICE_COUNT = torch.cuda.device_count


def native_cuda_is_available() -> bool:
    return _ORIGINAL_IS_AVAILABLE()


def native_cuda_device_count() -> int:
    return _ORIGINAL_DEVICE_COUNT()


# Names taken from the vendor module as they are when it has them.
DIRECT_NAMES = (
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "get_device_properties",
    "get_device_name",
    "get_device_capability",
    "is_bf16_supported",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "memory_stats",
    "empty_cache",
    "mem_get_info",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "device",
    "is_initialized",
    "init",
    "get_arch_list",
)

# Modules holding torch._utils._get_available_device_type (by attribute or imported by name).
USERS_OF_AVAILABLE_DEVICE_TYPE = ("torch._utils", "torch.nn.parallel.data_parallel",
                                  "torch.distributed.checkpoint.filesystem")

# Where each name takes a device (positionally, or as the keyword `device`): every form torch accepts
# there ("cuda", "cuda:1", torch.device("cuda", 1), an int) is translated to the vendor's device.
TAKES_DEVICE_FIRST = ("set_device", "synchronize", "get_device_properties", "get_device_name", "get_device_capability",
                      "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                      "reset_peak_memory_stats", "reset_max_memory_allocated", "memory_stats", "mem_get_info",
                      "get_rng_state", "Stream", "current_stream", "default_stream", "device")
DEVICE_ARGUMENT_POSITION = {**dict.fromkeys(TAKES_DEVICE_FIRST, 0), "set_rng_state": 1}


def _with_device_translated(original, position: int, translate):
    """`original` (a function or a class) with its device argument translated."""

    def translated(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if len(args) > position:
            args = (*args[:position], translate(args[position]), *args[position + 1:])
        elif "device" in kwargs:
            kwargs = {**kwargs, "device": translate(kwargs["device"])}
        return args, kwargs

    if isinstance(original, type):

        def __new__(cls, *args, **kwargs):
            args, kwargs = translated(args, kwargs)
            return original(*args, **kwargs)  # an instance of original: its own __init__ has run

        return type(original.__name__, (original, ), {"__new__": __new__, "__doc__": original.__doc__})

    def call(*args, **kwargs):
        args, kwargs = translated(args, kwargs)
        return original(*args, **kwargs)

    call.__name__, call.__doc__ = original.__name__, original.__doc__
    return call


def _unsupported(name: str, vendor: str):

    def raise_unsupported(*args, **kwargs):
        raise RuntimeError(f"torch.cuda.{name} has no equivalent on the {vendor} device (mapped by ditorch)")

    raise_unsupported.__name__ = name
    return raise_unsupported


def _generic(name: str, module, device_type: str):
    """Equivalents for names a vendor module may lack, built on its core functions or torch.accelerator."""
    accelerator = torch.accelerator

    def device_index(device=None) -> int:
        if device is None:
            return module.current_device()
        if isinstance(device, int):
            return device
        return torch.device(device).index or 0

    if name == "get_device_name":
        return lambda device=None: module.get_device_properties(device_index(device)).name
    if name == "get_device_capability":

        def capability(device=None):
            props = module.get_device_properties(device_index(device))
            return (getattr(props, "major", 0), getattr(props, "minor", 0))

        return capability
    if name == "is_bf16_supported":
        return lambda including_emulation=True: True
    if name == "manual_seed_all":

        def manual_seed_all(seed):
            for index in range(module.device_count()):
                with _device_context(module, index):
                    module.manual_seed(seed)

        return manual_seed_all
    if name in ("max_memory_reserved", "memory_stats"):
        if hasattr(accelerator, name):
            return lambda device=None: getattr(accelerator, name)(device_index(device))
    if name == "reset_max_memory_allocated":
        return lambda device=None: module.reset_peak_memory_stats(device)
    if name == "current_stream":
        return lambda device=None: accelerator.current_stream(device_index(device))
    if name == "default_stream":
        return lambda device=None: accelerator.current_stream(device_index(device))
    if name == "set_stream":
        return accelerator.set_stream
    if name == "stream":
        return _stream_context
    if name == "device":
        return lambda device: _device_context(module, device_index(device))
    if name in ("is_initialized", ):
        return lambda: True
    if name == "init":
        return lambda: None
    if name == "get_arch_list":
        return lambda: []
    if name == "seed_all":
        return lambda: module.manual_seed_all(torch.seed()) if hasattr(module, "manual_seed_all") else None
    return None


@contextlib.contextmanager
def _device_context(module, index: int):
    previous = module.current_device()
    module.set_device(index)
    try:
        yield
    finally:
        module.set_device(previous)


@contextlib.contextmanager
def _stream_context(stream):
    if stream is None:
        yield
        return
    previous = torch.accelerator.current_stream(stream.device_index)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)


class CudaSurface:
    """Applies and undoes the mapping of torch.cuda onto `device_type`'s module."""

    def __init__(self, vendor_name: str, device_type: str):
        self.vendor_name, self.device_type = vendor_name, device_type
        self._patches = Patches()
        self.mapped: dict[str, str] = {}

    def _replace(self, owner, name: str, value) -> None:
        self._patches.replace(owner, name, value)

    def apply(self) -> None:
        module = getattr(torch, self.device_type)
        translate = DeviceTranslator(self.device_type)
        for name in DIRECT_NAMES:
            if hasattr(module, name):
                replacement, source = getattr(module, name), f"torch.{self.device_type}.{name}"
            else:
                replacement = _generic(name, module, self.device_type)
                source = "generic (ditorch)" if replacement else "unsupported"
                replacement = replacement or _unsupported(name, self.vendor_name)
            if name in DEVICE_ARGUMENT_POSITION and source != "unsupported":
                replacement = _with_device_translated(replacement, DEVICE_ARGUMENT_POSITION[name], translate)
            self._replace(torch.cuda, name, replacement)
            self.mapped[f"torch.cuda.{name}"] = source
        self._map_amp()
        self._map_available_device_type()
        self._map_multi_device_copies()

    def _map_available_device_type(self) -> None:
        """torch's "which accelerator is there" (DataParallel, distributed checkpoint) answers the vendor's
        device type: once torch.cuda.is_available() is mapped it would answer "cuda", whose devices are not
        where the vendor's tensors live. Modules that imported the function by name are pointed too."""
        device_type = self.device_type

        def available_device_type() -> str:
            return device_type

        for module_name in USERS_OF_AVAILABLE_DEVICE_TYPE:
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, "_get_available_device_type"):
                self._replace(module, "_get_available_device_type", available_device_type)
        self.mapped["torch._utils._get_available_device_type"] = f"'{device_type}'"

    def _map_multi_device_copies(self) -> None:
        """nn.DataParallel's copies across devices (torch.nn.parallel.comm over torch._C) for the vendor's devices."""
        for name, replacement in MultiDeviceCopies(self.device_type).primitives().items():
            self._replace(torch._C, name, replacement)
            self.mapped[f"torch._C.{name}"] = "ditorch.multi_device"
        self._replace(torch.cuda.nccl, "is_available", lambda tensors: False)  # NCCL never holds the vendor's tensors
        self.mapped["torch.cuda.nccl.is_available"] = "False"

    def _map_amp(self) -> None:
        device_type = self.device_type

        class VendorAutocast(torch.amp.autocast):
            """torch.cuda.amp.autocast, running on the mapped vendor's device."""

            def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
                super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        class VendorGradScaler(torch.amp.GradScaler):
            """torch.cuda.amp.GradScaler, on the mapped vendor's device."""

            def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                         enabled=True):
                super().__init__(device_type, init_scale=init_scale, growth_factor=growth_factor,
                                 backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

        self._replace(torch.cuda.amp, "autocast", VendorAutocast)
        self._replace(torch.cuda.amp, "GradScaler", VendorGradScaler)
        self._replace(torch.cuda, "is_bf16_supported",
                      getattr(getattr(torch, device_type), "is_bf16_supported", lambda including_emulation=True: True))
        self.mapped["torch.cuda.amp.autocast"] = f"torch.amp.autocast('{device_type}')"
        self.mapped["torch.cuda.amp.GradScaler"] = f"torch.amp.GradScaler('{device_type}')"

    def undo(self) -> None:
        self._patches.undo()
        self.mapped.clear()
