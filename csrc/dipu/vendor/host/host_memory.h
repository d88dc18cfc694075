// What the host can give the emulated devices: their memory lives in host memory (arena.h), so an
// allocation the host cannot back would end in the kernel's OOM killer when it is first touched,
// not in a clean out-of-memory error. Read from /proc/meminfo; 0 when it cannot be read.
#pragma once

#include <cstdint>
#include <string>

namespace dipu::host {

uint64_t host_memory_available_bytes();  // MemAvailable
uint64_t host_memory_total_bytes();      // MemTotal
std::string format_gib(uint64_t bytes);  // "23.41 GiB"

}  // namespace dipu::host
