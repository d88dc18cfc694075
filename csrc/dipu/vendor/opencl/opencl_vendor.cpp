// The OpenCL vendor: the DIPU vendor runtime ABI over OpenCL 1.2 (opencl_device.h). Streams are
// in-order command queues, events are markers, synchronous copies and memsets first finish every
// queue of the device (as CUDA's legacy default stream orders itself after all blocking streams).
// The memory-sharing entry points (dipu_vendor_ipc.h) are not exported: OpenCL 1.2 has no way to hand
// a cl_mem to another process, so DiComm stages such transfers through host memory. An emulated chip
// (DIPU_OPENCL_RELATIVE_SPEED) makes the host wait for its clock (opencl_pacing.h) at a device or stream
// synchronisation, a copy to host memory and an event, as the host vendor does.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "opencl_device.h"

using dipu::opencl::clErrorName;
using dipu::opencl::currentDevice;
using dipu::opencl::lastErrorMessage;
using dipu::opencl::Location;
using dipu::opencl::Runtime;

namespace {

dipuError_t fail(dipuError_t error, const std::string& message) {
  lastErrorMessage() = message;
  return error;
}

dipuError_t failCl(const char* call, cl_int status) {
  return fail(status == CL_MEM_OBJECT_ALLOCATION_FAILURE || status == CL_OUT_OF_RESOURCES ? dipuErrorOutOfMemory
                                                                                          : dipuErrorUnknown,
              std::string(call) + " failed: " + clErrorName(status));
}

dipuError_t ready() {
  const Runtime& runtime = Runtime::instance();
  return runtime.error().empty() ? dipuSuccess : fail(dipuErrorInitialization, runtime.error());
}

bool validDevice(int32_t device) { return device >= 0 && device < Runtime::instance().deviceCount(); }

std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned_blocks;

bool isPinned(const void* ptr) {
  std::lock_guard lock(pinned_mutex);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = pinned_blocks.upper_bound(address);
  if (it == pinned_blocks.begin()) return false;
  --it;
  return address < it->first + it->second;
}

dipuError_t locate(const void* ptr, size_t size, const char* what, Location* where) {
  if (!Runtime::instance().locate(ptr, size, where)) {
    return fail(dipuErrorInvalidValue, std::string(what) + " is not a device memory range");
  }
  return dipuSuccess;
}

// Enqueues the copy on `queue`; blocking: returns once it is done. Host memory that is not pinned is
// always copied blocking (the caller may free or reuse it as soon as the call returns). A blocking copy
// to host memory also waits for the emulated chip to have produced what it reads.
dipuError_t enqueueCopy(cl_command_queue queue, void* dst, const void* src, size_t size, dipuMemcpyKind_t kind,
                        bool blocking) {
  if (size == 0) return dipuSuccess;
  Location from, to;
  cl_int status = CL_SUCCESS;
  cl_event done = nullptr;
  switch (kind) {
    case dipuMemcpyHostToDevice:
      if (auto error = locate(dst, size, "memcpy destination", &to)) return error;
      blocking = blocking || !isPinned(src);
      status = clEnqueueWriteBuffer(queue, to.buffer, blocking ? CL_TRUE : CL_FALSE, to.offset, size, src, 0, nullptr,
                                    &done);
      break;
    case dipuMemcpyDeviceToHost:
      if (auto error = locate(src, size, "memcpy source", &from)) return error;
      blocking = blocking || !isPinned(dst);
      status = clEnqueueReadBuffer(queue, from.buffer, blocking ? CL_TRUE : CL_FALSE, from.offset, size, dst, 0,
                                   nullptr, &done);
      if (status == CL_SUCCESS && blocking) Runtime::instance().pacer().waitForDevice(from.device);
      break;
    case dipuMemcpyDeviceToDevice:
      if (auto error = locate(src, size, "memcpy source", &from)) return error;
      if (auto error = locate(dst, size, "memcpy destination", &to)) return error;
      if (from.device != to.device) {  // two contexts: through the host
        std::string staged(size, '\0');
        const auto& runtime = Runtime::instance();
        status = clEnqueueReadBuffer(runtime.device(from.device).queue, from.buffer, CL_TRUE, from.offset, size,
                                     staged.data(), 0, nullptr, nullptr);
        if (status == CL_SUCCESS) {
          status = clEnqueueWriteBuffer(runtime.device(to.device).queue, to.buffer, CL_TRUE, to.offset, size,
                                        staged.data(), 0, nullptr, nullptr);
        }
        break;
      }
      status = clEnqueueCopyBuffer(queue, from.buffer, to.buffer, from.offset, to.offset, size, 0, nullptr, &done);
      if (status == CL_SUCCESS && blocking) status = clFinish(queue);
      break;
    default: return fail(dipuErrorInvalidValue, "unknown memcpy kind");
  }
  Runtime::instance().noteCommand(queue, done);
  return status == CL_SUCCESS ? dipuSuccess : failCl("memcpy", status);
}

// When the emulated chip reaches a recorded event: after the kernels enqueued before it (the record
// itself when the chip is not emulated or was idle).
std::chrono::steady_clock::time_point emulatedTime(dipuEvent_t event, bool wait) {
  auto reached = event->recorded_at;
  Runtime::instance().pacer().endOf(event->device, event->kernels, wait, &reached);
  return std::max(reached, event->recorded_at);
}

}  // namespace

