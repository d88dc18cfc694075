"""Small helpers on the tensors of an op call: short descriptions, statistics, device sync, and
copies that op tools make without being seen by other active tools."""

from __future__ import annotations

import csv
import os
import sys

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

_SHORT_DTYPES = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int64: "i64",
    torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
    torch.complex64: "c64", torch.complex128: "c128"
}


class _CurrentStderr:
    """sys.stderr as it is when written to (not when a tool was created): the default report stream."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


STDERR = _CurrentStderr()


def hidden():
    """A context in which ops run by a tool itself are not seen by any active op tool."""
    return _disable_current_modes()


def short_dtype(dtype: torch.dtype) -> str:
    return _SHORT_DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def describe(value) -> str:
    """'f32[8,64]' for a tensor; values of other leaves as repr; containers as lists."""
    if isinstance(value, torch.Tensor):
        return f"{short_dtype(value.dtype)}[{','.join(map(str, value.shape))}]"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    return repr(value)


def tensors_of(value) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def describe_tensors(value) -> str:
    return " ".join(describe(t) for t in tensors_of(value))


def map_tensors(fn, value):
    return tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, value)


def map_devices(value, device: torch.device):
    """Replace torch.device leaves (factory and copy arguments) with `device`."""
    return tree_map(lambda v: device if isinstance(v, torch.device) else v, value)


def device_of(value) -> torch.device:
    """The first non-CPU device among the tensors of value, else cpu."""
    for tensor in tensors_of(value):
        if tensor.device.type != "cpu":
            return tensor.device
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cpu":
        return
    module = getattr(torch, device.type, None)
    sync = getattr(module, "synchronize", None)
    if sync is not None:
        with hidden():
            sync(device)


def copy_to(tensor: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    with hidden():
        return tensor.detach().to(device=device, dtype=dtype or tensor.dtype, copy=True)


def tensor_stats(tensor: torch.Tensor) -> dict:
    """Shape, dtype and value statistics (over finite elements) of a tensor, computed on the CPU."""
    with hidden():
        stats = {
            "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", ""), "device": str(tensor.device)
        }
        if tensor.is_floating_point() or tensor.is_complex():
            values = tensor.detach().to("cpu", torch.float64 if tensor.is_floating_point() else torch.complex128)
            values = values.abs() if values.is_complex() else values
            finite = values[torch.isfinite(values)]
            stats.update(nan=int(torch.isnan(values).sum()), inf=int(torch.isinf(values).sum()))
            if finite.numel():
                stats.update(min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean()),
                             abs_max=float(finite.abs().max()))
        elif tensor.numel() and tensor.dtype != torch.bool:
            values = tensor.detach().to("cpu", torch.float64)
            stats.update(min=float(values.min()), max=float(values.max()))
        return stats


def format_stats(stats: dict) -> str:
    head = f"{stats['dtype']}{stats['shape']}"
    if "nan" in stats:
        values = (f" min {stats['min']:.4g} max {stats['max']:.4g} mean {stats['mean']:.4g} "
                  f"absmax {stats['abs_max']:.4g}" if "min" in stats else " no finite values")
        return f"{head}{values} nan {stats['nan']} inf {stats['inf']}"
    if "min" in stats:
        return f"{head} min {stats['min']:.6g} max {stats['max']:.6g}"
    return head


def open_output(path: str):
    """Open a text file for writing, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "w", encoding="utf-8", newline="")


class CsvRows:
    """A tool's rows, also written to a CSV file (header first, each row flushed) when a path is given."""

    def __init__(self, path: str | None, fields):
        self.path, self.fields = path, fields
        self.rows: list[dict] = []
        self._file = self._writer = None

    def open(self) -> None:
        if self.path:
            self._file = open_output(self.path)
            self._writer = csv.DictWriter(self._file, self.fields)
            self._writer.writeheader()

    def append(self, row: dict) -> None:
        self.rows.append(row)
        if self._writer:
            self._writer.writerow(row)
            self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = self._writer = None
