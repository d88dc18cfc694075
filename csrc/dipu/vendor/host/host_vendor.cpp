// The built-in host vendor: implements the DIPU vendor runtime ABI on the host CPU, emulating the
// chip described by DIPU_HOST_PROFILE. Work is executed eagerly at submission on the host; at a
// relative speed below 1 the emulated chip's timelines (host_device.h) say when it would have ended,
// and streams, events and copies to the host wait for them.
//
// Engines and streams, as on a CUDA device: each device has a compute engine (every kernel, in
// submission order: the vendor's kernels carry no stream) and a copy engine per direction (host to
// device, device to host). An asynchronous copy across the host link on a created stream runs on its
// direction's copy engine, beside the kernels, starting no earlier than the stream's earlier work
// and the events the stream waited for; on the default stream it runs in the compute engine's order.
// An event records when its stream's queued work ends; a stream that waits for an event runs its
// later copies no earlier than the event, and since a kernel may have been launched while any stream
// was current, later kernels too (the compute engine waits). Recording, querying or synchronising a
// created stream also covers the kernels queued so far, for the same reason: the emulation may make a
// caller wait longer than a real device would, never less.
#include <dlfcn.h>

#include <cstdio>
#include <map>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../dipu_vendor.h"
#include "device_memory.h"
#include "host_device.h"
#include "host_ipc.h"
#include "host_link.h"

struct dipuStream_st {
  int32_t device;
  std::mutex mutex;
  // when the copies queued on this stream, and the events it waited for, end on the emulated device
  std::chrono::steady_clock::time_point tail{};

  std::chrono::steady_clock::time_point read_tail() {
    std::lock_guard lock(mutex);
    return tail;
  }
  void hold_until(std::chrono::steady_clock::time_point time) {
    std::lock_guard lock(mutex);
    tail = std::max(tail, time);
  }
};

struct dipuEvent_st {
  std::chrono::steady_clock::time_point time;
  bool recorded = false;
};

namespace dipu::host {
namespace {

thread_local std::string last_error_message;
thread_local int32_t current_device = 0;

std::string library_directory() {
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&library_directory), &info);
  std::string path = info.dli_fname ? info.dli_fname : "";
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

struct DeviceState {
  Profile profile;
  HostLink link{Profile{}};
  std::string error;  // non-empty when the profile could not be loaded
};

const DeviceState& state() {
  static const DeviceState loaded = [] {
    DeviceState s;
    try {
      s.profile = load_profile_from_environment(library_directory() + "/host_profiles");
      s.link = HostLink(s.profile);
      DeviceMemory::instance().configure(s.profile.device_count, s.profile.memory_capacity, s.profile.host_accessible);
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    return s;
  }();
  return loaded;
}

dipuError_t fail(dipuError_t error, const std::string& message) {
  last_error_message = message;
  return error;
}

dipuError_t ready() {
  const DeviceState& s = state();
  return s.error.empty() ? dipuSuccess : fail(dipuErrorInitialization, s.error);
}

bool valid_device(int32_t device) { return device >= 0 && device < state().profile.device_count; }

std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned_blocks;

// Resolves a copy's source and destination to addresses the vendor may touch; each device range
// must lie inside one allocation (or one opened memory handle).
dipuError_t resolve_copy(void*& dst, const void*& src, size_t size, dipuMemcpyKind_t kind) {
  auto& memory = DeviceMemory::instance();
  bool dst_on_device = kind == dipuMemcpyHostToDevice || kind == dipuMemcpyDeviceToDevice;
  bool src_on_device = kind == dipuMemcpyDeviceToHost || kind == dipuMemcpyDeviceToDevice;
  if (dst_on_device) {
    dst = memory.vendor_view(dst, size);
    if (dst == nullptr) return fail(dipuErrorInvalidValue, "memcpy destination is not a device memory range");
  }
  if (src_on_device) {
    src = memory.vendor_view(src, size);
    if (src == nullptr) return fail(dipuErrorInvalidValue, "memcpy source is not a device memory range");
  }
  return dipuSuccess;
}

}  // namespace

dipuError_t report(dipuError_t error, const std::string& message) { return fail(error, message); }

dipuError_t initialized() { return ready(); }

const Profile& device_profile() {
  const DeviceState& s = state();
  if (!s.error.empty()) throw std::runtime_error(s.error);
  return s.profile;
}

void* kernel_view(const void* ptr) {
  void* view = DeviceMemory::instance().vendor_view(ptr);
  if (view == nullptr) throw std::runtime_error("kernel operand is not in device memory");
  return view;
}

namespace {

std::chrono::nanoseconds thread_cpu_time() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
}

struct PacingStats {
  std::atomic<uint64_t> kernels{0};
  std::atomic<uint64_t> late_kernels{0};
  std::atomic<int64_t> emulated_ns{0};
  std::atomic<int64_t> overrun_ns{0};
};

PacingStats pacing_stats;

}  // namespace

