#include "dicomm/device_memory.h"

#include <stdexcept>

#include "dicomm/request.h"

namespace dicomm {

DeviceMemory::DeviceMemory(const dicomm_device_memory_functions& functions) : functions_(functions) {
  if (!functions_.export_region || !functions_.open_region || !functions_.close_region || !functions_.copy ||
      !functions_.last_error) {
    throw std::invalid_argument("device memory functions need export, open, close, copy and last_error");
  }
}

std::string DeviceMemory::lastError() const {
  const char* text = functions_.last_error();
  return text && *text ? text : "no reason given";
}

std::shared_ptr<const DeviceMemory> DeviceMemory::fromAddresses(const std::map<std::string, uintptr_t>& addresses) {
  auto address = [&](const char* name) {
    auto found = addresses.find(name);
    if (found == addresses.end() || found->second == 0) {
      throw std::invalid_argument(std::string("device memory functions lack '") + name + "'");
    }
    return found->second;
  };
  dicomm_device_memory_functions functions{};
  functions.export_region = reinterpret_cast<dicomm_export_fn>(address("export"));
  functions.open_region = reinterpret_cast<dicomm_open_fn>(address("open"));
  functions.close_region = reinterpret_cast<dicomm_close_fn>(address("close"));
  functions.copy = reinterpret_cast<dicomm_copy_fn>(address("copy"));
  functions.last_error = reinterpret_cast<dicomm_last_error_fn>(address("last_error"));
  return std::make_shared<const DeviceMemory>(functions);
}

dicomm_region_handle DeviceMemory::exportRegion(void* device_ptr, size_t bytes) const {
  dicomm_region_handle handle{};
  if (functions_.export_region(&handle, device_ptr, bytes) != 0) {
    throw CommError("cannot register " + std::to_string(bytes) + " bytes of device memory: " + lastError());
  }
  return handle;
}

std::unique_ptr<DeviceMemory::OpenRegion> DeviceMemory::open(const dicomm_region_handle& handle,
                                                             int64_t owner_pid) const {
  void* device_ptr = nullptr;
  size_t bytes = 0;
  if (functions_.open_region(&device_ptr, &bytes, &handle, owner_pid) != 0) throw CommError(lastError());
  return std::make_unique<OpenRegion>(*this, device_ptr, bytes);
}

void DeviceMemory::copy(void* dst, const void* src, size_t bytes, CopyKind kind) const {
  if (bytes && functions_.copy(dst, src, bytes, int(kind)) != 0) {
    throw CommError("device memory copy of " + std::to_string(bytes) + " bytes failed: " + lastError());
  }
}

DeviceMemory::OpenRegion::OpenRegion(const DeviceMemory& memory, void* device_ptr, size_t bytes)
    : memory_(memory), device_ptr_(device_ptr), bytes_(bytes) {}

DeviceMemory::OpenRegion::~OpenRegion() { memory_.functions_.close_region(device_ptr_); }

}  // namespace dicomm
