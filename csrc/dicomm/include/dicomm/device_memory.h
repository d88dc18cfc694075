// How DiComm reaches a vendor's device memory without staging it through host memory: a small C
// ABI that DiComm declares and a device's vendor implements. DiComm never links or includes a
// vendor: whoever knows the vendor (for dipu, ditorch announcing it through h2.core.devices) hands
// DiComm the addresses of five functions with these shapes, and the engine calls them.
//
// - export: a handle (64 opaque bytes) naming [device_ptr, device_ptr + bytes) of memory this
//   process allocated, which a process on the same host can open.
// - open: opens a handle presented by process `owner_pid`; the vendor refuses (non-zero, one-line
//   last_error) a handle that process does not own, one to freed memory, or one whose range lies
//   outside its allocation. *device_ptr then addresses the range here; *bytes is its length.
// - close: undoes one open.
// - copy: copies `bytes` (kind: 0 host->device, 1 device->host, 2 device->device); device
//   pointers may be opened ones, and a copy outside one allocation or opened range is refused.
// - last_error: the calling thread's last failure, one line.
// Every function but last_error returns 0 on success. DIPU's dipuIpcGetMemHandle,
// dipuIpcOpenMemHandle, dipuIpcCloseMemHandle, dipuMemcpy and dipuGetLastErrorMessage have
// exactly these shapes (csrc/dipu/vendor/dipu_vendor_ipc.h).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <memory>
#include <string>

extern "C" {

#define DICOMM_REGION_HANDLE_BYTES 64

typedef struct {
  uint8_t bytes[DICOMM_REGION_HANDLE_BYTES];
} dicomm_region_handle;

typedef int (*dicomm_export_fn)(dicomm_region_handle* handle, void* device_ptr, size_t bytes);
typedef int (*dicomm_open_fn)(void** device_ptr, size_t* bytes, const dicomm_region_handle* handle, int64_t owner_pid);
typedef int (*dicomm_close_fn)(void* device_ptr);
typedef int (*dicomm_copy_fn)(void* dst, const void* src, size_t bytes, int kind);
typedef const char* (*dicomm_last_error_fn)(void);

typedef struct {
  dicomm_export_fn export_region;
  dicomm_open_fn open_region;
  dicomm_close_fn close_region;
  dicomm_copy_fn copy;
  dicomm_last_error_fn last_error;
} dicomm_device_memory_functions;

}  // extern "C"

namespace dicomm {

enum class CopyKind : int { HostToDevice = 0, DeviceToHost = 1, DeviceToDevice = 2 };

// The functions above, with failures as CommError (one line naming the step and the vendor's reason).
class DeviceMemory {
 public:
  // Throws std::invalid_argument when a function is missing.
  explicit DeviceMemory(const dicomm_device_memory_functions& functions);
  // From function addresses by name ("export", "open", "close", "copy", "last_error"), as a
  // language binding receives them; throws std::invalid_argument naming a missing one.
  static std::shared_ptr<const DeviceMemory> fromAddresses(const std::map<std::string, uintptr_t>& addresses);

  dicomm_region_handle exportRegion(void* device_ptr, size_t bytes) const;

  // A peer's region, opened for as long as this object lives.
  class OpenRegion {
   public:
    OpenRegion(const DeviceMemory& memory, void* device_ptr, size_t bytes);
    ~OpenRegion();
    OpenRegion(const OpenRegion&) = delete;
    OpenRegion& operator=(const OpenRegion&) = delete;
    void* data() const { return device_ptr_; }
    size_t bytes() const { return bytes_; }

   private:
    const DeviceMemory& memory_;
    void* device_ptr_;
    size_t bytes_;
  };
  // Opens a region presented by process `owner_pid`; refused handles throw CommError.
  std::unique_ptr<OpenRegion> open(const dicomm_region_handle& handle, int64_t owner_pid) const;
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind) const;

 private:
  std::string lastError() const;

  dicomm_device_memory_functions functions_;
};

}  // namespace dicomm
