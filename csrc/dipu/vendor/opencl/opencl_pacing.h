// The emulated chip's clock on an OpenCL device (DIPU_OPENCL_RELATIVE_SPEED below 1; docs/emulation.md).
// The device runs every kernel at its own speed; the emulated chip is busy for the kernel's run time on
// the device (its profiling START..END) divided by the relative speed, starting when the host enqueued
// it or when the chip's previous work ends, whichever is later. The host waits for that timeline where a
// real host waits for its device (device and stream synchronisation, a copy to host memory, an event),
// as the host vendor's clock does (vendor/host/host_device.h, where the work is the kernel thread's CPU
// time). A kernel the device finished after its emulated end (it waited on the device longer than the
// slack (1/speed - 1) x its run time) is counted late, with its overrun. The run time is the device's
// wall time (OpenCL reports no CPU time): on a device made of the host's own cores (pocl) the host's load
// lengthens it, and so the emulated time, without any kernel counted late. Changing this rule changes
// h2.core.emulation.PACING_REVISION (profiles measured before are stale).
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

namespace dipu::opencl {

struct PacingTotals {
  uint64_t kernels = 0;
  uint64_t late_kernels = 0;
  double emulated_s = 0.0;
  double overrun_s = 0.0;
  double run_s = 0.0;  // the device's own run time of the paced kernels (emulated_s x relative speed)
};

class Pacer {
 public:
  using Clock = std::chrono::steady_clock;

  Pacer(double relative_speed, size_t devices);
  bool active() const { return speed_ < 1.0; }

  // A kernel just enqueued on `device`; takes a reference of its own to `event`.
  void kernelEnqueued(int32_t device, cl_event event);
  // How many kernels have been enqueued on `device` so far (an event records it).
  uint64_t enqueued(int32_t device);
  // When the emulated chip ends the first `count` kernels of `device`. wait: waits on the device for
  // them; otherwise false when one of them has not finished on the device yet.
  bool endOf(int32_t device, uint64_t count, bool wait, Clock::time_point* end);
  // Sleeps until the emulated chip has done every kernel enqueued on `device` so far.
  void waitForDevice(int32_t device);
  // Whether the emulated chip is still busy with the kernels of `device` (or the device itself is).
  bool busy(int32_t device);
  // The kernels the device has finished so far, on the timeline.
  PacingTotals totals();

 private:
  struct Pending {
    cl_event event;
    Clock::time_point enqueued;
  };
  struct Line {
    std::deque<Pending> pending;                              // enqueued, not yet on the timeline
    std::deque<std::pair<uint64_t, Clock::time_point>> ends;  // recent kernels' emulated ends, by count
    Clock::time_point idle_at{};
    uint64_t enqueued = 0;
    uint64_t accounted = 0;
  };
  // Puts kernels of `line` on the timeline until `count` are; false when one has not finished and
  // !wait. The caller holds mutex_.
  bool account(Line& line, uint64_t count, bool wait);
  void place(Line& line, const Pending& kernel);
  Line& line(int32_t device);

  double speed_;
  std::mutex mutex_;
  std::vector<Line> lines_;
  PacingTotals totals_;
};

}  // namespace dipu::opencl
