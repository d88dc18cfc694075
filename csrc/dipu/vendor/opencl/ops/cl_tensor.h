// DIOPI operands as the OpenCL kernels see them: a device tensor is (buffer, element offset, shape,
// strides, dtype); a 0-dim host operand (a Python number) is its value.
#pragma once

#include <cstdint>
#include <vector>

#include <diopi/diopi.h>

#include "vendor/opencl/ops/cl_program.h"

namespace dipu::opencl {

struct Stream {
  int32_t device;
  cl_command_queue queue;
};

struct Operand {
  cl_mem buffer = nullptr;
  cl_long offset = 0;  // elements from the start of the buffer
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  diopiDtype_t dtype = diopi_dtype_float32;
  int32_t device = -1;
  bool host_scalar = false;
  double value = 0.0;  // host_scalar only

  int64_t numel() const;
  bool contiguous() const;
};

// The queue a DIOPI call runs on.
Stream streamOf(diopiContextHandle_t ctx);
size_t itemSize(diopiDtype_t dtype);
// Throws Decline for an operand the vendor cannot reach (host memory other than a 0-dim scalar).
Operand operand(diopiConstTensorHandle_t tensor);
double scalarValue(const diopiScalar_t* scalar);
// Shapes and strides as a kernel argument; Decline beyond 8 dimensions.
cl_long8 pack(const std::vector<int64_t>& values);
// The strides that read `t` broadcast to `shape` (0 along broadcast dimensions).
std::vector<int64_t> broadcastStrides(const Operand& t, const std::vector<int64_t>& shape);
std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape);

// The copy/cast kernel for (src, dst) dtypes, or nullptr when there is none.
const char* copyKernel(diopiDtype_t src, diopiDtype_t dst);
// dst[...] = src[...] (src broadcast to dst's shape, converted to its dtype); copyKernel must exist.
void copyInto(const Stream& stream, const Operand& dst, const Operand& src);

// A contiguous copy of a device operand: the operand itself when already contiguous, else a
// temporary buffer (released when this goes away; OpenCL frees it after the queued kernels).
class Dense {
 public:
  Dense(const Stream& stream, const Operand& source);
  ~Dense();
  Dense(const Dense&) = delete;
  Dense& operator=(const Dense&) = delete;
  cl_mem buffer() const { return buffer_; }
  cl_long offset() const { return offset_; }

 private:
  cl_mem buffer_;
  cl_long offset_;
  cl_mem owned_ = nullptr;
};

// A fresh device buffer of `bytes` on the stream's device, released when this goes away.
class Scratch {
 public:
  Scratch(const Stream& stream, size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  cl_mem buffer() const { return buffer_; }

 private:
  cl_mem buffer_;
};

}  // namespace dipu::opencl
