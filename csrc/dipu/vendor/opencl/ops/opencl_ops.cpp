// The OpenCL vendor's DIOPI kernels. GEMMs run through CLBlast; everything else is an OpenCL C kernel
// of kernels.cl.inc. Float32 only (plus the index and mask dtypes the operators take): a call with
// another dtype, more than 8 dimensions or a host operand that is not a scalar returns
// diopiFallbackToCPU before anything is written, and the shim runs it on the CPU. Operators absent
// here (attention, convolution, pooling, recurrent cells, batch and group norm) are not exported, so
// the shim's CPU fallback runs them too.
#include <clblast.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <diopi/diopi.h>

#include "vendor/opencl/ops/cl_tensor.h"

using namespace dipu::opencl;

namespace {

std::string& lastError() {
  thread_local std::string text;
  return text;
}

template <typename Body>
diopiError_t run(Body&& body) {
  try {
    body();
    return diopiSuccess;
  } catch (const Decline&) {
    return diopiFallbackToCPU;
  } catch (const std::exception& e) {
    lastError() = e.what();
    return diopiErrorOccurred;
  }
}

// Operation codes of ew_f32 (kernels.cl.inc, enum Op).
enum Op {
  kAdd = 1,
  kSub = 2,
  kMul = 3,
  kDiv = 4,
  kNeg = 5,
  kPow = 6,
  kRsqrt = 7,
  kSqrt = 8,
  kExp = 9,
  kSilu = 10,
  kSiluBackward = 11,
  kRelu = 12,
  kThresholdBackward = 13,
  kGelu = 14,
  kGeluTanh = 15,
  kGeluBackward = 16,
  kGeluTanhBackward = 17,
  kTanh = 18,
  kTanhBackward = 19,
  kSigmoid = 20,
  kSigmoidBackward = 21,
  kWhere = 22,
  kMaskedFill = 23,
  kFill = 24,
  kAddcmul = 25,
  kAddcdiv = 26,
  kLerp = 27,
  kDropoutBackward = 28,
  kSquaredDifference = 29,
  kMseBackward = 30
};

void requireFloat(const Operand& t) {
  if (t.dtype != diopi_dtype_float32) throw Decline("not float32");
}

Operand deviceFloat(diopiConstTensorHandle_t tensor) {
  Operand t = operand(tensor);
  requireFloat(t);
  if (t.host_scalar) throw Decline("host operand where a device tensor is needed");
  return t;
}

Operand contiguousOutput(diopiConstTensorHandle_t tensor) {
  Operand t = deviceFloat(tensor);
  if (!t.contiguous()) throw Decline("strided output");
  return t;
}

// out = op(floats..., mask) elementwise; a float operand may be a host scalar, or nullptr (unused).
void elementwise(diopiContextHandle_t ctx, diopiConstTensorHandle_t out_handle, int op,
                 std::vector<diopiConstTensorHandle_t> floats, diopiConstTensorHandle_t mask_handle, double s0) {
  Stream stream = streamOf(ctx);
  Operand out = deviceFloat(out_handle);
  floats.resize(3, nullptr);
  cl_mem none = placeholder(stream.device);
  struct Arg {
    cl_mem buffer;
    cl_long offset = 0;
    std::vector<int64_t> strides;
    float value = 0.0f;
  };
  std::vector<Arg> args(4, Arg{none, 0, std::vector<int64_t>(out.shape.size(), 0), 0.0f});
  int reads = 0, scalars = 0;
  for (size_t i = 0; i < 3; ++i) {
    if (floats[i] == nullptr) continue;
    Operand t = operand(floats[i]);
    if (t.host_scalar) {
      args[i].value = static_cast<float>(t.value);
      scalars |= 1 << i;
      continue;
    }
    requireFloat(t);
    args[i].buffer = t.numel() ? t.buffer : none;
    args[i].offset = t.offset;
    args[i].strides = broadcastStrides(t, out.shape);
    reads |= 1 << i;
  }
  if (mask_handle != nullptr) {
    Operand mask = operand(mask_handle);
    if (mask.host_scalar || (mask.dtype != diopi_dtype_bool && mask.dtype != diopi_dtype_uint8)) {
      throw Decline("mask is not a device bool tensor");
    }
    args[3].buffer = mask.numel() ? mask.buffer : none;
    args[3].offset = mask.offset;
    args[3].strides = broadcastStrides(mask, out.shape);
    reads |= 8;
  }
  launch(stream.device, stream.queue, "ew_f32", static_cast<size_t>(out.numel()), cl_int(op), cl_long{out.numel()},
         cl_int(out.shape.size()), pack(out.shape), out.buffer, out.offset, pack(out.stride), args[0].buffer,
         args[0].offset, pack(args[0].strides), args[1].buffer, args[1].offset, pack(args[1].strides), args[2].buffer,
         args[2].offset, pack(args[2].strides), args[3].buffer, args[3].offset, pack(args[3].strides), cl_int(reads),
         cl_int(scalars), cl_float(args[0].value), cl_float(args[1].value), cl_float(args[2].value),
         cl_float(static_cast<float>(s0)));
}

diopiError_t unary(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input, int op,
                   double s0 = 0.0) {
  return run([&] { elementwise(ctx, out, op, {input}, nullptr, s0); });
}

diopiError_t binary(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t a,
                    diopiConstTensorHandle_t b, int op, double s0 = 0.0) {
  return run([&] { elementwise(ctx, out, op, {a, b}, nullptr, s0); });
}

// ---- GEMM through CLBlast ----

void checkBlas(clblast::StatusCode status, const char* what) {
  if (status != clblast::StatusCode::kSuccess) {
    throw std::runtime_error(std::string("CLBlast ") + what + " failed with status " +
                             std::to_string(static_cast<int>(status)));
  }
}

// A matrix operand (the last two dimensions of `t`) as CLBlast reads it in row-major layout.
struct Matrix {
  cl_mem buffer;
  size_t offset;
  size_t ld;
  clblast::Transpose transpose;
  size_t batch_stride;
};

Matrix matrixOf(const Operand& t, const Dense& dense, bool use_dense) {
  size_t n = t.shape.size();
  int64_t rows = t.shape[n - 2], cols = t.shape[n - 1];
  if (use_dense) {
    return Matrix{dense.buffer(), static_cast<size_t>(dense.offset()), static_cast<size_t>(std::max<int64_t>(cols, 1)),
                  clblast::Transpose::kNo, static_cast<size_t>(rows * cols)};
  }
  int64_t sr = t.stride[n - 2], sc = t.stride[n - 1];
  size_t batch = n == 3 ? static_cast<size_t>(t.stride[0]) : 0;
  if ((sc == 1 || cols == 1) && sr >= std::max<int64_t>(cols, 1)) {
    return Matrix{t.buffer, static_cast<size_t>(t.offset), static_cast<size_t>(sr), clblast::Transpose::kNo, batch};
  }
  return Matrix{t.buffer, static_cast<size_t>(t.offset), static_cast<size_t>(sc), clblast::Transpose::kYes, batch};
}

bool readableAsMatrix(const Operand& t) {
  size_t n = t.shape.size();
  int64_t rows = t.shape[n - 2], cols = t.shape[n - 1];
  int64_t sr = t.stride[n - 2], sc = t.stride[n - 1];
  bool row_major = (sc == 1 || cols == 1) && sr >= std::max<int64_t>(cols, 1);
  bool column_major = (sr == 1 || rows == 1) && sc >= std::max<int64_t>(rows, 1);
  return (row_major || column_major) && (n == 2 || t.stride[0] > 0);
}

// out = alpha * a @ b + beta * out over 2-D or batched 3-D operands (out written by the caller first
// when beta != 0; zeroed here otherwise, as a recycled block may hold NaNs that 0 * NaN would keep).
void gemm(const Stream& stream, const Operand& out, const Operand& a, const Operand& b, float alpha, float beta) {
  size_t n = out.shape.size();
  size_t m = static_cast<size_t>(out.shape[n - 2]), cols = static_cast<size_t>(out.shape[n - 1]);
  size_t k = static_cast<size_t>(a.shape[a.shape.size() - 1]);
  if (out.stride[n - 1] != 1 && cols > 1) throw Decline("output is not row-major");
  if (out.numel() == 0) return;
  if (beta == 0.0f) {
    cl_float zero = 0.0f;
    cl_event filled = nullptr;
    size_t bytes = static_cast<size_t>(out.numel()) * sizeof(float);
    if (!out.contiguous()) throw Decline("strided output");
    checkCl(clEnqueueFillBuffer(stream.queue, out.buffer, &zero, sizeof(zero), static_cast<size_t>(out.offset) * 4,
                                bytes, 0, nullptr, &filled),
            "clEnqueueFillBuffer");
    Runtime::instance().noteKernel(stream.device, stream.queue, filled);
  }
  if (k == 0) return;
  bool dense_a = !readableAsMatrix(a), dense_b = !readableAsMatrix(b);
  Dense a_dense(stream, dense_a ? a : Operand{}), b_dense(stream, dense_b ? b : Operand{});
  Matrix ma = matrixOf(a, a_dense, dense_a), mb = matrixOf(b, b_dense, dense_b);
  size_t ldc = n == 2 ? static_cast<size_t>(std::max<int64_t>(out.stride[0], static_cast<int64_t>(cols)))
                      : static_cast<size_t>(std::max<int64_t>(out.stride[1], static_cast<int64_t>(cols)));
  cl_command_queue queue = stream.queue;
  cl_event done = nullptr;
  if (n == 2) {
    checkBlas(clblast::Gemm<float>(clblast::Layout::kRowMajor, ma.transpose, mb.transpose, m, cols, k, alpha, ma.buffer,
                                   ma.offset, ma.ld, mb.buffer, mb.offset, mb.ld, beta, out.buffer,
                                   static_cast<size_t>(out.offset), ldc, &queue, &done),
              "Gemm");
  } else {
    checkBlas(clblast::GemmStridedBatched<float>(
                  clblast::Layout::kRowMajor, ma.transpose, mb.transpose, m, cols, k, alpha, ma.buffer, ma.offset,
                  ma.ld, ma.batch_stride, mb.buffer, mb.offset, mb.ld, mb.batch_stride, beta, out.buffer,
                  static_cast<size_t>(out.offset), ldc, static_cast<size_t>(out.stride[0]),
                  static_cast<size_t>(out.shape[0]), &queue, &done),
              "GemmStridedBatched");
  }
  Runtime::instance().noteKernel(stream.device, queue, done);
}

// The reduced dimensions, each once (a 0-dim input has none: dim 0 and -1 name the scalar itself).
std::vector<int64_t> normalizedDims(diopiSize_t dim, size_t ndim) {
  std::vector<int64_t> dims;
  if (dim.len <= 0 || ndim == 0) {
    for (size_t i = 0; i < ndim; ++i) dims.push_back(static_cast<int64_t>(i));
    return dims;
  }
  for (int64_t i = 0; i < dim.len; ++i) {
    int64_t d = dim.data[i] < 0 ? dim.data[i] + static_cast<int64_t>(ndim) : dim.data[i];
    if (d < 0 || d >= static_cast<int64_t>(ndim)) throw Decline("dimension out of range");
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
  }
  return dims;
}

// How a reduction walks its input: the kept dimensions (with the input's and the output's strides)
// and the reduced ones (with the input's strides).
struct Reduction {
  std::vector<int64_t> kept_shape, kept_in_strides, kept_out_strides, red_shape, red_strides;
  int64_t count = 1;  // elements reduced into each output element
};

Reduction reductionOf(const Operand& input, const Operand& out, diopiSize_t dim, bool keepdim) {
  std::vector<int64_t> dims = normalizedDims(dim, input.shape.size());
  std::vector<bool> reduced(input.shape.size(), false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
  Reduction r;
  size_t out_dim = 0;
  int64_t kept = 1;
  for (size_t d = 0; d < input.shape.size(); ++d) {
    if (reduced[d]) {
      r.red_shape.push_back(input.shape[d]);
      r.red_strides.push_back(input.stride[d]);
      r.count *= input.shape[d];
      if (keepdim) ++out_dim;
    } else {
      if (out_dim >= out.shape.size()) throw Decline("unexpected output shape");
      r.kept_shape.push_back(input.shape[d]);
      r.kept_in_strides.push_back(input.stride[d]);
      r.kept_out_strides.push_back(out.stride[out_dim]);
      kept *= input.shape[d];
      ++out_dim;
    }
  }
  if (out.numel() != kept) throw Decline("unexpected output shape");
  return r;
}

// out = sum (or mean) of input over `dim`.
void reduce(diopiContextHandle_t ctx, diopiTensorHandle_t out_handle, diopiConstTensorHandle_t input_handle,
            diopiSize_t dim, bool keepdim, bool mean) {
  Stream stream = streamOf(ctx);
  Operand out = deviceFloat(out_handle), input = deviceFloat(input_handle);
  Reduction r = reductionOf(input, out, dim, keepdim);
  float divisor = mean ? static_cast<float>(r.count) : 1.0f;
  cl_mem in_buffer = input.numel() ? input.buffer : placeholder(stream.device);
  launch(stream.device, stream.queue, "reduce_f32", static_cast<size_t>(out.numel()), cl_long{out.numel()},
         cl_int(r.kept_shape.size()), pack(r.kept_shape), out.buffer, out.offset, pack(r.kept_out_strides), in_buffer,
         input.offset, pack(r.kept_in_strides), cl_int(r.red_shape.size()), pack(r.red_shape), pack(r.red_strides),
         cl_long{input.numel() ? r.count : 0}, cl_float(divisor));
}

// Softmax family: mode 0 softmax, 1 log_softmax, 2 and 3 their backward (x: the forward's output).
void softmax(diopiContextHandle_t ctx, diopiTensorHandle_t out_handle, diopiConstTensorHandle_t x_handle,
             diopiConstTensorHandle_t grad_handle, int64_t dim, int mode) {
  Stream stream = streamOf(ctx);
  Operand out = contiguousOutput(out_handle), x = deviceFloat(x_handle);
  Operand grad = grad_handle != nullptr ? deviceFloat(grad_handle) : Operand{};
  size_t ndim = x.shape.size();
  if (ndim == 0) throw Decline("0-dim softmax");
  int64_t d = dim < 0 ? dim + static_cast<int64_t>(ndim) : dim;
  int64_t outer = 1, inner = 1, len = x.shape[static_cast<size_t>(d)];
  for (int64_t i = 0; i < d; ++i) outer *= x.shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(d) + 1; i < ndim; ++i) inner *= x.shape[i];
  if (out.numel() == 0) return;
  Dense xd(stream, x);
  Dense gd(stream, grad_handle != nullptr ? grad : Operand{});
  cl_mem g_buffer = grad_handle != nullptr ? gd.buffer() : placeholder(stream.device);
  launch(stream.device, stream.queue, "softmax_f32", static_cast<size_t>(outer * inner), cl_int(mode),
         cl_long{outer * inner}, cl_long{len}, cl_long{inner}, out.buffer, out.offset, xd.buffer(), xd.offset(),
         g_buffer, grad_handle != nullptr ? gd.offset() : cl_long{0});
}

int64_t product(diopiSize_t size) {
  int64_t count = 1;
  for (int64_t i = 0; i < size.len; ++i) count *= size.data[i];
  return count;
}

// An optional float operand as (buffer, offset, present), made contiguous.
struct Optional {
  Optional(const Stream& stream, diopiConstTensorHandle_t handle)
      : operand(handle != nullptr ? deviceFloat(handle) : Operand{}), dense(stream, operand) {}
  cl_mem buffer(const Stream& stream) const {
    return operand.buffer != nullptr ? dense.buffer() : placeholder(stream.device);
  }
  cl_long offset() const { return operand.buffer != nullptr ? dense.offset() : 0; }
  cl_int present() const { return operand.buffer != nullptr ? 1 : 0; }
  Operand operand;
  Dense dense;
};

std::vector<int64_t> hostIndices(const Stream& stream, const Operand& index) {
  std::vector<int64_t> values(static_cast<size_t>(index.numel()));
  if (values.empty()) return values;
  Dense dense(stream, index);
  if (index.dtype == diopi_dtype_int64) {
    checkCl(clEnqueueReadBuffer(stream.queue, dense.buffer(), CL_TRUE, static_cast<size_t>(dense.offset()) * 8,
                                values.size() * 8, values.data(), 0, nullptr, nullptr),
            "clEnqueueReadBuffer (indices)");
  } else {
    std::vector<int32_t> narrow(values.size());
    checkCl(clEnqueueReadBuffer(stream.queue, dense.buffer(), CL_TRUE, static_cast<size_t>(dense.offset()) * 4,
                                narrow.size() * 4, narrow.data(), 0, nullptr, nullptr),
            "clEnqueueReadBuffer (indices)");
    std::copy(narrow.begin(), narrow.end(), values.begin());
  }
  return values;
}

Operand indexOperand(diopiConstTensorHandle_t handle) {
  Operand index = operand(handle);
  if (index.host_scalar || (index.dtype != diopi_dtype_int64 && index.dtype != diopi_dtype_int32)) {
    throw Decline("index is not a device int64/int32 tensor");
  }
  return index;
}

}  // namespace

