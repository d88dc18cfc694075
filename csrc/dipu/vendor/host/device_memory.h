// Device memory of the host vendor. Each device's allocations are carved out of one arena (an
// anonymous memory file, arena.h), so another process can map them through a handle. Devices that
// are not host-accessible hand out addresses of a PROT_NONE mapping, so any direct CPU access
// faults; the vendor's own copies and kernels use a second, read-write mapping. Handles from other
// processes are opened here too (imported ranges), after checking them against the owner's table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "arena.h"

namespace dipu::host {

// What a handle carries (the host vendor's layout of dipuIpcMemHandle_t; it fits in 64 bytes).
struct IpcHandle {
  uint32_t magic;
  uint32_t version;
  int64_t owner_pid;
  int32_t arena_fd;  // the descriptor number in the owner process
  uint32_t slot;
  uint64_t arena_nonce;
  uint64_t generation;
  uint64_t offset;  // from the start of the arena file
  uint64_t size;
};

class DeviceMemory {
 public:
  static DeviceMemory& instance();

  void configure(int32_t device_count, uint64_t capacity, bool host_accessible);
  // Returns nullptr, and says why in `why`, when the device's capacity would be exceeded or the
  // host could not back the allocation (host_memory.h).
  void* allocate(int32_t device, size_t size, std::string* why);
  // Returns false when ptr is not the start of a live allocation.
  bool release(void* ptr);
  // The address the vendor reads and writes for device address ptr; nullptr if ptr is not in
  // device memory (an allocation of this process or an opened handle).
  void* vendor_view(const void* ptr) const;
  // The same, for [ptr, ptr + size), which must lie inside one allocation or opened range.
  void* vendor_view(const void* ptr, size_t size) const;
  // The device owning ptr, or -1.
  int32_t device_of(const void* ptr) const;
  uint64_t used(int32_t device) const;
  uint64_t capacity() const { return capacity_; }
  // What the device could still allocate: its capacity left, bounded by the host memory that can
  // back new allocations (available, less earlier allocations not yet touched).
  uint64_t free_bytes(int32_t device) const;

  // Each returns "" on success, else why not (one line).
  std::string export_range(const void* ptr, size_t size, IpcHandle* handle);
  std::string open_handle(const IpcHandle& handle, int64_t expected_owner, void** ptr, size_t* size);
  std::string close_handle(void* ptr);
  std::string dma_buf(const void* ptr, size_t size, int* fd, uint64_t* offset);

 private:
  struct Block {
    size_t size;
    char* vendor_base;
    int32_t device;
    Arena* arena;                  // owned allocations only
    Arena::Allocation allocation;  // owned allocations only
    int opened = 0;                // > 0: an opened handle's range, counted per open
  };
  const Block* find(const void* ptr, uintptr_t* base) const;
  Arena& arena(int32_t device);
  // Host memory a new allocation can count on, or UINT64_MAX when /proc/meminfo cannot be read.
  uint64_t host_backing_left() const;
  std::string attach(const IpcHandle& handle, Arena** arena);

  mutable std::shared_mutex mutex_;
  std::map<uintptr_t, Block> blocks_;
  std::vector<uint64_t> used_;
  std::vector<std::unique_ptr<Arena>> arenas_;                               // per device, created at first use
  std::map<std::pair<int64_t, uint64_t>, std::unique_ptr<Arena>> attached_;  // (owner pid, nonce)
  uint64_t capacity_ = 0;
  bool host_accessible_ = true;
};

}  // namespace dipu::host
