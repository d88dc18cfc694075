// Copies that involve dipu tensors. Same-layout dense copies are one vendor memcpy (queued on the
// current stream when non_blocking and the host side is pinned); host-side
// conversions (dtype, layout, broadcasting) happen on a CPU staging tensor; device-side ones run
// the vendor's diopiCopyInp, or stage through the host when the vendor lacks it. Conjugate and
// negative views are copied as stored, then the destination's storage is conjugated or negated
// where the two tensors' math bits differ, as the CPU's copy_ does.
#include <ATen/EmptyTensor.h>
#include <ATen/ops/alias.h>
#include <ATen/ops/conj_physical.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/cpu_fallback.h"
#include "aten/diopi_call.h"
#include "runtime/device.h"
#include "runtime/vendor.h"

namespace dipu::aten {
namespace {

bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() && a.scalar_type() == b.scalar_type() &&
         a.is_non_overlapping_and_dense();
}

void memcpy_dense(const at::Tensor& dst, const at::Tensor& src, dipuMemcpyKind_t kind) {
  if (dst.numel() == 0) return;
  DIPU_CHECK(vendor().memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes(), kind));
}

bool is_pinned(const at::Tensor& host) { return vendor().is_pinned_host_pointer(host.data_ptr()) != 0; }

// A non_blocking copy between pinned host memory and the device is queued on the device's current
// stream; everything else is synchronous (a pageable or temporary host buffer could be gone before
// an asynchronous copy reads it).
void memcpy_dense_maybe_async(const at::Tensor& dst, const at::Tensor& src, dipuMemcpyKind_t kind, bool non_blocking) {
  const at::Tensor& host = kind == dipuMemcpyHostToDevice ? src : dst;
  const at::Tensor& device = kind == dipuMemcpyHostToDevice ? dst : src;
  if (!non_blocking || dst.numel() == 0 || !is_pinned(host)) {
    memcpy_dense(dst, src, kind);
    return;
  }
  dipuStream_t stream = vendor_stream(current_stream(device.device().index()));
  DIPU_CHECK(vendor().memcpy_async(dst.data_ptr(), src.data_ptr(), dst.nbytes(), kind, stream));
}

at::Tensor cpu_tensor_like(const at::Tensor& tensor) {
  return at::detail::empty_strided_cpu(tensor.sizes(), tensor.strides(), tensor.scalar_type());
}

void copy_host_to_device(const at::Tensor& src, const at::Tensor& dst, bool non_blocking = false);
void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst, bool non_blocking = false);

void copy_device_to_device(const at::Tensor& src, const at::Tensor& dst) {
  if (same_dense_layout(src, dst)) {
    memcpy_dense(dst, src, dipuMemcpyDeviceToDevice);
    return;
  }
  static diopi::OpSlot slot("aten::copy_", "diopiCopyInp");
  diopi::Call call(slot, dst);
  auto function = reinterpret_cast<decltype(&::diopiCopyInp)>(call.function());
  if (function != nullptr && call.accepts(src, dst) &&
      call.finish(function(call.context(), call.input(src), call.output(dst)))) {
    return;
  }
  note_fallback_reason(nullptr);  // staged below, not an operator fallback
  at::Tensor staged =
      at::detail::empty_cpu(dst.sizes(), dst.scalar_type(), std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  copy_device_to_host(src, staged);
  copy_host_to_device(staged, dst);
}

void copy_host_to_device(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (same_dense_layout(src, dst)) {
    memcpy_dense_maybe_async(dst, src, dipuMemcpyHostToDevice, non_blocking);
  } else if (dst.is_non_overlapping_and_dense()) {
    at::Tensor staged = cpu_tensor_like(dst);
    staged.copy_(src);
    memcpy_dense(dst, staged, dipuMemcpyHostToDevice);
  } else {
    at::Tensor dense = at::empty(dst.sizes(), dst.options());
    copy_host_to_device(src, dense);
    copy_device_to_device(dense, dst);
  }
}

void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (same_dense_layout(src, dst)) {
    memcpy_dense_maybe_async(dst, src, dipuMemcpyDeviceToHost, non_blocking);
  } else if (src.is_non_overlapping_and_dense()) {
    at::Tensor staged = cpu_tensor_like(src);
    memcpy_dense(staged, src, dipuMemcpyDeviceToHost);
    dst.copy_(staged);
  } else {
    at::Tensor dense = at::empty(src.sizes(), src.options());
    copy_device_to_device(src, dense);
    copy_device_to_host(dense, dst);
  }
}

// The same storage, sizes and strides with the conjugate and negative bits cleared: its values are
// the stored ones.
at::Tensor as_stored(const at::Tensor& tensor) {
  if (!tensor.is_conj() && !tensor.is_neg()) return tensor;
  at::Tensor stored = at::alias(tensor);
  stored._set_conj(false);
  stored._set_neg(false);
  return stored;
}

void copy_stored(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  bool src_on_device = self.device().is_privateuseone();
  bool dst_on_device = dst.device().is_privateuseone();
  c10::DeviceGuard guard(dst_on_device ? dst.device() : self.device());
  if (src_on_device && dst_on_device) {
    copy_device_to_device(self, dst);
  } else if (dst_on_device) {
    TORCH_CHECK(self.device().is_cpu(), "copy to dipu from ", self.device(), " is not supported");
    copy_host_to_device(self, dst, non_blocking);
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "copy from dipu to ", dst.device(), " is not supported");
    copy_device_to_host(self, dst, non_blocking);
  }
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  bool conjugate = self.is_conj() != dst.is_conj();
  bool negate = self.is_neg() != dst.is_neg();
  at::Tensor stored_dst = as_stored(dst);
  // The fix-up below runs on the stored values, so the copy before it must have landed.
  copy_stored(as_stored(self), stored_dst, non_blocking && !conjugate && !negate);
  // conj_physical_ itself calls a CPU/CUDA-only stub; its out= form dispatches to the device.
  if (conjugate) at::conj_physical_out(stored_dst, stored_dst);
  if (negate) stored_dst.neg_();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
}

// The conjugate and negative fallbacks would resolve a math-bit source by cloning it, and a clone
// copies through _copy_from again: endless recursion. copy_from handles the bits itself.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace dipu::aten