extern "C" {

const char* diopiGetLastError(void) { return lastError().c_str(); }

// ---- Linear algebra ----

diopiError_t diopiMm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                     diopiConstTensorHandle_t mat2) {
  return run([&] {
    Operand o = deviceFloat(out), a = deviceFloat(input), b = deviceFloat(mat2);
    if (a.shape.size() != 2 || b.shape.size() != 2) throw Decline("mm of non-matrices");
    gemm(streamOf(ctx), o, a, b, 1.0f, 0.0f);
  });
}

diopiError_t diopiBmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t mat2) {
  return run([&] {
    Operand o = deviceFloat(out), a = deviceFloat(input), b = deviceFloat(mat2);
    if (a.shape.size() != 3 || b.shape.size() != 3 || !o.contiguous()) throw Decline("bmm layout");
    gemm(streamOf(ctx), o, a, b, 1.0f, 0.0f);
  });
}

diopiError_t diopiAddmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                        diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, const diopiScalar_t* beta,
                        const diopiScalar_t* alpha) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = deviceFloat(out), bias = deviceFloat(input), a = deviceFloat(mat1), b = deviceFloat(mat2);
    if (a.shape.size() != 2 || b.shape.size() != 2 || !o.contiguous()) throw Decline("addmm layout");
    float beta_value = static_cast<float>(scalarValue(beta));
    broadcastStrides(bias, o.shape);  // declines before writing when the bias does not broadcast
    if (beta_value != 0.0f) copyInto(stream, o, bias);
    gemm(stream, o, a, b, static_cast<float>(scalarValue(alpha)), beta_value);
  });
}

