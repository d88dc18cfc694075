// How every host-vendor DIOPI kernel runs: paced to the profile's relative speed, exceptions turned
// into diopiErrorOccurred (diopiGetLastError() returns their text), and floating outputs given the
// profile's precision behaviour for the DIOPI function.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <optional>
#include <string>
#include <typeinfo>

#include <diopi/diopi.h>

#include "vendor/host/host_device.h"
#include "vendor/host/ops/tensor_view.h"

namespace dipu::host {

// The text diopiGetLastError() returns on this thread.
std::string& last_error();

// Rounds `output` when the profile lists `function` among the DIOPI functions it degrades.
void emulate_precision(const char* function, const at::Tensor& output);

template <typename Kernel>
diopiError_t run(Kernel&& kernel) {
  try {
    PacedKernel paced(typeid(Kernel).hash_code());
    kernel();
    return diopiSuccess;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return diopiErrorOccurred;
  }
}

inline at::Tensor view(diopiConstTensorHandle_t operand) { return tensor_view(operand); }

inline std::optional<at::Tensor> optional_view(diopiConstTensorHandle_t operand) {
  if (operand == nullptr) return std::nullopt;
  return tensor_view(operand);
}

inline std::optional<double> optional_double(const double* value) {
  return value == nullptr ? std::nullopt : std::optional<double>(*value);
}

// The shape of most kernels: `kernel` writes the one output `out` (viewed first), which then gets
// the profile's rounding for `function`.
template <typename Kernel>
diopiError_t run_into(const char* function, diopiTensorHandle_t out, Kernel&& kernel) {
  return run([&] {
    at::Tensor result = view(out);
    kernel(result);
    emulate_precision(function, result);
  });
}

// Writes `value` into the output `out` with the profile's rounding for `function`; an output the
// caller left out (NULL) is skipped.
void store(const char* function, diopiTensorHandle_t out, const at::Tensor& value);

}  // namespace dipu::host

// Kernel families that differ only in the ATen operator they run. Each defines the DIOPI function
// `name` with the signature diopi.h declares for the family.

// out = aten(input)
#define DEFINE_UNARY(name, aten_out)                                                                 \
  diopiError_t name(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input) { \
    return run_into(#name, out, [&](at::Tensor& result) { aten_out(result, view(input)); });         \
  }

// out = aten(input, other)
#define DEFINE_BINARY(name, aten_out)                                                                     \
  diopiError_t name(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,        \
                    diopiConstTensorHandle_t other) {                                                     \
    return run_into(#name, out, [&](at::Tensor& result) { aten_out(result, view(input), view(other)); }); \
  }

// out = aten(input, other, alpha)
#define DEFINE_BINARY_ALPHA(name, aten_out)                                                                     \
  diopiError_t name(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,              \
                    diopiConstTensorHandle_t other, const diopiScalar_t* alpha) {                               \
    return run_into(#name, out,                                                                                 \
                    [&](at::Tensor& result) { aten_out(result, view(input), view(other), to_scalar(alpha)); }); \
  }

// input.method(other), in place
#define DEFINE_BINARY_INPLACE(name, method)                                                            \
  diopiError_t name(diopiContextHandle_t, diopiTensorHandle_t input, diopiConstTensorHandle_t other) { \
    return run_into(#name, input, [&](at::Tensor& self) { self.method(view(other)); });                \
  }
