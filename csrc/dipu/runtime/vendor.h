// The loaded vendor runtime: a shared library implementing dipu_vendor.h, opened at run time.
#pragma once

#include <string>
#include <vector>

#include "vendor/dipu_vendor.h"

namespace dipu {

struct VendorApi {
  decltype(&dipuVendorName) vendor_name;
  decltype(&dipuVendorAbiVersion) abi_version;
  decltype(&dipuGetErrorString) error_string;
  decltype(&dipuGetLastErrorMessage) last_error_message;
  decltype(&dipuGetDeviceCount) device_count;
  decltype(&dipuSetDevice) set_device;
  decltype(&dipuGetDevice) get_device;
  decltype(&dipuGetDeviceProperties) device_properties;
  decltype(&dipuMemGetInfo) mem_get_info;
  decltype(&dipuDeviceSynchronize) device_synchronize;
  decltype(&dipuMalloc) malloc;
  decltype(&dipuFree) free;
  decltype(&dipuMallocHost) malloc_host;
  decltype(&dipuFreeHost) free_host;
  decltype(&dipuIsPinnedHostPointer) is_pinned_host_pointer;
  decltype(&dipuMemset) memset;
  decltype(&dipuMemcpy) memcpy;
  decltype(&dipuMemcpyAsync) memcpy_async;
  decltype(&dipuStreamCreate) stream_create;
  decltype(&dipuStreamDestroy) stream_destroy;
  decltype(&dipuStreamSynchronize) stream_synchronize;
  decltype(&dipuStreamQuery) stream_query;
  decltype(&dipuStreamWaitEvent) stream_wait_event;
  decltype(&dipuEventCreate) event_create;
  decltype(&dipuEventDestroy) event_destroy;
  decltype(&dipuEventRecord) event_record;
  decltype(&dipuEventSynchronize) event_synchronize;
  decltype(&dipuEventQuery) event_query;
  decltype(&dipuEventElapsedTime) event_elapsed_time;
};

// Chooses the library the first use of the device will open (Python sets it at import from
// DIPU_VENDOR). Fails once a vendor is loaded.
void set_vendor_path(const std::string& path);
// Which vendor devices the process sees, in order (visible device i is vendor device indices[i]);
// Python sets it at import from DIPU_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES. Fails once a vendor is
// loaded; an index the vendor lacks fails when it opens.
void set_visible_devices(const std::vector<int32_t>& indices);
// Opens the chosen library now if not done yet; returns its runtime API.
const VendorApi& vendor();
bool vendor_loaded();
// True in a child forked after the device was first used; vendor() refuses such a child.
bool in_bad_fork();
const std::string& vendor_path();
// The vendor's export of a DIOPI function, or nullptr when it does not implement it.
void* vendor_symbol(const char* name);
// Whether the CPU may dereference this vendor's device memory (cached device 0 property).
bool host_accessible();

// Throws a c10::Error naming the call and the vendor's explanation when error != dipuSuccess.
void check(dipuError_t error, const char* call);

}  // namespace dipu

#define DIPU_CHECK(expression) ::dipu::check((expression), #expression)
