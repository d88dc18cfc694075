#include "host_link.h"

#include <sched.h>

#include <thread>

namespace dipu::host {
namespace {

constexpr auto kYieldStretch = std::chrono::microseconds(60);  // above a sleep's usual overshoot

}  // namespace

HostLink::HostLink(const Profile& profile)
    : bytes_per_second_(profile.host_link_gbps * 1e9),
      latency_(std::chrono::nanoseconds(static_cast<int64_t>(profile.host_link_latency_us * 1e3))) {}

std::chrono::nanoseconds HostLink::cost(size_t bytes) const {
  if (!emulated()) return std::chrono::nanoseconds(0);
  return latency_ +
         std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(bytes) / bytes_per_second_ * 1e9));
}

void HostLink::finish_copy(std::chrono::steady_clock::time_point start, size_t bytes) const {
  if (emulated()) wait_until(start + cost(bytes));
}

void wait_until(std::chrono::steady_clock::time_point deadline) {
  auto now = std::chrono::steady_clock::now();
  if (deadline - now > kYieldStretch) std::this_thread::sleep_until(deadline - kYieldStretch);
  while (std::chrono::steady_clock::now() < deadline) sched_yield();
}

}  // namespace dipu::host
