#include "vendor.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <vector>

#include <c10/util/Exception.h>

namespace dipu {
namespace {

std::mutex vendor_mutex;
std::string chosen_path;
void* library = nullptr;
std::atomic<bool> loaded{false};
VendorApi api;
bool accessible = true;

// A child forked after the device was first used inherits the vendor's state, not its device: its
// memory writes would stay in the child (copy-on-write) and a real vendor's context is not
// fork-safe. Such a child may not use the device, as CUDA forbids it.
std::atomic<bool> forked_after_load{false};

void mark_forked_child() {
  if (loaded.load()) forked_after_load.store(true);
}

const bool fork_handler_installed = [] { return pthread_atfork(nullptr, nullptr, &mark_forked_child) == 0; }();

// The visible-device map: the device-indexed calls of the ABI (count, set/get device, properties,
// memory info) go through these, which translate the process's indices to the vendor's.
std::optional<std::vector<int32_t>> visible;
VendorApi vendor_own;  // the vendor's own device-indexed functions, called by the translations

bool visible_index(int32_t device) { return device >= 0 && device < static_cast<int32_t>(visible->size()); }

dipuError_t visible_device_count(int32_t* count) {
  *count = static_cast<int32_t>(visible->size());
  return dipuSuccess;
}

dipuError_t visible_set_device(int32_t device) {
  return visible_index(device) ? vendor_own.set_device((*visible)[device]) : dipuErrorInvalidDevice;
}

dipuError_t visible_get_device(int32_t* device) {
  int32_t own = 0;
  dipuError_t status = vendor_own.get_device(&own);
  if (status != dipuSuccess) return status;
  auto found = std::find(visible->begin(), visible->end(), own);
  if (found == visible->end()) return dipuErrorInvalidDevice;
  *device = static_cast<int32_t>(found - visible->begin());
  return dipuSuccess;
}

dipuError_t visible_device_properties(int32_t device, dipuDeviceProperties_t* properties) {
  return visible_index(device) ? vendor_own.device_properties((*visible)[device], properties) : dipuErrorInvalidDevice;
}

dipuError_t visible_mem_get_info(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  return visible_index(device) ? vendor_own.mem_get_info((*visible)[device], free_bytes, total_bytes)
                               : dipuErrorInvalidDevice;
}

void map_visible_devices() {
  if (!visible) return;
  int32_t count = 0;
  TORCH_CHECK(api.device_count(&count) == dipuSuccess, "DIPU vendor ", api.vendor_name(),
              " failed to start: ", api.last_error_message());
  for (int32_t index : *visible) {
    TORCH_CHECK(index < count, "visible device ", index, " does not exist (vendor ", api.vendor_name(), " has ", count,
                " device(s))");
  }
  vendor_own = api;
  api.device_count = &visible_device_count;
  api.set_device = &visible_set_device;
  api.get_device = &visible_get_device;
  api.device_properties = &visible_device_properties;
  api.mem_get_info = &visible_mem_get_info;
  // The opening thread's vendor device becomes visible device 0 (other threads are told by the
  // shim's set_device, or at their first current_device()).
  if (!visible->empty()) {
    TORCH_CHECK(vendor_own.set_device(visible->front()) == dipuSuccess, "DIPU vendor ", api.vendor_name(),
                " cannot select device ", visible->front(), ": ", api.last_error_message());
  }
}

template <typename Function>
void bind(Function& slot, const char* name) {
  void* symbol = dlsym(library, name);
  TORCH_CHECK(symbol != nullptr, "DIPU vendor ", chosen_path, " does not export ", name);
  slot = reinterpret_cast<Function>(symbol);
}

void open_library() {
  TORCH_CHECK(!chosen_path.empty(), "no DIPU vendor chosen: import ditorch.dipu or set DIPU_VENDOR");
  library = dlopen(chosen_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(library != nullptr, "cannot load DIPU vendor ", chosen_path, ": ", dlerror());
  bind(api.vendor_name, "dipuVendorName");
  bind(api.abi_version, "dipuVendorAbiVersion");
  TORCH_CHECK(api.abi_version() == DIPU_VENDOR_ABI_VERSION, "DIPU vendor ", chosen_path, " implements ABI version ",
              api.abi_version(), ", this shim needs ", DIPU_VENDOR_ABI_VERSION);
  bind(api.error_string, "dipuGetErrorString");
  bind(api.last_error_message, "dipuGetLastErrorMessage");
  bind(api.device_count, "dipuGetDeviceCount");
  bind(api.set_device, "dipuSetDevice");
  bind(api.get_device, "dipuGetDevice");
  bind(api.device_properties, "dipuGetDeviceProperties");
  bind(api.mem_get_info, "dipuMemGetInfo");
  bind(api.device_synchronize, "dipuDeviceSynchronize");
  bind(api.malloc, "dipuMalloc");
  bind(api.free, "dipuFree");
  bind(api.malloc_host, "dipuMallocHost");
  bind(api.free_host, "dipuFreeHost");
  bind(api.is_pinned_host_pointer, "dipuIsPinnedHostPointer");
  bind(api.memset, "dipuMemset");
  bind(api.memcpy, "dipuMemcpy");
  bind(api.memcpy_async, "dipuMemcpyAsync");
  bind(api.stream_create, "dipuStreamCreate");
  bind(api.stream_destroy, "dipuStreamDestroy");
  bind(api.stream_synchronize, "dipuStreamSynchronize");
  bind(api.stream_query, "dipuStreamQuery");
  bind(api.stream_wait_event, "dipuStreamWaitEvent");
  bind(api.event_create, "dipuEventCreate");
  bind(api.event_destroy, "dipuEventDestroy");
  bind(api.event_record, "dipuEventRecord");
  bind(api.event_synchronize, "dipuEventSynchronize");
  bind(api.event_query, "dipuEventQuery");
  bind(api.event_elapsed_time, "dipuEventElapsedTime");
  map_visible_devices();
  int32_t count = 0;
  dipuError_t status = api.device_count(&count);
  TORCH_CHECK(status == dipuSuccess, "DIPU vendor ", api.vendor_name(), " failed to start: ", api.last_error_message());
  dipuDeviceProperties_t properties{};
  if (count > 0 && api.device_properties(0, &properties) == dipuSuccess) {
    accessible = properties.host_accessible != 0;
  }
  loaded.store(true, std::memory_order_release);
}

}  // namespace

void set_vendor_path(const std::string& path) {
  std::lock_guard lock(vendor_mutex);
  TORCH_CHECK(!loaded.load() || path == chosen_path, "DIPU vendor ", chosen_path,
              " is already loaded; choose the vendor before the first use of the device");
  chosen_path = path;
}

void set_visible_devices(const std::vector<int32_t>& indices) {
  std::lock_guard lock(vendor_mutex);
  TORCH_CHECK(!loaded.load(), "DIPU vendor ", chosen_path,
              " is already loaded; choose the visible devices before the first use of the device");
  visible = indices;
}

const VendorApi& vendor() {
  TORCH_CHECK(!forked_after_load.load(std::memory_order_relaxed),
              "dipu cannot be used in a process forked after the device was first used; start worker processes "
              "with the 'spawn' start method (as CUDA requires)");
  if (loaded.load(std::memory_order_acquire)) return api;
  std::lock_guard lock(vendor_mutex);
  if (!loaded.load(std::memory_order_relaxed)) open_library();
  return api;
}

bool vendor_loaded() { return loaded.load(std::memory_order_acquire); }

bool in_bad_fork() { return forked_after_load.load(); }

const std::string& vendor_path() { return chosen_path; }

void* vendor_symbol(const char* name) {
  vendor();
  return dlsym(library, name);
}

bool host_accessible() {
  vendor();
  return accessible;
}

void check(dipuError_t error, const char* call) {
  if (error == dipuSuccess) return;
  const VendorApi& runtime = vendor();
  std::string detail = runtime.last_error_message();
  TORCH_CHECK(false, "DIPU vendor call ", call, " failed: ", runtime.error_string(error),
              detail.empty() ? "" : " (" + detail + ")");
}

}  // namespace dipu
