#include "tensor_view.h"

#include <ATen/ops/from_blob.h>

#include <cstring>
#include <stdexcept>

#include "vendor/host/host_device.h"

namespace dipu::host {
namespace {

at::ScalarType to_scalar_type(diopiDtype_t dtype) {
  switch (dtype) {
    case diopi_dtype_int8: return at::kChar;
    case diopi_dtype_uint8: return at::kByte;
    case diopi_dtype_int16: return at::kShort;
    case diopi_dtype_int32: return at::kInt;
    case diopi_dtype_int64: return at::kLong;
    case diopi_dtype_float16: return at::kHalf;
    case diopi_dtype_float32: return at::kFloat;
    case diopi_dtype_float64: return at::kDouble;
    case diopi_dtype_bool: return at::kBool;
    case diopi_dtype_bfloat16: return at::kBFloat16;
    case diopi_dtype_complex64: return at::kComplexFloat;
    case diopi_dtype_complex128: return at::kComplexDouble;
  }
  throw std::runtime_error("unknown DIOPI dtype " + std::to_string(static_cast<int>(dtype)));
}

template <typename Bits>
void round_bits(Bits* data, int64_t count, int dropped_bits) {
  const Bits one = 1;
  const Bits half_minus_one = (one << (dropped_bits - 1)) - 1;
  const Bits mask = ~((one << dropped_bits) - 1);
  for (int64_t i = 0; i < count; ++i) {
    Bits value = data[i];
    Bits exponent_all_ones = (sizeof(Bits) == 4) ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
    if ((value & exponent_all_ones) == exponent_all_ones) continue;  // inf and nan stay
    Bits lowest_kept = (value >> dropped_bits) & one;
    data[i] = (value + half_minus_one + lowest_kept) & mask;
  }
}

}  // namespace

at::Tensor tensor_view(diopiConstTensorHandle_t operand) {
  if (operand == nullptr) return {};
  note_operand(static_cast<int>(operand->dtype), operand->shape, operand->ndim);
  at::IntArrayRef shape(operand->shape, operand->ndim);
  at::IntArrayRef stride(operand->stride, operand->ndim);
  int64_t numel = 1;
  for (int64_t extent : shape) numel *= extent;
  void* data = operand->data;
  if (operand->device == diopi_device && numel > 0) data = kernel_view(data);
  at::Tensor tensor = at::from_blob(data, shape, stride, at::TensorOptions().dtype(to_scalar_type(operand->dtype)));
  if (operand->flags & diopi_tensor_wrapped_number) tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
  return tensor;
}

at::Scalar to_scalar(const diopiScalar_t* scalar) {
  switch (scalar->stype) {
    case diopi_dtype_float64: return at::Scalar(scalar->fval);
    case diopi_dtype_bool: return at::Scalar(scalar->ival != 0);
    default: return at::Scalar(scalar->ival);
  }
}

std::optional<at::IntArrayRef> to_dims(diopiSize_t size) {
  if (size.len < 0) return std::nullopt;
  return at::IntArrayRef(size.data, size.len);
}

void round_mantissa(const at::Tensor& tensor, int mantissa_bits) {
  if (!tensor.is_non_overlapping_and_dense()) throw std::runtime_error("precision emulation needs a dense output");
  if (tensor.scalar_type() == at::kFloat && mantissa_bits < 23) {
    round_bits(static_cast<uint32_t*>(tensor.data_ptr()), tensor.numel(), 23 - mantissa_bits);
  } else if (tensor.scalar_type() == at::kDouble && mantissa_bits < 52) {
    round_bits(static_cast<uint64_t*>(tensor.data_ptr()), tensor.numel(), 52 - mantissa_bits);
  }
}

}  // namespace dipu::host
