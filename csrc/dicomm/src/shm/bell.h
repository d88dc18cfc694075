// A process's doorbell in shared memory: its shm progress thread sleeps on it (a shared futex)
// when idle, and peers ring it after writing a frame, but only while it is parked.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>

namespace dicomm {

struct alignas(64) Bell {
  alignas(64) std::atomic<uint32_t> rings;
  alignas(64) std::atomic<uint32_t> parked;
};

constexpr size_t kBellSegmentBytes = 4096;

inline void ringBell(Bell* bell) {
  if (bell->parked.load(std::memory_order_seq_cst) == 0) return;
  bell->rings.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell->rings), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

inline void sleepOnBell(Bell* bell, uint32_t observed_rings, long timeout_ns) {
  timespec ts{timeout_ns / 1000000000L, timeout_ns % 1000000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell->rings), FUTEX_WAIT, observed_rings, &ts, nullptr, 0);
}

}  // namespace dicomm
