#include "device_memory.h"

#include "host_memory.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace dipu::host {
namespace {

constexpr uint32_t kHandleMagic = 0x48504944;  // "DIPH"
constexpr uint32_t kHandleVersion = 1;

// Where Yama restricts ptrace to descendants, let same-user peers take the arena's descriptor.
void allow_peers_to_open_handles() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
    int value = 0;
    if (scope >> value && value == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  });
}

}  // namespace

DeviceMemory& DeviceMemory::instance() {
  static DeviceMemory memory;
  return memory;
}

void DeviceMemory::configure(int32_t device_count, uint64_t capacity, bool host_accessible) {
  std::unique_lock lock(mutex_);
  used_.assign(device_count, 0);
  arenas_.clear();
  arenas_.resize(device_count);
  capacity_ = capacity;
  host_accessible_ = host_accessible;
}

Arena& DeviceMemory::arena(int32_t device) {
  // Twice what can be allocated: room for alignment and fragmentation; the file is sparse. A
  // capacity beyond the host's memory can never be backed, so the host's memory bounds it.
  const uint64_t host_total = host_memory_total_bytes();
  const uint64_t reachable = host_total == 0 ? capacity_ : std::min(capacity_, host_total);
  if (!arenas_[device]) arenas_[device] = Arena::create(2 * reachable, host_accessible_);
  return *arenas_[device];
}

uint64_t DeviceMemory::host_backing_left() const {
  const uint64_t available = host_memory_available_bytes();
  if (available == 0) return std::numeric_limits<uint64_t>::max();
  uint64_t allocated = 0;
  uint64_t resident = 0;
  for (size_t device = 0; device < used_.size(); ++device) {
    allocated += used_[device];
    if (arenas_[device]) resident += arenas_[device]->resident_bytes();
  }
  const uint64_t untouched = allocated > resident ? allocated - resident : 0;
  return available > untouched ? available - untouched : 0;
}

uint64_t DeviceMemory::free_bytes(int32_t device) const {
  std::shared_lock lock(mutex_);
  return std::min(capacity_ - used_[device], host_backing_left());
}

void* DeviceMemory::allocate(int32_t device, size_t size, std::string* why) {
  std::unique_lock lock(mutex_);
  if (used_[device] + size > capacity_) {
    *why = "device memory capacity exceeded";
    return nullptr;
  }
  const uint64_t backing = host_backing_left();
  if (size > backing) {
    *why = "the host cannot back it: emulated device memory lives in host memory, which has " + format_gib(backing) +
           " left for new allocations (MemAvailable less device allocations not yet touched)";
    return nullptr;
  }
  Arena* owner = nullptr;
  try {
    owner = &arena(device);
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
  auto allocation = owner->allocate(size);
  if (!allocation) {
    *why = "device memory too fragmented for one block of this size";
    return nullptr;
  }
  char* device_address = owner->device_address(allocation->offset);
  blocks_.emplace(reinterpret_cast<uintptr_t>(device_address),
                  Block{size, owner->vendor_address(allocation->offset), device, owner, *allocation, 0});
  used_[device] += size;
  return device_address;
}

bool DeviceMemory::release(void* ptr) {
  std::unique_lock lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end() || it->second.arena == nullptr) return false;
  const Block& block = it->second;
  block.arena->release(block.allocation, block.size);
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

void* DeviceMemory::vendor_view(const void* ptr, size_t size) const {
  std::shared_lock lock(mutex_);
  uintptr_t base = 0;
  const Block* block = find(ptr, &base);
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr) - base;
  if (block == nullptr || size > block->size - start) return nullptr;
  return block->vendor_base + start;
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

std::string DeviceMemory::export_range(const void* ptr, size_t size, IpcHandle* handle) {
  allow_peers_to_open_handles();
  std::shared_lock lock(mutex_);
  uintptr_t base = 0;
  const Block* block = find(ptr, &base);
  if (block == nullptr || block->arena == nullptr) return "the pointer is not device memory allocated by this process";
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr) - base;
  if (size > block->size - start) {
    return "the range of " + std::to_string(size) + " bytes runs past its allocation of " + std::to_string(block->size);
  }
  std::memset(handle, 0, sizeof(*handle));
  handle->magic = kHandleMagic;
  handle->version = kHandleVersion;
  handle->owner_pid = int64_t(getpid());
  handle->arena_fd = block->arena->fd();
  handle->slot = block->allocation.slot;
  handle->arena_nonce = block->arena->nonce();
  handle->generation = block->allocation.generation;
  handle->offset = block->allocation.offset + start;
  handle->size = size;
  return "";
}

