// Copies that involve dipu tensors. Same-layout dense copies are one vendor memcpy; host-side
// conversions (dtype, layout, broadcasting) happen on a CPU staging tensor; device-side ones run
// the vendor's diopiCopyInp, or stage through the host when the vendor lacks it.
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/cpu_fallback.h"
#include "aten/diopi_call.h"
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

at::Tensor cpu_tensor_like(const at::Tensor& tensor) {
  return at::detail::empty_strided_cpu(tensor.sizes(), tensor.strides(), tensor.scalar_type());
}

void copy_host_to_device(const at::Tensor& src, const at::Tensor& dst);
void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst);

void copy_device_to_device(const at::Tensor& src, const at::Tensor& dst) {
  if (same_dense_layout(src, dst)) {
    memcpy_dense(dst, src, dipuMemcpyDeviceToDevice);
    return;
  }
  static diopi::OpSlot slot("aten::copy_", "diopiCopyInp");
  diopi::Call call(slot, dst);
  auto function = reinterpret_cast<decltype(&::diopiCopyInp)>(call.function());
  if (function != nullptr && call.accepts(src, dst) && call.finish(function(call.context(), call.input(src), call.output(dst)))) {
    return;
  }
  note_fallback_reason(nullptr);  // staged below, not an operator fallback
  at::Tensor staged = at::detail::empty_cpu(dst.sizes(), dst.scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                            std::nullopt);
  copy_device_to_host(src, staged);
  copy_host_to_device(staged, dst);
}

void copy_host_to_device(const at::Tensor& src, const at::Tensor& dst) {
  if (same_dense_layout(src, dst)) {
    memcpy_dense(dst, src, dipuMemcpyHostToDevice);
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

void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst) {
  if (same_dense_layout(src, dst)) {
    memcpy_dense(dst, src, dipuMemcpyDeviceToHost);
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

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  bool src_on_device = self.device().is_privateuseone();
  bool dst_on_device = dst.device().is_privateuseone();
  c10::DeviceGuard guard(dst_on_device ? dst.device() : self.device());
  if (src_on_device && dst_on_device) {
    copy_device_to_device(self, dst);
  } else if (dst_on_device) {
    TORCH_CHECK(self.device().is_cpu(), "copy to dipu from ", self.device(), " is not supported");
    copy_host_to_device(self, dst);
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "copy from dipu to ", dst.device(), " is not supported");
    copy_device_to_host(self, dst);
  }
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

}  // namespace dipu::aten
