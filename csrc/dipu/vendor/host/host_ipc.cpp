// The host vendor's optional memory-sharing ABI (dipu_vendor_ipc.h): handles to device memory
// that other processes open, dma-buf style descriptors, and a count of copies by kind that tests
// use to prove a path made no host staging copy.
#include <atomic>
#include <cstring>

#include "../dipu_vendor_ipc.h"
#include "device_memory.h"
#include "host_ipc.h"

static_assert(sizeof(dipu::host::IpcHandle) <= DIPU_IPC_HANDLE_BYTES, "the host handle must fit dipuIpcMemHandle_t");

namespace dipu::host {
namespace {

std::atomic<uint64_t> copies[3];

dipuError_t refuse(const std::string& why) { return report(dipuErrorInvalidValue, why); }

}  // namespace

void count_copy(dipuMemcpyKind_t kind) {
  if (kind >= dipuMemcpyHostToDevice && kind <= dipuMemcpyDeviceToDevice) copies[kind].fetch_add(1);
}

}  // namespace dipu::host

using dipu::host::DeviceMemory;
using dipu::host::IpcHandle;

extern "C" {

dipuError_t dipuIpcGetMemHandle(dipuIpcMemHandle_t* handle, void* device_ptr, size_t size) {
  if (auto error = dipu::host::initialized()) return error;
  IpcHandle exported{};
  if (std::string why = DeviceMemory::instance().export_range(device_ptr, size, &exported); !why.empty()) {
    return dipu::host::refuse("cannot export device memory: " + why);
  }
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &exported, sizeof(exported));
  return dipuSuccess;
}

dipuError_t dipuIpcOpenMemHandle(void** device_ptr, size_t* size, const dipuIpcMemHandle_t* handle,
                                 int64_t expected_owner) {
  if (auto error = dipu::host::initialized()) return error;
  IpcHandle presented{};
  std::memcpy(&presented, handle->reserved, sizeof(presented));
  if (std::string why = DeviceMemory::instance().open_handle(presented, expected_owner, device_ptr, size);
      !why.empty()) {
    return dipu::host::refuse("refused a device memory handle: " + why);
  }
  return dipuSuccess;
}

dipuError_t dipuIpcCloseMemHandle(void* device_ptr) {
  if (std::string why = DeviceMemory::instance().close_handle(device_ptr); !why.empty()) {
    return dipu::host::refuse(why);
  }
  return dipuSuccess;
}

dipuError_t dipuMemGetDmaBuf(void* device_ptr, size_t size, int* fd, uint64_t* offset) {
  if (auto error = dipu::host::initialized()) return error;
  if (std::string why = DeviceMemory::instance().dma_buf(device_ptr, size, fd, offset); !why.empty()) {
    return dipu::host::refuse("cannot describe device memory for a NIC: " + why);
  }
  return dipuSuccess;
}

// Host vendor only (tests): dipuMemcpy / dipuMemcpyAsync calls so far, by kind.
void dipuHostCopyCounts(uint64_t* host_to_device, uint64_t* device_to_host, uint64_t* device_to_device) {
  *host_to_device = dipu::host::copies[dipuMemcpyHostToDevice].load();
  *device_to_host = dipu::host::copies[dipuMemcpyDeviceToHost].load();
  *device_to_device = dipu::host::copies[dipuMemcpyDeviceToDevice].load();
}

}  // extern "C"
