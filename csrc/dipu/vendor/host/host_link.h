// The emulated link between host memory and device memory (PCIe on a discrete chip). The host
// vendor copies with memmove, which takes a fraction of a microsecond for small sizes; a real
// discrete chip pays the link's latency and bandwidth on every copy. A profile that declares
// host_link_gbps makes each copy across the link take
//     host_link_latency_us + bytes / host_link_gbps
// from its start: a synchronous copy returns no earlier than that, an asynchronous one occupies a
// timeline of the device for that long (a copy engine on a created stream, the compute engine on the
// default stream; host_vendor.cpp), and a later synchronisation waits for it. The time is measured from
// the copy's start, so it depends on the profile, not on how long the host took to do the memmove
// (unless the host was slower than the emulated link).
#pragma once

#include <chrono>
#include <cstddef>

#include "host_profile.h"

namespace dipu::host {

class HostLink {
 public:
  explicit HostLink(const Profile& profile);
  bool emulated() const { return bytes_per_second_ > 0; }
  std::chrono::nanoseconds cost(size_t bytes) const;
  // Returns when a copy of `bytes` started at `start` has crossed the link.
  void finish_copy(std::chrono::steady_clock::time_point start, size_t bytes) const;

 private:
  double bytes_per_second_ = 0;
  std::chrono::nanoseconds latency_{0};
};

// Waits until `deadline` with microsecond precision: sleeps while far from it, yields the core
// for the last stretch (a sleep alone overshoots by the timer slack).
void wait_until(std::chrono::steady_clock::time_point deadline);

}  // namespace dipu::host
