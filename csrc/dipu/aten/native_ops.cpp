// Operators every dipu tensor needs natively, never through the fallback: allocation, views,
// resizing, storage rebinding, reading a scalar, and whether a tensor may take over another's data.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "runtime/allocator.h"
#include "runtime/device.h"

namespace dipu::aten {
namespace {

constexpr c10::DispatchKeySet kDipuKeys(c10::DispatchKey::PrivateUse1);

c10::Device target_device(std::optional<c10::Device> device) {
  c10::Device chosen = device.value_or(c10::Device(c10::DeviceType::PrivateUse1));
  TORCH_CHECK(chosen.is_privateuseone(), "dipu factory called for device ", chosen);
  return chosen.has_index() ? chosen : c10::Device(c10::DeviceType::PrivateUse1, current_device());
}

void check_strided_unpinned(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "dipu tensors are strided only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "only CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_strided_unpinned(layout, pin_memory);
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_generic(size, device_allocator(), kDipuKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_strided_unpinned(layout, pin_memory);
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kDipuKeys, c10::dtype_or_default(dtype));
}

void ensure_storage_bytes(const at::Tensor& self) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (impl->numel() == 0) return;
  size_t needed =
      at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), impl->itemsize(), impl->storage_offset());
  if (needed > impl->storage().nbytes()) {
    c10::DeviceGuard guard(self.device());
    resize_device_storage(impl->storage(), needed);
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(C10_AS_INTARRAYREF_SLOW(size));
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  ensure_storage_bytes(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  ensure_storage_bytes(self);
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt storage_offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return set_storage(self, std::move(source), storage_offset.guard_int(__FILE__, __LINE__),
                     C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  int64_t elements = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {elements}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) offset = storage_offset->guard_int(__FILE__, __LINE__);
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host =
      at::detail::empty_cpu({}, self.scalar_type(), std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  DIPU_CHECK(vendor().memcpy(host.data_ptr(), self.data_ptr(), self.itemsize(), dipuMemcpyDeviceToHost));
  return host.item();
}

bool dense_on_cpu_or_dipu(const at::Tensor& tensor) {
  return tensor.layout() == c10::kStrided && (tensor.device().is_cpu() || tensor.device().is_privateuseone()) &&
         !tensor.is_mkldnn() && !tensor.is_nested();
}

// Module.to("dipu") / .cuda() move a Parameter by handing it the moved data (`param.data = moved`)
// when this says the two may share one tensor object, as torch says for dense CPU and CUDA tensors;
// otherwise it makes new Parameter objects, orphaning an optimizer built before the move and untying
// tied weights.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense_on_cpu_or_dipu(self) && dense_on_cpu_or_dipu(from));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("view", TORCH_FN(view));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("unfold", TORCH_FN(unfold));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

}  // namespace dipu::aten
