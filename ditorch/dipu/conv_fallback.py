"""Convolutions on a vendor without `diopiConvolution` (the OpenCL vendor): computed on the CPU.

The shim registers `convolution_overrideable` and its backward for dipu, and they call the vendor's
`diopiConvolution`; the generic CPU fallback has no CPU kernel for these two operators (they exist only
for out-of-tree devices). For a vendor library that does not export `diopiConvolution`, `register` replaces
the two with kernels that copy their operands to the CPU, run `aten.convolution` (or its backward) there,
and copy the results back. Decided once, for the vendor chosen when ditorch.dipu is imported.
"""
from __future__ import annotations

import ctypes
import warnings

import torch

_library: torch.library.Library | None = None


def vendor_has_convolution(path: str) -> bool:
    """Whether the vendor library at `path` exports diopiConvolution (looking it up opens no device)."""
    return hasattr(ctypes.CDLL(path), "diopiConvolution")


def _on_cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.cpu()


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    output = torch.ops.aten.convolution(input.cpu(), weight.cpu(), _on_cpu(bias), stride, padding, dilation, transposed,
                                        output_padding, groups)
    return output.to(input.device)


def convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]
    grads = torch.ops.aten.convolution_backward(grad_output.cpu(), input.cpu(), weight.cpu(), bias_sizes, stride,
                                                padding, dilation, transposed, output_padding, groups, output_mask)
    return tuple(None if grad is None else grad.to(input.device) for grad in grads)


def register(vendor_path: str) -> bool:
    """Replace the dipu convolution kernels by the CPU ones when the vendor at `vendor_path` has no
    diopiConvolution; whether it did."""
    global _library
    if _library is not None or not vendor_path or vendor_has_convolution(vendor_path):
        return _library is not None
    _library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the shim's, on purpose
        _library.impl("convolution_overrideable", convolution, "PrivateUse1")
        _library.impl("convolution_backward_overrideable", convolution_backward, "PrivateUse1")
    return True
