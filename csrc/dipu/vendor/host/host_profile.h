// The chip a host vendor emulates: read from DIPU_HOST_PROFILE (a built-in profile name or a
// YAML file path). Built-in profiles are YAML files installed in host_profiles/ next to the
// vendor library.
#pragma once

#include <cstdint>
#include <set>
#include <string>

namespace dipu::host {

struct Profile {
  std::string name = "default";
  std::string description;
  int32_t device_count = 2;
  uint64_t memory_capacity = 16ull << 30;
  double relative_speed = 1.0;  // kernels take (1 / relative_speed) times the host's time
  bool host_accessible = true;
  // DIOPI functions whose floating-point outputs are rounded to round_output_mantissa_bits.
  std::set<std::string> round_output_ops;
  int32_t round_output_mantissa_bits = 23;
  // The emulated link between host memory and this chip's memory (PCIe on a discrete card): a copy
  // across it (host<->device, or device<->device with another process's memory opened through a
  // handle) costs host_link_latency_us plus bytes / host_link_gbps. 0 GB/s: no link is emulated and
  // a copy costs what the host's memmove costs.
  double host_link_gbps = 0;
  double host_link_latency_us = 0;
};

// Reads the profile that DIPU_HOST_PROFILE names; throws std::runtime_error with a one-line
// message naming the file and field when it is malformed.
Profile load_profile_from_environment(const std::string& builtin_profile_dir);
Profile parse_profile_file(const std::string& path);

}  // namespace dipu::host
