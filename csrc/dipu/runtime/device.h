// Devices and streams of the loaded vendor as PyTorch sees them: the current device per thread,
// and c10::Stream ids mapped to vendor streams (id 0 is a device's default stream).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "vendor.h"

namespace dipu {

c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);
void check_device(c10::DeviceIndex device);
void synchronize_device(c10::DeviceIndex device);

c10::Stream default_stream(c10::DeviceIndex device);
c10::Stream current_stream(c10::DeviceIndex device);
// Makes stream current on its device; returns the stream that was current there.
c10::Stream exchange_stream(c10::Stream stream);
c10::Stream create_stream(c10::DeviceIndex device);
dipuStream_t vendor_stream(c10::Stream stream);

}  // namespace dipu
