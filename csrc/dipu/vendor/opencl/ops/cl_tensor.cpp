#include "vendor/opencl/ops/cl_tensor.h"

#include <cstring>
#include <string>

namespace dipu::opencl {

int64_t Operand::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

bool Operand::contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Stream streamOf(diopiContextHandle_t ctx) {
  int32_t device = ctx != nullptr ? ctx->device_index : currentDevice();
  auto stream = ctx != nullptr ? static_cast<dipuStream_t>(ctx->stream) : nullptr;
  return Stream{device, Runtime::instance().queueOf(device, stream)};
}

size_t itemSize(diopiDtype_t dtype) {
  switch (dtype) {
    case diopi_dtype_int8:
    case diopi_dtype_uint8:
    case diopi_dtype_bool: return 1;
    case diopi_dtype_int16:
    case diopi_dtype_float16:
    case diopi_dtype_bfloat16: return 2;
    case diopi_dtype_int32:
    case diopi_dtype_float32: return 4;
    case diopi_dtype_int64:
    case diopi_dtype_float64:
    case diopi_dtype_complex64: return 8;
    case diopi_dtype_complex128: return 16;
  }
  throw Decline("unknown dtype");
}

namespace {

double hostValue(const void* data, diopiDtype_t dtype) {
  switch (dtype) {
    case diopi_dtype_float32: return *static_cast<const float*>(data);
    case diopi_dtype_float64: return *static_cast<const double*>(data);
    case diopi_dtype_int64: return static_cast<double>(*static_cast<const int64_t*>(data));
    case diopi_dtype_int32: return *static_cast<const int32_t*>(data);
    case diopi_dtype_int16: return *static_cast<const int16_t*>(data);
    case diopi_dtype_int8: return *static_cast<const int8_t*>(data);
    case diopi_dtype_uint8:
    case diopi_dtype_bool: return *static_cast<const uint8_t*>(data);
    default: throw Decline("host scalar of an unsupported dtype");
  }
}

}  // namespace

Operand operand(diopiConstTensorHandle_t tensor) {
  if (tensor == nullptr) throw Decline("absent operand");
  Operand result;
  result.shape.assign(tensor->shape, tensor->shape + tensor->ndim);
  result.stride.assign(tensor->stride, tensor->stride + tensor->ndim);
  result.dtype = tensor->dtype;
  if (tensor->device == diopi_host) {
    if (result.numel() != 1) throw Decline("host operand that is not a scalar");
    result.host_scalar = true;
    result.value = hostValue(tensor->data, tensor->dtype);
    return result;
  }
  size_t item = itemSize(tensor->dtype);
  if (result.numel() == 0) {
    result.device = currentDevice();
    return result;
  }
  Location where;
  // The elements' span is checked by the shim; here the start must lie in an allocation.
  if (!Runtime::instance().locate(tensor->data, 0, &where)) throw std::runtime_error("operand is not in device memory");
  if (where.offset % item != 0) throw Decline("operand not aligned to its element size");
  result.buffer = where.buffer;
  result.offset = static_cast<cl_long>(where.offset / item);
  result.device = where.device;
  return result;
}

double scalarValue(const diopiScalar_t* scalar) {
  if (scalar == nullptr) return 1.0;
  return scalar->stype == diopi_dtype_float64 ? scalar->fval : static_cast<double>(scalar->ival);
}

cl_long8 pack(const std::vector<int64_t>& values) {
  if (values.size() > 8) throw Decline("more than 8 dimensions");
  cl_long8 packed{};
  for (size_t i = 0; i < values.size(); ++i) packed.s[i] = values[i];
  return packed;
}

std::vector<int64_t> broadcastStrides(const Operand& t, const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 0);
  if (t.host_scalar) return strides;
  size_t lead = shape.size() - t.shape.size();
  if (t.shape.size() > shape.size()) throw Decline("operand has more dimensions than the output");
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == shape[lead + i]) {
      strides[lead + i] = t.shape[i] == 1 ? 0 : t.stride[i];
    } else if (t.shape[i] != 1) {
      throw Decline("shapes do not broadcast");
    }
  }
  return strides;
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

