// What the host vendor's DIOPI kernels need from the emulated device: its profile, the vendor's
// view of device addresses, and pacing to the profile's relative speed.
#pragma once

#include <chrono>
#include <cstdint>

#include "host_profile.h"

namespace dipu::host {

// Initialises the device from DIPU_HOST_PROFILE on first use; throws std::runtime_error when the
// profile is invalid.
const Profile& device_profile();

// The address kernels read and write for device address ptr; throws when ptr is not device memory.
void* kernel_view(const void* ptr);

// The emulated chip's clock. The host runs every kernel at once (its results exist when the call
// returns) but the chip is busy for the kernel's work on a warm host core divided by the profile's
// relative speed (a chip at 0.25 takes 4x the host core's work time); kernels queue on the device's
// timeline as on a real accelerator, where the host launches ahead and waits only to read results.
// So the host waits (sleeps until the device's timeline has caught up) at the points where a real
// host waits for its device: a copy to host memory, a device or stream synchronisation, an event
// synchronisation. The host's own delays (being scheduled late on a busy machine, framework overhead
// between kernels) are hidden as long as it stays ahead of the chip; a kernel the host finished after
// the chip would have (its work queued behind what the chip had not yet done, at the chip's speed) is
// counted late, with its overrun: the chip sat idle for that long waiting for the host.
//
// A kernel's work is the least CPU time its thread has spent on the same kernel (the same DIOPI
// function on operands of the same dtypes and shapes) in this process. A short kernel run after the
// host core was idle costs several times its warm CPU time (caches and predictors refilled), and a
// slower emulated chip leaves the host idle longer between kernels; charging the CPU time as spent
// would make that chip slower than its relative speed says. A real chip's kernel time does not depend
// on how long its host slept.
class PacedKernel {
 public:
  // `kernel` identifies the kernel's code; tensor_view() adds each operand it views (note_operand).
  explicit PacedKernel(size_t kernel);
  ~PacedKernel();
  PacedKernel(const PacedKernel&) = delete;
  PacedKernel& operator=(const PacedKernel&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::nanoseconds start_cpu_;
  uint64_t outer_signature_;
};

// Adds an operand (its dtype and shape) to the signature of the kernel running on this thread.
void note_operand(int dtype, const int64_t* shape, int64_t ndim);

// When the current device's queued work ends on the emulated timeline (in the past when it is idle).
std::chrono::steady_clock::time_point device_idle_at();
bool device_busy();
// Sleeps until the current device's queued work has ended.
void wait_for_device();

}  // namespace dipu::host
