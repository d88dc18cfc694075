// The OpenCL vendor's kernels: one program per device (kernels.cl.inc), built at the first DIOPI
// call and kept as a program binary on disk, keyed by the device, driver and source, so later
// processes skip the compiler (pocl takes ~10 s per program on this machine). The cache folder is
// DIPU_OPENCL_CACHE_DIR, else $XDG_CACHE_HOME/h2/opencl, else ~/.cache/h2/opencl.
#pragma once

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "vendor/opencl/opencl_device.h"

namespace dipu::opencl {

// A DIOPI call the vendor declines before writing anything: the shim runs it on the CPU.
struct Decline : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void checkCl(cl_int status, const char* what);

// The kernel `name` of the device's program (built or loaded on first use).
cl_kernel kernel(int32_t device, const char* name);
// A 64-byte buffer of the device for operands a kernel does not read.
cl_mem placeholder(int32_t device);
// Where the program binary of the device lives (for tests and `ditorch info`).
std::string programCachePath(int32_t device);
// Serialises setting a kernel's arguments and enqueueing it (kernel objects are shared).
std::mutex& launchMutex();

template <typename T>
void setArg(cl_kernel k, cl_uint index, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  checkCl(clSetKernelArg(k, index, sizeof(T), &value), "clSetKernelArg");
}

// Enqueues kernel `name` over `items` work items (none: nothing enqueued) with the given arguments.
template <typename... Args>
void launch(int32_t device, cl_command_queue queue, const char* name, size_t items, const Args&... args) {
  if (items == 0) return;
  cl_kernel k = kernel(device, name);
  std::lock_guard lock(launchMutex());
  cl_uint index = 0;
  (setArg(k, index++, args), ...);
  size_t global = items;
  cl_event done = nullptr;
  checkCl(clEnqueueNDRangeKernel(queue, k, 1, nullptr, &global, nullptr, 0, nullptr, &done), name);
  Runtime::instance().noteKernel(device, queue, done);
}

}  // namespace dipu::opencl
