#include "opencl_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

namespace dipu::opencl {
namespace {

constexpr size_t kAddressAlignment = 256;
constexpr size_t kAddressGap = 4096;  // between allocations, so one's end never resolves into the next

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string platformInfo(cl_platform_id platform, cl_platform_info what) {
  size_t size = 0;
  if (clGetPlatformInfo(platform, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string text(size, '\0');
  clGetPlatformInfo(platform, what, size, text.data(), nullptr);
  text.resize(text.find('\0') == std::string::npos ? size : text.find('\0'));
  return text;
}

std::string deviceInfo(cl_device_id device, cl_device_info what) {
  size_t size = 0;
  if (clGetDeviceInfo(device, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string text(size, '\0');
  clGetDeviceInfo(device, what, size, text.data(), nullptr);
  text.resize(text.find('\0') == std::string::npos ? size : text.find('\0'));
  return text;
}

template <typename T>
T deviceValue(cl_device_id device, cl_device_info what) {
  T value{};
  clGetDeviceInfo(device, what, sizeof(value), &value, nullptr);
  return value;
}

std::vector<cl_device_id> platformDevices(cl_platform_id platform) {
  cl_uint count = 0;
  if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &count) != CL_SUCCESS || count == 0) return {};
  std::vector<cl_device_id> devices(count);
  clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, count, devices.data(), nullptr);
  return devices;
}

std::string setting(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

bool isIndex(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

// The position in `names` that `choice` picks (an index or a case-insensitive substring), or -1.
int pick(const std::string& choice, const std::vector<std::string>& names) {
  if (isIndex(choice)) {
    size_t index = std::stoul(choice);
    return index < names.size() ? static_cast<int>(index) : -1;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (lower(names[i]).find(lower(choice)) != std::string::npos) return static_cast<int>(i);
  }
  return -1;
}

std::string listing(const std::vector<std::string>& names) {
  std::ostringstream text;
  for (size_t i = 0; i < names.size(); ++i) text << (i ? ", " : "") << i << " '" << names[i] << "'";
  return names.empty() ? "none" : text.str();
}

}  // namespace

std::string clErrorName(cl_int code) {
  switch (code) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_ARG_VALUE: return "CL_INVALID_ARG_VALUE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "OpenCL error " + std::to_string(code);
  }
}

int32_t& currentDevice() {
  thread_local int32_t device = 0;
  return device;
}

std::string& lastErrorMessage() {
  thread_local std::string message;
  return message;
}

Runtime& Runtime::instance() {
  static Runtime* runtime = new Runtime();  // never destroyed: queues may still be used at exit
  return *runtime;
}

Runtime::Runtime() {
  open();
  if (error_.empty()) emulate();
  if (error_.empty()) reserveAddresses();
  used_.assign(devices_.size(), 0);
  pacer_ = std::make_unique<Pacer>(relative_speed_, devices_.size());
}

// The emulated chip's memory and speed (DIPU_OPENCL_MEMORY_CAPACITY, DIPU_OPENCL_RELATIVE_SPEED), each
// a bad value refused in one line naming the setting.
void Runtime::emulate() {
  std::string capacity = setting("DIPU_OPENCL_MEMORY_CAPACITY");
  if (!capacity.empty()) {
    if (!isIndex(capacity) || capacity.size() > 18 || std::stoull(capacity) == 0) {
      error_ = "DIPU_OPENCL_MEMORY_CAPACITY=" + capacity + ": must be a positive number of bytes";
      return;
    }
    for (Device& device : devices_) device.capacity = std::min<uint64_t>(device.capacity, std::stoull(capacity));
  }
  std::string speed = setting("DIPU_OPENCL_RELATIVE_SPEED");
  if (!speed.empty()) {
    char* end = nullptr;
    double value = std::strtod(speed.c_str(), &end);
    if (end == speed.c_str() || *end != '\0' || !(value > 0.0 && value <= 1.0)) {
      error_ =
          "DIPU_OPENCL_RELATIVE_SPEED=" + speed + ": must be a number in (0, 1] (a fraction of the device's speed)";
      return;
    }
    relative_speed_ = value;
  }
}

void Runtime::open() {
  cl_uint count = 0;
  cl_int status = clGetPlatformIDs(0, nullptr, &count);
  if (status != CL_SUCCESS || count == 0) {
    error_ = "DIPU_VENDOR=opencl: the OpenCL ICD loader finds no platform (" +
             (status == CL_SUCCESS ? std::string("0 platforms") : clErrorName(status)) +
             "; check OCL_ICD_VENDORS and /etc/OpenCL/vendors)";
    return;
  }
  std::vector<cl_platform_id> platforms(count);
  clGetPlatformIDs(count, platforms.data(), nullptr);
  std::vector<std::string> platform_names;
  for (cl_platform_id p : platforms) platform_names.push_back(platformInfo(p, CL_PLATFORM_NAME));

  std::string platform_choice = setting("DIPU_OPENCL_PLATFORM");
  int chosen = -1;
  if (!platform_choice.empty()) {
    chosen = pick(platform_choice, platform_names);
    if (chosen < 0) {
      error_ = "DIPU_OPENCL_PLATFORM=" + platform_choice +
               ": no OpenCL platform matches (platforms: " + listing(platform_names) + ")";
      return;
    }
  } else {
    for (size_t i = 0; i < platforms.size() && chosen < 0; ++i) {
      if (!platformDevices(platforms[i]).empty()) chosen = static_cast<int>(i);
    }
    if (chosen < 0) {
      error_ = "DIPU_VENDOR=opencl: no OpenCL platform has a device (platforms: " + listing(platform_names) + ")";
      return;
    }
  }
  cl_platform_id platform = platforms[static_cast<size_t>(chosen)];
  std::vector<cl_device_id> ids = platformDevices(platform);
  std::vector<std::string> device_names;
  for (cl_device_id id : ids) device_names.push_back(deviceInfo(id, CL_DEVICE_NAME));
  if (ids.empty()) {
    error_ =
        "DIPU_OPENCL_PLATFORM=" + platform_choice + ": OpenCL platform '" + platform_names[chosen] + "' has no device";
    return;
  }
  std::string device_choice = setting("DIPU_OPENCL_DEVICE");
  if (!device_choice.empty()) {
    int index = pick(device_choice, device_names);
    if (index < 0) {
      error_ = "DIPU_OPENCL_DEVICE=" + device_choice + ": no device of OpenCL platform '" + platform_names[chosen] +
               "' matches (devices: " + listing(device_names) + ")";
      return;
    }
    ids = {ids[static_cast<size_t>(index)]};
  }
  for (cl_device_id id : ids) {
    Device device;
    device.platform = platform;
    device.id = id;
    device.name = deviceInfo(id, CL_DEVICE_NAME);
    device.platform_name = platform_names[chosen];
    device.platform_version = platformInfo(platform, CL_PLATFORM_VERSION);
    device.driver_version = deviceInfo(id, CL_DRIVER_VERSION);
    device.device_version = deviceInfo(id, CL_DEVICE_VERSION);
    device.c_version = deviceInfo(id, CL_DEVICE_OPENCL_C_VERSION);
    device.global_memory = deviceValue<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE);
    device.capacity = device.global_memory;
    device.max_allocation = deviceValue<cl_ulong>(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    device.compute_units = static_cast<int32_t>(deviceValue<cl_uint>(id, CL_DEVICE_MAX_COMPUTE_UNITS));
    device.host_unified = deviceValue<cl_bool>(id, CL_DEVICE_HOST_UNIFIED_MEMORY) == CL_TRUE;
    cl_context_properties properties[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(platform), 0};
    device.context = clCreateContext(properties, 1, &id, nullptr, nullptr, &status);
    if (status != CL_SUCCESS) {
      error_ = "DIPU_VENDOR=opencl: cannot create a context on OpenCL device '" + device.name + "' (" +
               clErrorName(status) + ")";
      return;
    }
    device.queue = clCreateCommandQueue(device.context, id, CL_QUEUE_PROFILING_ENABLE, &status);
    if (status != CL_SUCCESS) {
      error_ = "DIPU_VENDOR=opencl: cannot create a command queue on OpenCL device '" + device.name + "' (" +
               clErrorName(status) + ")";
      return;
    }
    devices_.push_back(device);
  }
}

void Runtime::reserveAddresses() {
  size_t total = 0;
  for (const Device& device : devices_) total += std::min<uint64_t>(device.global_memory, uint64_t{1} << 42) * 2;
  total = std::max<size_t>(total, size_t{1} << 30);
  void* base = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    error_ =
        "DIPU_VENDOR=opencl: cannot reserve " + std::to_string(total) + " bytes of address space for device memory";
    return;
  }
  reserved_base_ = reinterpret_cast<uintptr_t>(base);
  reserved_size_ = total;
  free_ranges_[reserved_base_] = total;
}

void* Runtime::allocate(int32_t device, size_t size, std::string* why) {
  const Device& d = devices_[static_cast<size_t>(device)];
  size_t rounded =
      std::max<size_t>(kAddressAlignment, (size + kAddressAlignment - 1) / kAddressAlignment * kAddressAlignment);
  std::lock_guard lock(mutex_);
  auto refuse = [&](const std::string& reason) -> void* {
    *why = "out of memory on OpenCL device " + std::to_string(device) + " (" + d.name + "): tried to allocate " +
           std::to_string(size) + " bytes, " + std::to_string(used_[device]) + " of " + std::to_string(d.capacity) +
           " bytes in use" + (d.capacity < d.global_memory ? " (the emulated chip's memory)" : "") +
           (reason.empty() ? "" : "; " + reason);
    return nullptr;
  };
  if (used_[device] + rounded > d.capacity) return refuse("");
  if (rounded > d.max_allocation) {
    return refuse("the device allocates at most " + std::to_string(d.max_allocation) + " bytes at once");
  }
  size_t span = rounded + kAddressGap;
  auto range = std::find_if(free_ranges_.begin(), free_ranges_.end(), [&](const auto& r) { return r.second >= span; });
  if (range == free_ranges_.end()) return refuse("no device address range left");
  cl_int status = CL_SUCCESS;
  cl_mem buffer = clCreateBuffer(d.context, CL_MEM_READ_WRITE, rounded, nullptr, &status);
  if (status != CL_SUCCESS) return refuse("clCreateBuffer: " + clErrorName(status));
  uintptr_t address = range->first;
  size_t left = range->second - span;
  free_ranges_.erase(range);
  if (left > 0) free_ranges_[address + span] = left;
  blocks_[address] = Block{rounded, buffer, device};
  used_[device] += rounded;
  return reinterpret_cast<void*>(address);
}

bool Runtime::release(void* ptr) {
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end()) return false;
  clReleaseMemObject(it->second.buffer);  // freed once the commands using it have finished
  used_[it->second.device] -= it->second.size;
  uintptr_t start = it->first;
  size_t span = it->second.size + kAddressGap;
  blocks_.erase(it);
  // Give the range back, merged with its free neighbours.
  auto next = free_ranges_.lower_bound(start);
  if (next != free_ranges_.end() && next->first == start + span) {
    span += next->second;
    free_ranges_.erase(next);
  }
  auto after = free_ranges_.lower_bound(start);
  if (after != free_ranges_.begin()) {
    auto before = std::prev(after);
    if (before->first + before->second == start) {
      before->second += span;
      return true;
    }
  }
  free_ranges_[start] = span;
  return true;
}

bool Runtime::locate(const void* ptr, size_t size, Location* where) const {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  auto it = blocks_.upper_bound(address);
  if (it == blocks_.begin()) return false;
  --it;
  size_t offset = address - it->first;
  if (offset > it->second.size || size > it->second.size - offset) return false;
  *where = Location{it->second.buffer, offset, it->second.size - offset, it->second.device};
  return true;
}

uint64_t Runtime::used(int32_t device) const {
  std::lock_guard lock(mutex_);
  return used_[static_cast<size_t>(device)];
}

void Runtime::addStream(dipuStream_t stream) {
  std::lock_guard lock(mutex_);
  streams_.insert(stream);
}

void Runtime::removeStream(dipuStream_t stream) {
  std::lock_guard lock(mutex_);
  streams_.erase(stream);
  auto last = last_command_.find(stream->queue);
  if (last != last_command_.end()) {
    clReleaseEvent(last->second);
    last_command_.erase(last);
  }
}

void Runtime::noteCommand(cl_command_queue queue, cl_event event) {
  if (event == nullptr) return;
  std::lock_guard lock(mutex_);
  cl_event& last = last_command_[queue];
  if (last != nullptr) clReleaseEvent(last);
  last = event;
}

void Runtime::noteKernel(int32_t device, cl_command_queue queue, cl_event event) {
  pacer_->kernelEnqueued(device, event);
  noteCommand(queue, event);
}

bool Runtime::queueIdle(cl_command_queue queue) const {
  std::lock_guard lock(mutex_);
  auto last = last_command_.find(queue);
  if (last == last_command_.end()) return true;
  cl_int state = CL_QUEUED;
  clGetEventInfo(last->second, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(state), &state, nullptr);
  return state == CL_COMPLETE || state < 0;
}

cl_int Runtime::finishDevice(int32_t device) const {
  std::vector<cl_command_queue> queues{devices_[static_cast<size_t>(device)].queue};
  {
    std::lock_guard lock(mutex_);
    for (dipuStream_t stream : streams_) {
      if (stream->device == device) queues.push_back(stream->queue);
    }
  }
  for (cl_command_queue queue : queues) {
    if (cl_int status = clFinish(queue); status != CL_SUCCESS) return status;
  }
  return CL_SUCCESS;
}

cl_command_queue Runtime::queueOf(int32_t device, dipuStream_t stream) const {
  return stream != nullptr ? stream->queue : devices_[static_cast<size_t>(device)].queue;
}

}  // namespace dipu::opencl
