"""Device arguments written for CUDA ("cuda", "cuda:1", torch.device("cuda"), and the unified
name "device") translated to the active vendor's device wherever a device is consumed: factory
functions, the `Tensor.new_*` factories, `Tensor.to/.cuda/.is_cuda`, `Module.to/.cuda`,
`torch.load(map_location=)`, `torch.autocast`/`torch.amp.autocast` and the autocast state queries
(`torch.is_autocast_enabled("cuda")`, ...), `torch.amp.GradScaler`, and the default device
(`with torch.device("cuda"):`, `torch.set_default_device("cuda")`).

Only those entry points are wrapped, so tensor work that never names a device runs untouched.
"""

from __future__ import annotations

import functools

import torch
import torch.utils._device

from ditorch.patches import Patches

ALIASES = ("cuda", "device")

FACTORY_FUNCTIONS = (
    "tensor",
    "as_tensor",
    "asarray",
    "empty",
    "empty_like",
    "empty_strided",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "rand",
    "rand_like",
    "randn",
    "randn_like",
    "randint",
    "randint_like",
    "randperm",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "tril_indices",
    "triu_indices",
    "normal",
    "scalar_tensor",
    "sparse_coo_tensor",
    "frombuffer",
    "empty_permuted",
)
TENSOR_FACTORY_METHODS = ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor")


class DeviceTranslator:

    def __init__(self, device_type: str):
        self.device_type = device_type

    def __call__(self, device):
        """The vendor device for a CUDA-written device argument; anything else unchanged."""
        if isinstance(device, str):
            kind, _, index = device.partition(":")
            if kind in ALIASES:
                return f"{self.device_type}:{index}" if index else self.device_type
            return device
        if isinstance(device, torch.device) and device.type == "cuda":
            return torch.device(self.device_type, device.index)
        return device


class DeviceArguments:
    """Installs and removes the wrappers that translate device arguments."""

    def __init__(self, device_type: str):
        self.translate = DeviceTranslator(device_type)
        self.device_type = device_type
        self._patches = Patches()
        self.mapped: list[str] = []

    def _wrap(self, owner, name: str, make_wrapper) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = make_wrapper(original)
        functools.update_wrapper(wrapper, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
        self._patches.replace(owner, name, wrapper)
        owner_name = getattr(owner, "__name__", str(owner))
        self.mapped.append(f"{owner_name}.{name}")

    def apply(self) -> None:
        translate = self.translate
        device_type = self.device_type

        def with_device_kwarg(original):

            def factory(*args, **kwargs):
                device = kwargs.get("device")
                if device is not None:
                    kwargs["device"] = translate(device)
                return original(*args, **kwargs)

            return factory

        # torch's default-device mode (`with torch.device(...)`) caches the factory functions it
        # intercepts on first use: fill the cache with torch's own before they are wrapped, or the
        # mode would not recognise them (and `with torch.device("meta")` would make CPU tensors).
        torch.utils._device._device_constructors()
        for name in FACTORY_FUNCTIONS:
            self._wrap(torch, name, with_device_kwarg)
        for name in TENSOR_FACTORY_METHODS:
            self._wrap(torch.Tensor, name, with_device_kwarg)

        def default_device_init(original):

            def __init__(self, device):
                return original(self, translate(device))

            return __init__

        self._wrap(torch.utils._device.DeviceContext, "__init__", default_device_init)

        def tensor_to(original):

            def to(self, *args, **kwargs):
                if args and isinstance(args[0], (str, torch.device)):
                    args = (translate(args[0]), *args[1:])
                if "device" in kwargs:
                    kwargs["device"] = translate(kwargs["device"])
                return original(self, *args, **kwargs)

            return to

        self._wrap(torch.Tensor, "to", tensor_to)
        self._wrap(torch.nn.Module, "to", tensor_to)

        def vendor_device(device):
            if device is None:
                current = getattr(torch, device_type).current_device()
                return torch.device(device_type, current if isinstance(current, int) else None)
            if isinstance(device, int):
                return torch.device(device_type, device)
            return torch.device(translate(device))

        def tensor_cuda(original):

            def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
                return self.to(vendor_device(device), non_blocking=non_blocking, memory_format=memory_format)

            return cuda

        def module_cuda(original):

            def cuda(self, device=None):
                return self.to(vendor_device(device))

            return cuda

        self._wrap(torch.Tensor, "cuda", tensor_cuda)
        self._wrap(torch.nn.Module, "cuda", module_cuda)
        self._patches.replace(torch.Tensor, "is_cuda", property(lambda self: self.device.type in ("cuda", device_type)))
        self.mapped.append("Tensor.is_cuda")

        def load(original):

            def load(*args, **kwargs):
                location = kwargs.get("map_location")
                if isinstance(location, (str, torch.device)):
                    kwargs["map_location"] = translate(location)
                return original(*args, **kwargs)

            return load

        self._wrap(torch, "load", load)

        def autocast_init(original):

            def __init__(self, device_type, *args, **kwargs):
                return original(self, translate(device_type), *args, **kwargs)

            return __init__

        self._wrap(torch.amp.autocast, "__init__", autocast_init)
        self._wrap_autocast_state()

        def grad_scaler_init(original):

            def __init__(self, device="cuda", *args, **kwargs):
                return original(self, translate(device), *args, **kwargs)

            return __init__

        self._wrap(torch.amp.GradScaler, "__init__", grad_scaler_init)

    def _wrap_autocast_state(self) -> None:
        """torch's autocast state functions, asked about "cuda", answer for the vendor's device; their
        legacy forms without a device (which mean CUDA) too."""
        translate, device_type = self.translate, self.device_type

        def by_device(original):

            def function(device, *args):
                return original(translate(device), *args)

            return function

        def is_autocast_enabled(original):

            def is_autocast_enabled(*args):
                return original(translate(args[0]) if args else device_type)

            return is_autocast_enabled

        def set_autocast_enabled(original):

            def set_autocast_enabled(*args):
                return original(translate(args[0]), args[1]) if len(args) == 2 else original(device_type, *args)

            return set_autocast_enabled

        self._wrap(torch, "is_autocast_enabled", is_autocast_enabled)
        self._wrap(torch, "set_autocast_enabled", set_autocast_enabled)
        self._wrap(torch, "get_autocast_dtype", by_device)
        self._wrap(torch, "set_autocast_dtype", by_device)
        self._wrap(torch.amp, "is_autocast_available", by_device)
        original_get_autocast_dtype = torch.get_autocast_dtype
        self._wrap(torch, "get_autocast_gpu_dtype", lambda original: lambda: original_get_autocast_dtype(device_type))

    def undo(self) -> None:
        self._patches.undo()
        self.mapped.clear()