// ---- Element-wise ----

diopiError_t diopiAdd(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha) {
  return binary(ctx, out, input, other, kAdd, scalarValue(alpha));
}

diopiError_t diopiAddInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other,
                         const diopiScalar_t* alpha) {
  return binary(ctx, input, input, other, kAdd, scalarValue(alpha));
}

diopiError_t diopiSub(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha) {
  return binary(ctx, out, input, other, kSub, scalarValue(alpha));
}

diopiError_t diopiMul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other) {
  return binary(ctx, out, input, other, kMul);
}

diopiError_t diopiMulInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other) {
  return binary(ctx, input, input, other, kMul);
}

diopiError_t diopiDiv(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other) {
  return binary(ctx, out, input, other, kDiv);
}

diopiError_t diopiDivInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other) {
  return binary(ctx, input, input, other, kDiv);
}

diopiError_t diopiNeg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kNeg);
}

diopiError_t diopiPowTensorScalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                                  const diopiScalar_t* exponent) {
  return unary(ctx, out, input, kPow, scalarValue(exponent));
}

diopiError_t diopiRsqrt(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kRsqrt);
}

diopiError_t diopiSqrt(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kSqrt);
}

diopiError_t diopiExp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kExp);
}

diopiError_t diopiWhere(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t condition,
                        diopiConstTensorHandle_t input, diopiConstTensorHandle_t other) {
  return run([&] { elementwise(ctx, out, kWhere, {input, other}, condition, 0.0); });
}

