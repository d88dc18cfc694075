#include "diopi_call.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>

#include <atomic>
#include <cstdlib>
#include <sstream>

#include "aten/cpu_fallback.h"
#include "runtime/device.h"
#include "runtime/vendor.h"

namespace dipu::diopi {
namespace {

std::atomic<uint64_t> config_generation{1};
std::mutex forced_mutex;

std::vector<std::string> parse_names(const char* text) {
  std::vector<std::string> names;
  std::stringstream stream(text == nullptr ? "" : text);
  std::string name;
  while (std::getline(stream, name, ',')) {
    size_t begin = name.find_first_not_of(' ');
    size_t end = name.find_last_not_of(' ');
    if (begin != std::string::npos) names.push_back(name.substr(begin, end - begin + 1));
  }
  return names;
}

std::vector<std::string>& forced_names() {
  static std::vector<std::string> names = parse_names(std::getenv("DIPU_FORCE_FALLBACK_OPS"));
  return names;
}

bool is_forced(const std::string& aten_name) {
  std::string qualified = aten_name.substr(aten_name.find("::") + 2);
  std::string base = qualified.substr(0, qualified.find('.'));
  std::lock_guard lock(forced_mutex);
  for (const std::string& name : forced_names()) {
    if (name == qualified || name == base) return true;
  }
  return false;
}

std::optional<diopiDtype_t> to_diopi_dtype(at::ScalarType type) {
  switch (type) {
    case at::kChar: return diopi_dtype_int8;
    case at::kByte: return diopi_dtype_uint8;
    case at::kShort: return diopi_dtype_int16;
    case at::kInt: return diopi_dtype_int32;
    case at::kLong: return diopi_dtype_int64;
    case at::kHalf: return diopi_dtype_float16;
    case at::kFloat: return diopi_dtype_float32;
    case at::kDouble: return diopi_dtype_float64;
    case at::kBool: return diopi_dtype_bool;
    case at::kBFloat16: return diopi_dtype_bfloat16;
    case at::kComplexFloat: return diopi_dtype_complex64;
    case at::kComplexDouble: return diopi_dtype_complex128;
    default: return std::nullopt;
  }
}

bool is_cpu_scalar(const at::Tensor& tensor) { return tensor.device().is_cpu() && tensor.dim() == 0; }

c10::Device device_of_list(const at::ITensorListRef& tensors) {
  for (const at::Tensor& tensor : tensors) {
    if (tensor.device().is_privateuseone()) return tensor.device();
  }
  return c10::Device(c10::DeviceType::PrivateUse1, current_device());
}

}  // namespace

void set_forced_fallback(const std::vector<std::string>& names) {
  {
    std::lock_guard lock(forced_mutex);
    forced_names() = names;
  }
  config_generation.fetch_add(1);
}

std::vector<std::string> forced_fallback() {
  std::lock_guard lock(forced_mutex);
  return forced_names();
}

static std::mutex& slots_mutex() {
  static std::mutex mutex;
  return mutex;
}

static std::vector<OpSlot*>& slots() {
  static std::vector<OpSlot*> registered;
  return registered;
}

OpSlot::OpSlot(const char* aten_name, const char* diopi_name) : aten_name_(aten_name), diopi_name_(diopi_name) {
  std::lock_guard lock(slots_mutex());
  slots().push_back(this);
}

std::map<std::string, int64_t> diopi_call_counts() {
  std::lock_guard lock(slots_mutex());
  std::map<std::string, int64_t> counts;
  for (const OpSlot* slot : slots()) counts[slot->aten_name()] += slot->calls();
  return counts;
}

void* OpSlot::function() {
  std::lock_guard lock(mutex_);
  uint64_t generation = config_generation.load();
  if (generation != generation_) {
    function_ = vendor_symbol(diopi_name_);
    forced_ = is_forced(aten_name_);
    generation_ = generation;
  }
  if (forced_) {
    aten::note_fallback_reason("forced by DIPU_FORCE_FALLBACK_OPS");
    return nullptr;
  }
  if (function_ == nullptr) aten::note_fallback_reason("the vendor does not implement this DIOPI function");
  return function_;
}

Call::Call(OpSlot& slot, const at::Tensor& first)
    : slot_(slot),
      device_(first.device().is_privateuseone() ? first.device()
                                                : c10::Device(c10::DeviceType::PrivateUse1, current_device())),
      device_guard_(device_) {
  context_.device_index = device_.index();
  context_.stream = vendor_stream(current_stream(device_.index()));
}

Call::Call(OpSlot& slot, const at::ITensorListRef& first)
    : slot_(slot), device_(device_of_list(first)), device_guard_(device_) {
  context_.device_index = device_.index();
  context_.stream = vendor_stream(current_stream(device_.index()));
}

bool Call::accept(const at::Tensor& tensor) {
  if (!tensor.defined()) return true;
  if (!tensor.device().is_privateuseone() && !is_cpu_scalar(tensor)) {
    aten::note_fallback_reason("an operand is a CPU tensor");
    return false;
  }
  if (!to_diopi_dtype(tensor.scalar_type())) {
    aten::note_fallback_reason("DIOPI has no dtype for an operand");
    return false;
  }
  if (tensor.is_conj() || tensor.is_neg()) {
    aten::note_fallback_reason("an operand is a conjugate or negative view (DIOPI tensors carry no math bits)");
    return false;
  }
  return true;
}

bool Call::accept(const std::optional<at::Tensor>& tensor) { return !tensor.has_value() || accept(*tensor); }

bool Call::accept(const at::ITensorListRef& tensors) {
  for (const at::Tensor& tensor : tensors) {
    if (!accept(tensor)) return false;
  }
  return true;
}

diopiTensor* Call::describe(const at::Tensor& tensor) {
  diopiTensor& operand = tensors_.emplace_back();
  operand.data = tensor.data_ptr();
  operand.dtype = *to_diopi_dtype(tensor.scalar_type());
  operand.device = tensor.device().is_cpu() ? diopi_host : diopi_device;
  operand.ndim = tensor.dim();
  operand.shape = tensor.sizes().data();
  operand.stride = tensor.strides().data();
  operand.flags = tensor.unsafeGetTensorImpl()->is_wrapped_number() ? diopi_tensor_wrapped_number : 0;
  return &operand;
}

diopiConstTensorHandle_t Call::input(const at::Tensor& tensor) { return tensor.defined() ? describe(tensor) : nullptr; }

diopiConstTensorHandle_t Call::input(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() ? input(*tensor) : nullptr;
}

const diopiConstTensorHandle_t* Call::inputs(const at::ITensorListRef& tensors) {
  auto& handles = tensor_lists_.emplace_back();
  for (const at::Tensor& tensor : tensors) handles.push_back(describe(tensor));
  return handles.data();
}

diopiTensorHandle_t Call::output(const at::Tensor& tensor) { return tensor.defined() ? describe(tensor) : nullptr; }

const diopiScalar_t* Call::scalar(const at::Scalar& value) {
  diopiScalar_t& scalar = scalars_.emplace_back();
  if (value.isFloatingPoint()) {
    scalar.stype = diopi_dtype_float64;
    scalar.fval = value.toDouble();
  } else if (value.isBoolean()) {
    scalar.stype = diopi_dtype_bool;
    scalar.ival = value.toBool() ? 1 : 0;
  } else {
    TORCH_CHECK(!value.isComplex(), "DIOPI scalars cannot be complex");
    scalar.stype = diopi_dtype_int64;
    scalar.ival = value.toLong();
  }
  return &scalar;
}

diopiSize_t Call::size(at::OptionalIntArrayRef values) {
  if (!values.has_value()) return diopiSize_t{nullptr, -1};
  auto& stored = int_lists_.emplace_back(values->begin(), values->end());
  return diopiSize_t{stored.data(), static_cast<int64_t>(stored.size())};
}

diopiSize_t Call::size(c10::SymIntArrayRef values) {
  auto& stored = int_lists_.emplace_back();
  for (const c10::SymInt& value : values) stored.push_back(value.guard_int(__FILE__, __LINE__));
  return diopiSize_t{stored.data(), static_cast<int64_t>(stored.size())};
}

const double* Call::optional_double(std::optional<double> value) {
  if (!value.has_value()) return nullptr;
  return &doubles_.emplace_back(*value);
}

const char* Call::string(c10::string_view value) { return strings_.emplace_back(value).c_str(); }

at::Tensor Call::empty_like(const at::Tensor& meta) {
  if (!meta.defined()) return {};
  return at::empty_strided(meta.sizes(), meta.strides(), meta.options().device(device_));
}

void Call::resize_output(const at::Tensor& out, const at::Tensor& meta_out) {
  if (out.sizes() != meta_out.sizes()) out.resize_(meta_out.sizes());
}

bool Call::finish(diopiError_t status) {
  if (status == diopiSuccess) {
    slot_.count_call();
    return true;
  }
  if (status == diopiFallbackToCPU) {
    aten::note_fallback_reason("the vendor declined the call");
    return false;
  }
  auto last_error = reinterpret_cast<decltype(&::diopiGetLastError)>(vendor_symbol("diopiGetLastError"));
  TORCH_CHECK(false, slot_.diopi_name(), " (for ", slot_.aten_name(),
              ") failed: ", last_error ? last_error() : "no detail from the vendor");
}

at::Tensor to_meta(const at::Tensor& tensor) {
  if (!tensor.defined() || is_cpu_scalar(tensor)) return tensor;
  return at::detail::empty_strided_meta(tensor.sizes(), tensor.strides(), tensor.scalar_type());
}

std::optional<at::Tensor> to_meta(const std::optional<at::Tensor>& tensor) {
  if (!tensor.has_value()) return std::nullopt;
  return to_meta(*tensor);
}

std::vector<at::Tensor> to_meta(const at::ITensorListRef& tensors) {
  std::vector<at::Tensor> metas;
  for (const at::Tensor& tensor : tensors) metas.push_back(to_meta(tensor));
  return metas;
}

}  // namespace dipu::diopi
