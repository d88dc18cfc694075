#include "host_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace dipu::host {
namespace {

uint64_t meminfo_bytes(const std::string& field) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.compare(0, field.size() + 1, field + ":") != 0) continue;
    std::istringstream fields(line.substr(field.size() + 1));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return 0;
}

}  // namespace

uint64_t host_memory_available_bytes() { return meminfo_bytes("MemAvailable"); }

uint64_t host_memory_total_bytes() { return meminfo_bytes("MemTotal"); }

std::string format_gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / double(1ull << 30));
  return text;
}

}  // namespace dipu::host
