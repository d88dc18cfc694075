#include "vendor.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <mutex>

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
