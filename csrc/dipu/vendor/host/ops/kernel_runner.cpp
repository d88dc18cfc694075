#include "kernel_runner.h"

namespace dipu::host {

std::string& last_error() {
  thread_local std::string text;
  return text;
}

void emulate_precision(const char* function, const at::Tensor& output) {
  const Profile& profile = device_profile();
  if (profile.round_output_ops.count(function) != 0) round_mantissa(output, profile.round_output_mantissa_bits);
}

void store(const char* function, diopiTensorHandle_t out, const at::Tensor& value) {
  if (out == nullptr) return;
  at::Tensor result = view(out);
  result.copy_(value);
  emulate_precision(function, result);
}

}  // namespace dipu::host