// One timeline per engine of an emulated device: when the work queued on it so far ends.
struct Timeline {
  std::mutex mutex;
  std::chrono::steady_clock::time_point idle_at{};

  std::chrono::steady_clock::time_point read() {
    std::lock_guard lock(mutex);
    return idle_at;
  }
  // Nothing queued after this call starts before `time`.
  void hold_until(std::chrono::steady_clock::time_point time) {
    std::lock_guard lock(mutex);
    idle_at = std::max(idle_at, time);
  }
};

enum Engine : size_t { kCompute = 0, kCopyToDevice = 1, kCopyToHost = 2, kEngines = 3 };

size_t device_slot(int32_t device) {
  int32_t devices = std::max(1, state().profile.device_count);
  return static_cast<size_t>(std::clamp<int32_t>(device, 0, devices - 1));
}

Timeline& engine_timeline(int32_t device, Engine engine) {
  static std::vector<Timeline> timelines(kEngines * static_cast<size_t>(std::max(1, state().profile.device_count)));
  return timelines[device_slot(device) * kEngines + engine];
}

// The compute engine's timeline (every kernel's).
Timeline& timeline(int32_t device) { return engine_timeline(device, kCompute); }

std::chrono::steady_clock::time_point device_idle_at() { return timeline(current_device).read(); }

bool device_busy() {
  auto now = std::chrono::steady_clock::now();
  return device_idle_at() > now;
}

void wait_for_device() { std::this_thread::sleep_until(device_idle_at()); }

// When everything queued on `device`, kernels and copies on every stream, ends.
std::chrono::steady_clock::time_point all_engines_idle_at(int32_t device) {
  auto idle = engine_timeline(device, kCompute).read();
  idle = std::max(idle, engine_timeline(device, kCopyToDevice).read());
  return std::max(idle, engine_timeline(device, kCopyToHost).read());
}

namespace {

constexpr uint64_t kSignatureSeed = 0xcbf29ce484222325ull;
constexpr size_t kMaxSignatures = 1 << 16;  // kernels of distinct shapes seen by one thread

uint64_t mixed(uint64_t signature, uint64_t value) {
  return (signature ^ (value + 0x9e3779b97f4a7c15ull + (signature << 6) + (signature >> 2))) * 0x100000001b3ull;
}

thread_local uint64_t running_signature = kSignatureSeed;

// The least CPU time this thread has spent on each kernel signature: the kernel's warm work. Changing how
// a kernel is charged changes h2.core.emulation.PACING_REVISION (profiles measured before are stale).
std::chrono::nanoseconds warm_work(uint64_t signature, std::chrono::nanoseconds spent) {
  thread_local std::unordered_map<uint64_t, std::chrono::nanoseconds> least;
  if (least.size() >= kMaxSignatures) least.clear();
  auto [entry, first] = least.try_emplace(signature, spent);
  if (!first && spent < entry->second) entry->second = spent;
  return entry->second;
}

}  // namespace

void note_operand(int dtype, const int64_t* shape, int64_t ndim) {
  running_signature = mixed(running_signature, static_cast<uint64_t>(dtype) << 32 | static_cast<uint64_t>(ndim));
  for (int64_t i = 0; i < ndim; ++i) running_signature = mixed(running_signature, static_cast<uint64_t>(shape[i]));
}

PacedKernel::PacedKernel(size_t kernel)
    : start_(std::chrono::steady_clock::now()), start_cpu_(thread_cpu_time()), outer_signature_(running_signature) {
  running_signature = mixed(kSignatureSeed, kernel);
}

