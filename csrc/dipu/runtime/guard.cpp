// The device guard: how PyTorch switches dipu devices and streams and records events.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "device.h"

namespace dipu {
namespace {

constexpr c10::DeviceType kDipu = c10::DeviceType::PrivateUse1;

struct DipuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDipu; }

  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device previous = getDevice();
    if (device.index() != previous.index()) set_device(device.index());
    return previous;
  }

  c10::Device getDevice() const override { return c10::Device(kDipu, current_device()); }

  void setDevice(c10::Device device) const override { set_device(device.index()); }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    try {
      set_device(device.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device device) const override { return current_stream(device.index()); }

  c10::Stream getDefaultStream(c10::Device device) const override { return default_stream(device.index()); }

  c10::Stream getNewStream(c10::Device device, int) const override { return create_stream(device.index()); }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override { return create_stream(device.index()); }

  c10::Stream exchangeStream(c10::Stream stream) const override { return exchange_stream(stream); }

  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "event of device ",
                static_cast<int>(device_index), " recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    c10::DeviceIndex previous = current_device();
    set_device(stream.device_index());
    if (*event == nullptr) {
      dipuEvent_t created = nullptr;
      DIPU_CHECK(vendor().event_create(&created));
      *event = created;
    }
    DIPU_CHECK(vendor().event_record(static_cast<dipuEvent_t>(*event), vendor_stream(stream)));
    set_device(previous);
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    DIPU_CHECK(vendor().stream_wait_event(vendor_stream(stream), static_cast<dipuEvent_t>(event)));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    dipuError_t status = vendor().event_query(static_cast<dipuEvent_t>(event));
    if (status == dipuErrorNotReady) return false;
    DIPU_CHECK(status);
    return true;
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event != nullptr) vendor().event_destroy(static_cast<dipuEvent_t>(event));
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) DIPU_CHECK(vendor().event_synchronize(static_cast<dipuEvent_t>(event)));
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "both events must be recorded before elapsed_time");
    float milliseconds = 0;
    DIPU_CHECK(
        vendor().event_elapsed_time(&milliseconds, static_cast<dipuEvent_t>(start), static_cast<dipuEvent_t>(end)));
    return milliseconds;
  }

  bool queryStream(const c10::Stream& stream) const override {
    dipuError_t status = vendor().stream_query(vendor_stream(stream));
    if (status == dipuErrorNotReady) return false;
    DIPU_CHECK(status);
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    DIPU_CHECK(vendor().stream_synchronize(vendor_stream(stream)));
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override { synchronize_device(device_index); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, DipuGuardImpl);

}  // namespace
}  // namespace dipu
