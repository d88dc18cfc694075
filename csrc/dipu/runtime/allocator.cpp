#include "allocator.h"

#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/util/Exception.h>

#include "device.h"

namespace dipu {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr auto kAggregate = static_cast<size_t>(StatType::AGGREGATE);

// The device-wide counter of every statistic with current/peak/allocated/freed values.
std::array<Stat*, 5> aggregate_stats(DeviceStats& stats) {
  return {&stats.allocated_bytes[kAggregate], &stats.reserved_bytes[kAggregate], &stats.allocation[kAggregate],
          &stats.segment[kAggregate], &stats.requested_bytes[kAggregate]};
}

size_t round_block(size_t size) { return (size + kBlockGranularity - 1) / kBlockGranularity * kBlockGranularity; }

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  return text;
}

void free_block(void* ptr);

class CachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t requested) override {
    c10::DeviceIndex device = current_device();
    c10::Device where(c10::DeviceType::PrivateUse1, device);
    if (requested == 0) return c10::DataPtr(nullptr, where);
    size_t size = round_block(requested);
    std::lock_guard lock(mutex_);
    ensure_devices();
    void* ptr = take_cached(device, size);
    if (ptr == nullptr) ptr = allocate_from_vendor(device, size, requested);
    live_[ptr] = Block{size, device};
    DeviceStats& stats = stats_[device];
    stats.allocated_bytes[kAggregate].increase(size);
    stats.allocation[kAggregate].increase(1);
    stats.requested_bytes[kAggregate].increase(requested);
    return c10::DataPtr(ptr, ptr, &free_block, where);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    DIPU_CHECK(vendor().memcpy(dest, src, count, dipuMemcpyDeviceToDevice));
  }

  void release(void* ptr) {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != live_.end(), "dipu allocator: free of an unknown block");
    Block block = it->second;
    live_.erase(it);
    DeviceStats& stats = stats_[block.device];
    stats.allocated_bytes[kAggregate].decrease(block.size);
    stats.allocation[kAggregate].decrease(1);
    cached_[block.device].emplace(block.size, ptr);
  }

  bool initialized() override { return vendor_loaded(); }

  void emptyCache(c10::MempoolId_t) override {
    std::lock_guard lock(mutex_);
    release_cached_blocks();
  }

  void recordStream(const c10::DataPtr&, c10::Stream) override {
    // Blocks are reused only after the framework frees them, and freeing happens in program
    // order; vendors with truly concurrent streams need per-stream pools here.
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    std::lock_guard lock(mutex_);
    return device_stats(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    std::lock_guard lock(mutex_);
    DeviceStats& stats = device_stats(device);
    for (Stat* stat : aggregate_stats(stats)) stat->reset_accumulated();
    stats.num_alloc_retries = 0;
    stats.num_ooms = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    std::lock_guard lock(mutex_);
    for (Stat* stat : aggregate_stats(device_stats(device))) stat->reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device(device);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    DIPU_CHECK(vendor().mem_get_info(device, &free_bytes, &total_bytes));
    return {free_bytes, total_bytes};
  }

 private:
  // The statistics of `device`, after checking that it exists; the caller holds mutex_.
  DeviceStats& device_stats(c10::DeviceIndex device) {
    ensure_devices();
    check_device(device);
    return stats_[device];
  }

  struct Block {
    size_t size;
    c10::DeviceIndex device;
  };

  void ensure_devices() {
    if (stats_.empty()) {
      stats_.resize(device_count());
      cached_.resize(device_count());
    }
  }

  void* take_cached(c10::DeviceIndex device, size_t size) {
    auto it = cached_[device].find(size);
    if (it == cached_[device].end()) return nullptr;
    void* ptr = it->second;
    cached_[device].erase(it);
    return ptr;
  }

  void* allocate_from_vendor(c10::DeviceIndex device, size_t size, size_t requested) {
    DeviceStats& stats = stats_[device];
    void* ptr = nullptr;
    dipuError_t status = vendor().malloc(&ptr, size);
    if (status == dipuErrorOutOfMemory) {
      stats.num_alloc_retries += 1;
      release_cached_blocks();
      status = vendor().malloc(&ptr, size);
    }
    if (status == dipuErrorOutOfMemory) {
      stats.num_ooms += 1;
      const std::string vendor_reason = vendor().last_error_message();
      size_t free_bytes = 0;
      size_t capacity = 0;
      vendor().mem_get_info(device, &free_bytes, &capacity);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "dipu out of memory on device ", static_cast<int>(device),
                       ": tried to allocate ", format_bytes(requested), " (", requested, " bytes); ",
                       format_bytes(stats.allocated_bytes[kAggregate].current), " allocated by tensors, ",
                       format_bytes(stats.reserved_bytes[kAggregate].current), " reserved, device capacity ",
                       format_bytes(capacity), " (", capacity, " bytes)",
                       vendor_reason.empty() ? std::string() : "; the vendor says: " + vendor_reason);
    }
    DIPU_CHECK(status);
    stats.reserved_bytes[kAggregate].increase(size);
    stats.segment[kAggregate].increase(1);
    stats.num_device_alloc += 1;
    return ptr;
  }

  void release_cached_blocks() {
    for (size_t device = 0; device < cached_.size(); ++device) {
      for (auto& [size, ptr] : cached_[device]) {
        DIPU_CHECK(vendor().free(ptr));
        stats_[device].reserved_bytes[kAggregate].decrease(size);
        stats_[device].segment[kAggregate].decrease(1);
        stats_[device].num_device_free += 1;
      }
      cached_[device].clear();
    }
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::vector<std::multimap<size_t, void*>> cached_;
  std::vector<DeviceStats> stats_;
};

CachingAllocator caching_allocator;

void free_block(void* ptr) { caching_allocator.release(ptr); }

struct RegisterAllocator {
  RegisterAllocator() { c10::SetAllocator(c10::DeviceType::PrivateUse1, &caching_allocator); }
} register_allocator;

}  // namespace

c10::CachingDeviceAllocator::DeviceStats device_memory_stats(c10::DeviceIndex device) {
  return caching_allocator.getDeviceStats(device);
}

void reset_peak_memory_stats(c10::DeviceIndex device) { caching_allocator.resetPeakStats(device); }

void empty_cache() { caching_allocator.emptyCache({0, 0}); }

c10::Allocator* device_allocator() { return &caching_allocator; }

void resize_device_storage(const c10::Storage& storage, size_t new_bytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  c10::DataPtr fresh = caching_allocator.allocate(new_bytes);
  size_t kept = std::min(new_bytes, impl->nbytes());
  if (kept > 0) DIPU_CHECK(vendor().memcpy(fresh.get(), impl->data(), kept, dipuMemcpyDeviceToDevice));
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

}  // namespace dipu