diopiError_t diopiMaskedFillInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t mask,
                                const diopiScalar_t* value) {
  return run([&] { elementwise(ctx, input, kMaskedFill, {input}, mask, scalarValue(value)); });
}

diopiError_t diopiFill(diopiContextHandle_t ctx, diopiTensorHandle_t input, const diopiScalar_t* value) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand t = operand(input);
    if (t.host_scalar) throw Decline("host tensor");
    if (t.dtype == diopi_dtype_float32) {
      elementwise(ctx, input, kFill, {}, nullptr, scalarValue(value));
      return;
    }
    if (!t.contiguous()) throw Decline("strided fill of a non-float tensor");
    if (t.numel() == 0) return;
    double v = scalarValue(value);
    uint64_t pattern = 0;
    switch (t.dtype) {
      case diopi_dtype_int64: {
        int64_t x = static_cast<int64_t>(v);
        std::memcpy(&pattern, &x, 8);
        break;
      }
      case diopi_dtype_int32: {
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(&pattern, &x, 4);
        break;
      }
      case diopi_dtype_bool: pattern = v != 0.0 ? 1 : 0; break;
      case diopi_dtype_uint8: pattern = static_cast<uint8_t>(v); break;
      default: throw Decline("fill of this dtype");
    }
    size_t item = itemSize(t.dtype);
    cl_event filled = nullptr;
    checkCl(clEnqueueFillBuffer(stream.queue, t.buffer, &pattern, item, static_cast<size_t>(t.offset) * item,
                                static_cast<size_t>(t.numel()) * item, 0, nullptr, &filled),
            "clEnqueueFillBuffer");
    Runtime::instance().noteKernel(stream.device, stream.queue, filled);
  });
}

