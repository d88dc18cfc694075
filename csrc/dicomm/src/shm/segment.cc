#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "dicomm/request.h"

namespace dicomm {
namespace {

// Maps `size` bytes of the shared-memory file `fd` and closes `fd`, whether or not the mapping worked.
void* mapSharedAndClose(int fd, size_t size, const std::string& name) {
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (data == MAP_FAILED) throw CommError("cannot map shared memory " + name + ": " + std::strerror(err));
  return data;
}

}  // namespace

SharedSegment::~SharedSegment() { release(); }

SharedSegment::SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = other.data_;
    size_ = other.size_;
    owner_linked_ = other.owner_linked_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.owner_linked_ = false;
  }
  return *this;
}

void SharedSegment::release() {
  unlink();
  if (data_) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void SharedSegment::unlink() {
  if (owner_linked_) shm_unlink(name_.c_str());
  owner_linked_ = false;
}

SharedSegment SharedSegment::create(const std::string& name, size_t size) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw CommError("cannot create shared memory " + name + ": " + std::strerror(errno));
  SharedSegment s;
  s.name_ = name;
  s.owner_linked_ = true;
  if (ftruncate(fd, off_t(size)) != 0) {
    const int err = errno;
    ::close(fd);
    throw CommError("cannot size shared memory " + name + " to " + std::to_string(size) + " bytes: " +
                    std::strerror(err) + " (is /dev/shm full?)");
  }
  s.data_ = mapSharedAndClose(fd, size, name);
  s.size_ = size;
  return s;
}

SharedSegment SharedSegment::open(const std::string& name, size_t size) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw CommError("cannot open the peer's shared memory " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) < size) {
    ::close(fd);
    throw CommError("the peer's shared memory " + name + " is smaller than the announced " + std::to_string(size) +
                    " bytes");
  }
  SharedSegment s;
  s.name_ = name;
  s.data_ = mapSharedAndClose(fd, size, name);
  s.size_ = size;
  return s;
}

int removeSegmentsOfDeadProcesses() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    const std::string prefix = "dicomm-";
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || !end || *end != '-') continue;
    struct stat st {};
    if (stat(("/dev/shm/" + name).c_str(), &st) != 0 || st.st_uid != getuid()) continue;
    if (kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

std::string uniqueSegmentName(const std::string& what) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return "/dicomm-" + std::to_string(getpid()) + "-" + std::to_string(salt % 1000000007) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + what;
}

}  // namespace dicomm
