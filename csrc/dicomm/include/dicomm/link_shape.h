// An emulated link's parameters: bandwidth and one-way latency (shaping.h applies them).
#pragma once

#include <limits>
#include <string>

namespace dicomm {

struct LinkShape {
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();  // infinity: not limited
  double latency_s = 0.0;                                                  // one way

  bool shaped() const;
  // Throws std::invalid_argument naming `what` when the bandwidth is not positive or the latency negative.
  void validate(const std::string& what) const;
};

}  // namespace dicomm
