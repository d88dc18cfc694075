// What a generated DIOPI kernel uses: the slot that finds the vendor's function for one ATen
// operator, and the Call that turns ATen arguments into DIOPI operands for one invocation.
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <ATen/core/IListRef.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <diopi/diopi.h>

namespace dipu::diopi {

// One ATen operator's route to the vendor. The lookup is redone whenever the vendor or the
// forced-fallback list changes.
class OpSlot {
 public:
  OpSlot(const char* aten_name, const char* diopi_name);
  // The vendor's function, or nullptr after recording why the operator must fall back.
  void* function();
  const char* aten_name() const { return aten_name_; }
  const char* diopi_name() const { return diopi_name_; }
  void count_call() { calls_.fetch_add(1, std::memory_order_relaxed); }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> calls_{0};
  const char* aten_name_;
  const char* diopi_name_;
  std::mutex mutex_;
  uint64_t generation_ = 0;
  void* function_ = nullptr;
  bool forced_ = false;
};

// Operators the user sends to the CPU regardless of the vendor (DIPU_FORCE_FALLBACK_OPS, or
// set_forced_fallback): names like "mm" (all overloads) or "add.Tensor".
// How many times each operator's DIOPI kernel ran (operators not called yet are absent).
std::map<std::string, int64_t> diopi_call_counts();

void set_forced_fallback(const std::vector<std::string>& names);
std::vector<std::string> forced_fallback();

class Call {
 public:
  Call(OpSlot& slot, const at::Tensor& first);
  Call(OpSlot& slot, const at::ITensorListRef& first);

  void* function() { return slot_.function(); }

  // True when every tensor argument can be handed to the vendor: on a dipu device, or a 0-dim
  // CPU scalar; with a dtype DIOPI knows. Otherwise records the fallback reason.
  template <typename... Tensors>
  bool accepts(const Tensors&... tensors) {
    return (accept(tensors) && ...);
  }

  diopiContextHandle_t context() { return &context_; }
  diopiConstTensorHandle_t input(const at::Tensor& tensor);
  diopiConstTensorHandle_t input(const std::optional<at::Tensor>& tensor);
  const diopiConstTensorHandle_t* inputs(const at::ITensorListRef& tensors);
  // nullptr for an undefined output: the vendor skips it.
  diopiTensorHandle_t output(const at::Tensor& tensor);
  const diopiScalar_t* scalar(const at::Scalar& value);
  diopiSize_t size(at::OptionalIntArrayRef values);
  diopiSize_t size(c10::SymIntArrayRef values);
  const double* optional_double(std::optional<double> value);
  const char* string(c10::string_view value);

  // A device tensor shaped like the Meta kernel's result (undefined when the Meta kernel leaves
  // that result out, as backward operators do for outputs their mask does not ask for).
  at::Tensor empty_like(const at::Tensor& meta);
  // Resizes an out= argument to the shape its Meta kernel gave it.
  void resize_output(const at::Tensor& out, const at::Tensor& meta_out);

  // True on success; false when the vendor declined (the caller falls back); throws on error.
  bool finish(diopiError_t status);

 private:
  bool accept(const at::Tensor& tensor);
  bool accept(const std::optional<at::Tensor>& tensor);
  bool accept(const at::ITensorListRef& tensors);
  diopiTensor* describe(const at::Tensor& tensor);

  OpSlot& slot_;
  c10::Device device_;
  c10::DeviceGuard device_guard_;
  diopiContext context_{};
  std::deque<diopiTensor> tensors_;
  std::deque<std::vector<int64_t>> int_lists_;
  std::deque<std::vector<diopiConstTensorHandle_t>> tensor_lists_;
  std::deque<diopiScalar_t> scalars_;
  std::deque<double> doubles_;
  std::deque<std::string> strings_;
};

// The argument as the operator's Meta kernel should see it: same metadata on the meta device;
// 0-dim CPU scalars stay as they are.
at::Tensor to_meta(const at::Tensor& tensor);
std::optional<at::Tensor> to_meta(const std::optional<at::Tensor>& tensor);
std::vector<at::Tensor> to_meta(const at::ITensorListRef& tensors);

}  // namespace dipu::diopi
