// ditorch.dipu._C: the Python face of the shim. Loading it registers the dipu kernels, guard,
// hooks and allocator; these functions expose the runtime to ditorch/dipu/*.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>

#include "aten/cpu_fallback.h"
#include "aten/diopi_call.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/vendor.h"

namespace py = pybind11;

namespace dipu {
namespace {

py::dict device_properties(c10::DeviceIndex device) {
  check_device(device);
  dipuDeviceProperties_t properties{};
  DIPU_CHECK(vendor().device_properties(device, &properties));
  py::dict result;
  result["name"] = std::string(properties.name);
  result["total_memory"] = properties.total_memory;
  result["compute_units"] = properties.compute_units;
  result["host_accessible"] = properties.host_accessible != 0;
  result["relative_speed"] = properties.relative_speed;
  result["major"] = properties.major;
  result["minor"] = properties.minor;
  return result;
}

py::dict stat_dict(const c10::CachingAllocator::Stat& stat) {
  py::dict result;
  result["current"] = stat.current;
  result["peak"] = stat.peak;
  result["allocated"] = stat.allocated;
  result["freed"] = stat.freed;
  return result;
}

py::dict memory_stats(c10::DeviceIndex device) {
  auto stats = device_memory_stats(device);
  constexpr size_t aggregate = 0;
  py::dict result;
  result["allocated_bytes"] = stat_dict(stats.allocated_bytes[aggregate]);
  result["reserved_bytes"] = stat_dict(stats.reserved_bytes[aggregate]);
  result["requested_bytes"] = stat_dict(stats.requested_bytes[aggregate]);
  result["allocation"] = stat_dict(stats.allocation[aggregate]);
  result["segment"] = stat_dict(stats.segment[aggregate]);
  result["num_alloc_retries"] = stats.num_alloc_retries;
  result["num_ooms"] = stats.num_ooms;
  return result;
}

std::pair<size_t, size_t> mem_get_info(c10::DeviceIndex device) {
  check_device(device);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  DIPU_CHECK(vendor().mem_get_info(device, &free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

// The vendor's pacing record (dipuGetPacingStats), or None for a vendor that does not keep one.
py::object pacing_stats() {
  auto get = reinterpret_cast<decltype(&dipuGetPacingStats)>(vendor_symbol("dipuGetPacingStats"));
  if (get == nullptr) return py::none();
  dipuPacingStats_t stats{};
  DIPU_CHECK(get(&stats));
  py::dict result;
  result["kernels"] = stats.kernels;
  result["late_kernels"] = stats.late_kernels;
  result["emulated_s"] = stats.emulated_s;
  result["overrun_s"] = stats.overrun_s;
  return result;
}

PyObject* default_generator_object(c10::DeviceIndex device) {
  return THPGenerator_initDefaultGenerator(default_generator(device));
}

}  // namespace
}  // namespace dipu

PYBIND11_MODULE(_C, m) {
  m.doc() = "DIPU shim runtime (see ditorch.dipu)";
  m.def("_set_vendor_path", &dipu::set_vendor_path);
  m.def("_vendor_path", &dipu::vendor_path);
  m.def("_vendor_loaded", &dipu::vendor_loaded);
  m.def("_in_bad_fork", &dipu::in_bad_fork);
  m.def("_vendor_name", [] { return std::string(dipu::vendor().vendor_name()); });
  m.def("_device_count", [] { return static_cast<int>(dipu::device_count()); });
  m.def("_current_device", [] { return static_cast<int>(dipu::current_device()); });
  m.def("_set_device", [](int device) { dipu::set_device(static_cast<c10::DeviceIndex>(device)); });
  m.def("_synchronize", [](int device) { dipu::synchronize_device(static_cast<c10::DeviceIndex>(device)); });
  m.def("_set_visible_devices", &dipu::set_visible_devices);
  m.def("_device_properties",
        [](int device) { return dipu::device_properties(static_cast<c10::DeviceIndex>(device)); });
  m.def("_host_accessible", &dipu::host_accessible);
  m.def("_pacing_stats", &dipu::pacing_stats);
  m.def("_memory_stats", [](int device) { return dipu::memory_stats(static_cast<c10::DeviceIndex>(device)); });
  m.def("_reset_peak_memory_stats",
        [](int device) { dipu::reset_peak_memory_stats(static_cast<c10::DeviceIndex>(device)); });
  m.def("_empty_cache", &dipu::empty_cache);
  m.def("_mem_get_info", [](int device) { return dipu::mem_get_info(static_cast<c10::DeviceIndex>(device)); });
  m.def("_default_generator", [](int device) {
    return py::reinterpret_steal<py::object>(dipu::default_generator_object(static_cast<c10::DeviceIndex>(device)));
  });
  m.def("_fallback_counts", &dipu::aten::fallback_counts);
  m.def("_reset_fallback_counts", &dipu::aten::reset_fallback_counts);
  m.def("_set_fallback_logging", &dipu::aten::set_fallback_logging);
  m.def("_fallback_logging", &dipu::aten::fallback_logging);
  m.def("_set_forced_fallback", &dipu::diopi::set_forced_fallback);
  m.def("_forced_fallback", &dipu::diopi::forced_fallback);
  m.def("_diopi_call_counts", &dipu::diopi::diopi_call_counts);
  m.def("_vendor_implements",
        [](const std::string& diopi_function) { return dipu::vendor_symbol(diopi_function.c_str()) != nullptr; });
}