PacedKernel::~PacedKernel() {
  const uint64_t signature = running_signature;
  running_signature = outer_signature_;
  double speed = state().profile.relative_speed;
  if (speed >= 1.0) return;
  auto work = warm_work(signature, thread_cpu_time() - start_cpu_);
  auto emulated = std::chrono::duration_cast<std::chrono::steady_clock::duration>(work / speed);
  const auto finished = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point chip_finished;
  {
    Timeline& line = timeline(current_device);
    std::lock_guard lock(line.mutex);
    chip_finished = std::max(line.idle_at, start_) + emulated;
    line.idle_at = chip_finished;
  }
  pacing_stats.kernels.fetch_add(1, std::memory_order_relaxed);
  pacing_stats.emulated_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(emulated).count(),
                                     std::memory_order_relaxed);
  // Late: the chip would have finished this kernel (after the work queued before it) while the host was
  // still running it, so the chip sat idle for the host.
  if (finished > chip_finished) {
    pacing_stats.late_kernels.fetch_add(1, std::memory_order_relaxed);
    pacing_stats.overrun_ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(finished - chip_finished).count(),
        std::memory_order_relaxed);
  }
}

}  // namespace dipu::host

using dipu::host::DeviceMemory;
using dipu::host::fail;
using dipu::host::ready;
using dipu::host::state;

