// A shared-memory mapping with no name anywhere (the shm transport's rings and doorbell): an
// anonymous memory file (memfd) that a peer takes from the owning process by pid and descriptor
// number, so a kill at any point leaves nothing in /dev/shm. The file starts with a header holding a random nonce the
// owner announces; a peer checks it after taking the file, so a reused pid or a wrong descriptor is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dicomm {

class AnonymousSegment {
 public:
  AnonymousSegment() = default;
  ~AnonymousSegment();
  AnonymousSegment(AnonymousSegment&& other) noexcept;
  AnonymousSegment& operator=(AnonymousSegment&& other) noexcept;
  AnonymousSegment(const AnonymousSegment&) = delete;
  AnonymousSegment& operator=(const AnonymousSegment&) = delete;

  // A zeroed `size`-byte region in a fresh sealed memfd; the descriptor stays open for peers to take.
  static AnonymousSegment create(const std::string& label, size_t size);
  // Takes `fd` from process `owner_pid` (pidfd_getfd, or /proc/<pid>/fd/<fd> where the kernel or a
  // seccomp filter refuses it), maps it and checks its nonce. Throws a one-line CommError starting
  // with `whose` (e.g. "rank 1's shm bell") when it cannot be taken or is not the announced file.
  static AnonymousSegment takeFromPeer(int64_t owner_pid, int fd, uint64_t nonce, size_t size,
                                       const std::string& whose);

  // Closes the owner's descriptor: peers that did not take the file by now cannot take it any more.
  void stopSharing();
  void* data() const { return payload_; }
  int fd() const { return fd_; }
  uint64_t nonce() const { return nonce_; }

 private:
  void release();

  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  void* payload_ = nullptr;
  int fd_ = -1;
  uint64_t nonce_ = 0;
};

}  // namespace dicomm
