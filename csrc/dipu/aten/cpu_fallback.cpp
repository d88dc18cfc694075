#include "cpu_fallback.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/vendor.h"

namespace dipu::aten {
namespace {

constexpr const char* kNotInTable = "not in the DIOPI table";

thread_local const char* pending_reason = nullptr;
std::mutex counts_mutex;
std::map<std::string, int64_t> counts;
std::atomic<bool> logging{[] {
  const char* value = std::getenv("DIPU_LOG_FALLBACK");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}()};

void record(const c10::OperatorName& name) {
  const char* reason = pending_reason ? pending_reason : kNotInTable;
  pending_reason = nullptr;
  std::string key = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  {
    std::lock_guard lock(counts_mutex);
    counts[key] += 1;
  }
  if (logging.load()) std::cerr << "[dipu] CPU fallback: " << key << " (" << reason << ")\n";
}

void no_delete(void*) {}

// A stand-in shows the same values as the tensor it stands for: same conjugate and negative bits.
void copy_math_bits(const at::Tensor& from, at::Tensor& to) {
  to._set_conj(from.is_conj());
  to._set_neg(from.is_neg());
}

// Host-side stand-ins for the device storages one operator touches.
class HostMirror {
 public:
  explicit HostMirror(bool alias) : alias_(alias) {}

  at::Tensor to_cpu(const at::Tensor& tensor) {
    if (!tensor.defined() || !tensor.device().is_privateuseone()) return tensor;
    Entry& entry = entry_for(tensor.storage());
    at::Tensor cpu = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(entry.host), c10::DispatchKeySet(c10::DispatchKey::CPU), tensor.dtype());
    cpu.unsafeGetTensorImpl()->set_sizes_and_strides(tensor.sizes(), tensor.strides(), tensor.storage_offset());
    copy_math_bits(tensor, cpu);
    return cpu;
  }

  // The device tensor for a CPU result: a view of an input's device storage when the result lives
  // in one of the mirrored storages, a fresh device copy otherwise.
  at::Tensor to_device(const at::Tensor& cpu, c10::Device device) {
    if (!cpu.defined() || !cpu.device().is_cpu()) return cpu;
    for (auto& [impl, entry] : entries_) {
      if (entry.host.unsafeGetStorageImpl() == cpu.storage().unsafeGetStorageImpl()) {
        return view_of(entry.device, cpu);
      }
    }
    return copy_to_device(cpu, device);
  }

  // Brings a mutated device argument up to date with its CPU stand-in.
  void commit_mutation(const at::Tensor& device_tensor, const at::Tensor& cpu) {
    if (!device_tensor.defined() || !device_tensor.device().is_privateuseone()) return;
    Entry& entry = entry_for(device_tensor.storage());
    bool same_storage = cpu.storage().unsafeGetStorageImpl() == entry.host.unsafeGetStorageImpl() &&
                        entry.host.data() == entry.original_host_data && entry.host.nbytes() == entry.original_nbytes;
    if (!same_storage) {
      device_tensor.resize_(cpu.sizes());
      device_tensor.copy_(cpu);
      return;
    }
    if (device_tensor.sizes() != cpu.sizes() || device_tensor.strides() != cpu.strides() ||
        device_tensor.storage_offset() != cpu.storage_offset()) {
      device_tensor.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
    }
    if (!alias_) entry.dirty = true;
  }

  // Copies every mutated staged storage back to the device.
  void write_back() {
    for (auto& [impl, entry] : entries_) {
      if (!entry.dirty || entry.device.nbytes() == 0) continue;
      DIPU_CHECK(vendor().memcpy(entry.device.mutable_data(), entry.host.data(), entry.device.nbytes(),
                                 dipuMemcpyHostToDevice));
      entry.dirty = false;
    }
  }

 private:
  struct Entry {
    c10::Storage device;
    c10::Storage host;
    const void* original_host_data = nullptr;
    size_t original_nbytes = 0;
    bool dirty = false;
  };

  Entry& entry_for(const c10::Storage& device_storage) {
    Entry& entry = entries_[device_storage.unsafeGetStorageImpl()];
    if (!entry.device) {
      entry.device = device_storage;
      entry.host = host_storage(device_storage);
      entry.original_host_data = entry.host.data();
      entry.original_nbytes = entry.host.nbytes();
    }
    return entry;
  }

  c10::Storage host_storage(const c10::Storage& device_storage) {
    size_t nbytes = device_storage.nbytes();
    if (alias_) {
      void* data = const_cast<void*>(device_storage.data());
      return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), nbytes, c10::DataPtr(data, data, &no_delete, c10::Device(c10::kCPU)),
          c10::GetCPUAllocator(), /*resizable=*/true));
    }
    c10::Storage staged(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(), /*resizable=*/true);
    if (nbytes > 0) {
      DIPU_CHECK(vendor().memcpy(staged.mutable_data(), device_storage.data(), nbytes, dipuMemcpyDeviceToHost));
    }
    return staged;
  }

  static at::Tensor view_of(const c10::Storage& device_storage, const at::Tensor& cpu) {
    at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(device_storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.dtype());
    view.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
    copy_math_bits(cpu, view);
    return view;
  }

  static at::Tensor copy_to_device(const at::Tensor& cpu, c10::Device device) {
    at::Tensor result = cpu.is_non_overlapping_and_dense()
                            ? at::empty_strided(cpu.sizes(), cpu.strides(), cpu.options().device(device))
                            : at::empty(cpu.sizes(), cpu.options().device(device));
    result.copy_(cpu);
    return result;
  }

  bool alias_;
  std::unordered_map<c10::StorageImpl*, Entry> entries_;
};