extern "C" {

const char* dipuVendorName(void) { return "host"; }

int32_t dipuVendorAbiVersion(void) { return DIPU_VENDOR_ABI_VERSION; }

const char* dipuGetErrorString(dipuError_t error) {
  switch (error) {
    case dipuSuccess: return "success";
    case dipuErrorInvalidValue: return "invalid value";
    case dipuErrorInvalidDevice: return "invalid device";
    case dipuErrorOutOfMemory: return "out of device memory";
    case dipuErrorNotReady: return "not ready";
    case dipuErrorInitialization: return "initialization failed";
    default: return "unknown error";
  }
}

const char* dipuGetLastErrorMessage(void) { return dipu::host::last_error_message.c_str(); }

dipuError_t dipuGetDeviceCount(int32_t* count) {
  if (auto error = ready()) return error;
  *count = state().profile.device_count;
  return dipuSuccess;
}

dipuError_t dipuSetDevice(int32_t device) {
  if (auto error = ready()) return error;
  if (!dipu::host::valid_device(device)) return fail(dipuErrorInvalidDevice, "no device " + std::to_string(device));
  dipu::host::current_device = device;
  return dipuSuccess;
}

dipuError_t dipuGetDevice(int32_t* device) {
  *device = dipu::host::current_device;
  return dipuSuccess;
}

dipuError_t dipuGetDeviceProperties(int32_t device, dipuDeviceProperties_t* properties) {
  if (auto error = ready()) return error;
  if (!dipu::host::valid_device(device)) return fail(dipuErrorInvalidDevice, "no device " + std::to_string(device));
  const auto& profile = state().profile;
  std::memset(properties, 0, sizeof(*properties));
  std::snprintf(properties->name, sizeof(properties->name), "host-emulated (%s)", profile.name.c_str());
  properties->total_memory = profile.memory_capacity;
  properties->compute_units = static_cast<int32_t>(std::thread::hardware_concurrency());
  properties->host_accessible = profile.host_accessible ? 1 : 0;
  properties->relative_speed = profile.relative_speed;
  properties->major = 1;
  properties->minor = 0;
  return dipuSuccess;
}

dipuError_t dipuMemGetInfo(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  if (auto error = ready()) return error;
  if (!dipu::host::valid_device(device)) return fail(dipuErrorInvalidDevice, "no device " + std::to_string(device));
  auto& memory = DeviceMemory::instance();
  *total_bytes = memory.capacity();
  *free_bytes = memory.free_bytes(device);
  return dipuSuccess;
}

dipuError_t dipuDeviceSynchronize(void) {
  if (auto error = ready()) return error;
  std::this_thread::sleep_until(dipu::host::all_engines_idle_at(dipu::host::current_device));
  return dipuSuccess;
}

dipuError_t dipuMalloc(void** ptr, size_t size) {
  if (auto error = ready()) return error;
  std::string why;
  *ptr = DeviceMemory::instance().allocate(dipu::host::current_device, size, &why);
  if (*ptr == nullptr) return fail(dipuErrorOutOfMemory, why);
  return dipuSuccess;
}

dipuError_t dipuFree(void* ptr) {
  if (ptr == nullptr) return dipuSuccess;
  if (!DeviceMemory::instance().release(ptr)) return fail(dipuErrorInvalidValue, "free of a non-device pointer");
  return dipuSuccess;
}

dipuError_t dipuMallocHost(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(64, std::max<size_t>(64, (size + 63) / 64 * 64));
  if (*ptr == nullptr) return fail(dipuErrorOutOfMemory, "pinned host allocation failed");
  std::lock_guard lock(dipu::host::pinned_mutex);
  dipu::host::pinned_blocks[reinterpret_cast<uintptr_t>(*ptr)] = size;
  return dipuSuccess;
}

dipuError_t dipuFreeHost(void* ptr) {
  if (ptr == nullptr) return dipuSuccess;
  std::lock_guard lock(dipu::host::pinned_mutex);
  if (dipu::host::pinned_blocks.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return fail(dipuErrorInvalidValue, "free of a non-pinned pointer");
  }
  std::free(ptr);
  return dipuSuccess;
}

int32_t dipuIsPinnedHostPointer(const void* ptr) {
  std::lock_guard lock(dipu::host::pinned_mutex);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = dipu::host::pinned_blocks.upper_bound(address);
  if (it == dipu::host::pinned_blocks.begin()) return 0;
  --it;
  return address < it->first + it->second ? 1 : 0;
}

dipuError_t dipuMemset(void* device_ptr, int32_t value, size_t size) {
  void* view = DeviceMemory::instance().vendor_view(device_ptr, size);
  if (view == nullptr) return fail(dipuErrorInvalidValue, "memset of a non-device memory range");
  std::memset(view, value, size);
  return dipuSuccess;
}

namespace dipu::host {
namespace {

// Host<->device copies cross the host link; so does a device<->device copy between two devices
// (another process's memory opened through a handle counts as another device: a peer copy).
bool crosses_link(const void* dst, const void* src, dipuMemcpyKind_t kind) {
  if (kind != dipuMemcpyDeviceToDevice) return true;
  auto& memory = DeviceMemory::instance();
  return memory.device_of(dst) != memory.device_of(src);
}

// An asynchronous copy on a created stream: on its direction's copy engine, after the stream's
// earlier work; the stream's tail moves to the copy's end.
void queue_on_copy_engine(dipuStream_t stream, dipuMemcpyKind_t kind, std::chrono::steady_clock::time_point start,
                          size_t size) {
  Timeline& engine = engine_timeline(stream->device, kind == dipuMemcpyDeviceToHost ? kCopyToHost : kCopyToDevice);
  std::scoped_lock lock(engine.mutex, stream->mutex);
  engine.idle_at = std::max({engine.idle_at, start, stream->tail}) + state().link.cost(size);
  stream->tail = engine.idle_at;
}

dipuError_t copy_now(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind, bool synchronous,
                     dipuStream_t stream = nullptr) {
  if (size == 0) return dipuSuccess;
  count_copy(kind);
  const auto start = std::chrono::steady_clock::now();
  const bool over_link = state().link.emulated() && crosses_link(dst, src, kind);
  if (auto error = resolve_copy(dst, src, size, kind)) return error;
  std::memmove(dst, src, size);
  if (!over_link) return dipuSuccess;
  if (synchronous) {
    state().link.finish_copy(start, size);
  } else if (stream != nullptr && kind != dipuMemcpyDeviceToDevice) {
    queue_on_copy_engine(stream, kind, start, size);
  } else {
    Timeline& line = timeline(stream != nullptr ? stream->device : current_device);
    std::lock_guard lock(line.mutex);
    line.idle_at = std::max(line.idle_at, start) + state().link.cost(size);
  }
  return dipuSuccess;
}

int32_t stream_device(dipuStream_t stream) { return stream != nullptr ? stream->device : current_device; }

// When the work queued on `stream` so far ends: the default stream's is the compute engine's; a
// created stream's is its copies' and, as its kernels ran on the compute engine, the compute engine's.
std::chrono::steady_clock::time_point stream_idle_at(dipuStream_t stream) {
  auto compute = timeline(stream_device(stream)).read();
  return stream != nullptr ? std::max(compute, stream->read_tail()) : compute;
}

}  // namespace
}  // namespace dipu::host

// A synchronous copy to host memory returns when the device has produced what it reads: the host
// waits for the compute engine's timeline. Other copies are not ordered behind the device's work.
// Where the profile declares a host link, a synchronous copy across it returns when the link would
// have moved the bytes, and an asynchronous one occupies a timeline for that long (host_link.h): on a
// created stream its direction's copy engine, on the default stream the compute engine.
dipuError_t dipuMemcpy(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind) {
  if (kind == dipuMemcpyDeviceToHost) dipu::host::wait_for_device();
  return dipu::host::copy_now(dst, src, size, kind, /*synchronous=*/true);
}

dipuError_t dipuMemcpyAsync(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind, dipuStream_t stream) {
  return dipu::host::copy_now(dst, src, size, kind, /*synchronous=*/false, stream);
}

dipuError_t dipuStreamCreate(dipuStream_t* stream) {
  *stream = new dipuStream_st{dipu::host::current_device};
  return dipuSuccess;
}

dipuError_t dipuStreamDestroy(dipuStream_t stream) {
  delete stream;
  return dipuSuccess;
}

dipuError_t dipuStreamSynchronize(dipuStream_t stream) {
  std::this_thread::sleep_until(dipu::host::stream_idle_at(stream));
  return dipuSuccess;
}

dipuError_t dipuStreamQuery(dipuStream_t stream) {
  return dipu::host::stream_idle_at(stream) > std::chrono::steady_clock::now() ? dipuErrorNotReady : dipuSuccess;
}

// Later work on `stream` starts no earlier than the event: its copies, and every kernel (the compute
// engine holds), since a kernel may have been launched while `stream` was current. An event never
// recorded is complete (CUDA's rule).
dipuError_t dipuStreamWaitEvent(dipuStream_t stream, dipuEvent_t event) {
  if (event == nullptr || !event->recorded) return dipuSuccess;
  dipu::host::timeline(dipu::host::stream_device(stream)).hold_until(event->time);
  if (stream != nullptr) stream->hold_until(event->time);
  return dipuSuccess;
}

dipuError_t dipuEventCreate(dipuEvent_t* event) {
  *event = new dipuEvent_st{};
  return dipuSuccess;
}

dipuError_t dipuEventDestroy(dipuEvent_t event) {
  delete event;
  return dipuSuccess;
}

dipuError_t dipuEventRecord(dipuEvent_t event, dipuStream_t stream) {
  // The device reaches the event after the stream's queued work.
  event->time = std::max(std::chrono::steady_clock::now(), dipu::host::stream_idle_at(stream));
  event->recorded = true;
  return dipuSuccess;
}

dipuError_t dipuEventSynchronize(dipuEvent_t event) {
  std::this_thread::sleep_until(event->time);
  return dipuSuccess;
}

dipuError_t dipuEventQuery(dipuEvent_t event) {
  auto now = std::chrono::steady_clock::now();
  return event->time > now ? dipuErrorNotReady : dipuSuccess;
}

dipuError_t dipuEventElapsedTime(float* milliseconds, dipuEvent_t start, dipuEvent_t end) {
  if (!start->recorded || !end->recorded) return fail(dipuErrorInvalidValue, "event was never recorded");
  *milliseconds = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return dipuSuccess;
}

dipuError_t dipuGetPacingStats(dipuPacingStats_t* stats) {
  auto& source = dipu::host::pacing_stats;
  stats->kernels = source.kernels.load(std::memory_order_relaxed);
  stats->late_kernels = source.late_kernels.load(std::memory_order_relaxed);
  stats->emulated_s = static_cast<double>(source.emulated_ns.load(std::memory_order_relaxed)) * 1e-9;
  stats->overrun_s = static_cast<double>(source.overrun_ns.load(std::memory_order_relaxed)) * 1e-9;
  return dipuSuccess;
}

}  // extern "C"