extern "C" {

const char* dipuVendorName(void) { return "opencl"; }

int32_t dipuVendorAbiVersion(void) { return DIPU_VENDOR_ABI_VERSION; }

const char* dipuGetErrorString(dipuError_t error) {
  switch (error) {
    case dipuSuccess: return "success";
    case dipuErrorInvalidValue: return "invalid value";
    case dipuErrorInvalidDevice: return "invalid device";
    case dipuErrorOutOfMemory: return "out of device memory";
    case dipuErrorNotReady: return "not ready";
    case dipuErrorInitialization: return "initialization failed";
    default: return "unknown error";
  }
}

const char* dipuGetLastErrorMessage(void) { return lastErrorMessage().c_str(); }

dipuError_t dipuGetDeviceCount(int32_t* count) {
  if (auto error = ready()) return error;
  *count = Runtime::instance().deviceCount();
  return dipuSuccess;
}

dipuError_t dipuSetDevice(int32_t device) {
  if (auto error = ready()) return error;
  if (!validDevice(device)) return fail(dipuErrorInvalidDevice, "no OpenCL device " + std::to_string(device));
  currentDevice() = device;
  return dipuSuccess;
}

dipuError_t dipuGetDevice(int32_t* device) {
  *device = currentDevice();
  return dipuSuccess;
}

dipuError_t dipuGetDeviceProperties(int32_t device, dipuDeviceProperties_t* properties) {
  if (auto error = ready()) return error;
  if (!validDevice(device)) return fail(dipuErrorInvalidDevice, "no OpenCL device " + std::to_string(device));
  const auto& d = Runtime::instance().device(device);
  std::memset(properties, 0, sizeof(*properties));
  std::snprintf(properties->name, sizeof(properties->name), "%s", d.name.c_str());
  properties->total_memory = d.capacity;
  properties->compute_units = d.compute_units;
  properties->host_accessible = 0;  // device addresses are the vendor's own: only its copies reach them
  properties->relative_speed = Runtime::instance().relativeSpeed();
  int major = 1, minor = 2;
  std::sscanf(d.device_version.c_str(), "OpenCL %d.%d", &major, &minor);
  properties->major = major;
  properties->minor = minor;
  return dipuSuccess;
}

// Optional (dipu_vendor.h): a one-line description of the device for `ditorch info`.
dipuError_t dipuGetDeviceDescription(int32_t device, char* text, size_t size) {
  if (auto error = ready()) return error;
  if (!validDevice(device)) return fail(dipuErrorInvalidDevice, "no OpenCL device " + std::to_string(device));
  const auto& d = Runtime::instance().device(device);
  std::snprintf(text, size, "OpenCL platform '%s' (%s), device '%s' (%s, %s), driver %s", d.platform_name.c_str(),
                d.platform_version.c_str(), d.name.c_str(), d.device_version.c_str(), d.c_version.c_str(),
                d.driver_version.c_str());
  return dipuSuccess;
}

dipuError_t dipuMemGetInfo(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  if (auto error = ready()) return error;
  if (!validDevice(device)) return fail(dipuErrorInvalidDevice, "no OpenCL device " + std::to_string(device));
  const auto& runtime = Runtime::instance();
  *total_bytes = runtime.device(device).capacity;
  *free_bytes = *total_bytes - runtime.used(device);
  return dipuSuccess;
}

dipuError_t dipuDeviceSynchronize(void) {
  if (auto error = ready()) return error;
  cl_int status = Runtime::instance().finishDevice(currentDevice());
  if (status != CL_SUCCESS) return failCl("clFinish", status);
  Runtime::instance().pacer().waitForDevice(currentDevice());
  return dipuSuccess;
}

dipuError_t dipuMalloc(void** ptr, size_t size) {
  if (auto error = ready()) return error;
  std::string why;
  *ptr = Runtime::instance().allocate(currentDevice(), size, &why);
  return *ptr == nullptr ? fail(dipuErrorOutOfMemory, why) : dipuSuccess;
}

dipuError_t dipuFree(void* ptr) {
  if (ptr == nullptr) return dipuSuccess;
  if (!Runtime::instance().release(ptr)) return fail(dipuErrorInvalidValue, "free of a non-device pointer");
  return dipuSuccess;
}

dipuError_t dipuMallocHost(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(64, std::max<size_t>(64, (size + 63) / 64 * 64));
  if (*ptr == nullptr) return fail(dipuErrorOutOfMemory, "pinned host allocation failed");
  std::lock_guard lock(pinned_mutex);
  pinned_blocks[reinterpret_cast<uintptr_t>(*ptr)] = size;
  return dipuSuccess;
}

dipuError_t dipuFreeHost(void* ptr) {
  if (ptr == nullptr) return dipuSuccess;
  std::lock_guard lock(pinned_mutex);
  if (pinned_blocks.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return fail(dipuErrorInvalidValue, "free of a non-pinned pointer");
  }
  std::free(ptr);
  return dipuSuccess;
}

int32_t dipuIsPinnedHostPointer(const void* ptr) { return isPinned(ptr) ? 1 : 0; }

dipuError_t dipuMemset(void* device_ptr, int32_t value, size_t size) {
  if (auto error = ready()) return error;
  if (size == 0) return dipuSuccess;
  Location to;
  if (auto error = locate(device_ptr, size, "memset range", &to)) return error;
  Runtime& runtime = Runtime::instance();
  cl_int status = runtime.finishDevice(to.device);
  cl_command_queue queue = runtime.device(to.device).queue;
  auto pattern = static_cast<cl_uchar>(value);
  if (status == CL_SUCCESS) {
    status = clEnqueueFillBuffer(queue, to.buffer, &pattern, 1, to.offset, size, 0, nullptr, nullptr);
  }
  if (status == CL_SUCCESS) status = clFinish(queue);
  return status == CL_SUCCESS ? dipuSuccess : failCl("memset", status);
}

// Synchronous: after the device's queued work, returns when the bytes have arrived.
dipuError_t dipuMemcpy(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind) {
  if (auto error = ready()) return error;
  Runtime& runtime = Runtime::instance();
  int32_t device = currentDevice();
  Location where;
  const void* on_device = kind == dipuMemcpyHostToDevice ? dst : src;
  if (size > 0 && runtime.locate(on_device, size, &where)) device = where.device;
  if (cl_int status = runtime.finishDevice(device); status != CL_SUCCESS) return failCl("clFinish", status);
  if (kind == dipuMemcpyDeviceToDevice && size > 0 && runtime.locate(dst, size, &where) && where.device != device) {
    if (cl_int status = runtime.finishDevice(where.device); status != CL_SUCCESS) return failCl("clFinish", status);
  }
  return enqueueCopy(runtime.device(device).queue, dst, src, size, kind, /*blocking=*/true);
}

dipuError_t dipuMemcpyAsync(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind, dipuStream_t stream) {
  if (auto error = ready()) return error;
  int32_t device = stream != nullptr ? stream->device : currentDevice();
  return enqueueCopy(Runtime::instance().queueOf(device, stream), dst, src, size, kind, /*blocking=*/false);
}

dipuError_t dipuStreamCreate(dipuStream_t* stream) {
  if (auto error = ready()) return error;
  int32_t device = currentDevice();
  const auto& d = Runtime::instance().device(device);
  cl_int status = CL_SUCCESS;
  cl_command_queue queue = clCreateCommandQueue(d.context, d.id, CL_QUEUE_PROFILING_ENABLE, &status);
  if (status != CL_SUCCESS) return failCl("clCreateCommandQueue", status);
  *stream = new dipuStream_st{device, queue};
  Runtime::instance().addStream(*stream);
  return dipuSuccess;
}

dipuError_t dipuStreamDestroy(dipuStream_t stream) {
  if (stream == nullptr) return dipuSuccess;
  Runtime::instance().removeStream(stream);
  clFinish(stream->queue);
  clReleaseCommandQueue(stream->queue);
  delete stream;
  return dipuSuccess;
}

dipuError_t dipuStreamSynchronize(dipuStream_t stream) {
  if (auto error = ready()) return error;
  int32_t device = stream != nullptr ? stream->device : currentDevice();
  cl_int status = clFinish(Runtime::instance().queueOf(device, stream));
  if (status != CL_SUCCESS) return failCl("clFinish", status);
  Runtime::instance().pacer().waitForDevice(device);
  return dipuSuccess;
}

dipuError_t dipuStreamQuery(dipuStream_t stream) {
  if (auto error = ready()) return error;
  int32_t device = stream != nullptr ? stream->device : currentDevice();
  cl_command_queue queue = Runtime::instance().queueOf(device, stream);
  clFlush(queue);
  Runtime& runtime = Runtime::instance();
  return runtime.queueIdle(queue) && !runtime.pacer().busy(device) ? dipuSuccess : dipuErrorNotReady;
}

dipuError_t dipuStreamWaitEvent(dipuStream_t stream, dipuEvent_t event) {
  if (auto error = ready()) return error;
  if (event->event == nullptr) return dipuSuccess;  // never recorded: nothing to wait for
  int32_t device = stream != nullptr ? stream->device : currentDevice();
  cl_int status = CL_SUCCESS;
  if (event->device != device) {  // another context: the host waits
    status = clWaitForEvents(1, &event->event);
  } else {
    cl_command_queue queue = Runtime::instance().queueOf(device, stream);
    cl_event barrier = nullptr;
    status = clEnqueueBarrierWithWaitList(queue, 1, &event->event, &barrier);
    Runtime::instance().noteCommand(queue, barrier);
  }
  return status == CL_SUCCESS ? dipuSuccess : failCl("stream wait", status);
}

dipuError_t dipuEventCreate(dipuEvent_t* event) {
  *event = new dipuEvent_st{};
  return dipuSuccess;
}

dipuError_t dipuEventDestroy(dipuEvent_t event) {
  if (event == nullptr) return dipuSuccess;
  if (event->event != nullptr) clReleaseEvent(event->event);
  delete event;
  return dipuSuccess;
}

dipuError_t dipuEventRecord(dipuEvent_t event, dipuStream_t stream) {
  if (auto error = ready()) return error;
  int32_t device = stream != nullptr ? stream->device : currentDevice();
  cl_command_queue queue = Runtime::instance().queueOf(device, stream);
  cl_event marker = nullptr;
  cl_int status = clEnqueueMarkerWithWaitList(queue, 0, nullptr, &marker);
  if (status != CL_SUCCESS) return failCl("clEnqueueMarkerWithWaitList", status);
  clFlush(queue);
  if (event->event != nullptr) clReleaseEvent(event->event);
  event->event = marker;
  event->device = device;
  event->kernels = Runtime::instance().pacer().enqueued(device);
  event->recorded_at = std::chrono::steady_clock::now();
  return dipuSuccess;
}

dipuError_t dipuEventSynchronize(dipuEvent_t event) {
  if (event->event == nullptr) return dipuSuccess;
  cl_int status = clWaitForEvents(1, &event->event);
  if (status != CL_SUCCESS) return failCl("clWaitForEvents", status);
  std::this_thread::sleep_until(emulatedTime(event, /*wait=*/true));
  return dipuSuccess;
}

dipuError_t dipuEventQuery(dipuEvent_t event) {
  if (event->event == nullptr) return dipuSuccess;
  cl_int state = CL_QUEUED;
  cl_int status = clGetEventInfo(event->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(state), &state, nullptr);
  if (status != CL_SUCCESS) return failCl("clGetEventInfo", status);
  if (state < 0) return fail(dipuErrorUnknown, "the device reported an error before the event: " + clErrorName(state));
  if (state != CL_COMPLETE) return dipuErrorNotReady;
  auto reached = std::chrono::steady_clock::time_point::max();
  Runtime::instance().pacer().endOf(event->device, event->kernels, /*wait=*/false, &reached);
  return std::max(reached, event->recorded_at) > std::chrono::steady_clock::now() ? dipuErrorNotReady : dipuSuccess;
}

dipuError_t dipuEventElapsedTime(float* milliseconds, dipuEvent_t start, dipuEvent_t end) {
  if (start->event == nullptr || end->event == nullptr) return fail(dipuErrorInvalidValue, "event was never recorded");
  if (Runtime::instance().pacer().active()) {  // the emulated chip's time between the two
    auto between = emulatedTime(end, /*wait=*/true) - emulatedTime(start, /*wait=*/true);
    *milliseconds = std::chrono::duration<float, std::milli>(between).count();
    return dipuSuccess;
  }
  cl_event both[] = {start->event, end->event};
  if (cl_int status = clWaitForEvents(2, both); status != CL_SUCCESS) return failCl("clWaitForEvents", status);
  cl_ulong begin_ns = 0, end_ns = 0;
  cl_int status = clGetEventProfilingInfo(start->event, CL_PROFILING_COMMAND_END, sizeof(begin_ns), &begin_ns, nullptr);
  if (status == CL_SUCCESS) {
    status = clGetEventProfilingInfo(end->event, CL_PROFILING_COMMAND_END, sizeof(end_ns), &end_ns, nullptr);
  }
  if (status != CL_SUCCESS) return failCl("clGetEventProfilingInfo", status);
  *milliseconds = static_cast<float>(static_cast<double>(static_cast<int64_t>(end_ns - begin_ns)) * 1e-6);
  return dipuSuccess;
}

// Optional (dipu_vendor.h): the emulated chip's clock, as the host vendor keeps it.
dipuError_t dipuGetPacingStats(dipuPacingStats_t* stats) {
  dipu::opencl::PacingTotals totals = Runtime::instance().pacer().totals();
  stats->kernels = totals.kernels;
  stats->late_kernels = totals.late_kernels;
  stats->emulated_s = totals.emulated_s;
  stats->overrun_s = totals.overrun_s;
  return dipuSuccess;
}

// Optional, this vendor's own: the OpenCL device's run time of the kernels dipuGetPacingStats counts
// (their profiling START..END), which the emulated chip's clock divides by the relative speed.
dipuError_t dipuGetPacedRunTime(double* seconds) {
  *seconds = Runtime::instance().pacer().totals().run_s;
  return dipuSuccess;
}

}  // extern "C"