std::string DeviceMemory::attach(const IpcHandle& handle, Arena** arena) {
  const auto key = std::make_pair(handle.owner_pid, handle.arena_nonce);
  auto found = attached_.find(key);
  if (found != attached_.end()) {
    *arena = found->second.get();
    return "";
  }
  const std::string owner = "process " + std::to_string(handle.owner_pid);
  const int pidfd = int(syscall(SYS_pidfd_open, pid_t(handle.owner_pid), 0));
  if (pidfd < 0) return owner + " (the handle's owner) is gone: " + std::strerror(errno);
  const int fd = int(syscall(SYS_pidfd_getfd, pidfd, handle.arena_fd, 0));
  const int error = errno;
  close(pidfd);
  if (fd < 0) return "cannot reach the device memory of " + owner + ": " + std::strerror(error);
  try {
    auto attached = Arena::attach(fd, handle.arena_nonce, host_accessible_);
    *arena = attached.get();
    attached_.emplace(key, std::move(attached));
  } catch (const std::exception& e) {
    close(fd);
    return e.what();
  }
  return "";
}

std::string DeviceMemory::open_handle(const IpcHandle& handle, int64_t expected_owner, void** ptr, size_t* size) {
  if (handle.magic != kHandleMagic || handle.version != kHandleVersion) return "not a host vendor memory handle";
  if (expected_owner >= 0 && handle.owner_pid != expected_owner) {
    return "the handle belongs to process " + std::to_string(handle.owner_pid) + ", not to the presenting process " +
           std::to_string(expected_owner);
  }
  std::unique_lock lock(mutex_);
  Arena* arena = nullptr;
  if (handle.owner_pid == int64_t(getpid())) {
    for (auto& own : arenas_) {
      if (own && own->nonce() == handle.arena_nonce) arena = own.get();
    }
    if (arena == nullptr) return "the handle names no device memory of this process";
  } else if (std::string why = attach(handle, &arena); !why.empty()) {
    return why;
  }
  if (std::string why = arena->check_range(handle.slot, handle.generation, handle.offset, handle.size); !why.empty()) {
    return why;
  }
  char* device_address = arena->device_address(handle.offset);
  if (handle.owner_pid != int64_t(getpid())) {
    auto [it, fresh] =
        blocks_.try_emplace(reinterpret_cast<uintptr_t>(device_address),
                            Block{handle.size, arena->vendor_address(handle.offset), -1, nullptr, {}, 0});
    if (!fresh && it->second.arena != nullptr) return "the handle's range is already device memory of this process";
    it->second.size = std::max<size_t>(it->second.size, handle.size);
    ++it->second.opened;
  }
  *ptr = device_address;
  *size = handle.size;
  return "";
}

std::string DeviceMemory::close_handle(void* ptr) {
  std::unique_lock lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end() || it->second.arena != nullptr) {
    // A handle of this process's own memory opens to the allocation itself: nothing to undo.
    uintptr_t base = 0;
    const Block* own = find(ptr, &base);
    return own != nullptr && own->arena != nullptr ? "" : "the pointer is not an opened memory handle";
  }
  if (--it->second.opened == 0) blocks_.erase(it);
  return "";
}

std::string DeviceMemory::dma_buf(const void* ptr, size_t size, int* fd, uint64_t* offset) {
  IpcHandle handle{};
  if (std::string why = export_range(ptr, size, &handle); !why.empty()) return why;
  *fd = fcntl(handle.arena_fd, F_DUPFD_CLOEXEC, 0);
  if (*fd < 0) return std::string("cannot duplicate the device memory descriptor: ") + std::strerror(errno);
  *offset = handle.offset;
  return "";
}

}  // namespace dipu::host
