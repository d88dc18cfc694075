// The device caching allocator: blocks come from the vendor's dipuMalloc, are rounded up to
// kBlockGranularity bytes, and return to a per-device cache of equal-size blocks when freed.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

namespace dipu {

constexpr size_t kBlockGranularity = 512;

c10::CachingDeviceAllocator::DeviceStats device_memory_stats(c10::DeviceIndex device);
void reset_peak_memory_stats(c10::DeviceIndex device);
void empty_cache();
c10::Allocator* device_allocator();
// Grows or shrinks a device storage to new_bytes, keeping its leading bytes.
void resize_device_storage(const c10::Storage& storage, size_t new_bytes);

}  // namespace dipu
