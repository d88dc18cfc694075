// What the host vendor's memory-sharing entry points (host_ipc.cpp) share with its runtime
// (host_vendor.cpp): error reporting, start-up, and the count of copies by kind.
#pragma once

#include <string>

#include "../dipu_vendor.h"

namespace dipu::host {

// Records `message` as the calling thread's last error and returns `error`.
dipuError_t report(dipuError_t error, const std::string& message);
// dipuSuccess once the profile is loaded, else the profile's error.
dipuError_t initialized();
// Counts one dipuMemcpy / dipuMemcpyAsync call of `kind` (dipuHostCopyCounts reads the counts).
void count_copy(dipuMemcpyKind_t kind);

}  // namespace dipu::host