diopiError_t diopiAddcmul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2,
                          const diopiScalar_t* value) {
  return run([&] { elementwise(ctx, out, kAddcmul, {input, tensor1, tensor2}, nullptr, scalarValue(value)); });
}

diopiError_t diopiAddcdiv(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2,
                          const diopiScalar_t* value) {
  return run([&] { elementwise(ctx, out, kAddcdiv, {input, tensor1, tensor2}, nullptr, scalarValue(value)); });
}

diopiError_t diopiLerpScalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                             diopiConstTensorHandle_t end, const diopiScalar_t* weight) {
  return binary(ctx, out, input, end, kLerp, scalarValue(weight));
}

diopiError_t diopiCopyInp(diopiContextHandle_t ctx, diopiConstTensorHandle_t src, diopiTensorHandle_t dest) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand from = operand(src), to = operand(dest);
    if (from.host_scalar || to.host_scalar || copyKernel(from.dtype, to.dtype) == nullptr) {
      throw Decline("copy of these operands");
    }
    broadcastStrides(from, to.shape);
    if (to.numel() == 0) return;
    if (from.buffer == to.buffer) {  // may overlap: read everything before writing
      Operand staged = from;
      Scratch scratch(stream, static_cast<size_t>(from.numel()) * itemSize(from.dtype));
      staged.buffer = scratch.buffer();
      staged.offset = 0;
      staged.stride = contiguousStrides(from.shape);
      copyInto(stream, staged, from);
      copyInto(stream, to, staged);
      return;
    }
    copyInto(stream, to, from);
  });
}

// ---- Activations ----

diopiError_t diopiSilu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kSilu);
}

diopiError_t diopiSiluBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input) {
  return binary(ctx, grad_input, grad_output, input, kSiluBackward);
}

diopiError_t diopiRelu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kRelu);
}

diopiError_t diopiReluInp(diopiContextHandle_t ctx, diopiTensorHandle_t input) {
  return unary(ctx, input, input, kRelu);
}

diopiError_t diopiThresholdBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    const diopiScalar_t* threshold) {
  return binary(ctx, grad_input, grad_output, input, kThresholdBackward, scalarValue(threshold));
}

diopiError_t diopiGelu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                       const char* approximate) {
  bool tanh = approximate != nullptr && std::strcmp(approximate, "tanh") == 0;
  return unary(ctx, out, input, tanh ? kGeluTanh : kGelu);
}

diopiError_t diopiGeluBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                               const char* approximate) {
  bool tanh = approximate != nullptr && std::strcmp(approximate, "tanh") == 0;
  return binary(ctx, grad_input, grad_output, input, tanh ? kGeluTanhBackward : kGeluBackward);
}

diopiError_t diopiTanh(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kTanh);
}

diopiError_t diopiTanhBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output) {
  return binary(ctx, grad_input, grad_output, output, kTanhBackward);
}

diopiError_t diopiSigmoid(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return unary(ctx, out, input, kSigmoid);
}

diopiError_t diopiSigmoidBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output) {
  return binary(ctx, grad_input, grad_output, output, kSigmoidBackward);
}

diopiError_t diopiDropoutBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t mask, double scale) {
  return run([&] { elementwise(ctx, grad_input, kDropoutBackward, {grad_output}, mask, scale); });
}

diopiError_t diopiSoftmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          int64_t dim) {
  return run([&] { softmax(ctx, out, input, nullptr, dim, 0); });
}

