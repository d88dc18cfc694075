// Host-vendor side of DIOPI: CPU tensors viewing the vendor's mapping of DIOPI operands.
#pragma once

#include <ATen/core/Tensor.h>

#include <diopi/diopi.h>

namespace dipu::host {

// A CPU tensor over the memory a DIOPI operand describes (through the vendor's own mapping for
// device memory); undefined for a null handle.
at::Tensor tensor_view(diopiConstTensorHandle_t operand);
at::Scalar to_scalar(const diopiScalar_t* scalar);
std::optional<at::IntArrayRef> to_dims(diopiSize_t size);
// Rounds the floating-point elements of a dense tensor to the given number of mantissa bits
// (round to nearest, ties to even).
void round_mantissa(const at::Tensor& tensor, int mantissa_bits);

}  // namespace dipu::host