c10::Device device_of_arguments(const std::vector<c10::IValue>& arguments) {
  for (const c10::IValue& value : arguments) {
    if (value.isTensor() && value.toTensor().defined() && value.toTensor().device().is_privateuseone()) {
      return value.toTensor().device();
    }
    if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList().vec()) {
        if (tensor.defined() && tensor.device().is_privateuseone()) return tensor.device();
      }
    }
  }
  return c10::Device(c10::DeviceType::PrivateUse1, current_device());
}

bool is_generator_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  auto optional = type->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

c10::IValue to_cpu_argument(const c10::IValue& value, const c10::Argument& argument, HostMirror& mirror) {
  if (is_generator_type(argument.type())) {
    std::optional<at::Generator> generator;
    if (value.isGenerator()) generator = value.toGenerator();
    return c10::IValue(cpu_generator_for(generator));
  }
  if (value.isTensor()) return mirror.to_cpu(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> cpu_list;
    for (const at::Tensor& tensor : value.toTensorList().vec()) cpu_list.push_back(mirror.to_cpu(tensor));
    return c10::IValue(cpu_list);
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> cpu_list;
    for (const std::optional<at::Tensor>& tensor : value.toOptionalTensorList().vec()) {
      cpu_list.push_back(tensor.has_value() ? std::optional<at::Tensor>(mirror.to_cpu(*tensor)) : std::nullopt);
    }
    return c10::IValue(cpu_list);
  }
  if (value.isDevice() && value.toDevice().is_privateuseone()) return c10::IValue(c10::Device(c10::kCPU));
  return value;
}

bool writes(const c10::Argument& argument) { return argument.alias_info() && argument.alias_info()->isWrite(); }

}  // namespace

void note_fallback_reason(const char* reason) { pending_reason = reason; }

std::map<std::string, int64_t> fallback_counts() {
  std::lock_guard lock(counts_mutex);
  return counts;
}

void reset_fallback_counts() {
  std::lock_guard lock(counts_mutex);
  counts.clear();
}

void set_fallback_logging(bool enabled) { logging.store(enabled); }

bool fallback_logging() { return logging.load(); }

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  record(schema.operator_name());
  const size_t num_arguments = schema.arguments().size();
  std::vector<c10::IValue> device_arguments(stack->end() - num_arguments, stack->end());
  c10::Device device = device_of_arguments(device_arguments);
  c10::DeviceGuard device_guard(device);
  HostMirror mirror(host_accessible());

  std::vector<c10::IValue> cpu_arguments;
  cpu_arguments.reserve(num_arguments);
  for (size_t i = 0; i < num_arguments; ++i) {
    cpu_arguments.push_back(to_cpu_argument(device_arguments[i], schema.arguments()[i], mirror));
  }
  torch::jit::drop(*stack, num_arguments);
  for (const c10::IValue& value : cpu_arguments) torch::jit::push(*stack, value);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (size_t i = 0; i < num_arguments; ++i) {
    if (!writes(schema.arguments()[i])) continue;
    if (device_arguments[i].isTensor()) {
      mirror.commit_mutation(device_arguments[i].toTensor(), cpu_arguments[i].toTensor());
    } else if (device_arguments[i].isTensorList()) {
      auto device_list = device_arguments[i].toTensorList().vec();
      auto cpu_list = cpu_arguments[i].toTensorList().vec();
      for (size_t j = 0; j < device_list.size(); ++j) mirror.commit_mutation(device_list[j], cpu_list[j]);
    }
  }
  mirror.write_back();

  const size_t num_returns = schema.returns().size();
  auto returns = torch::jit::last(*stack, num_returns);
  std::vector<c10::IValue> device_returns;
  for (size_t r = 0; r < num_returns; ++r) {
    const c10::Argument& declared = schema.returns()[r];
    if (writes(declared)) {
      for (size_t i = 0; i < num_arguments; ++i) {
        const c10::Argument& argument = schema.arguments()[i];
        if (argument.alias_info() && *argument.alias_info() == *declared.alias_info()) {
          device_returns.push_back(device_arguments[i]);
          break;
        }
      }
      TORCH_INTERNAL_ASSERT(device_returns.size() == r + 1, "dipu fallback: no argument aliases return ", r);
    } else if (returns[r].isTensor()) {
      device_returns.emplace_back(mirror.to_device(returns[r].toTensor(), device));
    } else if (returns[r].isTensorList()) {
      c10::List<at::Tensor> device_list;
      for (const at::Tensor& tensor : returns[r].toTensorList().vec()) {
        device_list.push_back(mirror.to_device(tensor, device));
      }
      device_returns.emplace_back(device_list);
    } else {
      device_returns.push_back(returns[r]);
    }
  }
  torch::jit::drop(*stack, num_returns);
  for (c10::IValue& value : device_returns) torch::jit::push(*stack, std::move(value));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

}  // namespace dipu::aten