diopiError_t diopiLogSoftmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                             int64_t dim) {
  return run([&] { softmax(ctx, out, input, nullptr, dim, 1); });
}

diopiError_t diopiSoftmaxBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output, int64_t dim) {
  return run([&] { softmax(ctx, grad_input, output, grad_output, dim, 2); });
}

diopiError_t diopiLogSoftmaxBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                     diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output,
                                     int64_t dim) {
  return run([&] { softmax(ctx, grad_input, output, grad_output, dim, 3); });
}

// ---- Reductions ----

diopiError_t diopiSum(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiSize_t dim, bool keepdim) {
  return run([&] { reduce(ctx, out, input, dim, keepdim, false); });
}

diopiError_t diopiMean(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                       diopiSize_t dim, bool keepdim) {
  return run([&] { reduce(ctx, out, input, dim, keepdim, true); });
}

// ---- Indexing ----

diopiError_t diopiIndexSelect(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                              int64_t dim, diopiConstTensorHandle_t index) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = operand(out), in = operand(input), idx = indexOperand(index);
    size_t item = in.host_scalar ? 0 : itemSize(in.dtype);
    if (in.host_scalar || o.dtype != in.dtype || (item != 4 && item != 8) || !o.contiguous()) {
      throw Decline("index_select operands");
    }
    if (item == 8 && idx.dtype != diopi_dtype_int64) throw Decline("index_select int32 index of 8-byte data");
    size_t ndim = in.shape.size();
    int64_t d = dim < 0 ? dim + static_cast<int64_t>(ndim) : dim;
    if (ndim == 0 || idx.shape.size() > 1) throw Decline("index_select shape");
    int64_t outer = 1, inner = 1, len = in.shape[static_cast<size_t>(d)];
    for (int64_t i = 0; i < d; ++i) outer *= in.shape[static_cast<size_t>(i)];
    for (size_t i = static_cast<size_t>(d) + 1; i < ndim; ++i) inner *= in.shape[i];
    for (int64_t value : hostIndices(stream, idx)) {
      if (value < -len || value >= len) throw std::runtime_error("index out of range in self");
      if (value < 0) throw Decline("negative index");
    }
    if (o.numel() == 0) return;
    Dense in_dense(stream, in), idx_dense(stream, idx);
    const char* name = item == 8                        ? "index_select_b8_i64"
                       : idx.dtype == diopi_dtype_int64 ? "index_select_b4_i64"
                                                        : "index_select_b4_i32";
    launch(stream.device, stream.queue, name, static_cast<size_t>(o.numel()), cl_long{o.numel()}, cl_long{idx.numel()},
           cl_long{len}, cl_long{inner}, o.buffer, o.offset, in_dense.buffer(), in_dense.offset(), idx_dense.buffer(),
           idx_dense.offset());
  });
}

diopiError_t diopiCat(diopiContextHandle_t ctx, diopiTensorHandle_t out, const diopiConstTensorHandle_t* tensors,
                      int64_t num_tensors, int64_t dim) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = operand(out);
    if (o.host_scalar || o.shape.empty()) throw Decline("cat output");
    int64_t d = dim < 0 ? dim + static_cast<int64_t>(o.shape.size()) : dim;
    std::vector<Operand> pieces;
    for (int64_t i = 0; i < num_tensors; ++i) {
      Operand piece = operand(tensors[i]);
      if (piece.host_scalar || copyKernel(piece.dtype, o.dtype) == nullptr) throw Decline("cat operand");
      if (piece.numel() == 0 && piece.shape.size() == 1) continue;  // legacy empty tensors are skipped
      if (piece.shape.size() != o.shape.size()) throw Decline("cat ranks");
      if (piece.buffer == o.buffer && piece.numel() > 0) throw Decline("cat into an operand");
      pieces.push_back(piece);
    }
    int64_t at = 0;
    for (const Operand& piece : pieces) {
      Operand slot = o;
      slot.shape = piece.shape;
      slot.offset = o.offset + at * o.stride[static_cast<size_t>(d)];
      at += piece.shape[static_cast<size_t>(d)];
      if (piece.numel() > 0) copyInto(stream, slot, piece);
    }
  });
}

diopiError_t diopiEmbeddingBackward(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t grad,
                                    diopiConstTensorHandle_t indices, int64_t num_weights, int64_t padding_idx,
                                    bool scale_grad_by_freq) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = contiguousOutput(out), g = deviceFloat(grad), idx = indexOperand(indices);
    if (o.shape.size() != 2) throw Decline("embedding weight is not 2-D");
    int64_t dim = o.shape[1];
    if (o.numel() == 0) return;
    Dense g_dense(stream, g), idx_dense(stream, idx);
    cl_mem idx_buffer = idx.numel() ? idx_dense.buffer() : placeholder(stream.device);
    cl_mem g_buffer = g.numel() ? g_dense.buffer() : placeholder(stream.device);
    launch(stream.device, stream.queue, idx.dtype == diopi_dtype_int64 ? "embedding_bwd_i64" : "embedding_bwd_i32",
           static_cast<size_t>(o.numel()), cl_long{num_weights}, cl_long{dim}, cl_long{idx.numel()},
           cl_long{padding_idx}, cl_int(scale_grad_by_freq ? 1 : 0), o.buffer, o.offset, g_buffer, g_dense.offset(),
           idx_buffer, idx_dense.offset());
  });
}

