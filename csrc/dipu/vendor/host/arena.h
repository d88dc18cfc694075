// One emulated device's memory as a shareable file. An arena is an anonymous memory file
// (memfd) holding a table of allocations (the export table) followed by the allocations
// themselves; the file is sparse, so untouched bytes cost nothing and freed ranges are handed back
// to the kernel. The owner maps it once and carves allocations out of it; another process that
// was handed the file (pidfd_getfd) maps it too and checks every handle against the table.
//
// Mappings: a read-write view that only the vendor's copies and kernels touch and, when the
// device is not host-accessible, a second PROT_NONE mapping whose addresses are the device
// pointers (direct CPU access faults). When it is host-accessible the two are the same.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dipu::host {

// One allocation in the export table. `generation` is odd while the allocation is live and
// changes at every allocation and free, so a handle remembers which life it was made in.
struct ArenaSlot {
  std::atomic<uint64_t> generation;
  uint64_t offset;
  uint64_t size;
};

class Arena {
 public:
  // A new arena with room for `bytes` of allocations; throws std::runtime_error.
  static std::unique_ptr<Arena> create(uint64_t bytes, bool host_accessible);
  // Maps an arena another process created, from a file descriptor this process now owns. Throws
  // std::runtime_error when the file is not an arena or its nonce is not `expected_nonce`.
  static std::unique_ptr<Arena> attach(int fd, uint64_t expected_nonce, bool host_accessible);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  struct Allocation {
    uint64_t offset;  // from the start of the file
    uint32_t slot;
    uint64_t generation;
  };
  // Owner only. nullopt when no free range is large enough.
  std::optional<Allocation> allocate(size_t size);
  // Owner only: ends the allocation's life (its handles stop opening) and returns its pages.
  void release(const Allocation& allocation, size_t size);

  char* device_address(uint64_t offset) const { return device_base_ + offset; }
  char* vendor_address(uint64_t offset) const { return vendor_base_ + offset; }
  // The offset of a device address inside this arena's mapping, or nullopt.
  std::optional<uint64_t> offset_of(const void* device_address) const;
  // Why [offset, offset + size) cannot be opened as part of allocation `slot` of `generation`, or "".
  std::string check_range(uint32_t slot, uint64_t generation, uint64_t offset, uint64_t size) const;

  int fd() const { return fd_; }
  // Bytes of the file the kernel holds pages for (touched and not handed back).
  uint64_t resident_bytes() const;
  uint64_t nonce() const { return nonce_; }

 private:
  Arena() = default;
  void map(bool host_accessible);

  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint64_t nonce_ = 0;
  char* vendor_base_ = nullptr;
  char* device_base_ = nullptr;
  bool separate_device_mapping_ = false;
  struct Header* header_ = nullptr;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes (owner only)
  std::vector<uint32_t> free_slots_;   // owner only
};

}  // namespace dipu::host
