// 64 random bits from the kernel (getrandom); a failed draw is a CommError, never a weak value.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "dicomm/request.h"

namespace dicomm {

inline uint64_t randomWord(const char* what) {
  uint64_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  size_t filled = 0;
  while (filled < sizeof(value)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(value) - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CommError(std::string("cannot draw ") + what + " (getrandom: " + std::strerror(errno) + ")");
    filled += size_t(n);
  }
  return value;
}

}  // namespace dicomm