// ---- Losses ----

diopiError_t diopiNLLLoss(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t total_weight,
                          diopiConstTensorHandle_t input, diopiConstTensorHandle_t target,
                          diopiConstTensorHandle_t weight, int64_t reduction, int64_t ignore_index) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = deviceFloat(out), tw = deviceFloat(total_weight), x = deviceFloat(input), t = operand(target);
    if (reduction != 1 && reduction != 2) throw Decline("nll_loss without reduction");
    if (t.host_scalar || t.dtype != diopi_dtype_int64 || x.shape.empty() || x.shape.size() > 2) {
      throw Decline("nll_loss operands");
    }
    int64_t classes = x.shape.back(), rows = x.shape.size() == 2 ? x.shape[0] : 1;
    Optional w(stream, weight);
    Dense xd(stream, x), td(stream, t);
    cl_mem t_buffer = t.numel() ? td.buffer() : placeholder(stream.device);
    cl_mem x_buffer = x.numel() ? xd.buffer() : placeholder(stream.device);
    launch(stream.device, stream.queue, "nll_loss_f32", 1, cl_long{rows}, cl_long{classes}, cl_int(reduction),
           cl_long{ignore_index}, o.buffer, o.offset, tw.buffer, tw.offset, x_buffer, xd.offset(), t_buffer,
           td.offset(), w.buffer(stream), w.offset(), w.present());
  });
}

diopiError_t diopiNLLLossBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                  diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight, int64_t reduction,
                                  int64_t ignore_index, diopiConstTensorHandle_t total_weight) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand gi = contiguousOutput(grad_input), go = deviceFloat(grad_output), x = deviceFloat(input);
    Operand t = operand(target), tw = deviceFloat(total_weight);
    if (reduction != 1 && reduction != 2) throw Decline("nll_loss backward without reduction");
    if (t.host_scalar || t.dtype != diopi_dtype_int64 || x.shape.empty() || x.shape.size() > 2) {
      throw Decline("nll_loss operands");
    }
    int64_t classes = x.shape.back(), rows = x.shape.size() == 2 ? x.shape[0] : 1;
    Optional w(stream, weight);
    Dense td(stream, t);
    cl_mem t_buffer = t.numel() ? td.buffer() : placeholder(stream.device);
    launch(stream.device, stream.queue, "nll_loss_bwd_f32", static_cast<size_t>(rows * classes), cl_long{rows},
           cl_long{classes}, cl_int(reduction), cl_long{ignore_index}, gi.buffer, gi.offset, go.buffer, go.offset,
           t_buffer, td.offset(), w.buffer(stream), w.offset(), w.present(), tw.buffer, tw.offset);
  });
}

// ---- Normalization ----

diopiError_t diopiLayerNorm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_invstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                            diopiSize_t normalized_shape, double eps) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = contiguousOutput(out), x = deviceFloat(input);
    Operand mean = save_mean != nullptr ? contiguousOutput(save_mean) : Operand{};
    Operand rstd = save_invstd != nullptr ? contiguousOutput(save_invstd) : Operand{};
    int64_t n = product(normalized_shape);
    if (n == 0 || x.numel() == 0) throw Decline("empty layer norm");
    int64_t rows = x.numel() / n;
    Optional w(stream, weight), b(stream, bias);
    Dense xd(stream, x);
    cl_mem none = placeholder(stream.device);
    int save = (save_mean != nullptr ? 1 : 0) | (save_invstd != nullptr ? 2 : 0);
    launch(stream.device, stream.queue, "layer_norm_f32", static_cast<size_t>(rows), cl_long{rows}, cl_long{n},
           cl_float(static_cast<float>(eps)), o.buffer, o.offset, mean.buffer ? mean.buffer : none, mean.offset,
           rstd.buffer ? rstd.buffer : none, rstd.offset, cl_int(save), xd.buffer(), xd.offset(), w.buffer(stream),
           w.offset(), b.buffer(stream), b.offset(), w.present(), b.present());
  });
}

diopiError_t diopiLayerNormBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t mean, diopiConstTensorHandle_t rstd,
                                    diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                                    diopiSize_t normalized_shape) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand go = deviceFloat(grad_output), x = deviceFloat(input), m = deviceFloat(mean), r = deviceFloat(rstd);
    Operand gi = grad_input != nullptr ? contiguousOutput(grad_input) : Operand{};
    Operand gw = grad_weight != nullptr ? contiguousOutput(grad_weight) : Operand{};
    Operand gb = grad_bias != nullptr ? contiguousOutput(grad_bias) : Operand{};
    int64_t n = product(normalized_shape);
    if (n == 0 || x.numel() == 0) throw Decline("empty layer norm");
    int64_t rows = x.numel() / n;
    Optional w(stream, weight);
    Dense god(stream, go), xd(stream, x), md(stream, m), rd(stream, r);
    cl_mem none = placeholder(stream.device);
    if (grad_input != nullptr) {
      launch(stream.device, stream.queue, "layer_norm_bwd_input_f32", static_cast<size_t>(rows), cl_long{rows},
             cl_long{n}, gi.buffer, gi.offset, god.buffer(), god.offset(), xd.buffer(), xd.offset(), md.buffer(),
             md.offset(), rd.buffer(), rd.offset(), w.buffer(stream), w.offset(), w.present());
    }
    int want = (grad_weight != nullptr ? 1 : 0) | (grad_bias != nullptr ? 2 : 0);
    if (want != 0) {
      launch(stream.device, stream.queue, "layer_norm_bwd_params_f32", static_cast<size_t>(n), cl_long{rows},
             cl_long{n}, gw.buffer ? gw.buffer : none, gw.offset, gb.buffer ? gb.buffer : none, gb.offset, cl_int(want),
             god.buffer(), god.offset(), xd.buffer(), xd.offset(), md.buffer(), md.offset(), rd.buffer(), rd.offset());
    }
  });
}

