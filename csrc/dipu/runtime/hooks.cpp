// The PrivateUse1 hooks: what ATen asks of an accelerator (availability, device count,
// generators, pinned memory), plus the pinned host allocator backed by dipuMallocHost.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <cstring>

#include "allocator.h"
#include "device.h"
#include "generator.h"

namespace dipu {
namespace {

void free_pinned(void* ptr) { DIPU_CHECK(vendor().free_host(ptr)); }

struct PinnedHostAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t size) override {
    void* ptr = nullptr;
    if (size > 0) DIPU_CHECK(vendor().malloc_host(&ptr, size));
    return c10::DataPtr(ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

PinnedHostAllocator pinned_allocator;

struct DipuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }

  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }

  bool hasPrimaryContext(c10::DeviceIndex device_index) const override { return vendor_loaded(); }

  c10::DeviceIndex deviceCount() const override { return isAvailable() ? device_count() : 0; }

  void setCurrentDevice(c10::DeviceIndex device) const override { set_device(device); }

  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex previous = current_device();
    set_device(device);
    return previous;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override { return new_generator(device_index); }

  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }

  bool isPinnedPtr(const void* data) const override {
    return vendor_loaded() && vendor().is_pinned_host_pointer(data) != 0;
  }

  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    resize_device_storage(storage, new_bytes);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new DipuHooks()); }
} register_hooks;

}  // namespace
}  // namespace dipu
