// A named POSIX shared-memory mapping: created by one process, opened by its peer, unlinked as
// soon as both have it mapped (so a crash leaves nothing behind in /dev/shm).
#pragma once

#include <cstddef>
#include <string>

namespace dicomm {

class SharedSegment {
 public:
  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  static SharedSegment create(const std::string& name, size_t size);
  // Throws CommError when the segment is missing or smaller than `size`.
  static SharedSegment open(const std::string& name, size_t size);

  void unlink();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void release();

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_linked_ = false;
};

// A fresh segment name unique to this process and call.
std::string uniqueSegmentName(const std::string& what);

// Removes this user's /dev/shm/dicomm-<pid>-* segments whose creating process no longer exists
// (a process killed during setup, before its peers mapped them). Returns how many it removed.
int removeSegmentsOfDeadProcesses();

}  // namespace dicomm
