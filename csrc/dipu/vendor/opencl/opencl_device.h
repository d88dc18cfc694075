// The OpenCL vendor's devices and memory, shared by its runtime ABI (opencl_vendor.cpp) and its
// DIOPI kernels (ops/). Devices come from the ICD loader: the platform and device chosen by
// DIPU_OPENCL_PLATFORM / DIPU_OPENCL_DEVICE (an index or a name substring; unset: the first platform
// with a device, all of its devices). Each device has one context and an in-order default queue;
// streams are further in-order queues of that context.
//
// Device memory: every dipuMalloc is one cl_mem buffer, handed out at a fake address inside a
// PROT_NONE reservation (so a stray CPU access faults instead of reading garbage). A device address
// anywhere inside an allocation resolves to (buffer, byte offset), which is how views and strided
// tensors reach kernels and copies.
//
// An emulated chip (docs/emulation.md) on an OpenCL device: DIPU_OPENCL_MEMORY_CAPACITY (bytes) caps
// every device's memory below its own, and DIPU_OPENCL_RELATIVE_SPEED (in (0, 1]) paces its kernels
// to that fraction of the device's speed (opencl_pacing.h).
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "../dipu_vendor.h"
#include "opencl_pacing.h"

struct dipuStream_st {
  int32_t device;
  cl_command_queue queue;
};

struct dipuEvent_st {
  int32_t device = -1;
  cl_event event = nullptr;  // the marker of the last record, or null before any
  uint64_t kernels = 0;      // kernels enqueued on the device before the record (the emulated clock's)
  std::chrono::steady_clock::time_point recorded_at{};
};

namespace dipu::opencl {

struct Device {
  cl_platform_id platform = nullptr;
  cl_device_id id = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;  // the default stream (NULL dipuStream_t)
  std::string name;
  std::string platform_name;
  std::string platform_version;
  std::string driver_version;
  std::string device_version;
  std::string c_version;
  uint64_t global_memory = 0;
  uint64_t capacity = 0;  // what dipuMalloc hands out in all: global_memory, or the emulated chip's memory
  uint64_t max_allocation = 0;
  int32_t compute_units = 0;
  bool host_unified = false;
};

// Where a device address lies: the buffer holding it and the byte offset into that buffer.
struct Location {
  cl_mem buffer = nullptr;
  size_t offset = 0;
  size_t room = 0;  // bytes from the address to the end of its allocation
  int32_t device = -1;
};

// The devices, opened once per process. error() is "" on success, else one line naming the setting.
class Runtime {
 public:
  static Runtime& instance();

  const std::string& error() const { return error_; }
  int32_t deviceCount() const { return static_cast<int32_t>(devices_.size()); }
  const Device& device(int32_t index) const { return devices_[static_cast<size_t>(index)]; }

  // nullptr and `why` set when the device's capacity or the driver refuses.
  void* allocate(int32_t device, size_t size, std::string* why);
  bool release(void* ptr);
  // false when [ptr, ptr + size) is not inside one allocation.
  bool locate(const void* ptr, size_t size, Location* where) const;
  uint64_t used(int32_t device) const;
  // The emulated chip's speed as a fraction of the device's (1: not emulated) and its clock.
  double relativeSpeed() const { return relative_speed_; }
  Pacer& pacer() { return *pacer_; }

  // The queues of a device (its default one and every live stream), to finish before a synchronous
  // operation as CUDA's legacy default stream does.
  void addStream(dipuStream_t stream);
  void removeStream(dipuStream_t stream);
  cl_int finishDevice(int32_t device) const;
  // The last command enqueued on `queue` (the caller's reference passes to the runtime), so that
  // queueIdle can tell an idle queue from a busy one (OpenCL has no query for a queue).
  void noteCommand(cl_command_queue queue, cl_event event);
  // The same for a kernel of a DIOPI operator on `device`, which the emulated chip's clock paces.
  void noteKernel(int32_t device, cl_command_queue queue, cl_event event);
  bool queueIdle(cl_command_queue queue) const;
  cl_command_queue queueOf(int32_t device, dipuStream_t stream) const;

 private:
  Runtime();
  void open();
  void emulate();
  void reserveAddresses();

  std::string error_;
  double relative_speed_ = 1.0;
  std::unique_ptr<Pacer> pacer_;
  std::vector<Device> devices_;
  mutable std::mutex mutex_;
  struct Block {
    size_t size;
    cl_mem buffer;
    int32_t device;
  };
  std::map<uintptr_t, Block> blocks_;
  std::map<uintptr_t, size_t> free_ranges_;  // fake address ranges not handed out (start -> size)
  std::vector<uint64_t> used_;
  std::set<dipuStream_t> streams_;
  std::map<cl_command_queue, cl_event> last_command_;
  uintptr_t reserved_base_ = 0;
  size_t reserved_size_ = 0;
};

std::string clErrorName(cl_int code);
int32_t& currentDevice();
std::string& lastErrorMessage();

}  // namespace dipu::opencl
