#include "generator.h"

#include <ATen/CPUGeneratorImpl.h>

#include <deque>
#include <mutex>

#include "device.h"

namespace dipu {

DipuGeneratorImpl::DipuGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void DipuGeneratorImpl::set_current_seed(uint64_t seed) { cpu_generator_.set_current_seed(seed); }

void DipuGeneratorImpl::set_offset(uint64_t offset) { cpu_generator_.set_offset(offset); }

uint64_t DipuGeneratorImpl::get_offset() const { return cpu_generator_.get_offset(); }

uint64_t DipuGeneratorImpl::current_seed() const { return cpu_generator_.current_seed(); }

uint64_t DipuGeneratorImpl::seed() { return cpu_generator_.seed(); }

void DipuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  cpu_generator_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> DipuGeneratorImpl::get_state() const {
  return cpu_generator_.unsafeGetGeneratorImpl()->get_state();
}

DipuGeneratorImpl* DipuGeneratorImpl::clone_impl() const {
  auto* copy = new DipuGeneratorImpl(device().index());
  copy->cpu_generator_ = cpu_generator_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag created;
  static std::deque<at::Generator> generators;
  std::call_once(created, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i)
      generators.push_back(at::make_generator<DipuGeneratorImpl>(i));
  });
  check_device(device < 0 ? current_device() : device);
  return generators[device < 0 ? current_device() : device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<DipuGeneratorImpl>(device < 0 ? current_device() : device);
}

at::Generator cpu_generator_for(const std::optional<at::Generator>& generator) {
  const at::Generator& chosen =
      (generator.has_value() && generator->defined()) ? *generator : default_generator(current_device());
  if (chosen.device().type() == c10::DeviceType::CPU) return chosen;
  return chosen.get<DipuGeneratorImpl>()->cpu_generator();
}

}  // namespace dipu
