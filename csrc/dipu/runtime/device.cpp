#include "device.h"

#include <mutex>
#include <vector>

#include <c10/util/Exception.h>

namespace dipu {
namespace {

thread_local c10::DeviceIndex thread_device = 0;
// Whether this thread has told the vendor its device: a vendor's current device starts at its own
// device 0, which is not the process's device 0 when visible devices are mapped.
thread_local bool thread_device_told = false;
thread_local std::vector<c10::StreamId> thread_current_streams;

std::mutex streams_mutex;
std::vector<std::vector<dipuStream_t>> created_streams;  // [device][id - 1]

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

}  // namespace

c10::DeviceIndex device_count() {
  static const c10::DeviceIndex count = [] {
    int32_t n = 0;
    DIPU_CHECK(vendor().device_count(&n));
    return static_cast<c10::DeviceIndex>(n);
  }();
  return count;
}

void check_device(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < device_count(), "dipu device ", static_cast<int>(device),
              " does not exist (device count ", static_cast<int>(device_count()), ")");
}

c10::DeviceIndex current_device() {
  if (!thread_device_told && vendor_loaded()) set_device(thread_device);
  return thread_device;
}

void set_device(c10::DeviceIndex device) {
  check_device(device);
  if (device == thread_device && thread_device_told) return;
  DIPU_CHECK(vendor().set_device(device));
  thread_device = device;
  thread_device_told = true;
}

void synchronize_device(c10::DeviceIndex device) {
  c10::DeviceIndex previous = current_device();
  set_device(device);
  DIPU_CHECK(vendor().device_synchronize());
  set_device(previous);
}

c10::Stream default_stream(c10::DeviceIndex device) {
  check_device(device);
  return make_stream(device, 0);
}

c10::Stream current_stream(c10::DeviceIndex device) {
  check_device(device);
  if (thread_current_streams.size() <= static_cast<size_t>(device)) return make_stream(device, 0);
  return make_stream(device, thread_current_streams[device]);
}

c10::Stream exchange_stream(c10::Stream stream) {
  c10::Stream previous = current_stream(stream.device_index());
  if (thread_current_streams.size() < static_cast<size_t>(device_count())) {
    thread_current_streams.resize(device_count(), 0);
  }
  thread_current_streams[stream.device_index()] = stream.id();
  return previous;
}

c10::Stream create_stream(c10::DeviceIndex device) {
  check_device(device);
  c10::DeviceIndex previous = current_device();
  set_device(device);
  dipuStream_t handle = nullptr;
  DIPU_CHECK(vendor().stream_create(&handle));
  set_device(previous);
  std::lock_guard lock(streams_mutex);
  if (created_streams.size() < static_cast<size_t>(device_count())) created_streams.resize(device_count());
  created_streams[device].push_back(handle);
  return make_stream(device, static_cast<c10::StreamId>(created_streams[device].size()));
}

dipuStream_t vendor_stream(c10::Stream stream) {
  if (stream.id() == 0) return nullptr;
  std::lock_guard lock(streams_mutex);
  return created_streams.at(stream.device_index()).at(stream.id() - 1);
}

}  // namespace dipu
