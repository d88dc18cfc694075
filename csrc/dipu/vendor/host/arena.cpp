#include "arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dipu::host {

constexpr uint64_t kArenaMagic = 0x414e455241555049ull;  // "IPUARENA"
constexpr uint64_t kSlotCount = 16384;
constexpr uint64_t kAlignment = 512;

struct Header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t slot_count;
  uint64_t data_offset;
  ArenaSlot slots[kSlotCount];
};

namespace {

uint64_t page_bytes() { return uint64_t(sysconf(_SC_PAGESIZE)); }
uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

[[noreturn]] void fail_errno(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

uint64_t random_nonce() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof(value), 0) != ssize_t(sizeof(value)))
    fail_errno("drawing the device memory nonce (getrandom)");
  return value | 1;  // never 0
}

uint64_t data_offset() { return round_up(sizeof(Header), page_bytes()); }

}  // namespace

uint64_t Arena::resident_bytes() const {
  struct stat status {};
  if (fstat(fd_, &status) != 0) return 0;
  return uint64_t(status.st_blocks) * 512;
}

std::unique_ptr<Arena> Arena::create(uint64_t bytes, bool host_accessible) {
  std::unique_ptr<Arena> arena(new Arena());
  arena->fd_ = memfd_create("dipu-device-arena", MFD_CLOEXEC);
  if (arena->fd_ < 0) fail_errno("memfd_create for device memory");
  arena->file_bytes_ = data_offset() + round_up(bytes, page_bytes());
  if (ftruncate(arena->fd_, off_t(arena->file_bytes_)) != 0) fail_errno("sizing the device memory file");
  arena->map(host_accessible);
  Header* header = arena->header_;
  header->magic = kArenaMagic;
  header->nonce = arena->nonce_ = random_nonce();
  header->slot_count = kSlotCount;
  header->data_offset = data_offset();
  arena->free_[data_offset()] = arena->file_bytes_ - data_offset();
  for (uint32_t s = kSlotCount; s > 0; --s) arena->free_slots_.push_back(s - 1);
  return arena;
}

std::unique_ptr<Arena> Arena::attach(int fd, uint64_t expected_nonce, bool host_accessible) {
  std::unique_ptr<Arena> arena(new Arena());
  arena->fd_ = fd;
  struct stat info {};
  if (fstat(fd, &info) != 0) fail_errno("fstat of the peer's device memory file");
  if (!S_ISREG(info.st_mode) || uint64_t(info.st_size) < data_offset()) {
    throw std::runtime_error("the handle's file is not device memory");
  }
  Header probe{};
  if (pread(fd, &probe, offsetof(Header, slots), 0) != ssize_t(offsetof(Header, slots)) || probe.magic != kArenaMagic ||
      probe.nonce != expected_nonce || probe.slot_count != kSlotCount || probe.data_offset != data_offset()) {
    throw std::runtime_error("the handle's file is not the device memory the handle names (forged or stale handle)");
  }
  arena->file_bytes_ = uint64_t(info.st_size);
  arena->nonce_ = expected_nonce;
  arena->map(host_accessible);
  return arena;
}

void Arena::map(bool host_accessible) {
  void* view = mmap(nullptr, file_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  if (view == MAP_FAILED) fail_errno("mapping device memory");
  vendor_base_ = static_cast<char*>(view);
  header_ = static_cast<Header*>(view);
  separate_device_mapping_ = !host_accessible;
  device_base_ = vendor_base_;
  if (separate_device_mapping_) {
    void* guarded = mmap(nullptr, file_bytes_, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
    if (guarded == MAP_FAILED) fail_errno("mapping device memory");
    device_base_ = static_cast<char*>(guarded);
  }
}

Arena::~Arena() {
  if (separate_device_mapping_ && device_base_) munmap(device_base_, file_bytes_);
  if (vendor_base_) munmap(vendor_base_, file_bytes_);
  if (fd_ >= 0) close(fd_);
}

std::optional<Arena::Allocation> Arena::allocate(size_t size) {
  if (free_slots_.empty()) return std::nullopt;
  const uint64_t bytes = round_up(size == 0 ? 1 : size, kAlignment);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t offset = it->first;
    const uint64_t left = it->second - bytes;
    free_.erase(it);
    if (left) free_[offset + bytes] = left;
    Allocation allocation{offset, free_slots_.back(), 0};
    free_slots_.pop_back();
    ArenaSlot& slot = header_->slots[allocation.slot];
    slot.offset = offset;
    slot.size = size;
    allocation.generation = slot.generation.fetch_add(1) + 1;  // now odd: live
    return allocation;
  }
  return std::nullopt;
}

void Arena::release(const Allocation& allocation, size_t size) {
  ArenaSlot& slot = header_->slots[allocation.slot];
  slot.generation.fetch_add(1);  // even: freed; handles of this life stop opening
  free_slots_.push_back(allocation.slot);
  uint64_t offset = allocation.offset;
  uint64_t bytes = round_up(size == 0 ? 1 : size, kAlignment);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      offset = previous->first;
      bytes += previous->second;
      free_.erase(previous);
    }
  }
  free_[offset] = bytes;
  // Whole pages inside the (merged) free range go back to the kernel; they read as zeros later.
  const uint64_t first_page = round_up(offset, page_bytes());
  const uint64_t end_page = (offset + bytes) / page_bytes() * page_bytes();
  if (end_page > first_page) {
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(first_page), off_t(end_page - first_page));
  }
}

std::optional<uint64_t> Arena::offset_of(const void* device_address) const {
  const char* p = static_cast<const char*>(device_address);
  if (p < device_base_ + data_offset() || p >= device_base_ + file_bytes_) return std::nullopt;
  return uint64_t(p - device_base_);
}

std::string Arena::check_range(uint32_t slot_index, uint64_t generation, uint64_t offset, uint64_t size) const {
  if (slot_index >= kSlotCount) return "the handle names no allocation (slot " + std::to_string(slot_index) + ")";
  const ArenaSlot& slot = header_->slots[slot_index];
  const uint64_t now = slot.generation.load();
  if (now != generation || (now & 1) == 0) return "the handle refers to freed device memory";
  if (offset < slot.offset || size > slot.size || offset - slot.offset > slot.size - size) {
    return "the handle's range [" + std::to_string(offset) + ", +" + std::to_string(size) +
           ") lies outside its allocation";
  }
  return "";
}

}  // namespace dipu::host
