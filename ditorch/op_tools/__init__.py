"""Op-level tools for precision alignment and performance analysis on any device (CPU included):
autocompare against a CPU reference, capture and replay, overflow check, per-op timing, CPU
fallback, dtype cast and an op log. Each is a context manager with start()/stop(), selects ops by
exact name, regular expression or predicate, with an exclude list, and can be switched on from
environment variables (ditorch.op_tools.environment).

They see ATen ops (backward ops included) through a TorchDispatchMode, and module paths through
global module hooks that exist only while a tool is active: with no tool active nothing is hooked.
Must not import h2. Importing this package is cheap; the tools load on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "OpFilter": "ditorch.op_tools.op_filter",
    "OpCall": "ditorch.op_tools.tool",
    "OpTool": "ditorch.op_tools.tool",
    "Tolerances": "ditorch.op_tools.compare",
    "compare_tensors": "ditorch.op_tools.compare",
    "OpAutoCompare": "ditorch.op_tools.autocompare",
    "OpCapture": "ditorch.op_tools.capture",
    "OpOverflowCheck": "ditorch.op_tools.overflow",
    "OpTimeMeasure": "ditorch.op_tools.timing",
    "OpFallback": "ditorch.op_tools.fallback",
    "OpDtypeCast": "ditorch.op_tools.dtype_cast",
    "OpObserve": "ditorch.op_tools.observe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ditorch.op_tools' has no attribute '{name}'")
