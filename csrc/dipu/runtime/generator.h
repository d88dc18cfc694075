// Random number generators of dipu devices. Random operators run through the CPU fallback, so a
// dipu generator owns a CPU generator (the CPU's mt19937) that those kernels draw from: the same
// seed gives the same numbers on dipu as on the CPU.
#pragma once

#include <ATen/core/Generator.h>

namespace dipu {

class DipuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit DipuGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // The CPU generator that fallback kernels draw from.
  const at::Generator& cpu_generator() const { return cpu_generator_; }

 private:
  DipuGeneratorImpl* clone_impl() const override;
  at::Generator cpu_generator_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The CPU generator a fallback kernel should use in place of `generator` (a dipu generator, or
// none: the current device's default).
at::Generator cpu_generator_for(const std::optional<at::Generator>& generator);

}  // namespace dipu
