#include "device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace dipu::host {
namespace {

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

DeviceMemory& DeviceMemory::instance() {
  static DeviceMemory memory;
  return memory;
}

void DeviceMemory::configure(int32_t device_count, uint64_t capacity, bool host_accessible) {
  std::unique_lock lock(mutex_);
  used_.assign(device_count, 0);
  capacity_ = capacity;
  host_accessible_ = host_accessible;
}

void* DeviceMemory::allocate(int32_t device, size_t size) {
  std::unique_lock lock(mutex_);
  if (used_[device] + size > capacity_) return nullptr;
  Block block{size, 0, nullptr, device};
  char* device_address = nullptr;
  if (host_accessible_) {
    block.mapped_size = round_up(size == 0 ? 1 : size, 64);
    device_address = static_cast<char*>(std::aligned_alloc(64, block.mapped_size));
    if (device_address == nullptr) return nullptr;
    block.vendor_base = device_address;
  } else {
    block.mapped_size = round_up(size == 0 ? 1 : size, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    int fd = memfd_create("dipu-device-memory", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    bool sized = ftruncate(fd, static_cast<off_t>(block.mapped_size)) == 0;
    void* guarded = sized ? mmap(nullptr, block.mapped_size, PROT_NONE, MAP_SHARED, fd, 0) : MAP_FAILED;
    void* backing = sized ? mmap(nullptr, block.mapped_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (guarded == MAP_FAILED || backing == MAP_FAILED) {
      if (guarded != MAP_FAILED) munmap(guarded, block.mapped_size);
      if (backing != MAP_FAILED) munmap(backing, block.mapped_size);
      return nullptr;
    }
    device_address = static_cast<char*>(guarded);
    block.vendor_base = static_cast<char*>(backing);
  }
  used_[device] += size;
  blocks_.emplace(reinterpret_cast<uintptr_t>(device_address), block);
  return device_address;
}

bool DeviceMemory::release(void* ptr) {
  std::unique_lock lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end()) return false;
  const Block& block = it->second;
  if (host_accessible_) {
    std::free(ptr);
  } else {
    munmap(ptr, block.mapped_size);
    munmap(block.vendor_base, block.mapped_size);
  }
  used_[block.device] -= block.size;
  blocks_.erase(it);
  return true;
}

const DeviceMemory::Block* DeviceMemory::find(const void* ptr, uintptr_t* base) const {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = blocks_.upper_bound(address);
  if (it == blocks_.begin()) return nullptr;
  --it;
  if (address > it->first + it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

void* DeviceMemory::vendor_view(const void* ptr) const {
  std::shared_lock lock(mutex_);
  uintptr_t base = 0;
  const Block* block = find(ptr, &base);
  if (block == nullptr) return nullptr;
  return block->vendor_base + (reinterpret_cast<uintptr_t>(ptr) - base);
}

int32_t DeviceMemory::device_of(const void* ptr) const {
  std::shared_lock lock(mutex_);
  uintptr_t base = 0;
  const Block* block = find(ptr, &base);
  return block == nullptr ? -1 : block->device;
}

uint64_t DeviceMemory::used(int32_t device) const {
  std::shared_lock lock(mutex_);
  return used_[device];
}

}  // namespace dipu::host
