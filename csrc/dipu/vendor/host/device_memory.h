// Device memory of the host vendor. Host-accessible devices hand out ordinary host memory. Other
// devices back every allocation with an anonymous file mapped twice: the address handed to the
// framework is mapped PROT_NONE, so any direct CPU access faults, and a second read-write mapping
// that only the vendor's own copies and kernels use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <shared_mutex>
#include <vector>

namespace dipu::host {

class DeviceMemory {
 public:
  static DeviceMemory& instance();

  void configure(int32_t device_count, uint64_t capacity, bool host_accessible);
  // Returns nullptr when the device's capacity would be exceeded.
  void* allocate(int32_t device, size_t size);
  // Returns false when ptr is not the start of a live allocation.
  bool release(void* ptr);
  // The address the vendor reads and writes for device address ptr; nullptr if ptr is not in
  // device memory.
  void* vendor_view(const void* ptr) const;
  // The device owning ptr, or -1.
  int32_t device_of(const void* ptr) const;
  uint64_t used(int32_t device) const;
  uint64_t capacity() const { return capacity_; }

 private:
  struct Block {
    size_t size;
    size_t mapped_size;
    char* vendor_base;
    int32_t device;
  };
  const Block* find(const void* ptr, uintptr_t* base) const;

  mutable std::shared_mutex mutex_;
  std::map<uintptr_t, Block> blocks_;
  std::vector<uint64_t> used_;
  uint64_t capacity_ = 0;
  bool host_accessible_ = true;
};

}  // namespace dipu::host
