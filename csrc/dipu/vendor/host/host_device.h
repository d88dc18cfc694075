// What the host vendor's DIOPI kernels need from the emulated device: its profile, the vendor's
// view of device addresses, and pacing to the profile's relative speed.
#pragma once

#include <chrono>

#include "host_profile.h"

namespace dipu::host {

// Initialises the device from DIPU_HOST_PROFILE on first use; throws std::runtime_error when the
// profile is invalid.
const Profile& device_profile();

// The address kernels read and write for device address ptr; throws when ptr is not device memory.
void* kernel_view(const void* ptr);

// Slows the enclosing kernel down to the profile's relative speed: on destruction it waits until
// (elapsed / relative_speed) has passed since construction.
class PacedKernel {
 public:
  PacedKernel();
  ~PacedKernel();
  PacedKernel(const PacedKernel&) = delete;
  PacedKernel& operator=(const PacedKernel&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dipu::host
