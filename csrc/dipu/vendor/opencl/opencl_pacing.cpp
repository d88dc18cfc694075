#include "opencl_pacing.h"

#include <algorithm>
#include <thread>

namespace dipu::opencl {
namespace {

// Kernels enqueued ahead of the emulated chip before the host waits for the oldest (a real device's
// launch queue is bounded too), and recent kernels' ends kept for events recorded between them.
constexpr size_t kMaxPending = 1024;
constexpr size_t kKeptEnds = 4096;

cl_ulong profilingTime(cl_event event, cl_profiling_info what, bool* ok) {
  cl_ulong value = 0;
  if (clGetEventProfilingInfo(event, what, sizeof(value), &value, nullptr) != CL_SUCCESS) *ok = false;
  return value;
}

}  // namespace

Pacer::Pacer(double relative_speed, size_t devices) : speed_(relative_speed), lines_(std::max<size_t>(1, devices)) {}

Pacer::Line& Pacer::line(int32_t device) {
  return lines_[static_cast<size_t>(std::clamp<int32_t>(device, 0, static_cast<int32_t>(lines_.size()) - 1))];
}

void Pacer::kernelEnqueued(int32_t device, cl_event event) {
  if (!active() || event == nullptr) return;
  clRetainEvent(event);
  std::lock_guard lock(mutex_);
  Line& l = line(device);
  l.pending.push_back(Pending{event, Clock::now()});
  l.enqueued += 1;
  if (l.pending.size() > kMaxPending) account(l, l.accounted + 1, /*wait=*/true);
}

uint64_t Pacer::enqueued(int32_t device) {
  std::lock_guard lock(mutex_);
  return line(device).enqueued;
}

void Pacer::place(Line& l, const Pending& kernel) {
  bool ok = true;
  cl_ulong queued = profilingTime(kernel.event, CL_PROFILING_COMMAND_QUEUED, &ok);
  cl_ulong start = profilingTime(kernel.event, CL_PROFILING_COMMAND_START, &ok);
  cl_ulong end = profilingTime(kernel.event, CL_PROFILING_COMMAND_END, &ok);
  clReleaseEvent(kernel.event);
  l.accounted += 1;
  if (!ok || end < start || start < queued) {  // no timestamps: the chip takes no time for it
    l.ends.emplace_back(l.accounted, l.idle_at);
    return;
  }
  auto run = std::chrono::nanoseconds(end - start);
  auto emulated = std::chrono::duration_cast<Clock::duration>(run / speed_);
  l.idle_at = std::max(l.idle_at, kernel.enqueued) + emulated;
  // Device timestamps count from the enqueue; the host's clock placed that moment at kernel.enqueued.
  Clock::time_point finished = kernel.enqueued + std::chrono::nanoseconds(end - queued);
  totals_.kernels += 1;
  totals_.emulated_s += std::chrono::duration<double>(emulated).count();
  totals_.run_s += std::chrono::duration<double>(run).count();
  if (finished > l.idle_at) {
    totals_.late_kernels += 1;
    totals_.overrun_s += std::chrono::duration<double>(finished - l.idle_at).count();
  }
  l.ends.emplace_back(l.accounted, l.idle_at);
  if (l.ends.size() > kKeptEnds) l.ends.pop_front();
}

bool Pacer::account(Line& l, uint64_t count, bool wait) {
  while (l.accounted < count && !l.pending.empty()) {
    Pending kernel = l.pending.front();
    if (wait) {
      clWaitForEvents(1, &kernel.event);
    } else {
      cl_int state = CL_QUEUED;
      clGetEventInfo(kernel.event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(state), &state, nullptr);
      if (state > CL_COMPLETE) return false;  // queued, submitted or running
    }
    l.pending.pop_front();
    place(l, kernel);
  }
  return true;
}

bool Pacer::endOf(int32_t device, uint64_t count, bool wait, Clock::time_point* end) {
  std::lock_guard lock(mutex_);
  Line& l = line(device);
  if (!account(l, count, wait)) return false;
  *end = Clock::time_point{};  // no kernel, or one so old that its end has passed
  auto it = std::lower_bound(l.ends.begin(), l.ends.end(), count,
                             [](const auto& entry, uint64_t wanted) { return entry.first < wanted; });
  if (it != l.ends.end() && it->first == count) *end = it->second;
  return true;
}

void Pacer::waitForDevice(int32_t device) {
  if (!active()) return;
  Clock::time_point until;
  {
    std::lock_guard lock(mutex_);
    Line& l = line(device);
    account(l, l.enqueued, /*wait=*/true);
    until = l.idle_at;
  }
  std::this_thread::sleep_until(until);
}

bool Pacer::busy(int32_t device) {
  if (!active()) return false;
  std::lock_guard lock(mutex_);
  Line& l = line(device);
  return !account(l, l.enqueued, /*wait=*/false) || l.idle_at > Clock::now();
}

PacingTotals Pacer::totals() {
  std::lock_guard lock(mutex_);
  for (Line& l : lines_) account(l, l.enqueued, /*wait=*/false);  // what the device has finished so far
  return totals_;
}

}  // namespace dipu::opencl