// ---- Losses and checks beyond the training step ----

diopiError_t diopiMSELoss(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t target, int64_t reduction) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = deviceFloat(out), x = deviceFloat(input), y = deviceFloat(target);
    if (x.shape != y.shape) throw Decline("mse_loss of broadcast operands");
    if (reduction == 0) {
      elementwise(ctx, out, kSquaredDifference, {input, target}, nullptr, 0.0);
      return;
    }
    // The squared differences into a scratch buffer, then summed (and divided for the mean).
    Scratch scratch(stream, static_cast<size_t>(x.numel()) * sizeof(float));
    Operand squares = x;
    squares.buffer = scratch.buffer();
    squares.offset = 0;
    squares.stride = contiguousStrides(x.shape);
    cl_mem none = placeholder(stream.device);
    std::vector<int64_t> x_strides = broadcastStrides(x, x.shape), y_strides = broadcastStrides(y, x.shape);
    std::vector<int64_t> zeros(x.shape.size(), 0);
    launch(stream.device, stream.queue, "ew_f32", static_cast<size_t>(x.numel()), cl_int(kSquaredDifference),
           cl_long{x.numel()}, cl_int(x.shape.size()), pack(x.shape), squares.buffer, cl_long{0}, pack(squares.stride),
           x.numel() ? x.buffer : none, x.offset, pack(x_strides), y.numel() ? y.buffer : none, y.offset,
           pack(y_strides), none, cl_long{0}, pack(zeros), none, cl_long{0}, pack(zeros), cl_int(3), cl_int(0),
           cl_float(0), cl_float(0), cl_float(0), cl_float(0));
    std::vector<int64_t> all_shape{x.numel()}, all_stride{1}, empty;
    float divisor = reduction == 1 ? static_cast<float>(x.numel()) : 1.0f;
    launch(stream.device, stream.queue, "reduce_f32", size_t{1}, cl_long{1}, cl_int(0), pack(empty), o.buffer, o.offset,
           pack(empty), squares.buffer, cl_long{0}, pack(empty), cl_int(1), pack(all_shape), pack(all_stride),
           cl_long{x.numel()}, cl_float(divisor));
  });
}

diopiError_t diopiMSELossBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                  diopiConstTensorHandle_t target, int64_t reduction) {
  return run([&] {
    Operand x = deviceFloat(input);
    double scale = reduction == 1 ? 2.0 / static_cast<double>(std::max<int64_t>(x.numel(), 1)) : 2.0;
    elementwise(ctx, grad_input, kMseBackward, {input, target, grad_output}, nullptr, scale);
  });
}

diopiError_t diopiAll(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiSize_t dim, bool keepdim) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = operand(out), x = operand(input);
    if (o.host_scalar || x.host_scalar || o.dtype != diopi_dtype_bool ||
        (x.dtype != diopi_dtype_bool && x.dtype != diopi_dtype_uint8)) {
      throw Decline("all of a non-bool tensor");
    }
    Reduction r = reductionOf(x, o, dim, keepdim);
    if (o.numel() == 0) return;
    cl_mem in_buffer = x.numel() ? x.buffer : placeholder(stream.device);
    launch(stream.device, stream.queue, "all_u8", static_cast<size_t>(o.numel()), cl_long{o.numel()},
           cl_int(r.kept_shape.size()), pack(r.kept_shape), o.buffer, o.offset, pack(r.kept_out_strides), in_buffer,
           x.offset, pack(r.kept_in_strides), cl_int(r.red_shape.size()), pack(r.red_shape), pack(r.red_strides),
           cl_long{x.numel() ? r.count : 0});
  });
}

diopiError_t diopiIsNegInf(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return run([&] {
    Stream stream = streamOf(ctx);
    Operand o = operand(out), x = deviceFloat(input);
    if (o.host_scalar || o.dtype != diopi_dtype_bool) throw Decline("isneginf output");
    std::vector<int64_t> strides = broadcastStrides(x, o.shape);
    if (o.numel() == 0) return;
    launch(stream.device, stream.queue, "isneginf_f32", static_cast<size_t>(o.numel()), cl_long{o.numel()},
           cl_int(o.shape.size()), pack(o.shape), o.buffer, o.offset, pack(o.stride), x.buffer, x.offset,
           pack(strides));
  });
}

}  // extern "C"
