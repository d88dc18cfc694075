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

// Holds the enclosing kernel to the emulated chip's time: the CPU time the calling thread spent in
// it, divided by the profile's relative speed (a chip at 0.25 takes 4x the host core's work time).
// On destruction it waits until that time has passed since construction; a kernel the host could
// not finish in time (its thread waited for a core) is counted late, with its overrun. Measuring the
// thread's CPU time rather than the wall clock keeps the emulated time independent of how many
// processes share the host's cores, as long as the waiting fits in the slack (1/speed - 1) x work.
class PacedKernel {
 public:
  PacedKernel();
  ~PacedKernel();
  PacedKernel(const PacedKernel&) = delete;
  PacedKernel& operator=(const PacedKernel&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::nanoseconds start_cpu_;
};

}  // namespace dipu::host