const char* copyKernel(diopiDtype_t src, diopiDtype_t dst) {
  if (src == dst) {
    switch (itemSize(src)) {
      case 1: return "copy_b1";
      case 2: return "copy_b2";
      case 4: return "copy_b4";
      case 8: return dst == diopi_dtype_complex64 ? "copy_b8" : "copy_b8";
      default: return nullptr;
    }
  }
  auto code = [](diopiDtype_t dtype) -> const char* {
    switch (dtype) {
      case diopi_dtype_float32: return "f32";
      case diopi_dtype_int64: return "i64";
      case diopi_dtype_int32: return "i32";
      case diopi_dtype_uint8: return "u8";
      case diopi_dtype_bool: return "bool";
      default: return nullptr;
    }
  };
  static const char* const kCasts[] = {"cast_f32_i64", "cast_f32_i32", "cast_f32_u8", "cast_f32_bool",
                                       "cast_i64_f32", "cast_i64_i32", "cast_i64_u8", "cast_i64_bool",
                                       "cast_i32_f32", "cast_i32_i64", "cast_i32_u8", "cast_i32_bool",
                                       "cast_u8_f32",  "cast_u8_i64",  "cast_u8_i32", "cast_u8_bool"};
  const char* from = code(src == diopi_dtype_bool ? diopi_dtype_uint8 : src);  // bool reads as 0/1 bytes
  const char* to = code(dst);
  if (from == nullptr || to == nullptr) return nullptr;
  if (src == diopi_dtype_bool && dst == diopi_dtype_uint8) return "copy_b1";
  std::string name = std::string("cast_") + from + "_" + to;
  for (const char* cast : kCasts) {
    if (name == cast) return cast;
  }
  return nullptr;
}

void copyInto(const Stream& stream, const Operand& dst, const Operand& src) {
  const char* name = copyKernel(src.dtype, dst.dtype);
  if (name == nullptr || src.host_scalar) throw Decline("no copy kernel for these dtypes");
  std::vector<int64_t> src_strides = broadcastStrides(src, dst.shape);
  launch(stream.device, stream.queue, name, static_cast<size_t>(dst.numel()), cl_long{dst.numel()},
         cl_int(dst.shape.size()), pack(dst.shape), dst.buffer, dst.offset, pack(dst.stride), src.buffer, src.offset,
         pack(src_strides));
}

Dense::Dense(const Stream& stream, const Operand& source) : buffer_(source.buffer), offset_(source.offset) {
  if (source.contiguous() || source.numel() == 0) return;
  const Device& d = Runtime::instance().device(stream.device);
  size_t bytes = static_cast<size_t>(source.numel()) * itemSize(source.dtype);
  cl_int status = CL_SUCCESS;
  owned_ = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes, nullptr, &status);
  checkCl(status, "clCreateBuffer (contiguous copy)");
  Operand target = source;
  target.buffer = owned_;
  target.offset = 0;
  target.stride = contiguousStrides(source.shape);
  copyInto(stream, target, source);
  buffer_ = owned_;
  offset_ = 0;
}

Dense::~Dense() {
  if (owned_ != nullptr) clReleaseMemObject(owned_);
}

Scratch::Scratch(const Stream& stream, size_t bytes) {
  cl_int status = CL_SUCCESS;
  buffer_ = clCreateBuffer(Runtime::instance().device(stream.device).context, CL_MEM_READ_WRITE,
                           std::max<size_t>(bytes, 64), nullptr, &status);
  checkCl(status, "clCreateBuffer (scratch)");
}

Scratch::~Scratch() { clReleaseMemObject(buffer_); }

}  // namespace dipu::opencl
