#include "shm/anonymous_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dicomm/job_secret.h"
#include "dicomm/request.h"

namespace dicomm {
namespace {

constexpr uint64_t kMagic = 0x4d4853434d4d4f43ull;  // "COMMCSHM"
constexpr size_t kHeaderBytes = 64;

struct Header {
  uint64_t magic;
  uint64_t nonce;
};
static_assert(sizeof(Header) <= kHeaderBytes);

std::string errnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

// The owner's descriptor `fd`, duplicated into this process, or -1 with `why` saying what refused it.
int takeDescriptor(int64_t owner_pid, int fd, std::string* why) {
  const int pidfd = int(syscall(SYS_pidfd_open, pid_t(owner_pid), 0));
  if (pidfd >= 0) {
    const int taken = int(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    *why = errnoText("pidfd_getfd");
    close(pidfd);
    if (taken >= 0) return taken;
  } else {
    *why = errnoText("pidfd_open");
  }
  // Where pidfd_getfd is refused (no ptrace attach right, a seccomp filter, an old kernel), the
  // owner's /proc entry reopens the same file with only ptrace read access.
  const std::string path = "/proc/" + std::to_string(owner_pid) + "/fd/" + std::to_string(fd);
  const int reopened = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (reopened < 0) *why += "; " + errnoText(path);
  return reopened;
}

void* mapShared(int fd, size_t bytes) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return data == MAP_FAILED ? nullptr : data;
}

}  // namespace

AnonymousSegment::~AnonymousSegment() { release(); }

AnonymousSegment::AnonymousSegment(AnonymousSegment&& other) noexcept { *this = std::move(other); }

AnonymousSegment& AnonymousSegment::operator=(AnonymousSegment&& other) noexcept {
  if (this != &other) {
    release();
    mapping_ = other.mapping_;
    mapping_bytes_ = other.mapping_bytes_;
    payload_ = other.payload_;
    fd_ = other.fd_;
    nonce_ = other.nonce_;
    other.mapping_ = nullptr;
    other.payload_ = nullptr;
    other.mapping_bytes_ = 0;
    other.fd_ = -1;
  }
  return *this;
}

void AnonymousSegment::release() {
  stopSharing();
  if (mapping_) munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  payload_ = nullptr;
  mapping_bytes_ = 0;
}

void AnonymousSegment::stopSharing() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

AnonymousSegment AnonymousSegment::create(const std::string& label, size_t size) {
  AnonymousSegment s;
  s.fd_ = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.fd_ < 0) throw CommError("cannot create shared memory " + label + ": " + std::strerror(errno));
  s.mapping_bytes_ = kHeaderBytes + size;
  // Sealed at its size: a peer holding the file cannot shrink it under our mapping (SIGBUS).
  if (ftruncate(s.fd_, off_t(s.mapping_bytes_)) != 0 ||
      fcntl(s.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw CommError(errnoText("cannot size shared memory " + label + " to " + std::to_string(size) + " bytes"));
  }
  s.mapping_ = mapShared(s.fd_, s.mapping_bytes_);
  if (!s.mapping_) throw CommError(errnoText("cannot map shared memory " + label));
  s.nonce_ = (randomWord("a shared memory nonce") >> 1) | 1;  // 63 bits: fits a signed text field
  auto* header = static_cast<Header*>(s.mapping_);
  header->magic = kMagic;
  header->nonce = s.nonce_;
  s.payload_ = static_cast<char*>(s.mapping_) + kHeaderBytes;
  return s;
}

AnonymousSegment AnonymousSegment::takeFromPeer(int64_t owner_pid, int fd, uint64_t nonce, size_t size,
                                                const std::string& whose) {
  const std::string where = " (process " + std::to_string(owner_pid) + ", descriptor " + std::to_string(fd) + ")";
  std::string why;
  AnonymousSegment s;
  s.fd_ = takeDescriptor(owner_pid, fd, &why);
  if (s.fd_ < 0) throw CommError(whose + " cannot be taken" + where + ": " + why);
  s.mapping_bytes_ = kHeaderBytes + size;
  struct stat st {};
  Header header{};
  const int seals = fcntl(s.fd_, F_GET_SEALS);
  if (fstat(s.fd_, &st) != 0 || !S_ISREG(st.st_mode) || size_t(st.st_size) != s.mapping_bytes_ || seals < 0 ||
      !(seals & F_SEAL_SHRINK) || pread(s.fd_, &header, sizeof(header), 0) != ssize_t(sizeof(header)) ||
      header.magic != kMagic || header.nonce != nonce) {
    throw CommError(whose + where + " is not the file it announced (wrong size, seals or nonce)");
  }
  s.mapping_ = mapShared(s.fd_, s.mapping_bytes_);
  if (!s.mapping_) throw CommError(errnoText("cannot map " + whose + where));
  s.payload_ = static_cast<char*>(s.mapping_) + kHeaderBytes;
  s.stopSharing();  // the mapping keeps the file; nobody takes it from us
  return s;
}

}  // namespace dicomm
