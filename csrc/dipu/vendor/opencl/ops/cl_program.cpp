#include "vendor/opencl/ops/cl_program.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

namespace dipu::opencl {
namespace {

const char* const kSource =
#include "vendor/opencl/ops/kernels.cl.inc"
    ;

struct Program {
  cl_program program = nullptr;
  std::map<std::string, cl_kernel> kernels;
  cl_mem placeholder = nullptr;
};

std::mutex program_mutex;
std::map<int32_t, Program> programs;

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

std::string buildOptions(const Device& device) {
  cl_device_fp_config config = 0;
  clGetDeviceInfo(device.id, CL_DEVICE_SINGLE_FP_CONFIG, sizeof(config), &config, nullptr);
  std::string options = "-cl-std=CL1.2";
  // Division and square root rounded as the CPU rounds them, where the device can.
  if (config & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) options += " -cl-fp32-correctly-rounded-divide-sqrt";
  return options;
}

std::string cacheDirectory() {
  if (const char* dir = std::getenv("DIPU_OPENCL_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/h2/opencl";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/h2/opencl";
}

void makeDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    mkdir(path.substr(0, slash).c_str(), 0755);
  }
  mkdir(path.c_str(), 0755);
}

std::string buildLog(cl_program program, cl_device_id device) {
  size_t size = 0;
  clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
  std::string log(size, '\0');
  clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
  return log.substr(0, 2000);
}

cl_program loadBinary(const Device& device, const std::string& path, const std::string& options) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return nullptr;
  std::string binary((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto* bytes = reinterpret_cast<const unsigned char*>(binary.data());
  size_t size = binary.size();
  cl_int binary_status = CL_SUCCESS, status = CL_SUCCESS;
  cl_program program = clCreateProgramWithBinary(device.context, 1, &device.id, &size, &bytes, &binary_status, &status);
  if (status != CL_SUCCESS || binary_status != CL_SUCCESS) return nullptr;
  if (clBuildProgram(program, 1, &device.id, options.c_str(), nullptr, nullptr) != CL_SUCCESS) {
    clReleaseProgram(program);
    return nullptr;
  }
  return program;
}

void saveBinary(cl_program program, const std::string& path) {
  size_t size = 0;
  if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr) != CL_SUCCESS || size == 0) {
    return;
  }
  std::string binary(size, '\0');
  unsigned char* bytes = reinterpret_cast<unsigned char*>(binary.data());
  if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof(bytes), &bytes, nullptr) != CL_SUCCESS) return;
  std::string temporary = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream file(temporary, std::ios::binary);
    file.write(binary.data(), static_cast<std::streamsize>(binary.size()));
    if (!file) return;
  }
  std::rename(temporary.c_str(), path.c_str());  // atomic: concurrent processes never read half a file
}

Program& programOf(int32_t device) {
  auto found = programs.find(device);
  if (found != programs.end()) return found->second;
  const Device& d = Runtime::instance().device(device);
  std::string options = buildOptions(d);
  std::string path = programCachePath(device);
  cl_program program = loadBinary(d, path, options);
  if (program == nullptr) {
    cl_int status = CL_SUCCESS;
    const char* source = kSource;
    program = clCreateProgramWithSource(d.context, 1, &source, nullptr, &status);
    checkCl(status, "clCreateProgramWithSource");
    status = clBuildProgram(program, 1, &d.id, options.c_str(), nullptr, nullptr);
    if (status != CL_SUCCESS) {
      throw std::runtime_error("building the OpenCL vendor's kernels for '" + d.name +
                               "' failed: " + buildLog(program, d.id));
    }
    makeDirectories(cacheDirectory());
    saveBinary(program, path);
  }
  Program entry;
  entry.program = program;
  cl_int status = CL_SUCCESS;
  entry.placeholder = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 64, nullptr, &status);
  checkCl(status, "clCreateBuffer");
  return programs.emplace(device, std::move(entry)).first->second;
}

}  // namespace

void checkCl(cl_int status, const char* what) {
  if (status != CL_SUCCESS) throw std::runtime_error(std::string(what) + " failed: " + clErrorName(status));
}

std::string programCachePath(int32_t device) {
  const Device& d = Runtime::instance().device(device);
  std::ostringstream key;
  key << d.platform_name << '\n'
      << d.platform_version << '\n'
      << d.name << '\n'
      << d.driver_version << '\n'
      << buildOptions(d) << '\n'
      << kSource;
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.bin", static_cast<unsigned long long>(fnv1a(key.str())));
  return cacheDirectory() + "/" + name;
}

cl_kernel kernel(int32_t device, const char* name) {
  std::lock_guard lock(program_mutex);
  Program& program = programOf(device);
  auto found = program.kernels.find(name);
  if (found != program.kernels.end()) return found->second;
  cl_int status = CL_SUCCESS;
  cl_kernel k = clCreateKernel(program.program, name, &status);
  checkCl(status, name);
  program.kernels[name] = k;
  return k;
}

cl_mem placeholder(int32_t device) {
  std::lock_guard lock(program_mutex);
  return programOf(device).placeholder;
}

std::mutex& launchMutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace dipu::opencl
