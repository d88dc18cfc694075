"""Comparing an op's output with a reference: max absolute and relative error, cosine similarity,
and allclose under tolerances that default per dtype and can be overridden per op and per dtype."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping

import torch

from ditorch.op_tools.tensors import hidden

# (rtol, atol) per dtype: the defaults of torch.testing.assert_close.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
EXACT = (0.0, 0.0)


class Tolerances:
    """(rtol, atol) for an output of a given dtype from a given op.

    `per_dtype` replaces the defaults for a dtype: {torch.bfloat16: (2e-2, 1e-3)}.
    `per_op` sets an op's tolerance, for all dtypes or per dtype, keyed by any spelling of the op's
    name ('mm', 'aten.mm.default'): {'mm': (1e-3, 1e-5)} or {'mm': {torch.float32: (1e-3, 1e-5)}}.
    """

    def __init__(self, per_dtype: Mapping[torch.dtype, tuple[float, float]] | None = None,
                 per_op: Mapping[str, tuple[float, float] | Mapping[torch.dtype, tuple[float, float]]] | None = None):
        self.per_dtype = {**DEFAULT_TOLERANCES, **(per_dtype or {})}
        self.per_op = dict(per_op or {})

    def lookup(self, op_names: Iterable[str], dtype: torch.dtype) -> tuple[float, float]:
        for name in op_names:
            override = self.per_op.get(name)
            if override is None:
                continue
            if isinstance(override, Mapping):
                if dtype in override:
                    return tuple(override[dtype])
                continue
            return tuple(override)
        if dtype.is_floating_point or dtype.is_complex:
            return self.per_dtype.get(dtype, DEFAULT_TOLERANCES[torch.float32])
        return EXACT


@dataclasses.dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float  # max |a - e| / |e| over elements with |e| > atol (smaller ones are judged by atol)
    cosine: float
    allclose: bool
    rtol: float
    atol: float
    note: str = ""

    def worse_than(self, other: "Comparison") -> bool:
        return (not self.allclose, self.max_rel, self.max_abs) > (not other.allclose, other.max_rel, other.max_abs)


def compare_tensors(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> Comparison:
    """Compare `actual` (the device's result) with `expected` (the reference), both moved to the CPU."""
    with hidden():
        if tuple(actual.shape) != tuple(expected.shape):
            return Comparison(math.inf, math.inf, math.nan, False, rtol, atol,
                              f"shape {list(actual.shape)} vs reference {list(expected.shape)}")
        if actual.dtype == expected.dtype and actual.device == expected.device and torch.equal(actual, expected):
            return Comparison(0.0, 0.0, 1.0, True, rtol, atol)  # bit-identical (NaN never equals itself)
        exact = not (actual.is_floating_point() or actual.is_complex())
        wide = torch.complex128 if (actual.is_complex() or expected.is_complex()) else torch.float64
        a = actual.detach().to("cpu", wide)
        e = expected.detach().to("cpu", wide)
        if a.numel() == 0:
            return Comparison(0.0, 0.0, 1.0, True, rtol, atol)
        same = (a == e) | (torch.isnan(a) & torch.isnan(e))
        if exact:
            ok = bool(same.all())
            diff = (a - e).abs()
            return Comparison(float(diff.max()), 0.0 if ok else math.inf, 1.0 if ok else math.nan, ok, rtol, atol)
        diff = torch.where(same, torch.zeros((), dtype=torch.float64), (a - e).abs())
        diff = torch.nan_to_num(diff, nan=math.inf)
        max_abs = float(diff.max())
        magnitude = e.abs()
        judged = magnitude > atol
        max_rel = float((diff[judged] / magnitude[judged]).max()) if bool(judged.any()) else 0.0
        allclose = bool(torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True))
        return Comparison(max_abs, max_rel, _cosine(a, e), allclose, rtol, atol)


def _cosine(a: torch.Tensor, e: torch.Tensor) -> float:
    a, e = a.flatten(), e.flatten()
    if a.is_complex():
        a, e = torch.view_as_real(a).flatten(), torch.view_as_real(e).flatten()
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return math.nan
    norm_a, norm_e = float(a.norm()), float(e.norm())
    if norm_a == 0 and norm_e == 0:
        return 1.0
    if norm_a == 0 or norm_e == 0:
        return 0.0
    return float(torch.dot(a, e)) / (norm_a * norm_e)
