"""torch.compile for CUDA-written scripts on another vendor: graphs whose tensors live on the vendor's
device compile with inductor only where inductor has a code generator for that device; otherwise they
run eagerly (the captured FX graph, as torch.compile's "eager" backend does), with one warning line
per process. Graphs on the CPU still go to inductor, with the script's mode and options.
"""

from __future__ import annotations

import sys

import torch

from ditorch.patches import Patches


def inductor_generates_code_for(device_type: str) -> bool:
    from torch._inductor.codegen.common import get_scheduling_for_device
    return get_scheduling_for_device(device_type) is not None


class VendorAwareInductor:
    """A torch.compile backend: inductor for graphs it can compile, eager for the vendor's graphs."""

    def __init__(self, device_type: str, mode, options, dynamic, name):
        self.device_type = device_type
        self.inductor = torch._TorchCompileInductorWrapper(mode, options, dynamic, name)
        self.warned = False

    def _on_vendor(self, example_inputs) -> bool:
        return any(isinstance(t, torch.Tensor) and t.device.type == self.device_type for t in example_inputs)

    def __call__(self, graph_module, example_inputs):
        if not self._on_vendor(example_inputs) or inductor_generates_code_for(self.device_type):
            return self.inductor(graph_module, example_inputs)
        if not self.warned:
            self.warned = True
            print(
                f"ditorch: torch.compile: inductor has no code generator for the {self.device_type} device; "
                f"its graphs run eagerly (backend 'eager')", file=sys.stderr, flush=True)
        return graph_module.forward

    def reset(self):
        self.inductor.reset()


class CompileMapping:
    """Replaces torch.compile so that its default backend (inductor) is vendor-aware."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self._patches = Patches()

    def apply(self) -> None:
        original = torch.compile
        device_type = self.device_type

        def compile(model=None, *, backend=None, mode=None, options=None, dynamic=None, name=None, **kwargs):
            if model is None:  # used as @torch.compile(...)
                return lambda fn: compile(fn, backend=backend, mode=mode, options=options, dynamic=dynamic, name=name,
                                          **kwargs)
            if backend in (None, "inductor") and not (options or {}).get("use_aoti"):
                backend = VendorAwareInductor(device_type, mode, options, dynamic, name)
                mode = options = None
            return original(model, backend=backend, mode=mode, options=options, dynamic=dynamic, name=name, **kwargs)

        compile.__wrapped__ = original
        compile.__doc__ = original.__doc__
        self._patches.replace(torch, "compile", compile)

    def undo(self) -> None:
        self._patches.undo()
